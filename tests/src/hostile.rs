//! A hostile peer: a member of the mesh (a real node certificate issued by the test's CA, and
//! the signing key that goes with it) that speaks the node's gRPC services with adversarial
//! messages, so tests can show what a compromised or broken node cannot do to the others.
//!
//! It plays both sides. As a client of a victim node ([`HostilePeer::channel`]) it sends what
//! it likes: absurd sequence numbers, per-origin maps with thousands of made-up ids
//! ([`made_up_ids`], [`seq_map`]), records in another node's name (signed with its own key,
//! [`HostilePeer::forged`]), records stamped far in the future ([`ntp_in`]), NUL bytes in
//! strings, messages at and past the size limits. As a fake peer the victim dials
//! ([`HostilePeer::serve`]), it answers `Node.GetInfo`, `Node.WatchInfo` (an endless stream of
//! beats) and `Node.ListPeers` with the `NodeInfo` the test controls (a forged id, a
//! `memory_seq` of `u64::MAX`), and `Memory.Sync` and `Memory.Push` as its [`Behaviour`]
//! says (endless "more" answers, huge maps, slow or never-answered pushes), counting the calls
//! and how many ran at once ([`Calls`]) so a test can show the victim's calls stay bounded.
//!
//! [`MembershipFlood`] is the stranger on the LAN: no certificate, only one datagram of a real
//! member seen on the wire, which it turns into a flood at nodes' membership ports (copies of
//! the member's certificate with made-up signatures, stale copies, replays, garbage).
//!
//! It is test code: it never listens or sends anywhere but 127.0.0.1, and it stops when its
//! [`HostileServer`] (or [`MembershipFlood`]) is dropped.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use mesh_cert::OriginSigner;
use mesh_proto::v1 as pb;
use mesh_tls::MeshTls;
use tonic::{Request, Response, Status};

use crate::{Harness, NodeProcess};

/// Now as uhlc stamps it (NTP64 over the Unix epoch: seconds in the high 32 bits, the fraction
/// in the low 32), moved by `secs` (negative: in the past).
pub fn ntp_in(secs: i64) -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let now = (since_epoch.as_secs() << 32)
        + ((u64::from(since_epoch.subsec_nanos()) << 32) / 1_000_000_000);
    now.saturating_add_signed(secs.saturating_mul(1 << 32))
}

/// `n` well-formed node ids that no certificate has (64 hex digits each).
pub fn made_up_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{:064x}", i + 1)).collect()
}

/// A per-origin map (as `Sync` carries them) naming each id with `seq`.
pub fn seq_map(ids: &[String], seq: u64) -> HashMap<String, u64> {
    ids.iter().map(|id| (id.clone(), seq)).collect()
}

/// A member of the mesh that misbehaves: its TLS material and its record signer.
pub struct HostilePeer {
    tls: MeshTls,
    signer: OriginSigner,
}

impl std::fmt::Debug for HostilePeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostilePeer")
            .field("id", &self.id())
            .finish()
    }
}

impl HostilePeer {
    /// A new member called `name`, with a node certificate of `harness`'s CA.
    pub fn new(harness: &Harness, name: &str) -> anyhow::Result<Self> {
        Self::with_files(&harness.issue(name)?)
    }

    /// A member presenting the certificate and key in `files` (one a test made, such as a
    /// second certificate for a name already issued).
    pub fn with_files(files: &mesh_tls::TlsFiles) -> anyhow::Result<Self> {
        let tls = MeshTls::load(files)?;
        let signer = tls.origin_signer()?;
        Ok(Self { tls, signer })
    }

    /// Its node id (its certificate's).
    pub fn id(&self) -> String {
        self.tls.identity().id.to_string()
    }

    /// Its TLS material.
    pub fn tls(&self) -> &MeshTls {
        &self.tls
    }

    /// The key it signs records with (its own: a record it signs in another's name is a
    /// forgery).
    pub fn signer(&self) -> &OriginSigner {
        &self.signer
    }

