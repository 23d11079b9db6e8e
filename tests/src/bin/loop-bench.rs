//! Measures the agent loop's overhead per round against the scripted fake OpenAI server: the
//! run time of a task with 21 rounds (20 `list_nodes` calls, then an answer) minus that of a
//! one-round task, divided by 20. Run time is taken from the task's own events (`started` to
//! `completed`, stamped by the node), so the CLI's start-up and TLS handshake are not in it;
//! what remains per round is one streamed model call over HTTP, one tool call, the supervisor
//! hooks and the persisted events.
//!
//! Run: `cargo build --release --bins && target/release/loop-bench [RUNS]` (default 10).

use std::process::ExitCode;

use mesh_tests::{
    Harness, NodeOptions,
    fake_openai::{FakeOpenAi, Scripted},
};

const ROUNDS: usize = 21;

fn main() -> ExitCode {
    let runs = mesh_tests::arg(1, 10);
    match bench(runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(runs: usize) -> anyhow::Result<()> {
    let fake = FakeOpenAi::start();
    let harness = Harness::new()?;
    let config = format!(
        "[[models]]\nname = \"fake\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nchat = [\"fake\"]\n",
        fake.base_url()
    );
    let node = harness.spawn(NodeOptions::new("bench").extra(&config))?;
    let time_task = |rounds: usize| -> anyhow::Result<f64> {
        fake.push((1..rounds).map(|i| Scripted::tool("list_nodes", &format!("{{\"i\": {i}}}"))));
        fake.push([Scripted::text("done")]);
        let (code, result) = harness.run_json(
            &node,
            &["--role", "chat", "--max-rounds", "50", "benchmark"],
        )?;
        anyhow::ensure!(code == Some(0), "task failed: {result}");
        let id = result["task_id"].as_str().unwrap_or_default();
        let output = harness.cli(&node, &["tasks", "show", id, "--json"])?;
        let shown: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let at = |kind: &str| {
            shown["events"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["type"] == kind)
                .and_then(|e| e["at_ms"].as_u64())
        };
        match (at("started"), at("completed")) {
            (Some(start), Some(end)) => Ok((end - start) as f64),
            _ => anyhow::bail!("task {id} has no started/completed events"),
        }
    };
    time_task(1)?; // warm-up
    let mut one = Vec::new();
    let mut many = Vec::new();
    for _ in 0..runs {
        one.push(time_task(1)?);
        many.push(time_task(ROUNDS)?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (t1, tn) = (median(&mut one), median(&mut many));
    println!("runs: {runs}");
    println!("1-round task, started→completed (median):  {t1:8.1} ms");
    println!("{ROUNDS}-round task, started→completed (median): {tn:8.1} ms");
    println!(
        "overhead per round:      {:8.2} ms",
        (tn - t1) / (ROUNDS - 1) as f64
    );
    Ok(())
}
