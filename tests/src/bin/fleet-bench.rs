//! The fleet bench: starts N nodes on this machine and measures what membership costs and how
//! fast it moves, as issue 17 asks, so the current design and its replacement are compared by
//! the same numbers:
//!
//! - full view: time from the last node's start (its process is spawned) until every node lists every other as `up`;
//! - idle CPU (per node and all together) over a window with no requests, from the nodes'
//!   `/proc/PID/stat`, and their RSS;
//! - a new member → every node lists it `up`;
//! - a write (memory Put on one node) → visible by Get on every node;
//! - SIGSTOP (a host that vanishes: no reset, no goodbye) → every node lists it `down`, and
//!   SIGCONT → `up` again everywhere;
//! - SIGKILL → every node lists the killed node `down`; SIGTERM → likewise.
//!
//! The nodes run with the harness ([`mesh_tests::Harness`]): 127.0.0.1, ephemeral ports, mDNS
//! off, no models; each knows one seed node (the first) as its static peer, so everything else
//! it learns comes from the membership protocol. What a node sees is read from its `ListPeers`
//! (the contract of `mesh-cli status`, which a new membership keeps), polled over one mTLS
//! channel per node; the channels are closed during the idle window so the bench's own traffic
//! is not counted. A figure's resolution is the poll interval it prints.
//!
//! Run: `cargo build --release --bins && target/release/fleet-bench [NODES] [IDLE_SECS]`
//! (default 10 nodes, a 30-s idle window).

use std::{
    process::{Command, ExitCode},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use mesh_proto::v1 as pb;
use mesh_tests::{Harness, NodeOptions, NodeProcess};
use mesh_tls::{Dialer, MeshTls};
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// Longest wait for a full view: the design on main took 76 s at 40 nodes (issue 17).
const FULL_VIEW_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest wait for any other figure.
const EVENT_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline of one `ListPeers` or `Get` of the bench.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let nodes = mesh_tests::arg(1, 10);
    let idle = Duration::from_secs(mesh_tests::arg(2, 30) as u64);
    match run(nodes, idle) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(n: usize, idle: Duration) -> anyhow::Result<()> {
    if n < 5 {
        bail!(
            "give at least 5 nodes (a seed, a writer, one stopped, one killed, one terminated), not {n}"
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    let harness = Harness::new()?;
    let dialer = MeshTls::load(harness.client_files())?.dialer();
    // Polling every node at once costs the nodes CPU too: the interval grows with the fleet,
    // so the bench keeps well under one ListPeers per node every 100 ms.
    let every = Duration::from_millis((5 * n as u64).max(100));
    println!(
        "fleet-bench: {n} nodes (static seed, mDNS off, no models), idle window {} s, poll every {} ms, {} cores, load average {}",
        idle.as_secs(),
        every.as_millis(),
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        load_average()
    );

    let started = Instant::now();
    let seed = harness.spawn(options("n00"))?;
    let seed_addr = seed.addr.clone();
    let mut nodes = vec![seed];
    let mut since = Instant::now();
    for i in 1..n {
        since = Instant::now(); // the last node's start, once the loop ends
        nodes.push(harness.spawn(options(&format!("n{i:02}")).peer(&seed_addr))?);
    }
    println!(
        "started {n} nodes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let names: Arc<Vec<String>> = Arc::new(nodes.iter().map(|n| n.name.clone()).collect());

    // Full view: every node lists the n-1 others up.
    let clients = rt.block_on(connect(&dialer, &nodes))?;
    let all = names.clone();
    let full = rt.block_on(poll_all(
        &clients,
        every,
        since,
        FULL_VIEW_TIMEOUT,
        move |me, peers| {
            all.iter()
                .filter(|name| **name != all[me])
                .all(|name| state(peers, name) == Some(pb::PeerState::Up))
        },
    ));
    report("full view after the last start", &full);
    drop(clients); // their keepalives would count as the nodes' idle work

    // Idle: CPU over the window, RSS at its end; no live node may be suspected or marked
    // down meanwhile (counted in the nodes' logs: `peer state` lines).
    let verdicts = |nodes: &[NodeProcess]| {
        let logs: Vec<String> = nodes.iter().map(NodeProcess::log_text).collect();
        let count = |to: &str| {
            logs.iter()
                .flat_map(|log| log.lines())
                .filter(|l| l.contains("\"peer state\"") && l.contains(&format!("\"to\":\"{to}\"")))
                .count()
        };
        (count("suspect"), count("down"))
    };
    let verdicts_before = verdicts(&nodes);
    let before = cpu_ticks(&nodes)?;
    std::thread::sleep(idle); // the measurement window itself, not a wait for a condition
    let after = cpu_ticks(&nodes)?;
    let tick = clock_ticks()?;
    let cpu: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / tick / idle.as_secs_f64() * 100.0)
        .collect();
    let total: f64 = cpu.iter().sum();
    println!(
        "{:<36} all {n} together {total:.1}% of a core; per node {}",
        "idle CPU",
        spread(&cpu, "%")
    );
    let rss = nodes
        .iter()
        .map(|node| rss_mb(node.pid()))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    println!("{:<36} per node {}", "RSS", spread(&rss, " MB"));
    let verdicts_after = verdicts(&nodes);
    println!(
        "{:<36} {} suspect, {} down (every node is alive)",
        "false verdicts in the idle window",
        verdicts_after.0 - verdicts_before.0,
        verdicts_after.1 - verdicts_before.1
    );

    // A new member: from its start (its process is spawned) until every node lists it up.
    let mut clients = rt.block_on(connect(&dialer, &nodes))?;
    let since = Instant::now();
    let late = harness.spawn(options("late").peer(&seed_addr))?;
    let known = rt.block_on(poll_all(
        &clients,
        every,
        since,
        EVENT_TIMEOUT,
        |_, peers| state(peers, "late") == Some(pb::PeerState::Up),
    ));
    report("new member -> up everywhere", &known);
    nodes.push(late);
    clients.push(rt.block_on(connect(&dialer, &nodes[n..]))?.remove(0));

    // A write on n01 → visible on every other node.
    let value = format!("fleet-bench {}", mesh_tests::unix_ms()).into_bytes();
    let put = pb::MemoryPutRequest {
        namespace: "fleet-bench".into(),
        key: "k".into(),
        value: value.clone(),
    };
    let mut writer = pb::memory_client::MemoryClient::new(clients[1].clone());
    let since = Instant::now();
    rt.block_on(async { tokio::time::timeout(CALL_TIMEOUT, writer.put(put)).await })
        .context("Put on n01 timed out")?
        .context("Put on n01")?;
    let readers: Vec<Channel> = clients
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, c)| c.clone())
        .collect();
    let seen = rt.block_on(poll_reads(&readers, every, since, value));
    report("write on one -> readable everywhere", &seen);

    // A host that vanishes without closing its connections (SIGSTOP: no reset, no goodbye),
    // then comes back (SIGCONT); then SIGKILL and SIGTERM. The victims are neither the seed
    // nor the writer.
    let mut gone = Vec::new();
    for (victim, signal, to) in [
        (n - 3, "STOP", pb::PeerState::Down),
        (n - 3, "CONT", pb::PeerState::Up),
        (n - 1, "KILL", pb::PeerState::Down),
        (n - 2, "TERM", pb::PeerState::Down),
    ] {
        let name = nodes[victim].name.clone();
        let observers: Vec<Channel> = clients
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != victim && !gone.contains(i))
            .map(|(_, c)| c.clone())
            .collect();
        let since = Instant::now();
        nodes[victim].signal(signal)?;
        let seen = rt.block_on(poll_all(
            &observers,
            every,
            since,
            EVENT_TIMEOUT,
            move |_, peers| state(peers, &name) == Some(to),
        ));
        let state_name = if to == pb::PeerState::Up {
            "up"
        } else {
            "down"
        };
        report(&format!("SIG{signal} -> {state_name} everywhere"), &seen);
        if matches!(signal, "KILL" | "TERM") {
            nodes[victim].wait_exit(Duration::from_secs(10))?;
            gone.push(victim);
        }
    }
    Ok(())
}

