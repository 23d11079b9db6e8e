//! Delegation overhead: a one-round task (scripted fake model) submitted to the GPU node
//! directly ("local") versus submitted to a laptop node that forwards it to the GPU node
//! ("delegated"). Timed in-process from the `Submit` call to the `completed` event over one
//! kept-open mTLS channel per node, so the difference is what delegation adds: routing, the
//! forward hop and relaying the events back.
//!
//! Run: `cargo build --release --bins && target/release/delegation-bench [RUNS]` (default 50).

use std::{process::ExitCode, time::Instant};

use mesh_proto::v1 as pb;
use mesh_tests::{
    Harness, NodeOptions,
    fake_openai::{FakeOpenAi, Scripted},
};
use mesh_tls::MeshTls;

fn main() -> ExitCode {
    let runs = mesh_tests::arg(1, 50);
    match bench(runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(runs: usize) -> anyhow::Result<()> {
    mesh_tls::install_crypto_provider();
    let fake = FakeOpenAi::start();
    let harness = Harness::new()?;
    let laptop = harness.spawn(NodeOptions::new("laptop"))?;
    let gpu = harness.spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
        "[[resources.gpus]]\nname = \"RTX\"\nvram_mb = 24576\n\n[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\ncoder = [\"m\"]\n",
        fake.base_url()
    )))?;
    harness.wait_all_up(&[&laptop, &gpu], std::time::Duration::from_secs(20))?;
    let client_files = harness.issue("bench-client")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dialer = MeshTls::load(&client_files)?.dialer();
        let mut direct =
            pb::tasks_client::TasksClient::new(dialer.connect(&gpu.addr).await?.channel);
        let mut via =
            pb::tasks_client::TasksClient::new(dialer.connect(&laptop.addr).await?.channel);
        let request = || pb::SubmitRequest {
            prompt: "benchmark".into(),
            target: Some(pb::submit_request::Target::Role("coder".into())),
            ..Default::default()
        };
        async fn time(
            client: &mut pb::tasks_client::TasksClient<tonic::transport::Channel>,
            request: pb::SubmitRequest,
            fake: &FakeOpenAi,
        ) -> anyhow::Result<f64> {
            fake.push([Scripted::text("ok")]);
            let started = Instant::now();
            let mut stream = client.submit(request).await?.into_inner();
            while let Some(event) = stream.message().await? {
                match event.kind {
                    Some(pb::task_event::Kind::Completed(done)) => {
                        anyhow::ensure!(done.executed_on == "gpu", "ran on {}", done.executed_on);
                        return Ok(started.elapsed().as_secs_f64() * 1000.0);
                    }
                    Some(pb::task_event::Kind::Failed(failed)) => {
                        anyhow::bail!("task failed: {:?}", failed.error)
                    }
                    _ => {}
                }
            }
            anyhow::bail!("no outcome")
        }
        for _ in 0..5 {
            time(&mut direct, request(), &fake).await?;
            time(&mut via, request(), &fake).await?;
        }
        let (mut local, mut delegated) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            local.push(time(&mut direct, request(), &fake).await?);
            delegated.push(time(&mut via, request(), &fake).await?);
        }
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[(v.len() - 1) * 99 / 100])
        };
        let (l50, l99) = stats(&mut local);
        let (d50, d99) = stats(&mut delegated);
        println!("one-round task, submit → completed, {runs} runs each");
        println!("  local      p50 {l50:7.2} ms   p99 {l99:7.2} ms");
        println!("  delegated  p50 {d50:7.2} ms   p99 {d99:7.2} ms");
        println!("  added by delegation at p50: {:.2} ms", d50 - l50);
        anyhow::Ok(())
    })
}
