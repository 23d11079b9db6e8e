//! Shared-memory figures:
//!
//! 1. **Durable local puts/s**, in-process: `Memory::open` on a fresh sled db in a temp dir, then
//!    2,000 sequential `put`s of 100-byte values (each returns once flushed).
//! 2. **Disk bytes per stored byte**: 20,000 records of 1 KiB put one after another, flushed,
//!    then every file under the sled directory summed (apparent size and allocated blocks) and
//!    divided by the value bytes stored.
//! 3. **Replication latency to 4 peers**: 5 real `mesh-node` processes on loopback (mTLS, static
//!    peer → full mesh by peer exchange), one gRPC `Memory` client per node. Each run puts a key
//!    on node 0 and, from the moment the `Put` is acknowledged, polls `Get` on the 4 other nodes
//!    concurrently until each returns the value; p50 / p99 / max over all (run × peer) samples.
//!    A sample includes the polling granularity (the mean interval between polls is printed).
//! 4. **Convergence after a partition**: nodes A and B start without knowing each other; A gets
//!    10,000 keys, B 10,000 other keys, and both write the same 1,000 keys (concurrent
//!    overwrites), over gRPC with `--in-flight` puts in flight per node (default 1: with 32 in
//!    flight the nodes' sled stores deadlocked, see 6.), each side ending with a marker key.
//!    Then a node C peering with both is started ("heal"; peer exchange introduces A and B),
//!    and the nodes must survive it: a call that fails names the node. Timed from just before C
//!    is spawned until A, B and C all hold both markers (records are pulled in write order per
//!    writer), then checked with `List`: 21,002 live keys on each node and the same winner for
//!    every doubly-written key. Peer discovery (heal → `peer joined` among the three) is read
//!    from the nodes' own log timestamps.
//! 5. **Signing and verifying records**, in-process: 20,000 records of 100-byte values, each
//!    signed by a node (its canonical bytes built, then signed with the node key) and then
//!    verified as a receiving node does (canonical bytes, cached origin key, signature check),
//!    for an Ed25519 node certificate of a real CA and for an ECDSA P-256 key (older nodes, and
//!    `--insecure` ones); mean µs per record, and the time to verify a full `Sync` batch (512).
//! 6. **Concurrent durable local puts/s**, in-process: 2,000 puts shared by 2, 4, then 8 tokio
//!    tasks on fresh dbs. Last, because sled 0.34 can deadlock when transactions run alongside
//!    concurrent flushes (`flush_async` callers parked on its rwlock behind a transaction that
//!    waits for them; compare spacejam/sled#1308), and its IO thread pool is process-wide: a
//!    batch that does not finish within 30 s is reported as wedged and larger counts are skipped.
//!
//! Run: `cargo build --release --bins && target/release/memory-bench [--runs N] [--in-flight M]`
//! (N: replication runs, default 200, a bare number works too; M: puts in flight per node while
//! loading the partition, default 1). Takes a minute or two on 2 cores.

use std::{
    path::Path,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, bail, ensure};
use mesh_cert::{OriginSigner, OriginVerifier};
use mesh_node::testing::{Entry, Memory, MemoryOptions, Record};
use mesh_proto::v1 as pb;
use mesh_tests::{Harness, NodeOptions, NodeProcess};
use mesh_tls::MeshTls;
use time::{OffsetDateTime, format_description::well_known::Rfc3339};
use tokio::task::JoinSet;
use tonic::transport::Channel;

type Client = pb::memory_client::MemoryClient<Channel>;

