//! gRPC adapters: protobuf in, domain types out, and back. The `Node` service handlers and the
//! client side of the same service ([`PeerClient`]) both live here, so prost types never travel
//! further than this module.
//!
//! Every message from the network is bounded and checked here ([`TryFrom`] into domain types);
//! bad input becomes `INVALID_ARGUMENT` naming the field. Handlers decide nothing themselves:
//! they read the capabilities and the peer table, hand dial-in introductions to membership,
//! and a drain to `tasks::Drain` once the admission says the caller may (`drain`).

pub(crate) mod accept;
pub(crate) mod approvals;
pub(crate) mod cron;
mod drain;
pub(crate) mod gate;
pub(crate) mod join;
pub(crate) mod keys;
pub(crate) mod memory;
pub(crate) mod models;
pub(crate) mod settings;
pub(crate) mod tasks;
pub(crate) mod tools;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use mesh_cert::{CertIdentity, CertRole};
use mesh_domain::{BoxFuture, NodeId, NodeInfo, sync::MutexExt};
use mesh_proto::convert::{check_len, peer_state};
use mesh_proto::v1 as pb;
use mesh_tls::{
    DialError, Dialer,
    deadline::{Deadlines, within},
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};

use crate::{
    admission::Admission,
    capabilities::Capabilities,
    discovery::{Claim, DiscoveryEvent, PeerSource},
    memory::Memory,
    peers::{FleetView, LinkError, PeerLink, PeerTable, PeerView},
    storage::StoreError,
    tasks::Drain,
};

/// Largest message a node accepts (decoded).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Most peers taken from one `ListPeers` answer.
const MAX_LIST: usize = 256;
/// Most `WatchPeers` streams open at once on a node: each holds a task and sends the fleet's
/// view at every change, so a caller may not open them without bound.
pub(crate) const MAX_PEER_WATCHERS: usize = 64;
/// How often `WatchPeers` sends the view when nothing changed (last-seen times and lag move).
const PEER_WATCH_REFRESH: Duration = Duration::from_secs(5);
/// Bounds on the beat interval a watcher may ask for.
const MIN_BEAT: Duration = Duration::from_millis(250);
const MAX_BEAT: Duration = Duration::from_secs(2);

impl From<Status> for LinkError {
    fn from(status: Status) -> Self {
        if status.code() == tonic::Code::Unavailable && status.message().contains(LEAVING) {
            Self::Leaving
        } else {
            Self::Failed(format!("{}: {}", status.code(), status.message()))
        }
    }
}

const LEAVING: &str = "node is shutting down";

/// The `agentmesh.v1.Node` service.
#[derive(Debug, Clone)]
pub(crate) struct NodeService {
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
    /// Dial-in introductions go to membership through the discovery channel.
    introductions: mpsc::Sender<DiscoveryEvent>,
    /// Cancelled when the node starts shutting down: open `WatchInfo` streams end cleanly.
    leaving: CancellationToken,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
    /// For replication lag in `ListPeers`.
    memory: Option<Arc<Memory>>,
    /// One permit per open `WatchPeers` stream ([`MAX_PEER_WATCHERS`]).
    peer_watchers: Arc<tokio::sync::Semaphore>,
    /// `Drain` and `Undrain`: the drain, and who may ask for it.
    drain: Option<Arc<Drain>>,
    admission: Option<Arc<Admission>>,
}

impl NodeService {
    /// Wires the service to the node's parts.
    pub(crate) fn new(
        caps: Arc<Capabilities>,
        peers: Arc<PeerTable>,
        introductions: mpsc::Sender<DiscoveryEvent>,
        leaving: CancellationToken,
        tls: bool,
    ) -> Self {
        Self {
            caps,
            peers,
            introductions,
            leaving,
            tls,
            memory: None,
            peer_watchers: Arc::new(tokio::sync::Semaphore::new(MAX_PEER_WATCHERS)),
            drain: None,
            admission: None,
        }
    }

