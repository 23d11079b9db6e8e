//! The hostile soak (issue 16): a 3-node mesh (alpha, beta, gamma; static peers, no mDNS) where
//! alpha, the victim, takes everything at once for as long as asked:
//!
//! - a **connection flood**: idle sockets on both of alpha's ports that never send a byte,
//!   reopened as soon as alpha closes them;
//! - a **hostile member** ([`crate::hostile`]): as a peer alpha dials, it advertises
//!   `memory_seq = u64::MAX`, answers every `Sync` with "more" for ever (a forged record in
//!   beta's name, one stamped a minute ahead, one in a made-up origin's name, and 10,000-entry
//!   maps) and holds every push 8 s; as a client it sends alpha `Sync` requests with
//!   maps at the bound, forged, far-future and NUL-keyed pushes;
//! - a **normal workload**: memory writes to alpha, reads of them on beta and gamma, and
//!   `mesh-cli status` on alpha every half second.
//!
//! It samples alpha's RSS and open descriptors, and at the end checks that every write alpha
//! acknowledged is on all three nodes. `tests/tests/hostile_soak.rs` runs it for a few seconds
//! in CI; `hostile-soak` (tests/src/bin/hostile-soak.rs) for as long as asked.

use std::{
    collections::{BTreeSet, HashMap},
    io::{ErrorKind, Read},
    net::{SocketAddr, TcpStream},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;
use mesh_proto::v1 as pb;

use crate::{
    Harness, NodeOptions, NodeProcess,
    hostile::{Behaviour, HostilePeer, made_up_ids, ntp_in, seq_map},
    wait_for,
};

/// How long setup and the final convergence may take.
const DEADLINE: Duration = Duration::from_secs(60);
/// The namespace the workload writes.
const NAMESPACE: &str = "soak";

/// How a hostile soak runs.
#[derive(Debug, Clone)]
pub struct HostileSoakOptions {
    /// How long the flood, the hostile member and the workload run together.
    pub duration: Duration,
    /// Idle sockets held open on each of alpha's two ports.
    pub idle_sockets: usize,
    /// Alpha's handshake and header timeouts, seconds (`[connections]`).
    pub connection_timeout_s: u64,
}

/// One sample of the victim's resources.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Since the flood started.
    pub at: Duration,
    /// Resident set size, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
}

/// The flood on one of alpha's ports.
#[derive(Debug, Default, Clone, Copy)]
pub struct Flood {
    /// Idle sockets opened.
    pub opened: usize,
    /// Of them, closed by alpha.
    pub closed: usize,
    /// Connection attempts that failed (refused at a cap, timed out).
    pub refused: usize,
}

/// What a hostile soak saw.
#[derive(Debug, Default, Clone)]
pub struct HostileSoakReport {
    /// Memory writes alpha acknowledged.
    pub writes_acked: usize,
    /// Writes alpha refused or that failed (counted, not lost: never acknowledged).
    pub writes_failed: usize,
    /// Acknowledged writes missing on any node at the end.
    pub writes_lost: usize,
    /// Reads answered by beta and gamma.
    pub reads: usize,
    /// `mesh-cli status` latencies on alpha, in the order they ran.
    pub status: Vec<Duration>,
    /// `mesh-cli status` calls that failed or took longer than 5 s.
    pub status_failures: Vec<String>,
    /// The flood on alpha's gRPC port, then on its front door.
    pub flood: [Flood; 2],
    /// Adversarial calls the hostile member made as a client.
    pub hostile_calls: usize,
    /// Of them, forgeries alpha accepted (must be 0).
    pub forgeries_accepted: usize,
    /// Calls alpha made to the hostile member: (`Sync`, `Push`) in total and at most at once.
    pub calls_to_hostile: ((usize, usize), (usize, usize)),
    /// Alpha's resources over time.
    pub samples: Vec<Sample>,
    /// Wall time of the loaded phase.
    pub elapsed: Duration,
}

impl HostileSoakReport {
    /// Requests the mesh served to the workload: acknowledged writes, reads, status calls.
    pub fn served(&self) -> usize {
        self.writes_acked + self.reads + self.status.len()
    }

    /// The `p`-th percentile (0–100) of the `mesh-cli status` latencies.
    pub fn status_percentile(&self, p: usize) -> Duration {
        let mut sorted = self.status.clone();
        sorted.sort();
        match sorted.len() {
            0 => Duration::ZERO,
            n => sorted[((n - 1) * p / 100).min(n - 1)],
        }
    }

