//! Cron firing delay: from a firing's scheduled time to its task's `started` event on the
//! executing node. Two real nodes on loopback: a "server" with no models and a "gpu" node that
//! serves the role through the scripted fake model; an every-second schedule is added on the
//! server and left to fire. Both nodes share this machine's clock, so the difference is what
//! the scheduler (tick, firing record, routing, forward, queue) adds.
//!
//! Run: `cargo build --release --bins && target/release/cron-bench [FIRINGS]` (default 60).

use std::{process::ExitCode, time::Duration};

use mesh_proto::v1 as pb;
use mesh_tests::{Harness, NodeOptions, fake_openai::FakeOpenAi};

fn main() -> ExitCode {
    let firings = mesh_tests::arg(1, 60);
    match bench(firings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(firings: usize) -> anyhow::Result<()> {
    mesh_tls::install_crypto_provider();
    let fake = FakeOpenAi::start();
    let harness = Harness::new()?;
    let server = harness.spawn(NodeOptions::new("server"))?;
    let gpu = harness.spawn(NodeOptions::new("gpu").peer(&server.addr).extra(&format!(
        "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nresearch = [\"m\"]\n",
        fake.base_url()
    )))?;
    harness.wait_all_up(&[&server, &gpu], Duration::from_secs(20))?;
    let client_files = harness.issue("bench-client")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dialer = mesh_tls::MeshTls::load(&client_files)?.dialer();
        let mut cron =
            pb::cron_client::CronClient::new(dialer.connect(&server.addr).await?.channel);
        let mut tasks =
            pb::tasks_client::TasksClient::new(dialer.connect(&gpu.addr).await?.channel);
        cron.add(pb::CronAddRequest {
            name: "bench".into(),
            schedule: "* * * * * *".into(),
            task: Some(pb::SubmitRequest {
                prompt: "tick".into(),
                target: Some(pb::submit_request::Target::Role("research".into())),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        let deadline = Duration::from_secs(firings as u64 + 30);
        let history = loop {
            let list = cron
                .history(pb::CronHistoryRequest {
                    name: "bench".into(),
                    limit: 1000,
                })
                .await?
                .into_inner()
                .firings;
            let done = list.iter().filter(|f| f.status == "done").count();
            if done >= firings {
                break list;
            }
            anyhow::ensure!(
                list.first().is_none_or(|f| {
                    mesh_tests::unix_ms().saturating_sub(f.scheduled_at_ms)
                        < deadline.as_millis() as u64
                }),
                "only {done} of {firings} firings done in {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await; // poll interval
        };
        cron.remove(pb::CronRemoveRequest {
            name: "bench".into(),
        })
        .await?;
        let mut delays = Vec::new();
        let mut other = Vec::new();
        for firing in history.iter().filter(|f| f.status == "done").take(firings) {
            let mut events = tasks
                .watch(pb::WatchRequest {
                    task_id: firing.task_id.clone(),
                    follow: false,
                })
                .await?
                .into_inner();
            while let Some(event) = events.message().await? {
                if let Some(pb::task_event::Kind::Started(_)) = event.kind {
                    delays.push(event.at_ms as f64 - firing.scheduled_at_ms as f64);
                }
            }
            if firing.executed_on != "gpu" {
                other.push(firing.executed_on.clone());
            }
        }
        anyhow::ensure!(other.is_empty(), "firings ran elsewhere: {other:?}");
        anyhow::ensure!(!delays.is_empty(), "no started events");
        delays.sort_by(f64::total_cmp);
        let pick = |q: usize| delays[(delays.len() - 1) * q / 100];
        println!(
            "every-second schedule on `server`, task started on `gpu`, {} firings",
            delays.len()
        );
        println!(
            "  scheduled time → task started: p50 {:.1} ms   p99 {:.1} ms   max {:.1} ms",
            pick(50),
            pick(99),
            delays[delays.len() - 1]
        );
        anyhow::Ok(())
    })?;
    drop(fake);
    Ok(())
}