    /// This node and every peer it knows, as `ListPeers` answers.
    fn fleet_view(&self) -> pb::ListPeersResponse {
        let peers = self
            .peers
            .snapshot()
            .into_iter()
            .map(|peer| {
                let (lag_records, lag_ms) = self
                    .memory
                    .as_ref()
                    .map(|m| m.lag(&peer.info.id, peer.info.memory_seq))
                    .unwrap_or_default();
                pb::Peer {
                    info: Some((&peer.info).into()),
                    addr: peer.addr.clone(),
                    state: pb::PeerState::from(peer.state) as i32,
                    last_seen_ms: peer.last_seen_ms(),
                    source: peer.source.as_str().into(),
                    lag_records,
                    lag_ms,
                }
            })
            .collect();
        let own = self.caps.snapshot();
        let peers = with_revoked(peers, self.memory.as_deref());
        pb::ListPeersResponse {
            peers: fold_revoked(&own.name, peers),
            node: Some((&own).into()),
        }
    }

    /// Drains the node with `drain` when an operator asks, as `admission` decides.
    pub(crate) fn with_drain(mut self, drain: Arc<Drain>, admission: Arc<Admission>) -> Self {
        self.drain = Some(drain);
        self.admission = Some(admission);
        self
    }

    /// Reports replication lag from `memory` in `ListPeers`.
    pub(crate) fn with_memory(mut self, memory: Arc<Memory>) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The tonic server for this service, with message size limits.
    pub(crate) fn into_server(self) -> pb::node_server::NodeServer<Self> {
        pb::node_server::NodeServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * MAX_MESSAGE_BYTES)
    }

    fn introduce<T>(&self, request: &Request<T>, hello: pb::PeerHello) -> Result<(), Status> {
        let id = NodeId::parse(&hello.id)
            .map_err(|e| Status::invalid_argument(format!("hello.id: {e}")))?;
        let port = u16::try_from(hello.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Status::invalid_argument("hello.port: must be 1-65535"))?;
        check_len("hello.name", &hello.name, 63)?;
        if self.tls {
            let presented = caller_identity(request)?;
            if presented.role == Some(CertRole::Client) {
                return Err(Status::permission_denied(
                    "a client certificate cannot introduce itself as a node",
                ));
            }
            if presented.id != id {
                return Err(Status::permission_denied(
                    "hello.id does not match the certificate you presented",
                ));
            }
        }
        let Some(remote) = request.remote_addr() else {
            return Ok(());
        };
        let addr = SocketAddr::new(remote.ip(), port).to_string();
        let event = DiscoveryEvent::Seen {
            addrs: vec![addr],
            name: Some(hello.name),
            claim: Some(Claim {
                id,
                fingerprint: None,
            }),
            source: PeerSource::DialIn,
        };
        // Membership may be busy; a dropped introduction is repeated on the next dial.
        let _ = self.introductions.try_send(event);
        Ok(())
    }
}