    /// The largest open-descriptor count and RSS (KiB) in the first and the second half of the
    /// run: bounded resources keep the second half near the first.
    pub fn halves(&self) -> ((usize, u64), (usize, u64)) {
        let mid = self.elapsed / 2;
        let most = |early: bool| {
            self.samples
                .iter()
                .filter(|s| (s.at < mid) == early)
                .fold((0, 0), |(f, r), s| (f.max(s.fds), r.max(s.rss_kib)))
        };
        (most(true), most(false))
    }
}

/// Runs the soak; an error means the mesh could not be set up or checked, not a finding.
pub fn run(options: &HostileSoakOptions) -> anyhow::Result<HostileSoakReport> {
    // The flood holds two sockets per idle connection it keeps, plus room.
    crate::raise_open_files_limit(2 * options.idle_sockets as u64 + 500)?;
    let h = Harness::alone()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let beta = h.spawn(NodeOptions::new("beta"))?;
    let gamma = h.spawn(NodeOptions::new("gamma").peer(beta.addr.clone()))?;
    let hostile = HostilePeer::new(&h, "hostile")?;
    let beta_id = runtime.block_on(async {
        let mut node = pb::node_client::NodeClient::new(hostile.channel(&beta).await?);
        anyhow::Ok(
            node.get_info(pb::GetInfoRequest::default())
                .await?
                .into_inner()
                .id,
        )
    })?;
    let server = hostile.serve(hostile_behaviour(&hostile, &beta_id))?;
    let alpha = h.spawn(
        NodeOptions::new("alpha")
            .peer(beta.addr.clone())
            .peer(gamma.addr.clone())
            .peer(server.addr.to_string())
            .extra(&format!(
                "[connections]\nhandshake_timeout_s = {0}\nheader_timeout_s = {0}\n",
                options.connection_timeout_s
            )),
    )?;
    h.wait_all_up(&[&alpha, &beta, &gamma], DEADLINE)?;
    let door: SocketAddr = alpha
        .http_url()?
        .trim_start_matches("http://")
        .parse()
        .context("alpha's front door")?;
    let grpc: SocketAddr = alpha.addr.parse().context("alpha's address")?;

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut report = HostileSoakReport::default();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    thread::scope(|scope| -> anyhow::Result<()> {
        let flood = scope.spawn(|| flood(&[grpc, door], options.idle_sockets, &stop));
        let sampler = scope.spawn(|| sample(&alpha, started, &stop));
        let status = scope.spawn(|| status_loop(&h, &alpha, &stop));
        let readers = [&beta, &gamma];
        let (workload, adversary) = runtime.block_on(async {
            let workload = workload(&h, &alpha, &readers, &acked, &stop);
            let adversary = adversary(&hostile, &alpha, &beta_id, &stop);
            let deadline = async {
                tokio::time::sleep(options.duration).await;
                stop.store(true, Ordering::SeqCst);
            };
            let (workload, adversary, ()) = tokio::join!(workload, adversary, deadline);
            (workload, adversary)
        });
        let (writes_failed, reads) = workload?;
        let (hostile_calls, forgeries_accepted) = adversary?;
        report.writes_failed = writes_failed;
        report.reads = reads;
        report.hostile_calls = hostile_calls;
        report.forgeries_accepted = forgeries_accepted;
        let joined = |e| anyhow::anyhow!("a soak thread panicked: {e:?}");
        report.flood = flood.join().map_err(joined)?;
        report.samples = sampler.join().map_err(joined)?;
        (report.status, report.status_failures) = status.join().map_err(joined)?;
        Ok(())
    })?;
    report.elapsed = started.elapsed();
    let calls = &server.behaviour.calls;
    report.calls_to_hostile = (
        (calls.sync.total(), calls.sync.most()),
        (calls.push.total(), calls.push.most()),
    );

    // Every acknowledged write reaches every node.
    let acked: BTreeSet<String> = acked
        .lock()
        .map_or_else(|e| e.into_inner().clone(), |a| a.clone())
        .into_iter()
        .collect();
    report.writes_acked = acked.len();
    let mut lost = BTreeSet::new();
    for node in [&alpha, &beta, &gamma] {
        let missing = runtime.block_on(async {
            let channel = h.member_channel(node).await?;
            let mut memory = pb::memory_client::MemoryClient::new(channel);
            let converged = Instant::now();
            let missing = loop {
                let held = list_all(&mut memory).await?;
                let missing = acked.difference(&held).cloned().collect::<BTreeSet<_>>();
                if missing.is_empty() || converged.elapsed() > DEADLINE {
                    break missing;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            anyhow::Ok(missing)
        })?;
        if !missing.is_empty() {
            eprintln!(
                "{}: {} acknowledged writes missing, e.g. {:?}",
                node.name,
                missing.len(),
                missing.iter().take(3).collect::<Vec<_>>()
            );
        }
        lost.extend(missing);
    }
    report.writes_lost = lost.len();
    drop(server);
    Ok(report)
}

/// The hostile member as a peer: `memory_seq = u64::MAX`, endless `Sync` answers with a
/// forged, a far-future and a made-up-origin record and huge maps, every push held 8 s (just
/// under the pusher's deadline: a call abandoned at its deadline keeps running on this fake
/// server, which would count it twice).
fn hostile_behaviour(hostile: &HostilePeer, beta_id: &str) -> Behaviour {
    let made_up = made_up_ids(10_000);
    let huge = seq_map(&made_up, u64::MAX);
    let answers = Arc::new(AtomicUsize::new(0));
    let behaviour = Behaviour::new(pb::NodeInfo {
        memory_seq: u64::MAX,
        ..hostile.info("hostile")
    });
    let (forged, future) = (
        hostile.forged(beta_id, "forged", "not from beta", ntp_in(0), 1),
        hostile.record("future", "from a minute ahead", ntp_in(60), 1),
    );
    Behaviour {
        sync: Arc::new(move |request: &pb::MemorySyncRequest| {
            let n = answers.fetch_add(1, Ordering::SeqCst);
            let made_up_record = pb::MemoryRecord {
                namespace: "notes".into(),
                key: format!("made-up-{n}"),
                value: b"v".to_vec(),
                hlc: ntp_in(0),
                origin: made_up[n % made_up.len()].clone(),
                seq: n as u64 + 1,
                tombstone: false,
                signature: vec![0; 64],
            };
            let maps = if request.after.is_empty() {
                huge.clone()
            } else {
                HashMap::new()
            };
            Ok(pb::MemorySyncResponse {
                records: vec![forged.clone(), future.clone(), made_up_record],
                more: true,
                heads: maps.clone(),
                frontier: maps.clone(),
                known: maps,
                certificates: Vec::new(),
            })
        }),
        sync_delay: Duration::from_millis(20),
        push_delay: Duration::from_secs(8),
        ..behaviour
    }
}

/// Holds `per_port` idle sockets open on each address, reopening those the node closed, until
/// `stop`; what happened on each.
fn flood(addrs: &[SocketAddr; 2], per_port: usize, stop: &AtomicBool) -> [Flood; 2] {
    let mut floods = [Flood::default(); 2];
    let mut sockets: [Vec<TcpStream>; 2] = [Vec::new(), Vec::new()];
    let mut buf = [0u8; 16];
    while !stop.load(Ordering::SeqCst) {
        for ((addr, held), flood) in addrs.iter().zip(&mut sockets).zip(&mut floods) {
            let before = held.len();
            held.retain(|tcp| match (&*tcp).read(&mut buf) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => e.kind() == ErrorKind::WouldBlock,
            });
            flood.closed += before - held.len();
            while held.len() < per_port && !stop.load(Ordering::SeqCst) {
                match TcpStream::connect_timeout(addr, Duration::from_secs(1))
                    .and_then(|tcp| tcp.set_nonblocking(true).map(|()| tcp))
                {
                    Ok(tcp) => {
                        held.push(tcp);
                        flood.opened += 1;
                    }
                    Err(_) => {
                        flood.refused += 1;
                        break;
                    }
                }
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    floods
}

/// Samples the node's RSS and open descriptors every second until `stop`.
fn sample(node: &NodeProcess, started: Instant, stop: &AtomicBool) -> Vec<Sample> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        samples.push(Sample {
            at: started.elapsed(),
            rss_kib: node.rss_kib(),
            fds: node.open_fds(),
        });
        thread::sleep(Duration::from_secs(1));
    }
    samples
}

/// Runs `mesh-cli status --json` on `node` every half second until `stop`: the latencies, and
/// what failed (an error, or no answer within 5 s).
fn status_loop(h: &Harness, node: &NodeProcess, stop: &AtomicBool) -> (Vec<Duration>, Vec<String>) {
    let (mut took, mut failures) = (Vec::new(), Vec::new());
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let child = h
            .cli_command(node, &["status", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                failures.push(format!("spawn mesh-cli: {e}"));
                break;
            }
        };
        let exited = wait_for("mesh-cli status", Duration::from_secs(5), || {
            child.try_wait().ok().flatten()
        });
        let elapsed = started.elapsed();
        match exited {
            Ok(status) if status.success() => took.push(elapsed),
            Ok(status) => {
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = err.read_to_string(&mut stderr);
                }
                failures.push(format!("{status}: {}", stderr.trim()));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                failures.push("no answer within 5 s".into());
            }
        }
        thread::sleep(Duration::from_millis(500).saturating_sub(elapsed));
    }
    (took, failures)
}