/// A bench node: logs at `info`, as a deployment does.
fn options(name: &str) -> NodeOptions {
    NodeOptions::new(name).log("info")
}

/// One mTLS channel per node, with the harness's client certificate.
async fn connect(dialer: &Dialer, nodes: &[NodeProcess]) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::new();
    for node in nodes {
        let connection = dialer
            .connect(&node.addr)
            .await
            .with_context(|| format!("connect to {} at {}", node.name, node.addr))?;
        channels.push(connection.channel);
    }
    Ok(channels)
}

/// The state `peers` gives the node named `name`, if it lists it.
fn state(peers: &pb::ListPeersResponse, name: &str) -> Option<pb::PeerState> {
    peers
        .peers
        .iter()
        .find(|p| p.info.as_ref().is_some_and(|i| i.name == name))
        .and_then(|p| pb::PeerState::try_from(p.state).ok())
}

/// Polls every node's `ListPeers` until `done(its index, its answer)` holds; per node, the
/// time from `since` (None: not within `timeout`).
async fn poll_all(
    channels: &[Channel],
    every: Duration,
    since: Instant,
    timeout: Duration,
    done: impl Fn(usize, &pb::ListPeersResponse) -> bool + Send + Sync + 'static,
) -> Vec<Option<Duration>> {
    let done = Arc::new(done);
    let count = channels.len();
    let mut tasks = JoinSet::new();
    for (i, channel) in channels.iter().enumerate() {
        let mut client = pb::node_client::NodeClient::new(channel.clone());
        let done = done.clone();
        tasks.spawn(async move {
            // Staggered, so the nodes are not all asked in the same instant.
            tokio::time::sleep(every * i as u32 / count as u32).await;
            loop {
                let answer =
                    tokio::time::timeout(CALL_TIMEOUT, client.list_peers(pb::ListPeersRequest {}))
                        .await;
                if let Ok(Ok(peers)) = &answer
                    && done(i, peers.get_ref())
                {
                    return (i, Some(since.elapsed()));
                }
                if since.elapsed() > timeout {
                    // What the node last said, so a miss can be looked into.
                    let last = match answer {
                        Ok(Ok(peers)) => peers
                            .get_ref()
                            .peers
                            .iter()
                            .filter(|p| p.state != pb::PeerState::Up as i32)
                            .map(|p| {
                                let name = p.info.as_ref().map_or("?", |i| i.name.as_str());
                                format!("{name}={}", p.state().as_str_name())
                            })
                            .collect::<Vec<_>>()
                            .join(" "),
                        Ok(Err(status)) => format!("error: {}", status.message()),
                        Err(_) => "no answer within the call timeout".to_owned(),
                    };
                    eprintln!("  observer {i} missed it; peers not up in its view: [{last}]");
                    return (i, None);
                }
                tokio::time::sleep(every).await;
            }
        });
    }
    collect(tasks, count).await
}

