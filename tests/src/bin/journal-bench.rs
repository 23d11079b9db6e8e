//! Durable tasks' cost and recovery (issue 30), on real processes over real mTLS with real sled
//! on disk:
//!
//! 1. The journal's cost per step: a task of STEPS tool rounds (each a side-effecting
//!    `shell_exec`, so its intent is also confirmed by the origin) on a GPU node sent there by
//!    a laptop; the GPU node's `agentmesh_task_journal_append_seconds` histogram (each append
//!    written and flushed, the origin's confirmation not included) gives p50/p99 as bucket
//!    bounds, and `agentmesh_task_journal_bytes` / `_appends` the bytes per step; the task's
//!    time per round with the journal is printed too.
//! 2. From SIGKILL to the task running again: KILLS times, a fresh fleet (laptop, gpu1, gpu2);
//!    once gpu1 has run a step, gpu1 is killed, and the time until gpu2's model is first asked
//!    (the resumed task running) is measured.
//!
//! Run: `cargo build --release --bins && target/release/journal-bench [STEPS] [KILLS]`
//! (defaults 40 and 5).

use std::{
    path::Path,
    process::{ExitCode, Stdio},
    time::{Duration, Instant},
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    wait_for,
};

const DEADLINE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let (steps, kills) = (mesh_tests::arg(1, 40), mesh_tests::arg(2, 5));
    match bench(steps, kills) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn gpu(fake: &FakeOpenAi, vram: u64, root: &Path) -> String {
    format!(
        "[[resources.gpus]]\nname = \"RTX\"\nvram_mb = {vram}\n\n[tools]\nroots = [{root:?}]\n\n[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\ncoder = [\"m\"]\n",
        fake.base_url()
    )
}

const SHELL: &str = "client_max_tier = \"shell\"\nremote_max_tier = \"shell\"\n";

fn shell(n: usize) -> Scripted {
    Scripted::tool("shell_exec", &format!("{{\"command\": \"echo {n}\"}}"))
}

/// `mesh-cli run --json` on `node` for a shell-tier coder task, in the background.
fn submit(harness: &Harness, node: &NodeProcess, rounds: usize) -> std::process::Child {
    harness
        .cli_command(
            node,
            &[
                "run",
                "--json",
                "--role",
                "coder",
                "--tier",
                "shell",
                "--max-rounds",
                &rounds.to_string(),
                "bench",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run")
}

fn finished(caller: std::process::Child) -> anyhow::Result<()> {
    let output = caller.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "the task failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(())
}

/// The value of the metric line that starts with `name` (labels included).
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The upper bound of the histogram bucket holding quantile `q`: `(le, cumulative count)`.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map_or(f64::NAN, |(le, _)| *le)
}

fn bench(steps: usize, kills: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // 1. The cost per step.
    {
        let harness = Harness::new()?;
        let fake = FakeOpenAi::start();
        let laptop = harness.spawn(NodeOptions::new("laptop").security(SHELL))?;
        let node = harness.spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .security(SHELL)
                .extra(&gpu(&fake, 24576, dir.path())),
        )?;
        harness.wait_all_up(&[&laptop, &node], DEADLINE)?;
        fake.push((0..steps).map(shell));
        fake.push([Scripted::text("done")]);
        let started = Instant::now();
        finished(submit(&harness, &laptop, steps + 1))?;
        let took = started.elapsed();
        let page = node.metrics()?;
        let buckets: Vec<(f64, f64)> = page
            .lines()
            .filter(|l| l.starts_with("agentmesh_task_journal_append_seconds_bucket"))
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect();
        let appends = metric(&page, "agentmesh_task_journal_appends_total");
        let bytes = metric(&page, "agentmesh_task_journal_bytes_total");
        let sum = metric(&page, "agentmesh_task_journal_append_seconds_sum");
        println!(
            "journal: {appends} appends for {steps} tool rounds; append (write + flush) p50 <= {:.3} ms, p99 <= {:.3} ms, mean {:.3} ms; {:.0} bytes per step; the task took {:.1} ms per round end to end",
            quantile(&buckets, 0.5) * 1000.0,
            quantile(&buckets, 0.99) * 1000.0,
            sum / appends.max(1.0) * 1000.0,
            bytes / appends.max(1.0),
            took.as_secs_f64() * 1000.0 / (steps + 1) as f64,
        );
    }
    // 2. From SIGKILL to the task running again.
    let mut resumed = Vec::new();
    for _ in 0..kills {
        let harness = Harness::new()?;
        let (fake1, fake2) = (FakeOpenAi::start(), FakeOpenAi::start());
        let laptop = harness.spawn(NodeOptions::new("laptop").security(SHELL))?;
        let spawn = |name: &str, fake: &FakeOpenAi, vram| {
            harness.spawn(
                NodeOptions::new(name)
                    .peer(&laptop.addr)
                    .security(SHELL)
                    .extra(&gpu(fake, vram, dir.path())),
            )
        };
        let gpu1 = spawn("gpu1", &fake1, 24576)?;
        let gpu2 = spawn("gpu2", &fake2, 16384)?;
        harness.wait_all_up(&[&laptop, &gpu1, &gpu2], DEADLINE)?;
        fake1.push([shell(1), Scripted::stall()]);
        fake2.push([Scripted::text("done")]);
        let caller = submit(&harness, &laptop, 4);
        let measured = (|| {
            wait_for("gpu1's second model call", DEADLINE, || {
                (fake1.requests().len() >= 2).then_some(())
            })?;
            let killed = Instant::now();
            gpu1.signal("KILL")?;
            wait_for("gpu2's first model call", DEADLINE, || {
                (!fake2.requests().is_empty()).then_some(())
            })?;
            anyhow::Ok(killed.elapsed().as_secs_f64() * 1000.0)
        })();
        // The caller is waited for however the measure went.
        let ended = finished(caller);
        resumed.push(measured?);
        ended?;
    }
    resumed.sort_by(f64::total_cmp);
    if let (Some(min), Some(max)) = (resumed.first(), resumed.last()) {
        println!(
            "resume: SIGKILL to the task running again on the next node, {kills} runs: median {:.1} ms, min {min:.1} ms, max {max:.1} ms",
            resumed[resumed.len() / 2]
        );
    }
    Ok(())
}
