//! MCP tool-call overhead through one hop: the same call of `mcp-server-time`'s
//! `get_current_time` (over stdio, the PyPI server) made in-process through the node library's
//! MCP hub ("local": what an agent does with a tool its own node hosts) and through `Tools.Call`
//! on a node that hosts it ("one hop": what an agent on another node does; mTLS with a node
//! certificate over one kept channel, the host's admission and its own local call). Each side
//! runs its own server process. Timed from the call to its result; interleaved.
//!
//! Run: `cargo build --release --bins && target/release/mcp-bench [RUNS]` (default 200). Needs
//! the tests' Python (`MESH_PYTHON`, or the venv `deploy/test.sh --setup-only` makes).

use std::{process::ExitCode, sync::Arc, time::Instant};

use mesh_domain::Tier;
use mesh_node::{
    config::{McpConfig, McpTransport},
    testing::{LoopHealth, McpHub, PeerChannels, RemoteCall, RemoteTools, RemoteToolsClient},
};
use mesh_tests::{Harness, NodeOptions, python3, wait_for};
use mesh_tls::MeshTls;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TOOL: &str = "time__get_current_time";

/// Prints what the in-process hub reports about its server.
struct Printed;

impl LoopHealth for Printed {
    fn loop_failing(&self, name: &str, reason: Option<String>) {
        if let Some(reason) = reason {
            eprintln!("{name}: {reason}");
        }
    }
}

fn main() -> ExitCode {
    let runs = mesh_tests::arg(1, 200);
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
    let python = python3();
    let args = ["-m", "mcp_server_time", "--local-timezone", "UTC"];
    let harness = Harness::new()?;
    let host = harness.spawn(NodeOptions::new("host").log("info").extra(&format!(
        "[[mcp]]\nname = \"time\"\ncommand = {python:?}\nargs = {args:?}\ntier = \"read\"\n"
    )))?;
    wait_for(
        "the host to advertise the tool",
        std::time::Duration::from_secs(30),
        || {
            let status = harness.status(&host).ok()?;
            status.to_string().contains(TOOL).then_some(())
        },
    )?;
    let peer_files = harness.issue("bench-peer")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let hub = McpHub::new(
            vec![McpConfig {
                name: "time".into(),
                transport: McpTransport::Stdio {
                    command: python.display().to_string(),
                    args: args.iter().map(|a| (*a).to_owned()).collect(),
                    env: Default::default(),
                },
                tier: Tier::Read,
                tools: None,
                timeout: std::time::Duration::from_secs(60),
            }],
            Arc::new(Printed),
        );
        let cancel = CancellationToken::new();
        let loop_task = tokio::spawn(hub.clone().run(0, cancel.clone()));
        let started = Instant::now();
        while hub.tool(TOOL).is_none() {
            anyhow::ensure!(
                started.elapsed().as_secs() < 30 && !loop_task.is_finished(),
                "the in-process server did not come up"
            );
            // Polling the hub for its tools, not waiting for anything to settle.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let remote =
            RemoteToolsClient::new(PeerChannels::new(MeshTls::load(&peer_files)?.dialer()));
        let arguments = json!({"timezone": "Europe/Paris"});
        let call = RemoteCall {
            name: TOOL.into(),
            arguments: arguments.to_string(),
            tier: Tier::Read,
            task_id: String::new(),
            started_by: None,
        };
        let local_call = || async {
            let started = Instant::now();
            let output = hub.call(TOOL, &arguments).await?;
            anyhow::ensure!(output.text.contains("Europe/Paris"), "{}", output.text);
            anyhow::Ok(started.elapsed().as_secs_f64() * 1000.0)
        };
        let remote_call = || async {
            let started = Instant::now();
            let output = remote.call(&host.addr, &call, None).await?;
            anyhow::ensure!(output.text.contains("Europe/Paris"), "{}", output.text);
            anyhow::Ok(started.elapsed().as_secs_f64() * 1000.0)
        };
        for _ in 0..10 {
            local_call().await?;
            remote_call().await?;
        }
        let (mut local, mut hop) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            local.push(local_call().await?);
            hop.push(remote_call().await?);
        }
        cancel.cancel();
        let _ = loop_task.await;
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[(v.len() - 1) * 99 / 100])
        };
        let (l50, l99) = stats(&mut local);
        let (h50, h99) = stats(&mut hop);
        println!("{TOOL} over stdio, call → result, {runs} runs each");
        println!("  local (in-process hub)   p50 {l50:7.3} ms   p99 {l99:7.3} ms");
        println!("  one hop (Tools.Call)     p50 {h50:7.3} ms   p99 {h99:7.3} ms");
        println!("  added by the hop at p50: {:.3} ms", h50 - l50);
        anyhow::Ok(())
    })
}