/// Writes to `node` (each acknowledged key recorded in `acked`) and reads what it wrote back
/// from `readers`, until `stop`: (writes that failed, reads answered).
async fn workload(
    h: &Harness,
    node: &NodeProcess,
    readers: &[&NodeProcess],
    acked: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) -> anyhow::Result<(usize, usize)> {
    let mut writer = pb::memory_client::MemoryClient::new(h.member_channel(node).await?);
    let mut reading = Vec::new();
    for reader in readers {
        reading.push(pb::memory_client::MemoryClient::new(
            h.member_channel(reader).await?,
        ));
    }
    let (mut failed, mut reads) = (0, 0);
    let mut n = 0usize;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let key = format!("k{n:08}");
        let put = pb::MemoryPutRequest {
            namespace: NAMESPACE.into(),
            key: key.clone(),
            value: format!("value {n}").into_bytes(),
        };
        match tokio::time::timeout(Duration::from_secs(10), writer.put(put)).await {
            Ok(Ok(_)) => acked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(key),
            _ => failed += 1,
        }
        // Read an earlier write back on another node (it may not have arrived yet: a read
        // answered is what counts here; arrival is checked at the end).
        let count = reading.len();
        let reader = &mut reading[n % count];
        let get = pb::MemoryGetRequest {
            namespace: NAMESPACE.into(),
            key: format!("k{:08}", n.saturating_sub(10).max(1)),
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(10), reader.get(get)).await {
            reads += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((failed, reads))
}

/// The hostile member as a client of `node` until `stop`: `Sync` at the bound with absurd
/// sequences, and forged, far-future and NUL-keyed pushes. Answers (calls made, forgeries
/// accepted).
async fn adversary(
    hostile: &HostilePeer,
    node: &NodeProcess,
    beta_id: &str,
    stop: &AtomicBool,
) -> anyhow::Result<(usize, usize)> {
    let mut memory = pb::memory_client::MemoryClient::new(hostile.channel(node).await?)
        .max_encoding_message_size(64 << 20)
        .max_decoding_message_size(64 << 20);
    let huge = seq_map(&made_up_ids(10_000), u64::MAX);
    let push = |record: pb::MemoryRecord| pb::MemoryPushRequest {
        records: vec![record],
        node: String::new(),
        certificates: vec![hostile.signer().certificate().to_vec()],
    };
    let (mut calls, mut accepted) = (0, 0);
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let within = Duration::from_secs(10);
        // Answered (it is within the bounds) but names nobody alpha knows.
        let _ = tokio::time::timeout(
            within,
            memory.sync(pb::MemorySyncRequest {
                after: huge.clone(),
                frontier: huge.clone(),
                node: String::new(),
            }),
        )
        .await;
        let forgeries = [
            hostile.forged(
                beta_id,
                &format!("forged-{n}"),
                "not from beta",
                ntp_in(0),
                n,
            ),
            hostile.record(&format!("future-{n}"), "a minute ahead", ntp_in(60), n),
            hostile.record(&format!("nul\0{n}"), "v", ntp_in(0), n),
        ];
        calls += 1;
        for record in forgeries {
            calls += 1;
            // Refused either as a call (a NUL key, a forged origin) or record by record in
            // the answer (a far-future stamp): `applied` is what got in.
            if let Ok(Ok(answer)) = tokio::time::timeout(within, memory.push(push(record))).await
                && answer.into_inner().applied > 0
            {
                accepted += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((calls, accepted))
}

/// Every key of the soak namespace `memory` holds, following the List cursor.
async fn list_all(
    memory: &mut pb::memory_client::MemoryClient<tonic::transport::Channel>,
) -> anyhow::Result<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    let mut after = String::new();
    loop {
        let page = memory
            .list(pb::MemoryListRequest {
                namespace: NAMESPACE.into(),
                prefix: String::new(),
                limit: 10_000,
                after: after.clone(),
            })
            .await?
            .into_inner();
        keys.extend(
            page.records
                .into_iter()
                .filter(|r| !r.tombstone)
                .map(|r| r.key),
        );
        if page.next_after.is_empty() {
            return Ok(keys);
        }
        after = page.next_after;
    }
}