/// Namespace every benchmark writes to (replicated: not in `local_namespaces`).
const NS: &str = "bench";
/// Sequential local puts.
const SEQ_PUTS: usize = 2_000;
/// Concurrent local writer counts tried, in order, sharing [`CONCURRENT_PUTS`] puts.
const WRITER_COUNTS: [usize; 3] = [2, 4, 8];
const CONCURRENT_PUTS: usize = 2_000;
/// How long a batch of local puts may go without finishing before the store counts as wedged.
const LOCAL_DEADLINE: Duration = Duration::from_secs(30);
/// Records (of 1 KiB) for the disk-usage figure.
const DISK_RECORDS: usize = 20_000;
/// Keys only A has, only B has, and both wrote.
const SIDE_KEYS: usize = 10_000;
const SHARED_KEYS: usize = 1_000;
/// Longest one gRPC call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between replication polls (tokio's timer rounds it up to its 1 ms tick).
const POLL: Duration = Duration::from_micros(200);
/// Replication deadline per sample.
const REPLICATION_DEADLINE: Duration = Duration::from_secs(10);
/// Convergence deadline after the heal.
const CONVERGENCE_DEADLINE: Duration = Duration::from_secs(120);
/// Replication runs not counted.
const WARM_UP: usize = 10;

/// Command-line settings.
#[derive(Debug, Clone, Copy)]
struct Settings {
    runs: usize,
    in_flight: usize,
}

