//! Connections before authentication (issue 16, point 1): a node started with a soft limit of
//! 1,024 open files, flooded with idle sockets on both its ports, still answers `mesh-cli
//! status` and `/healthz` within a second, and closes the idle sockets itself once its
//! handshake and header timeouts pass. mDNS is off; every socket is on loopback.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use mesh_tests::{Harness, NodeOptions, NodeProcess, wait_for};

/// Idle sockets opened on each port.
const FLOOD: usize = 1_500;
/// The node's handshake and header timeouts in this test, seconds.
const TIMEOUT_S: u64 = 2;
/// The bound on `mesh-cli status` and `/healthz` under the flood (the issue's).
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// The soft open-files limit the node is started with.
const NODE_SOFT_LIMIT: u64 = 1_024;

/// `FLOOD` connected sockets to `addr` that never send a byte, non-blocking so they can be
/// checked without waiting.
fn idle_sockets(addr: SocketAddr) -> anyhow::Result<Vec<TcpStream>> {
    (0..FLOOD)
        .map(|i| {
            let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .with_context(|| format!("open idle socket {i} to {addr}"))?;
            tcp.set_nonblocking(true)?;
            Ok(tcp)
        })
        .collect()
}

/// How many of `sockets` the node closed: a read ends (EOF) or fails (reset), where an open
/// idle socket would block.
fn closed(sockets: &mut [TcpStream]) -> usize {
    let mut buf = [0u8; 16];
    sockets
        .iter_mut()
        .filter(|tcp| match (&**tcp).read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        })
        .count()
}

/// `mesh-cli status --json`, killed if it has not answered within [`ANSWER_WITHIN`].
fn status_within(harness: &Harness, node: &NodeProcess) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut child = harness
        .cli_command(node, &["status", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let exited = wait_for("mesh-cli status to answer", ANSWER_WITHIN, || {
        child.try_wait().ok().flatten()
    });
    let took = started.elapsed();
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        bail!("mesh-cli status did not answer within {ANSWER_WITHIN:?} under the flood");
    }
    let output = child.wait_with_output()?;
    ensure!(
        output.status.success(),
        "mesh-cli status failed under the flood: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    ensure!(status["nodes"].is_array(), "no nodes in {status}");
    Ok(took)
}

/// `GET path` on the front door with a read and write timeout of [`ANSWER_WITHIN`]; the answer.
fn get_within(door: SocketAddr, path: &str) -> anyhow::Result<(String, Duration)> {
    let started = Instant::now();
    let mut tcp = TcpStream::connect_timeout(&door, ANSWER_WITHIN)?;
    tcp.set_read_timeout(Some(ANSWER_WITHIN))?;
    tcp.set_write_timeout(Some(ANSWER_WITHIN))?;
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer)
        .with_context(|| format!("read the answer to GET {path}"))?;
    Ok((answer, started.elapsed()))
}

/// The node raises its soft open-files limit (1,024 here) to the hard one and says so; with
/// 1,500 idle sockets on each port it answers `mesh-cli status` and `/healthz` within 1 s, and
/// closes at least 95% of each port's idle sockets within its timeout (2 s) plus a margin.
/// Checked to fail without each protection: no handshake timeout (the gRPC sockets stay open),
/// no header timeout (the front door's stay open), no raised limit (the log check, and the
/// node runs out of descriptors: the status call is not answered in time).
#[test]
fn idle_socket_floods_on_both_ports_are_closed_and_the_node_keeps_answering() -> anyhow::Result<()>
{
    // It holds 3,000 sockets, plus room.
    let hard = mesh_tests::raise_open_files_limit(2 * FLOOD as u64 + 500)?;
    let harness = Harness::new()?;
    let nofile = format!("--nofile={NODE_SOFT_LIMIT}:{hard}");
    let node = harness.spawn(
        NodeOptions::new("flooded")
            .wrapped(&["prlimit", &nofile, "--"])
            .extra(&format!(
                "[connections]\nhandshake_timeout_s = {TIMEOUT_S}\nheader_timeout_s = {TIMEOUT_S}\n"
            )),
    )?;
    let grpc: SocketAddr = node.addr.parse()?;
    let door: SocketAddr = node
        .http_url()?
        .trim_start_matches("http://")
        .parse()
        .context("the front door's address")?;

    let log = node.log_text();
    let raised = log
        .lines()
        .find(|line| line.contains("open-files limit"))
        .with_context(|| format!("the node did not log its open-files limit:\n{log}"))?;
    ensure!(
        raised.contains(&format!("\"open_files\":\"{hard}\""))
            && raised.contains(&format!("\"was\":{NODE_SOFT_LIMIT}")),
        "the node does not run with the hard limit {hard}: {raised}"
    );

    let flood_started = Instant::now();
    let mut grpc_sockets = idle_sockets(grpc)?;
    let mut door_sockets = idle_sockets(door)?;
    let opened_in = flood_started.elapsed();
    ensure!(
        opened_in < Duration::from_secs(TIMEOUT_S),
        "opening the sockets took {opened_in:?}, longer than the node's timeout: the check below would not run while they are open"
    );

    // While they are open (the node's timeout has not passed yet): both answer within 1 s.
    let status_took = status_within(&harness, &node)?;
    let (health, health_took) = get_within(door, "/healthz")?;
    ensure!(
        health.starts_with("HTTP/1.1 200") && health.contains("\"status\""),
        "GET /healthz under the flood: {health}"
    );
    ensure!(
        health_took < ANSWER_WITHIN,
        "GET /healthz took {health_took:?}"
    );
    let still_open = FLOOD - closed(&mut grpc_sockets);
    ensure!(
        flood_started.elapsed() < Duration::from_secs(TIMEOUT_S),
        "the answers came after the node's timeout ({:?}); they prove nothing about the flood",
        flood_started.elapsed()
    );
    eprintln!(
        "opened {} sockets in {opened_in:?}; status {status_took:?}, /healthz {health_took:?}, {still_open} gRPC sockets still open",
        2 * FLOOD
    );

    // Then the node closes them itself.
    let enough = FLOOD * 95 / 100;
    wait_for(
        "the node to close 95% of the idle sockets on each port",
        Duration::from_secs(TIMEOUT_S + 8),
        || {
            (closed(&mut grpc_sockets) >= enough && closed(&mut door_sockets) >= enough)
                .then_some(())
        },
    )
    .with_context(|| {
        format!(
            "closed {} of {FLOOD} gRPC and {} of {FLOOD} front-door sockets",
            closed(&mut grpc_sockets),
            closed(&mut door_sockets)
        )
    })?;
    eprintln!("closed within {:?} of the flood", flood_started.elapsed());

    let (metrics, _) = get_within(door, "/metrics")?;
    for series in [
        "agentmesh_connections_timed_out_total{listener=\"grpc\",phase=\"handshake\"}",
        "agentmesh_connections_timed_out_total{listener=\"http\",phase=\"headers\"}",
    ] {
        let count: usize = metrics
            .lines()
            .find_map(|line| line.strip_prefix(series))
            .and_then(|value| value.trim().parse().ok())
            .with_context(|| format!("no {series} in /metrics"))?;
        ensure!(count >= enough, "{series} is {count}");
    }
    Ok(())
}