/// Polls every node's memory `Get` of the bench's key until it returns `value`.
async fn poll_reads(
    channels: &[Channel],
    every: Duration,
    since: Instant,
    value: Vec<u8>,
) -> Vec<Option<Duration>> {
    let count = channels.len();
    let mut tasks = JoinSet::new();
    for (i, channel) in channels.iter().enumerate() {
        let mut client = pb::memory_client::MemoryClient::new(channel.clone());
        let value = value.clone();
        tasks.spawn(async move {
            loop {
                let get = pb::MemoryGetRequest {
                    namespace: "fleet-bench".into(),
                    key: "k".into(),
                };
                let answer = tokio::time::timeout(CALL_TIMEOUT, client.get(get)).await;
                if let Ok(Ok(found)) = answer
                    && found.get_ref().record.as_ref().map(|r| &r.value) == Some(&value)
                {
                    return (i, Some(since.elapsed()));
                }
                if since.elapsed() > EVENT_TIMEOUT {
                    return (i, None);
                }
                tokio::time::sleep(every).await;
            }
        });
    }
    collect(tasks, count).await
}

/// The polling tasks' results in node order (a task that panicked counts as never seen).
async fn collect(
    mut tasks: JoinSet<(usize, Option<Duration>)>,
    count: usize,
) -> Vec<Option<Duration>> {
    let mut times = vec![None; count];
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, time)) = joined {
            times[i] = time;
        }
    }
    times
}

/// Prints p50 / max over the nodes that saw the event, and how many never did.
fn report(label: &str, times: &[Option<Duration>]) {
    let seen: Vec<f64> = times.iter().flatten().map(Duration::as_secs_f64).collect();
    let missed = times.len() - seen.len();
    let missing = if missed > 0 {
        format!("; {missed} of {} never within the timeout", times.len())
    } else {
        String::new()
    };
    println!(
        "{label:<36} {}{missing}",
        if seen.is_empty() {
            "no node".to_owned()
        } else {
            spread(&seen, " s")
        }
    );
}

/// `p50 X  max Y  (n=N)` of `values`, with `unit`.
fn spread(values: &[f64], unit: &str) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let max = sorted.last().copied().unwrap_or(0.0);
    let min = sorted.first().copied().unwrap_or(0.0);
    format!(
        "p50 {p50:.2}{unit}  min {min:.2}{unit}  max {max:.2}{unit}  (n={})",
        sorted.len()
    )
}

/// utime + stime of each node so far, in clock ticks (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(nodes: &[NodeProcess]) -> anyhow::Result<Vec<u64>> {
    nodes
        .iter()
        .map(|node| {
            let path = format!("/proc/{}/stat", node.pid());
            let stat = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
            // The command name (field 2) may hold spaces; the fields after it are plain.
            let rest = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest)
                .with_context(|| format!("{path}: no `)` after the command name"))?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let field = |k: usize| -> anyhow::Result<u64> {
                // Field 3 (the state) is the first after the name.
                let raw = fields
                    .get(k - 3)
                    .with_context(|| format!("{path}: no field {k}"))?;
                raw.parse()
                    .with_context(|| format!("{path}: field {k} `{raw}` is not a number"))
            };
            Ok(field(14)? + field(15)?)
        })
        .collect()
}

/// Clock ticks per second (`getconf CLK_TCK`), the unit of `/proc/PID/stat` times.
fn clock_ticks() -> anyhow::Result<f64> {
    let output = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("run getconf CLK_TCK")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .parse()
        .with_context(|| format!("getconf CLK_TCK printed `{}`", text.trim()))
}

/// Resident set size of `pid` in MB (`VmRSS` of `/proc/PID/status`).
fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{path} has no VmRSS line"))?;
    Ok(kb / 1024.0)
}

/// The 1-minute load average, to tell a quiet machine from a busy one in the output.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