type InfoStreamOut = std::pin::Pin<Box<dyn Stream<Item = Result<pb::NodeInfo, Status>> + Send>>;
type PeersStreamOut =
    std::pin::Pin<Box<dyn Stream<Item = Result<pb::ListPeersResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    async fn get_info(
        &self,
        _request: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        Ok(Response::new((&self.caps.snapshot()).into()))
    }

    type WatchInfoStream = InfoStreamOut;

    async fn watch_info(
        &self,
        request: Request<pb::WatchInfoRequest>,
    ) -> Result<Response<Self::WatchInfoStream>, Status> {
        if self.leaving.is_cancelled() {
            return Err(Status::unavailable(LEAVING));
        }
        let interval = match request.get_ref().interval_ms {
            0 => MAX_BEAT / 2,
            ms => Duration::from_millis(u64::from(ms)).clamp(MIN_BEAT, MAX_BEAT),
        };
        if let Some(hello) = request.get_ref().hello.clone() {
            self.introduce(&request, hello)?;
        }
        let caps = self.caps.clone();
        let leaving = self.leaving.clone();
        let mut changed = caps.subscribe();
        let stream = stream_from(move |tx| async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = leaving.cancelled() => return,
                    () = tx.closed() => return,
                    _ = tick.tick() => {}
                    Ok(()) = changed.changed() => {}
                }
                if tx.send(Ok((&caps.snapshot()).into())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_peers(
        &self,
        _request: Request<pb::ListPeersRequest>,
    ) -> Result<Response<pb::ListPeersResponse>, Status> {
        Ok(Response::new(self.fleet_view()))
    }

    type WatchPeersStream = PeersStreamOut;

    async fn watch_peers(
        &self,
        _request: Request<pb::WatchPeersRequest>,
    ) -> Result<Response<Self::WatchPeersStream>, Status> {
        if self.leaving.is_cancelled() {
            return Err(Status::unavailable(LEAVING));
        }
        let permit = self.peer_watchers.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this node already serves {MAX_PEER_WATCHERS} fleet watchers (`mesh-cli status --watch`); stop one first"
            ))
        })?;
        let this = self.clone();
        let mut peers_changed = self.peers.subscribe();
        let mut own_changed = self.caps.subscribe();
        let stream = stream_from(move |tx| async move {
            let _permit = permit;
            let mut refresh = tokio::time::interval(PEER_WATCH_REFRESH);
            refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = this.leaving.cancelled() => return,
                    () = tx.closed() => return,
                    _ = refresh.tick() => {}
                    Ok(()) = peers_changed.changed() => {}
                    Ok(()) = own_changed.changed() => {}
                }
                if tx.send(Ok(this.fleet_view())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn drain(
        &self,
        request: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        self.drain_call(&request)
    }

    async fn undrain(
        &self,
        request: Request<pb::UndrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        self.undrain_call(&request)
    }

    async fn revoke(
        &self,
        request: Request<pb::SignedRevocation>,
    ) -> Result<Response<pb::RevokeResponse>, Status> {
        // Any caller the gate let through may call: the CA's signature, checked by the memory
        // before anything is stored, is what authorizes a revocation.
        let Some(memory) = &self.memory else {
            return Err(Status::failed_precondition(
                "this node keeps no memory, so it cannot record revocations",
            ));
        };
        let signed = prost::Message::encode_to_vec(request.get_ref());
        let (revocation, new) = memory.revoke(&signed).await?;
        self.peers.revoke(&revocation.id);
        Ok(Response::new(pb::RevokeResponse { new }))
    }
}

/// `peers` plus a `revoked` row for every revoked certificate not among them (one never met,
/// or met before this node restarted), so `mesh-cli status` lists every revoked device.
fn with_revoked(mut peers: Vec<pb::Peer>, memory: Option<&Memory>) -> Vec<pb::Peer> {
    let Some(memory) = memory else {
        return peers;
    };
    for revocation in memory.revoked().list() {
        let id = revocation.id.to_string();
        if peers
            .iter()
            .any(|p| p.info.as_ref().is_some_and(|info| info.id == id))
        {
            continue;
        }
        peers.push(pb::Peer {
            info: Some(pb::NodeInfo {
                id,
                name: revocation.name,
                ..Default::default()
            }),
            state: pb::PeerState::Revoked as i32,
            last_seen_ms: revocation.revoked_at_ms,
            ..Default::default()
        });
    }
    peers
}

/// `peers` without the `revoked` rows whose name a live row (or this node, `own`) holds: a
/// device that joined again after its certificate was revoked is listed once, as it is now,
/// not once more for good as the certificate it had.
fn fold_revoked(own: &str, peers: Vec<pb::Peer>) -> Vec<pb::Peer> {
    let revoked = pb::PeerState::Revoked as i32;
    let name = |peer: &pb::Peer| peer.info.as_ref().map(|info| info.name.clone());
    let live: std::collections::HashSet<String> = peers
        .iter()
        .filter(|peer| peer.state != revoked)
        .filter_map(name)
        .chain(std::iter::once(own.to_owned()))
        .collect();
    peers
        .into_iter()
        .filter(|peer| peer.state != revoked || name(peer).is_none_or(|n| !live.contains(&n)))
        .collect()
}

/// Runs `body` with the sending half of a channel and streams what it sends.
pub(crate) fn stream_from<T, F, Fut>(body: F) -> impl Stream<Item = Result<T, Status>> + Send
where
    T: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(body(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A storage failure as a status: a full disk is `RESOURCE_EXHAUSTED` (callers, the router
/// among them, try another node), anything else `UNAVAILABLE`. `message` is the whole error's.
pub(crate) fn store_status(error: &StoreError, message: String) -> Status {
    match error {
        StoreError::DiskFull(_) => Status::resource_exhausted(message),
        StoreError::Engine(_) => Status::unavailable(message),
    }
}

/// A status a peer answered, in words: its message, or the code's description when it sent
/// none (never both, so a node's own sentence is not prefixed with the code's).
pub(crate) fn status_words(status: &Status) -> String {
    if status.message().is_empty() {
        status.code().to_string()
    } else {
        status.message().to_owned()
    }
}

/// The identity in the client certificate of a request.
pub(crate) fn caller_identity<T>(request: &Request<T>) -> Result<CertIdentity, Status> {
    let certs = request.peer_certs().ok_or_else(|| {
        Status::unauthenticated("a client certificate from the mesh CA is required")
    })?;
    let first = certs.first().ok_or_else(|| {
        Status::unauthenticated("a client certificate from the mesh CA is required")
    })?;
    let identity =
        CertIdentity::from_der(first).map_err(|e| Status::unauthenticated(e.to_string()))?;
    if identity.role.is_none() {
        warn_legacy_once(&identity);
    }
    Ok(identity)
}

/// Names a caller whose certificate carries no role (issued before roles existed) once: such a
/// caller is trusted least (both tier caps), and its owner should re-issue it. The set of names
/// already logged is bounded; past it, nothing more is logged.
fn warn_legacy_once(identity: &CertIdentity) {
    const MAX_NAMED: usize = 1024;
    static NAMED: std::sync::Mutex<Option<std::collections::HashSet<NodeId>>> =
        std::sync::Mutex::new(None);
    let mut named = NAMED.lock_unpoisoned();
    let named = named.get_or_insert_with(Default::default);
    if named.len() < MAX_NAMED && named.insert(identity.id.clone()) {
        tracing::warn!(
            caller = identity.common_name.as_deref().unwrap_or(""),
            id = %identity.id.short(),
            "a caller's certificate carries no role (issued before roles existed): it is trusted \
             least (both security.remote_max_tier and security.client_max_tier cap its tasks); \
             issue it a new one with `mesh-cli ca issue --role node|client`"
        );
    }
}

/// How long a cached channel to a peer stays unused before it is dropped (its connection
/// closes once no call holds it): a node keeps connections only to the peers it talks to.
pub(crate) const CHANNEL_IDLE: Duration = Duration::from_secs(60);

/// One kept-open channel per peer address, shared by the delegation, chat and replication
/// clients, so a forwarded task or a push does not pay a TCP and TLS handshake; with the
/// deadlines every call on them gets. A channel unused for [`CHANNEL_IDLE`] is dropped (checked
/// at every use of the cache; replication uses it every sync interval).
#[derive(Debug, Clone)]
pub struct PeerChannels {
    dialer: Dialer,
    /// Told of addresses whose connection is refused, so membership suspects them at once.
    table: Option<Arc<PeerTable>>,
    /// The channels by address, with when each was last handed out.
    channels: Arc<std::sync::Mutex<std::collections::HashMap<String, (Channel, Instant)>>>,
    /// How long each call on these channels may take (tests shorten them).
    deadlines: Deadlines,
    /// How long an unused channel is kept ([`CHANNEL_IDLE`]; tests shorten it).
    idle: Duration,
}

impl PeerChannels {
    /// Dials with `dialer` on first use of an address; calls get the mesh's
    /// [`mesh_tls::deadline::DEADLINES`].
    pub fn new(dialer: Dialer) -> Self {
        Self {
            dialer,
            table: None,
            channels: Arc::default(),
            deadlines: Deadlines::default(),
            idle: CHANNEL_IDLE,
        }
    }

    /// The same, dropping channels unused for `idle` (tests).
    pub fn with_idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// The addresses a channel is cached for.
    pub fn cached(&self) -> Vec<String> {
        self.channels.lock_unpoisoned().keys().cloned().collect()
    }

    /// The same, reporting refused connections to `table` ([`PeerTable::report_unreachable`]).
    pub fn reporting_to(mut self, table: Arc<PeerTable>) -> Self {
        self.table = Some(table);
        self
    }

    /// The same, with other deadlines (tests wait for a silent peer in milliseconds).
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// How long each call on these channels may take.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// The channel to `addr`, dialing it the first time.
    pub async fn get(&self, addr: &str) -> Result<Channel, DialError> {
        let now = Instant::now();
        {
            let mut channels = self.channels.lock_unpoisoned();
            channels.retain(|_, (_, used)| now.duration_since(*used) < self.idle);
            if let Some((channel, used)) = channels.get_mut(addr) {
                *used = now;
                return Ok(channel.clone());
            }
        }
        let channel = match self.dialer.connect(addr).await {
            Ok(connection) => connection.channel,
            Err(e) => {
                if let (DialError::Refused(_), Some(table)) = (&e, &self.table) {
                    table.report_unreachable(addr);
                }
                return Err(e);
            }
        };
        self.channels
            .lock_unpoisoned()
            .insert(addr.to_owned(), (channel.clone(), Instant::now()));
        Ok(channel)
    }

    /// Drops the channel to `addr` after a failure, so the next use dials afresh.
    pub fn forget(&self, addr: &str) {
        self.channels.lock_unpoisoned().remove(addr);
    }
}

/// A client for another node's `Node` service.
#[derive(Debug, Clone)]
pub struct PeerClient {
    inner: pb::node_client::NodeClient<Channel>,
    deadlines: Deadlines,
}

/// Membership's link to peers: fetches a member's `NodeInfo` over a fresh connection of the
/// node's dialer (it is needed only when the member's version changes, so no connection is
/// kept for it), checking that the certificate presented is the member's.
#[derive(Debug, Clone)]
pub struct NodeLink {
    dialer: Dialer,
    deadlines: Deadlines,
}

impl NodeLink {
    /// Dials with `dialer`; calls get the mesh's [`mesh_tls::deadline::DEADLINES`].
    pub fn new(dialer: Dialer) -> Self {
        Self {
            dialer,
            deadlines: Deadlines::default(),
        }
    }

    /// The same, with other deadlines (tests wait for a silent peer in milliseconds).
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// A channel to member `id` at `addr`, refused when the certificate presented there is a
    /// client's or another node's; with the certificate's identity (`None` without TLS).
    async fn member_channel(
        &self,
        addr: &str,
        id: &NodeId,
    ) -> Result<(PeerClient, Option<CertIdentity>), LinkError> {
        let connection = self
            .dialer
            .connect(addr)
            .await
            .map_err(|e| LinkError::Failed(format!("dial {addr}: {e}")))?;
        if let Some(presented) = &connection.peer {
            if presented.role == Some(CertRole::Client) {
                return Err(LinkError::Invalid(
                    "the peer presents a client certificate, which may never serve as a node"
                        .into(),
                ));
            }
            if presented.id != *id {
                return Err(LinkError::Invalid(format!(
                    "the node at {addr} presents the certificate of {}, not of member {}",
                    presented.id.short(),
                    id.short()
                )));
            }
        }
        Ok((
            PeerClient::new(connection.channel).with_deadlines(self.deadlines),
            connection.peer,
        ))
    }
}

impl PeerLink for NodeLink {
    fn info<'a>(
        &'a self,
        addr: &'a str,
        id: &'a NodeId,
    ) -> BoxFuture<'a, Result<NodeInfo, LinkError>> {
        Box::pin(async move {
            let (mut client, presented) = self.member_channel(addr, id).await?;
            let info = client.info().await?;
            if info.id != *id {
                return Err(LinkError::Invalid(format!(
                    "GetInfo at {addr} answered for {}, not for member {}",
                    info.id.short(),
                    id.short()
                )));
            }
            // A node's name is the one its certificate was issued for, so `--on NAME` can only
            // reach the holder of that certificate (issue 26: a certificate issued to `evil`
            // with `name = "a"` in its config got every task meant for `a`).
            if let Some(presented) = presented
                && presented.common_name.as_deref() != Some(info.name.as_str())
            {
                return Err(LinkError::Invalid(match presented.common_name {
                    Some(cn) => format!(
                        "it calls itself `{}`, but its certificate was issued to `{cn}`",
                        info.name
                    ),
                    None => format!(
                        "it calls itself `{}`, but its certificate names no node (no common name)",
                        info.name
                    ),
                }));
            }
            Ok(info)
        })
    }

    fn members<'a>(
        &'a self,
        addr: &'a str,
        id: &'a NodeId,
    ) -> BoxFuture<'a, Result<Vec<(NodeId, String)>, LinkError>> {
        Box::pin(async move {
            let view = self.member_channel(addr, id).await?.0.list_peers().await?;
            Ok(view
                .peers
                .into_iter()
                .filter(|p| {
                    matches!(
                        p.state,
                        mesh_domain::PeerState::Up | mesh_domain::PeerState::Suspect
                    )
                })
                .map(|p| (p.info.id, p.addr))
                .collect())
        })
    }
}