    /// An mTLS channel to `node`, presenting its certificate.
    pub async fn channel(&self, node: &NodeProcess) -> anyhow::Result<tonic::transport::Channel> {
        Ok(self.tls.dialer().connect(&node.addr).await?.channel)
    }

    /// A `notes` record in its own name, stamped `hlc`, with sequence `seq`, signed.
    pub fn record(&self, key: &str, value: &str, hlc: u64, seq: u64) -> pb::MemoryRecord {
        self.forged(&self.id(), key, value, hlc, seq)
    }

    /// A record of any namespace (a system one, say) in its own name, stamped `hlc`, with
    /// sequence `seq`, signed: genuinely its own write, whatever the namespace's rules say.
    pub fn write(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        hlc: u64,
        seq: u64,
    ) -> pb::MemoryRecord {
        let mut record = pb::MemoryRecord {
            namespace: namespace.into(),
            key: key.into(),
            value: value.to_vec(),
            hlc,
            origin: self.id(),
            seq,
            tombstone: false,
            signature: Vec::new(),
        };
        if let Err(e) = crate::sign_record(&self.signer, &mut record) {
            eprintln!("hostile peer: sign {namespace}/{key}: {e}");
        }
        record
    }

    /// Pushes `records` to `node` through `Memory.Push`, with its certificate, as a node
    /// pushes its own writes.
    pub async fn push(
        &self,
        node: &NodeProcess,
        records: Vec<pb::MemoryRecord>,
    ) -> anyhow::Result<pb::MemoryPushResponse> {
        let mut client = pb::memory_client::MemoryClient::new(self.channel(node).await?);
        Ok(client
            .push(pb::MemoryPushRequest {
                records,
                node: String::new(),
                certificates: vec![self.signer.certificate().to_vec()],
            })
            .await?
            .into_inner())
    }

    /// A `notes` record in `origin`'s name, signed with this peer's key: a forgery unless
    /// `origin` is its own id.
    pub fn forged(
        &self,
        origin: &str,
        key: &str,
        value: &str,
        hlc: u64,
        seq: u64,
    ) -> pb::MemoryRecord {
        let mut record = pb::MemoryRecord {
            namespace: "notes".into(),
            key: key.into(),
            value: value.as_bytes().to_vec(),
            hlc,
            origin: origin.to_owned(),
            seq,
            tombstone: false,
            signature: Vec::new(),
        };
        if let Err(e) = crate::sign_record(&self.signer, &mut record) {
            // Left unsigned: refused like any other record whose signature does not verify.
            eprintln!("hostile peer: sign {key}: {e}");
        }
        record
    }

    /// Its honest `NodeInfo`: its own name and id, this build's version and protocol.
    pub fn info(&self, name: &str) -> pb::NodeInfo {
        pb::NodeInfo {
            name: name.into(),
            id: self.id(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: mesh_proto::PROTOCOL_MAJOR,
            ..Default::default()
        }
    }

    /// Serves `behaviour` over mTLS on 127.0.0.1 with this peer's certificate, on a thread and
    /// runtime of its own (tests that block while they poll keep it answering).
    pub fn serve(&self, behaviour: Behaviour) -> anyhow::Result<HostileServer> {
        let server_tls = self.tls.server_config(false)?;
        let revoked = self.tls.revoked().clone();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = Service(Arc::new(behaviour.clone()));
        let membership_tls = self.tls.clone();
        let (seen, seen_rx) = tokio::sync::mpsc::channel(8);
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = addr_tx.send(Err(anyhow::anyhow!("hostile runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                    Ok(listener) => listener,
                    Err(e) => {
                        let _ = addr_tx.send(Err(anyhow::anyhow!("bind: {e}")));
                        return;
                    }
                };
                let addr = match listener.local_addr() {
                    Ok(addr) => addr,
                    Err(e) => {
                        let _ = addr_tx.send(Err(anyhow::anyhow!("local addr: {e}")));
                        return;
                    }
                };
                // It speaks SWIM too, as a member of the mesh, so nodes list it and call it; on
                // a thread of its own, so slow answers of the hostile service do not make it
                // look dead.
                let leave = tokio_util::sync::CancellationToken::new();
                let swim = match swim_member(membership_tls, addr, seen_rx, leave.clone()) {
                    Ok(swim) => swim,
                    Err(e) => {
                        let _ = addr_tx.send(Err(e));
                        return;
                    }
                };
                let _ = addr_tx.send(Ok(addr));
                let served = tonic::transport::Server::builder()
                    .add_service(pb::node_server::NodeServer::new(service.clone()))
                    .add_service(
                        pb::memory_server::MemoryServer::new(service)
                            .max_decoding_message_size(64 << 20)
                            .max_encoding_message_size(64 << 20),
                    )
                    .serve_with_incoming_shutdown(
                        mesh_node::testing::TlsIncoming::new(
                            tonic::transport::server::TcpIncoming::from(listener),
                            server_tls,
                            revoked,
                            &mesh_node::config::ConnectionLimits::default(),
                        ),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await;
                if let Err(e) = served {
                    eprintln!("hostile peer server: {e}");
                }
                leave.cancel();
                let _ = swim.join();
            });
        });
        let addr = addr_rx.recv().context("hostile server thread")??;
        Ok(HostileServer {
            addr,
            behaviour,
            seen,
            stop: Some(stop),
        })
    }
}