fn main() -> ExitCode {
    let settings = match parse_args() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e:#}\nusage: memory-bench [--runs N] [--in-flight M]");
            return ExitCode::FAILURE;
        }
    };
    match bench(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--runs N` (or `--runs=N`, or a bare `N`), `--in-flight M` (or `--in-flight=M`).
fn parse_args() -> anyhow::Result<Settings> {
    let mut settings = Settings {
        runs: 200,
        in_flight: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name.to_owned(), value.to_owned()),
            _ if arg.starts_with("--") => {
                let value = args
                    .next()
                    .with_context(|| format!("{arg} needs a number"))?;
                (arg, value)
            }
            _ => ("--runs".to_owned(), arg),
        };
        let number: usize = value
            .parse()
            .with_context(|| format!("{name}: `{value}` is not a number"))?;
        ensure!(number > 0, "{name} must be at least 1");
        match name.as_str() {
            "--runs" => settings.runs = number,
            "--in-flight" => settings.in_flight = number,
            _ => bail!("unknown option `{name}`"),
        }
    }
    Ok(settings)
}

/// The figures, printed together at the end.
#[derive(Debug, Default)]
struct Report(Vec<(String, String)>);

impl Report {
    fn add(&mut self, label: impl Into<String>, value: impl Into<String>) {
        let (label, value) = (label.into(), value.into());
        eprintln!("  {label}: {value}");
        self.0.push((label, value));
    }

    fn print(&self) {
        let width = self
            .0
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0);
        for (label, value) in &self.0 {
            println!("{label:<width$}  {value}");
        }
    }
}

fn bench(settings: Settings) -> anyhow::Result<()> {
    mesh_tls::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new()?;
    let mut report = Report::default();
    let mut failed = 0;
    let mut outcome = |report: &mut Report, what: &str, result: anyhow::Result<()>| {
        if let Err(e) = result {
            failed += 1;
            report.add(format!("{what}: FAILED"), format!("{e:#}"));
        }
    };

    eprintln!("local puts…");
    let result = runtime.block_on(local_puts(&mut report));
    outcome(&mut report, "local puts", result);
    eprintln!("disk usage…");
    let result = runtime.block_on(disk_usage(&mut report));
    outcome(&mut report, "disk usage", result);
    eprintln!("replication latency ({} runs)…", settings.runs);
    let result = replication(&runtime, settings.runs, &mut report);
    outcome(&mut report, "replication", result);
    eprintln!(
        "convergence after a partition ({} puts in flight per node)…",
        settings.in_flight
    );
    let result = convergence(&runtime, settings.in_flight, &mut report);
    outcome(&mut report, "convergence", result);
    eprintln!("signing and verifying records…");
    let result = signatures(&mut report);
    outcome(&mut report, "signatures", result);
    eprintln!("concurrent local puts…");
    let result = runtime.block_on(local_concurrent_puts(&mut report));
    outcome(&mut report, "concurrent local puts", result);

    println!();
    report.print();
    // A wedged sled transaction may hold a runtime worker forever; do not wait for it.
    runtime.shutdown_background();
    ensure!(failed == 0, "{failed} part(s) failed, see above");
    Ok(())
}

/// Records signed and verified for the per-record cost.
const SIGNED_RECORDS: usize = 20_000;

/// Sign and verify cost per record, Ed25519 (a node certificate from a real CA) and ECDSA P-256.
fn signatures(report: &mut Report) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    mesh_cert::ca::ca_init(dir.path())?;
    let (cert, key) = mesh_cert::ca::issue(dir.path(), "signer", &[], mesh_cert::CertRole::Node)?;
    let tls = MeshTls::load(&mesh_tls::TlsFiles {
        ca: dir.path().join(mesh_cert::ca::CA_CERT_FILE),
        cert,
        key,
    })?;
    let ed25519 = (tls.origin_signer()?, tls.origin_verifier()?);
    let p256 = (
        OriginSigner::self_certified(rcgen::KeyPair::generate()?)?,
        OriginVerifier::self_certified(),
    );
    for (label, (signer, verifier)) in [("Ed25519", ed25519), ("ECDSA P-256", p256)] {
        let mut entries: Vec<Entry> = (0..SIGNED_RECORDS)
            .map(|i| Entry {
                namespace: NS.into(),
                key: format!("k{i}"),
                record: Record {
                    value: vec![b'x'; 100],
                    hlc: 1 << 32,
                    origin: signer.id().clone(),
                    seq: i as u64 + 1,
                    tombstone: false,
                    signature: Vec::new(),
                },
            })
            .collect();
        let started = Instant::now();
        for entry in &mut entries {
            entry.record.signature = signer.sign(&entry.signed_bytes())?;
        }
        let sign = started.elapsed();
        verifier.learn(signer.certificate())?;
        let started = Instant::now();
        for entry in &entries {
            verifier.verify(
                &entry.record.origin,
                entry.record.written_at(),
                &entry.signed_bytes(),
                &entry.record.signature,
            )?;
        }
        let verify = started.elapsed();
        let per = |d: Duration| d.as_secs_f64() * 1e6 / SIGNED_RECORDS as f64;
        report.add(
            format!("sign one record ({label})"),
            format!("{:.1} µs", per(sign)),
        );
        report.add(
            format!("verify one record ({label})"),
            format!(
                "{:.1} µs (a Sync batch of {}: {:.1} ms)",
                per(verify),
                mesh_node::testing::SYNC_BATCH,
                per(verify) * mesh_node::testing::SYNC_BATCH as f64 / 1000.0
            ),
        );
    }
    Ok(())
}

/// A fresh memory on its own sled db; the temp dir goes when the returned guard drops. The
/// local-writes receiver is drained by a task that ends once the memory is dropped.
fn open_memory(name: &str) -> anyhow::Result<(tempfile::TempDir, sled::Db, Arc<Memory>)> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("memory-bench-{name}"))
        .tempdir()?;
    let db = sled::open(dir.path().join("db"))?;
    let (memory, mut writes) = Memory::open(
        std::sync::Arc::new(mesh_node::testing::SledStore::new(db.clone())),
        Arc::new(OriginSigner::generate()?),
        Arc::new(OriginVerifier::self_certified()),
        MemoryOptions::default(),
    );
    tokio::spawn(async move { while writes.recv().await.is_some() {} });
    Ok((dir, db, memory))
}

/// Puts `count` copies of `value` one after another under `{prefix}{i}`.
async fn sequential_puts(
    memory: &Memory,
    prefix: &str,
    count: usize,
    value: &[u8],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for i in 0..count {
        let key = format!("{prefix}{i:06}");
        tokio::time::timeout(LOCAL_DEADLINE, memory.put(NS, &key, Some(value.to_vec())))
            .await
            .with_context(|| {
                format!("local put {key} did not return within {LOCAL_DEADLINE:?}")
            })??;
    }
    Ok(started.elapsed())
}

/// Runs `writers` tasks, writer `w` putting `per_writer` values under `{prefix}{w}/{i}`.
async fn concurrent_puts(
    memory: &Arc<Memory>,
    prefix: &str,
    writers: usize,
    per_writer: usize,
    value: &[u8],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for w in 0..writers {
        let (memory, value, prefix) = (memory.clone(), value.to_vec(), prefix.to_owned());
        set.spawn(async move {
            for i in 0..per_writer {
                memory
                    .put(NS, &format!("{prefix}{w}/{i:06}"), Some(value.clone()))
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

async fn local_puts(report: &mut Report) -> anyhow::Result<()> {
    let (_dir, _db, memory) = open_memory("local")?;
    let value = vec![b'x'; 100];
    sequential_puts(&memory, "warm/", 50, &value).await?;
    let took = sequential_puts(&memory, "seq/", SEQ_PUTS, &value).await?;
    report.add(
        format!("local durable puts, 1 writer ({SEQ_PUTS} × 100 B)"),
        format!(
            "{:8.0} puts/s  ({:.3} ms each)",
            SEQ_PUTS as f64 / took.as_secs_f64(),
            ms(took) / SEQ_PUTS as f64
        ),
    );
    Ok(())
}

async fn local_concurrent_puts(report: &mut Report) -> anyhow::Result<()> {
    let value = vec![b'x'; 100];
    for writers in WRITER_COUNTS {
        let (_dir, db, memory) = open_memory(&format!("writers{writers}"))?;
        let per_writer = CONCURRENT_PUTS / writers;
        let label = format!(
            "local durable puts, {writers} writers ({} × 100 B)",
            per_writer * writers
        );
        let run = concurrent_puts(&memory, "w", writers, per_writer, &value);
        match tokio::time::timeout(LOCAL_DEADLINE, run).await {
            Ok(took) => {
                let took = took?;
                report.add(
                    label,
                    format!(
                        "{:8.0} puts/s",
                        (per_writer * writers) as f64 / took.as_secs_f64()
                    ),
                );
            }
            Err(_) => {
                report.add(
                    label,
                    format!(
                        "WEDGED: no progress for {LOCAL_DEADLINE:?} (sled flush deadlock); \
                         larger writer counts skipped"
                    ),
                );
                // Dropping a sled db flushes it, which would block forever now.
                std::mem::forget(memory);
                std::mem::forget(db);
                break;
            }
        }
    }
    Ok(())
}

/// Apparent size and allocated bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let (mut apparent, mut allocated) = (0, 0);
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            let (a, b) = disk_bytes(&entry.path())?;
            apparent += a;
            allocated += b;
        } else {
            apparent += meta.len();
            allocated += meta.blocks() * 512;
        }
    }
    Ok((apparent, allocated))
}

async fn disk_usage(report: &mut Report) -> anyhow::Result<()> {
    let (dir, _db, memory) = open_memory("disk")?;
    let value = vec![b'v'; 1024];
    sequential_puts(&memory, "d/", DISK_RECORDS, &value).await?;
    tokio::time::timeout(LOCAL_DEADLINE, memory.flush())
        .await
        .context("flush did not return")??;
    let stored = (DISK_RECORDS * value.len()) as u64;
    let (apparent, allocated) = disk_bytes(dir.path())?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    report.add(
        format!("disk, {DISK_RECORDS} records × 1 KiB: value bytes"),
        format!("{stored} B ({:.1} MiB)", mib(stored)),
    );
    report.add(
        "disk: sled dir, apparent size",
        format!(
            "{apparent} B ({:.1} MiB) = {:.2} B per stored byte",
            mib(apparent),
            apparent as f64 / stored as f64
        ),
    );
    report.add(
        "disk: sled dir, allocated blocks",
        format!(
            "{allocated} B ({:.1} MiB) = {:.2} B per stored byte",
            mib(allocated),
            allocated as f64 / stored as f64
        ),
    );
    Ok(())
}

async fn connect(harness: &Harness, nodes: &[&NodeProcess]) -> anyhow::Result<Vec<Client>> {
    let dialer = MeshTls::load(&harness.issue("bench-client")?)?.dialer();
    let mut clients = Vec::new();
    for node in nodes {
        let channel = dialer
            .connect(&node.addr)
            .await
            .with_context(|| format!("connect to {}", node.name))?
            .channel;
        clients.push(Client::new(channel).max_decoding_message_size(16 * 1024 * 1024));
    }
    Ok(clients)
}

/// A request that fails after [`CALL_DEADLINE`] instead of waiting on a stuck node.
fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

async fn put(client: &mut Client, key: &str, value: Vec<u8>) -> anyhow::Result<pb::MemoryRecord> {
    Ok(client
        .put(request(pb::MemoryPutRequest {
            namespace: NS.into(),
            key: key.into(),
            value,
        }))
        .await
        .with_context(|| format!("put {key}"))?
        .into_inner())
}

async fn get(client: &mut Client, key: &str) -> anyhow::Result<Option<pb::MemoryRecord>> {
    Ok(client
        .get(request(pb::MemoryGetRequest {
            namespace: NS.into(),
            key: key.into(),
        }))
        .await
        .with_context(|| format!("get {key}"))?
        .into_inner()
        .record)
}

/// Every record under `prefix`, following the node's cursor when an answer is cut.
async fn list(client: &mut Client, prefix: &str) -> anyhow::Result<Vec<pb::MemoryRecord>> {
    let (mut records, mut after) = (Vec::new(), String::new());
    loop {
        let answer = client
            .list(request(pb::MemoryListRequest {
                namespace: NS.into(),
                prefix: prefix.into(),
                limit: 10_000,
                after,
            }))
            .await
            .with_context(|| format!("list {prefix}"))?
            .into_inner();
        records.extend(answer.records);
        if answer.next_after.is_empty() {
            return Ok(records);
        }
        after = answer.next_after;
    }
}

/// Polls `Get key` on `client` until it holds `want`; returns the time since `since` and the
/// number of `Get`s sent.
async fn await_value(
    mut client: Client,
    key: String,
    want: pb::MemoryRecord,
    since: Instant,
) -> anyhow::Result<(Duration, u32)> {
    let mut polls = 0;
    loop {
        polls += 1;
        let got = get(&mut client, &key).await?;
        if got.is_some_and(|r| r.hlc == want.hlc && r.origin == want.origin) {
            return Ok((since.elapsed(), polls));
        }
        if since.elapsed() >= REPLICATION_DEADLINE {
            bail!("{key} not replicated within {REPLICATION_DEADLINE:?}");
        }
        tokio::time::sleep(POLL).await; // poll interval, deadline above
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted
        .get(sorted.len().saturating_sub(1) * p / 100)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn replication(
    runtime: &tokio::runtime::Runtime,
    runs: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let harness = Harness::new()?;
    let first = harness.spawn(NodeOptions::new("r0"))?;
    let mut nodes = vec![first];
    for i in 1..5 {
        let node = harness.spawn(NodeOptions::new(&format!("r{i}")).peer(&nodes[0].addr))?;
        nodes.push(node);
    }
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    harness.wait_all_up(&refs, Duration::from_secs(30))?;
    runtime.block_on(async {
        let clients = connect(&harness, &refs).await?;
        let (mut writer, readers) = match clients.split_first() {
            Some((writer, readers)) => (writer.clone(), readers.to_vec()),
            None => bail!("no nodes"),
        };
        let mut samples = Vec::new();
        let (mut polls, mut polling) = (0u64, Duration::ZERO);
        for run in 0..WARM_UP + runs {
            let key = format!("lat/{run:06}");
            let written = put(&mut writer, &key, format!("value {run}").into_bytes()).await?;
            let acked = Instant::now();
            let mut set = JoinSet::new();
            for reader in &readers {
                set.spawn(await_value(
                    reader.clone(),
                    key.clone(),
                    written.clone(),
                    acked,
                ));
            }
            while let Some(done) = set.join_next().await {
                let (took, n) = done??;
                if run >= WARM_UP {
                    samples.push(took);
                    polls += u64::from(n);
                    polling += took;
                }
            }
        }
        samples.sort();
        let n = samples.len();
        report.add(
            format!("replication to 4 peers, put ack → visible ({runs} runs × 4 = {n})"),
            format!(
                "p50 {:7.2} ms   p99 {:7.2} ms   max {:7.2} ms",
                ms(percentile(&samples, 50)),
                ms(percentile(&samples, 99)),
                ms(samples.last().copied().unwrap_or_default())
            ),
        );
        report.add(
            "  (includes polling: mean interval between Gets)",
            format!("{:.2} ms", ms(polling) / polls.max(1) as f64),
        );
        anyhow::Ok(())
    })
}

/// Puts `keys` on `client` with `in_flight` requests in flight.
async fn put_many(
    client: &Client,
    keys: Vec<(String, Vec<u8>)>,
    in_flight: usize,
) -> anyhow::Result<()> {
    let mut lanes: Vec<Vec<(String, Vec<u8>)>> = vec![Vec::new(); in_flight];
    for (i, kv) in keys.into_iter().enumerate() {
        lanes[i % in_flight].push(kv);
    }
    let mut set = JoinSet::new();
    for lane in lanes {
        let mut client = client.clone();
        set.spawn(async move {
            for (key, value) in lane {
                put(&mut client, &key, value).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Loads one side of the partition: its own keys and the shared ones, then its marker key.
async fn load_side(mut client: Client, side: &str, in_flight: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut keys: Vec<(String, Vec<u8>)> = (0..SIDE_KEYS)
        .map(|i| (format!("{side}/{i:05}"), format!("{side} {i}").into_bytes()))
        .collect();
    keys.extend((0..SHARED_KEYS).map(|i| {
        (
            format!("both/{i:04}"),
            format!("from {side} {i}").into_bytes(),
        )
    }));
    put_many(&client, keys, in_flight).await.with_context(|| {
        format!(
            "load side {side} with {in_flight} puts in flight (a node that stops answering under \
             concurrent puts has likely wedged in sled: see --in-flight)"
        )
    })?;
    put(&mut client, &format!("end/{side}"), b"end".to_vec()).await?;
    Ok(started.elapsed())
}

/// Whether every node holds the full key set, with the same winner for every shared key.
async fn fully_converged(clients: &mut [Client]) -> anyhow::Result<bool> {
    let mut shared: Option<Vec<(String, u64, String)>> = None;
    for client in clients.iter_mut() {
        for (prefix, want) in [("a/", SIDE_KEYS), ("b/", SIDE_KEYS), ("end/", 2)] {
            if list(client, prefix).await?.len() != want {
                return Ok(false);
            }
        }
        let winners: Vec<(String, u64, String)> = list(client, "both/")
            .await?
            .into_iter()
            .map(|r| (r.key, r.hlc, r.origin))
            .collect();
        if winners.len() != SHARED_KEYS {
            return Ok(false);
        }
        match &shared {
            None => shared = Some(winners),
            Some(first) if *first != winners => return Ok(false),
            Some(_) => {}
        }
    }
    Ok(true)
}

fn convergence(
    runtime: &tokio::runtime::Runtime,
    in_flight: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let harness = Harness::new()?;
    let a = harness.spawn(NodeOptions::new("part-a"))?;
    let b = harness.spawn(NodeOptions::new("part-b"))?;
    let (mut a_client, mut b_client) = runtime.block_on(async {
        let clients = connect(&harness, &[&a, &b]).await?;
        match <[Client; 2]>::try_from(clients) {
            Ok([a, b]) => anyhow::Ok((a, b)),
            Err(_) => bail!("expected two clients"),
        }
    })?;
    let loaded = runtime.block_on(async {
        let (a_took, b_took) = tokio::join!(
            load_side(a_client.clone(), "a", in_flight),
            load_side(b_client.clone(), "b", in_flight)
        );
        let (a_took, b_took) = (a_took?, b_took?);
        // Still partitioned: neither side has anything of the other.
        ensure!(
            get(&mut a_client, "end/b").await?.is_none()
                && get(&mut b_client, "end/a").await?.is_none(),
            "A and B replicated before the heal"
        );
        anyhow::Ok(a_took.max(b_took))
    })?;
    let per_side = SIDE_KEYS + SHARED_KEYS + 1;
    report.add(
        format!("gRPC puts, 2 nodes × {per_side} at once, {in_flight} in flight each"),
        format!(
            "{:8.0} puts/s per node ({:.1} s)",
            per_side as f64 / loaded.as_secs_f64(),
            loaded.as_secs_f64()
        ),
    );

    let healed_wall = SystemTime::now();
    let healed = Instant::now();
    let c = harness.spawn(NodeOptions::new("heal-c").peer(&a.addr).peer(&b.addr))?;
    let (markers, full) = runtime.block_on(async {
        let mut clients = vec![a_client.clone(), b_client.clone()];
        clients.extend(connect(&harness, &[&c]).await?);
        let names = [&a.name, &b.name, &c.name];
        let deadline = healed + CONVERGENCE_DEADLINE;
        // Cheap poll first: each side's marker is its last write, and records are pulled in
        // write order per writer, so a node holding both markers has (almost surely) all.
        'poll: loop {
            ensure!(
                Instant::now() < deadline,
                "not converged within {CONVERGENCE_DEADLINE:?} of the heal"
            );
            for (client, name) in clients.iter_mut().zip(names) {
                for marker in ["end/a", "end/b"] {
                    let held = get(client, marker).await.with_context(|| {
                        format!(
                            "{name} stopped answering {:.1} s after the heal",
                            healed.elapsed().as_secs_f64()
                        )
                    })?;
                    if held.is_none() {
                        tokio::time::sleep(Duration::from_millis(5)).await; // poll interval
                        continue 'poll;
                    }
                }
            }
            break;
        }
        let markers = healed.elapsed();
        // Then the full check, repeated until it passes.
        loop {
            if fully_converged(&mut clients).await? {
                return anyhow::Ok((markers, healed.elapsed()));
            }
            ensure!(
                Instant::now() < deadline,
                "markers everywhere but key sets still differ {CONVERGENCE_DEADLINE:?} after the heal"
            );
            tokio::time::sleep(Duration::from_millis(50)).await; // poll interval, deadline above
        }
    })?;
    let total = 2 * SIDE_KEYS + SHARED_KEYS + 2;
    report.add(
        format!("convergence, heal → {total} keys on A, B, C (markers seen)"),
        format!("{:8.0} ms", ms(markers)),
    );
    report.add(
        "  full List check passed (markers + check time)",
        format!("{:8.0} ms", ms(full)),
    );
    let nodes = [&a, &b, &c];
    let mut discovery = Duration::ZERO;
    let mut a_b = Duration::ZERO;
    for observer in nodes {
        for other in nodes {
            if observer.name == other.name {
                continue;
            }
            let joined = joined_after(observer, &other.name, healed_wall).with_context(|| {
                format!("{} never logged {} joining", observer.name, other.name)
            })?;
            discovery = discovery.max(joined);
            if observer.name != c.name && other.name != c.name {
                a_b = a_b.max(joined);
            }
        }
    }
    report.add(
        "  discovery, heal → every pair up (node logs)",
        format!("{:8.0} ms", ms(discovery)),
    );
    report.add(
        "  discovery, heal → A and B up on each other",
        format!("{:8.0} ms", ms(a_b)),
    );
    Ok(())
}

/// When `observer` first logged `peer` joining (or coming up) after `since`, as a delay.
fn joined_after(observer: &NodeProcess, peer: &str, since: SystemTime) -> Option<Duration> {
    let since = OffsetDateTime::from(since);
    observer.log_text().lines().find_map(|line| {
        let line: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = &line["fields"];
        let event = fields["message"] == "peer joined" || fields["message"] == "peer up";
        if !event || fields["peer"] != peer {
            return None;
        }
        let stamp = OffsetDateTime::parse(line["timestamp"].as_str()?, &Rfc3339).ok()?;
        (stamp >= since).then(|| (stamp - since).unsigned_abs())
    })
}