impl PeerClient {
    /// Wraps an open channel; calls get the mesh's [`mesh_tls::deadline::DEADLINES`].
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: pb::node_client::NodeClient::new(channel)
                .max_decoding_message_size(4 * MAX_MESSAGE_BYTES),
            deadlines: Deadlines::default(),
        }
    }

    /// The same, with other deadlines.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// Calls `GetInfo`.
    pub async fn info(&mut self) -> Result<NodeInfo, LinkError> {
        let info = within(
            self.deadlines.unary,
            "Node.GetInfo",
            self.inner.get_info(pb::GetInfoRequest {}),
        )
        .await?
        .into_inner();
        NodeInfo::try_from(info).map_err(|s| LinkError::Invalid(s.message().to_owned()))
    }

    /// Calls `ListPeers`.
    pub async fn list_peers(&mut self) -> Result<FleetView, LinkError> {
        let limit = self.deadlines.unary;
        let response = within(
            limit,
            "Node.ListPeers",
            self.inner.list_peers(pb::ListPeersRequest {}),
        )
        .await?
        .into_inner();
        let invalid = |s: Status| LinkError::Invalid(s.message().to_owned());
        let own = response
            .node
            .ok_or_else(|| LinkError::Invalid("ListPeersResponse.node is missing".into()))
            .and_then(|info| NodeInfo::try_from(info).map_err(invalid))?;
        let mut peers = Vec::new();
        for peer in response.peers.into_iter().take(MAX_LIST) {
            let Some(info) = peer.info else { continue };
            let Ok(info) = NodeInfo::try_from(info) else {
                continue;
            };
            let state = peer_state(peer.state);
            if check_len("peers.addr", &peer.addr, 300).is_err() {
                continue;
            }
            peers.push(PeerView {
                info,
                addr: peer.addr,
                state,
                last_seen_ms: peer.last_seen_ms,
            });
        }
        Ok(FleetView { own, peers })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use mesh_cert::{OriginSigner, OriginVerifier};
    use mesh_domain::{ChatRequest, Message, Role, Target, TaskSpec};
    use tokio::net::TcpListener;

    use super::*;
    use crate::{
        chat::RemoteChat,
        memory::{MemoryOptions, MemoryPeers, SyncRequest},
        storage::SledStore,
        tasks::Forwarder,
    };

    /// What a silent peer does with every call.
    #[derive(Clone, Copy)]
    enum Silence {
        /// Accepts the call and never answers it.
        Nothing,
        /// Answers with the headers of a gRPC response, then never sends a message.
        AfterHeaders,
    }

    /// Issue 28: a device that joined again after its certificate was revoked was listed twice
    /// for good, once as the revoked certificate; a revoked row is shown only while no live
    /// row (nor the answering node) holds its name.
    #[test]
    fn a_revoked_row_whose_name_is_live_again_is_folded_away() {
        let row = |name: &str, id: &str, state: pb::PeerState| pb::Peer {
            info: Some(pb::NodeInfo {
                name: name.into(),
                id: id.into(),
                ..Default::default()
            }),
            state: state as i32,
            ..Default::default()
        };
        let peers = vec![
            row("homeserver", "old", pb::PeerState::Revoked),
            row("homeserver", "new", pb::PeerState::Up),
            row("gone", "g", pb::PeerState::Revoked),
            row("me", "mine-before", pb::PeerState::Revoked),
            row("down", "d", pb::PeerState::Down),
        ];
        let ids: Vec<String> = fold_revoked("me", peers)
            .into_iter()
            .filter_map(|p| p.info.map(|info| info.id))
            .collect();
        assert_eq!(ids, ["new", "g", "d"]);
    }

    /// Issue 17, point 4: a channel unused for the idle time is dropped from the cache (its
    /// connection closes with the last call holding it), one in use is kept.
    #[tokio::test]
    async fn a_channel_unused_for_the_idle_time_is_dropped() {
        let idle = Duration::from_millis(200);
        let channels = PeerChannels::new(Dialer::Plain).with_idle(idle);
        let (quiet, busy) = (
            silent_peer(Silence::Nothing).await,
            silent_peer(Silence::Nothing).await,
        );
        channels.get(&quiet).await.expect("dial quiet");
        channels.get(&busy).await.expect("dial busy");
        let started = Instant::now();
        while started.elapsed() < idle * 2 {
            // `busy` is used every 50 ms; `quiet` never again.
            tokio::time::sleep(Duration::from_millis(50)).await; // the pace of use under test
            channels.get(&busy).await.expect("busy");
        }
        assert_eq!(channels.cached(), [busy]);
    }

    /// A gRPC server on loopback that accepts any call and goes silent: a hung or hostile peer.
    async fn silent_peer(silence: Silence) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let router = axum::Router::new().fallback(move || async move {
            if let Silence::Nothing = silence {
                std::future::pending::<()>().await;
            }
            let body = axum::body::Body::from_stream(tokio_stream::pending::<
                Result<axum::body::Bytes, std::io::Error>,
            >());
            axum::http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body)
                .expect("response")
        });
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::from(router))
                .serve_with_incoming(incoming),
        );
        addr
    }

    const SHORT: Duration = Duration::from_millis(300);

    fn short() -> Deadlines {
        Deadlines {
            unary: SHORT,
            sync: SHORT,
            push: SHORT,
            open: SHORT,
            task_idle: SHORT,
            chat_idle: SHORT,
            chat: SHORT * 2,
            tool: SHORT,
        }
    }

    /// Awaits `call`, which must end (with an error naming `what`) soon after its deadline.
    async fn fails_in_time<T: std::fmt::Debug, E: std::fmt::Display>(
        what: &str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) {
        let started = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{what} still waits for a silent peer after 10 s"));
        let error = outcome.expect_err("a silent peer's call fails").to_string();
        assert!(error.contains(what), "{what}: {error}");
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
    }

    fn memory() -> (tempfile::TempDir, Arc<Memory>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(OriginSigner::generate().expect("signer")),
            Arc::new(OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        (dir, memory)
    }

    /// Every kind of call a node makes to a peer ends at its deadline when the peer accepts it
    /// and goes silent (before answering, or between messages of a stream), and the same
    /// clients go on serving with a peer that answers.
    #[tokio::test]
    async fn calls_to_a_peer_that_goes_silent_fail_at_their_deadlines_and_others_still_work() {
        let silent = silent_peer(Silence::Nothing).await;
        let headers_only = silent_peer(Silence::AfterHeaders).await;
        let channels = PeerChannels::new(Dialer::Plain).with_deadlines(short());
        let (_dir, local) = memory();
        let own = local.own_id().clone();

        let replication = memory::RemoteMemory::new(channels.clone(), own.clone());
        let sync = SyncRequest {
            node: Some(own.clone()),
            after: Default::default(),
            frontier: Default::default(),
        };
        fails_in_time(
            "Memory.Sync",
            replication.sync(silent.clone(), sync.clone()),
        )
        .await;
        fails_in_time(
            "Memory.Push",
            replication.push(silent.clone(), Vec::new(), Vec::new()),
        )
        .await;

        let forwarding = tasks::RemoteTasks::new(channels.clone());
        let spec = TaskSpec::new("hi", Target::Model("m".into()));
        fails_in_time(
            "Tasks.Submit",
            forwarding.forward(silent.clone(), spec.clone()),
        )
        .await;
        let mut events = forwarding
            .forward(headers_only.clone(), spec)
            .await
            .expect("the stream opens");
        // Said to people as what happened, not as the call's name.
        fails_in_time("went away mid-task (it sent nothing for 300 ms)", async {
            events.recv().await.expect("the relay reports the silence")
        })
        .await;
        tokio::time::timeout(
            Duration::from_secs(5),
            forwarding.cancel(silent.clone(), "t".into()),
        )
        .await
        .expect("a cancel gives up at its deadline");

        let chats = models::RemoteModels::new(channels.clone());
        let request = ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        };
        let (deltas, _) = crate::llm::delta_channel();
        let target = Target::Model("m".into());
        let message = |e: crate::chat::RemoteChatError| e.message;
        fails_in_time("Models.Chat", async {
            chats
                .chat(&silent, &target, &request, &deltas)
                .await
                .map_err(message)
        })
        .await;
        fails_in_time("Models.Chat stream", async {
            chats
                .chat(&headers_only, &target, &request, &deltas)
                .await
                .map_err(message)
        })
        .await;

        let tools = tools::RemoteToolsClient::new(channels.clone());
        let call = crate::agent::tools::RemoteCall {
            name: "time__now".into(),
            arguments: "{}".into(),
            tier: mesh_domain::Tier::Read,
            task_id: String::new(),
            started_by: None,
        };
        fails_in_time("Tools.Call", {
            use crate::agent::tools::RemoteTools;
            tools.call(&silent, &call, None)
        })
        .await;

        let link = NodeLink::new(Dialer::Plain).with_deadlines(short());
        fails_in_time("Node.GetInfo", link.info(&silent, &own)).await;
        let mut client =
            PeerClient::new(channels.get(&silent).await.expect("connects")).with_deadlines(short());
        fails_in_time("Node.ListPeers", client.list_peers()).await;

        // A peer that answers is still served by the same clients.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let answering = listener.local_addr().expect("addr").to_string();
        let (_peer_dir, peer) = memory();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(memory::MemoryService::new(peer, false).into_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        replication
            .sync(answering, sync)
            .await
            .expect("a peer that answers is synced");
    }
}