/// How a `Sync` call is answered: from the request, what to send back.
pub type SyncAnswer =
    Arc<dyn Fn(&pb::MemorySyncRequest) -> Result<pb::MemorySyncResponse, Status> + Send + Sync>;

/// What a served hostile peer answers. Shared with the server: a test may change `info` while
/// it runs.
#[derive(Clone)]
pub struct Behaviour {
    /// What `GetInfo`, every `WatchInfo` beat and `ListPeers` answer with.
    pub info: Arc<Mutex<pb::NodeInfo>>,
    /// How `Memory.Sync` is answered (after `sync_delay`).
    pub sync: SyncAnswer,
    /// How long each `Sync` answer takes.
    pub sync_delay: Duration,
    /// How long each `Push` answer takes (a long one: a peer that never answers in time).
    pub push_delay: Duration,
    /// The calls it got.
    pub calls: Arc<Calls>,
}

impl std::fmt::Debug for Behaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Behaviour")
            .field("info", &self.info())
            .field("sync_delay", &self.sync_delay)
            .field("push_delay", &self.push_delay)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl Behaviour {
    /// Answers with `info`, `Sync` with nothing, pushes at once.
    pub fn new(info: pb::NodeInfo) -> Self {
        Self {
            info: Arc::new(Mutex::new(info)),
            sync: Arc::new(|_| Ok(pb::MemorySyncResponse::default())),
            sync_delay: Duration::ZERO,
            push_delay: Duration::ZERO,
            calls: Arc::default(),
        }
    }

    fn info(&self) -> pb::NodeInfo {
        self.info
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// One kind of call a served hostile peer got: how many, and how many at once at most.
#[derive(Debug, Default)]
pub struct Counter {
    total: AtomicUsize,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl Counter {
    /// How many calls came.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// The most that ran at once.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    fn enter(self: &Arc<Self>) -> Running {
        self.total.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Running(self.clone())
    }
}

/// A call being answered; counted out on drop (also when the caller gives up on it).
struct Running(Arc<Counter>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls of one kind, counted per calling node (the id a `Sync` or `Push` declares).
#[derive(Debug, Default)]
pub struct PerCaller(Mutex<HashMap<String, Arc<Counter>>>);

impl PerCaller {
    /// The counter of `caller`'s calls.
    pub fn of(&self, caller: &str) -> Arc<Counter> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(caller.to_owned())
            .or_default()
            .clone()
    }

    /// The most calls one caller had running at once.
    pub fn most(&self) -> usize {
        self.counters().iter().map(|c| c.most()).max().unwrap_or(0)
    }

    /// The calls of every caller.
    pub fn total(&self) -> usize {
        self.counters().iter().map(|c| c.total()).sum()
    }

    fn counters(&self) -> Vec<Arc<Counter>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}

/// The calls a served hostile peer got, per calling node.
#[derive(Debug, Default)]
pub struct Calls {
    /// `Memory.Sync` calls.
    pub sync: PerCaller,
    /// `Sync` calls that asked from the start (an empty `after`): pulls begun.
    pub sync_from_start: PerCaller,
    /// `Memory.Push` calls.
    pub push: PerCaller,
}

/// A served hostile peer; it stops on drop.
#[derive(Debug)]
pub struct HostileServer {
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    /// What it answers, and the calls it got.
    pub behaviour: Behaviour,
    /// Where it hears of candidate members, as a node hears of them from discovery.
    seen: tokio::sync::mpsc::Sender<mesh_node::testing::DiscoveryEvent>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl HostileServer {
    /// Makes it announce itself to the member at `addr` (SWIM's join), as a node does to a
    /// static peer: a test that needs its nodes to know each other first starts them, then
    /// has this peer come in.
    pub fn announce_to(&self, addr: &str) -> anyhow::Result<()> {
        self.seen
            .blocking_send(mesh_node::testing::DiscoveryEvent::Seen {
                addrs: vec![addr.to_owned()],
                name: None,
                claim: None,
                source: mesh_node::testing::PeerSource::Static,
            })
            .map_err(|_| anyhow::anyhow!("the hostile peer's membership has stopped"))
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The gRPC services of a served hostile peer.
#[derive(Clone)]
struct Service(Arc<Behaviour>);

#[tonic::async_trait]
impl pb::node_server::Node for Service {
    async fn get_info(
        &self,
        _: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        Ok(Response::new(self.0.info()))
    }

    type WatchInfoStream = tokio_stream::wrappers::ReceiverStream<Result<pb::NodeInfo, Status>>;

    async fn watch_info(
        &self,
        _: Request<pb::WatchInfoRequest>,
    ) -> Result<Response<Self::WatchInfoStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let behaviour = self.0.clone();
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(Duration::from_millis(500));
            loop {
                beat.tick().await;
                if tx.send(Ok(behaviour.info())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn revoke(
        &self,
        _: Request<pb::SignedRevocation>,
    ) -> Result<Response<pb::RevokeResponse>, Status> {
        Err(Status::unimplemented(
            "a hostile peer records no revocations",
        ))
    }

    async fn list_peers(
        &self,
        _: Request<pb::ListPeersRequest>,
    ) -> Result<Response<pb::ListPeersResponse>, Status> {
        Ok(Response::new(pb::ListPeersResponse {
            node: Some(self.0.info()),
            peers: Vec::new(),
        }))
    }

    type WatchPeersStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::ListPeersResponse, Status>>;

    async fn watch_peers(
        &self,
        _: Request<pb::WatchPeersRequest>,
    ) -> Result<Response<Self::WatchPeersStream>, Status> {
        Err(Status::unimplemented(
            "a hostile peer has no fleet to watch",
        ))
    }

    async fn drain(
        &self,
        _: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        Err(Status::unimplemented("a hostile peer is never drained"))
    }

    async fn undrain(
        &self,
        _: Request<pb::UndrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        Err(Status::unimplemented("a hostile peer is never drained"))
    }
}

#[tonic::async_trait]
impl pb::memory_server::Memory for Service {
    async fn get(
        &self,
        _: Request<pb::MemoryGetRequest>,
    ) -> Result<Response<pb::MemoryGetResponse>, Status> {
        Err(Status::unimplemented(
            "a hostile peer answers Sync and Push",
        ))
    }

    async fn put(
        &self,
        _: Request<pb::MemoryPutRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        Err(Status::unimplemented(
            "a hostile peer answers Sync and Push",
        ))
    }

    async fn delete(
        &self,
        _: Request<pb::MemoryDeleteRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        Err(Status::unimplemented(
            "a hostile peer answers Sync and Push",
        ))
    }

    async fn list(
        &self,
        _: Request<pb::MemoryListRequest>,
    ) -> Result<Response<pb::MemoryListResponse>, Status> {
        Err(Status::unimplemented(
            "a hostile peer answers Sync and Push",
        ))
    }

    async fn namespaces(
        &self,
        _: Request<pb::MemoryNamespacesRequest>,
    ) -> Result<Response<pb::MemoryNamespacesResponse>, Status> {
        Err(Status::unimplemented(
            "a hostile peer answers Sync and Push",
        ))
    }

    async fn sync(
        &self,
        request: Request<pb::MemorySyncRequest>,
    ) -> Result<Response<pb::MemorySyncResponse>, Status> {
        let caller = &request.get_ref().node;
        let (counter, from_start) = (
            self.0.calls.sync.of(caller),
            self.0.calls.sync_from_start.of(caller),
        );
        let _running = counter.enter();
        let _from_start = request
            .get_ref()
            .after
            .is_empty()
            .then(|| from_start.enter());
        tokio::time::sleep(self.0.sync_delay).await;
        (self.0.sync)(request.get_ref()).map(Response::new)
    }

    async fn push(
        &self,
        request: Request<pb::MemoryPushRequest>,
    ) -> Result<Response<pb::MemoryPushResponse>, Status> {
        let counter = self.0.calls.push.of(&request.get_ref().node);
        let _running = counter.enter();
        tokio::time::sleep(self.0.push_delay).await;
        Ok(Response::new(pb::MemoryPushResponse::default()))
    }
}

/// A SWIM member with `tls`'s identity on UDP at `addr` (the hostile server's port), running
/// on a thread of its own until `leave`.
fn swim_member(
    tls: MeshTls,
    addr: std::net::SocketAddr,
    mut seen: tokio::sync::mpsc::Receiver<mesh_node::testing::DiscoveryEvent>,
    leave: tokio_util::sync::CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use mesh_node::testing::{
        Member, Membership, MembershipParts, Opener, PeerTable, Sealer, lan_config,
    };
    let socket = std::net::UdpSocket::bind(addr).context("bind UDP")?;
    socket.set_nonblocking(true)?;
    let signer = Arc::new(tls.origin_signer()?);
    let opener = Opener::new(Arc::new(tls.origin_verifier()?));
    let bump = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(std::thread::spawn(move || {
        runtime.block_on(async move {
            let socket = match tokio::net::UdpSocket::from_std(socket) {
                Ok(socket) => socket,
                Err(e) => {
                    eprintln!("hostile peer SWIM socket: {e}");
                    return;
                }
            };
            // Nothing about it ever changes (its NodeInfo is the behaviour's): no sender kept.
            let (_, changes) = tokio::sync::watch::channel(0);
            let membership = Membership::new(MembershipParts {
                own: Member {
                    id: signer.id().clone(),
                    addr,
                    bump,
                },
                socket: Arc::new(socket),
                sealer: Arc::new(Sealer::new(signer)),
                opener: Arc::new(opener),
                link: Arc::new(mesh_node::testing::NodeLink::new(tls.dialer())),
                table: Arc::new(PeerTable::default()),
                changes,
                config: lan_config(),
                adverts: mesh_node::testing::AdvertGuard::new(
                    64,
                    64,
                    Arc::new(tokio::sync::Notify::new()),
                ),
            });
            membership.run(&mut seen, leave).await;
        });
    }))
}

/// What a [`MembershipFlood`] sent, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FloodSent {
    /// Copies of the member's datagram stamped now, with a made-up signature (half of them
    /// under the member's run, half under made-up runs): each passes every check that needs no
    /// cryptography.
    pub forged: u64,
    /// Copies stamped an hour ago, with a made-up signature.
    pub stale: u64,
    /// The member's datagram itself, again.
    pub replayed: u64,
    /// Random bytes, and the datagram cut short.
    pub garbage: u64,
}

impl FloodSent {
    /// Every datagram sent.
    pub fn total(&self) -> u64 {
        self.forged + self.stale + self.replayed + self.garbage
    }
}

/// What a [`MembershipFlood`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodMix {
    /// Every kind in [`FloodSent`] in turn.
    Everything,
    /// Only forged copies stamped now: the most a node can be made to check.
    Forged,
}

/// A stranger flooding membership ports from one thread, as fast as it can, from `sources` UDP
/// sockets in turn (each a source the nodes count failures of); see the module doc. Stops on
/// [`MembershipFlood::stop`] or drop.
#[derive(Debug)]
pub struct MembershipFlood {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<FloodSent>>,
}

/// Where the stamp sits in a membership datagram (after the magic and the run).
const STAMP_AT: std::ops::Range<usize> = 12..20;
/// Where the run sits.
const RUN_AT: std::ops::Range<usize> = 4..12;

impl MembershipFlood {
    /// Starts flooding `targets` with what `seen` (one sealed datagram of a member, as captured
    /// on the wire) makes possible.
    pub fn start(
        seen: Vec<u8>,
        targets: Vec<SocketAddr>,
        sources: usize,
        mix: FloodMix,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            seen.len() > 100 && seen.starts_with(b"AMS1"),
            "not a membership datagram"
        );
        anyhow::ensure!(!targets.is_empty() && sources > 0, "nothing to flood");
        let sockets = (0..sources)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()
            .context("bind the flood's sockets")?;
        // The layout: magic, run, stamp, cert_len u16, cert, payload_len u16, payload, sig_len
        // u8, sig (node/src/peers/envelope.rs).
        let u16_at = |at: usize| -> Option<usize> {
            Some(usize::from(u16::from_be_bytes([
                *seen.get(at)?,
                *seen.get(at + 1)?,
            ])))
        };
        let payload_len_at = 22 + u16_at(20).context("cert_len")?;
        let sig_len_at = payload_len_at + 2 + u16_at(payload_len_at).context("payload_len")?;
        let sig_len = usize::from(*seen.get(sig_len_at).context("sig_len")?);
        anyhow::ensure!(
            sig_len_at + 1 + sig_len == seen.len() && sig_len >= 8,
            "not a sealed datagram's layout"
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sent = FloodSent::default();
            let (mut forged, mut stale) = (seen.clone(), seen.clone());
            let mut garbage = vec![0u8; seen.len()];
            let sig_at = seen.len() - sig_len;
            let mut n: u64 = 0;
            let mut now_us = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..1024 {
                    if n.is_multiple_of(1024) {
                        now_us = crate::unix_ms() * 1000;
                    }
                    n += 1;
                    // Different bytes every time: a made-up signature, a counter in garbage.
                    let noise = n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes();
                    let kind = match mix {
                        FloodMix::Everything => n % 4,
                        FloodMix::Forged => 0,
                    };
                    let datagram: &[u8] = match kind {
                        0 => {
                            sent.forged += 1;
                            forged[STAMP_AT].copy_from_slice(&now_us.to_be_bytes());
                            if n.is_multiple_of(8) {
                                forged[RUN_AT].copy_from_slice(&noise);
                            } else {
                                forged[RUN_AT].copy_from_slice(&seen[RUN_AT]);
                            }
                            forged[sig_at..sig_at + 8].copy_from_slice(&noise);
                            &forged
                        }
                        1 => {
                            sent.stale += 1;
                            let hour_ago = now_us.saturating_sub(3_600_000_000) + n % 1000;
                            stale[STAMP_AT].copy_from_slice(&hour_ago.to_be_bytes());
                            stale[sig_at..sig_at + 8].copy_from_slice(&noise);
                            &stale
                        }
                        2 => {
                            sent.replayed += 1;
                            &seen
                        }
                        _ => {
                            sent.garbage += 1;
                            for chunk in garbage.chunks_mut(8) {
                                chunk.copy_from_slice(&noise[..chunk.len()]);
                            }
                            if n % 8 == 3 {
                                &seen[..seen.len() / 2]
                            } else {
                                &garbage
                            }
                        }
                    };
                    let socket = &sockets[(n as usize / targets.len()) % sockets.len()];
                    let target = targets[(n as usize) % targets.len()];
                    // Refused (ICMP), or the kernel's buffers full: a flood does not care.
                    let _ = socket.send_to(datagram, target);
                }
            }
            sent
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the flood; what it sent.
    pub fn stop(mut self) -> FloodSent {
        self.halt()
    }

    fn halt(&mut self) -> FloodSent {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for MembershipFlood {
    fn drop(&mut self) {
        self.halt();
    }
}
