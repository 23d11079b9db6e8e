//! Load: waves of concurrent agent tasks across a 3-node mesh whose nodes share one scripted
//! fake model (answering at once). Every task is submitted at the same moment, spread round
//! robin over the three nodes (each routes it where it fits), over one kept-open mTLS channel
//! per node. Checks that none is lost (every task ends `completed`), none is answered twice
//! (task ids are unique, and the model got exactly one call per task), and prints the
//! submit → completed latency (p50/p99/max), where tasks ran, and each node's resident memory
//! (VmRSS) at start and after each wave, to see whether memory stays bounded.
//!
//! Run: `cargo build --release --bins && target/release/load-bench [TASKS] [WAVES]`
//! (defaults 1000 and 3).

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use anyhow::{Context, bail, ensure};
use mesh_proto::v1 as pb;
use mesh_tests::{Harness, NodeOptions, NodeProcess, fake_openai::FakeOpenAi};
use mesh_tls::MeshTls;

fn main() -> ExitCode {
    let arg = mesh_tests::arg;
    match bench(arg(1, 1000), arg(2, 3)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Resident memory of a process, KiB.
fn rss_kib(node: &NodeProcess) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid()))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")
}

/// One task: (task id, where it ran, milliseconds from submit to completed).
async fn run_task(
    mut client: pb::tasks_client::TasksClient<tonic::transport::Channel>,
    n: usize,
) -> anyhow::Result<(String, String, f64)> {
    let started = Instant::now();
    let request = pb::SubmitRequest {
        prompt: format!("load task {n}"),
        target: Some(pb::submit_request::Target::Role("chat".into())),
        ..Default::default()
    };
    let mut stream = client.submit(request).await?.into_inner();
    let mut id = String::new();
    while let Some(event) = stream.message().await? {
        if id.is_empty() {
            id = event.task_id.clone();
        }
        match event.kind {
            Some(pb::task_event::Kind::Completed(done)) => {
                return Ok((id, done.executed_on, started.elapsed().as_secs_f64() * 1e3));
            }
            Some(pb::task_event::Kind::Failed(failed)) => bail!("task {n} failed: {failed:?}"),
            _ => {}
        }
    }
    bail!("task {n}: the stream ended without an outcome")
}

fn bench(tasks: usize, waves: usize) -> anyhow::Result<()> {
    mesh_tls::install_crypto_provider();
    let fake = FakeOpenAi::start();
    let harness = Harness::new()?;
    let model = format!(
        "[tasks]\nworkers = 8\nqueue = {tasks}\n\n[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nchat = [\"m\"]\n",
        fake.base_url()
    );
    let a = harness.spawn(NodeOptions::new("a").extra(&model))?;
    let b = harness.spawn(NodeOptions::new("b").peer(&a.addr).extra(&model))?;
    let c = harness.spawn(NodeOptions::new("c").peer(&a.addr).extra(&model))?;
    let nodes = [&a, &b, &c];
    harness.wait_all_up(&nodes, std::time::Duration::from_secs(30))?;
    let client_files = harness.issue("load-client")?;
    let rss_at_start: Vec<u64> = nodes.iter().map(|n| rss_kib(n)).collect::<Result<_, _>>()?;
    println!(
        "{tasks} tasks per wave, {waves} waves, 3 nodes (8 workers, queue {tasks} each); RSS at start: a {} MiB, b {} MiB, c {} MiB",
        rss_at_start[0] / 1024,
        rss_at_start[1] / 1024,
        rss_at_start[2] / 1024
    );
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dialer = MeshTls::load(&client_files)?.dialer();
        let mut clients = Vec::new();
        for node in nodes {
            clients.push(pb::tasks_client::TasksClient::new(
                dialer.connect(&node.addr).await?.channel,
            ));
        }
        let mut calls_before = 0;
        for wave in 1..=waves {
            let started = Instant::now();
            let mut set = tokio::task::JoinSet::new();
            for n in 0..tasks {
                set.spawn(run_task(clients[n % clients.len()].clone(), n));
            }
            let mut ids = std::collections::HashSet::new();
            let mut placed: BTreeMap<String, usize> = BTreeMap::new();
            let mut latencies = Vec::with_capacity(tasks);
            let mut failures = Vec::new();
            while let Some(joined) = set.join_next().await {
                match joined? {
                    Ok((id, on, ms)) => {
                        ensure!(ids.insert(id.clone()), "task id {id} answered twice");
                        *placed.entry(on).or_default() += 1;
                        latencies.push(ms);
                    }
                    Err(e) => failures.push(e.to_string()),
                }
            }
            let wall = started.elapsed().as_secs_f64();
            let calls = fake.requests().len();
            ensure!(
                failures.is_empty(),
                "{} of {tasks} tasks failed, e.g. {}",
                failures.len(),
                failures[0]
            );
            ensure!(
                calls - calls_before == tasks,
                "the model got {} calls for {tasks} tasks",
                calls - calls_before
            );
            calls_before = calls;
            latencies.sort_by(f64::total_cmp);
            let pct = |p: usize| latencies[(latencies.len() - 1) * p / 100];
            let rss: Vec<u64> = nodes.iter().map(|n| rss_kib(n)).collect::<Result<_, _>>()?;
            println!(
                "wave {wave}: {tasks} completed, none lost, none twice, in {wall:.2} s ({:.0} tasks/s); submit → completed p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; ran on {placed:?}; RSS a {} MiB, b {} MiB, c {} MiB",
                tasks as f64 / wall,
                pct(50),
                pct(99),
                latencies[latencies.len() - 1],
                rss[0] / 1024,
                rss[1] / 1024,
                rss[2] / 1024
            );
        }
        anyhow::Ok(())
    })
}
