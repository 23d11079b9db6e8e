//! gRPC adapters: protobuf in, domain types out, and back. The `Node` service handlers and the
//! client side of the same service ([`PeerClient`]) both live here, so prost types never travel
//! further than this module.
//!
//! Every message from the network is bounded and checked here ([`TryFrom`] into domain types);
//! bad input becomes `INVALID_ARGUMENT` naming the field. Handlers decide nothing themselves:
//! they read the capabilities and the peer table, and hand dial-in introductions to membership.

pub mod cron;
pub mod memory;
pub mod models;
pub mod tasks;

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use mesh_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};

use crate::{
    capabilities::{
        Capabilities, Gpu, Health, HealthStatus, Load, ModelInfo, NodeInfo, PersonaInfo, Resources,
    },
    config::Tier,
    discovery::{Claim, DiscoveryEvent, PeerSource},
    identity::{CertIdentity, NodeId},
    peers::{PeerState, PeerTable},
};

/// Largest message a node accepts (decoded).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Limits on lists and strings inside `NodeInfo`.
const MAX_LIST: usize = 256;
const MAX_STRING: usize = 1024;
/// Bounds on the beat interval a watcher may ask for.
const MIN_BEAT: Duration = Duration::from_millis(250);
const MAX_BEAT: Duration = Duration::from_secs(2);

/// A node introducing itself when it watches another (peer exchange and dial-back).
#[derive(Debug, Clone)]
pub struct Hello {
    /// Node name.
    pub name: String,
    /// Node id.
    pub id: NodeId,
    /// Port it listens on.
    pub port: u16,
}

/// One peer as another node reports it (`ListPeers`).
#[derive(Debug, Clone)]
pub struct PeerView {
    /// Its latest info.
    pub info: NodeInfo,
    /// Address the reporting node reaches it at.
    pub addr: String,
    /// State in the reporting node's table.
    pub state: PeerState,
    /// Unix ms of its last beat.
    pub last_seen_ms: u64,
}

/// A node's answer to `ListPeers`.
#[derive(Debug, Clone)]
pub struct FleetView {
    /// The node that answered.
    pub own: NodeInfo,
    /// Its peers.
    pub peers: Vec<PeerView>,
}

/// Errors calling a peer.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The peer answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(Status),
    /// The peer is shutting down.
    #[error("peer is shutting down")]
    Leaving,
    /// The peer sent something that fails validation.
    #[error("invalid message from peer: {0}")]
    Invalid(String),
}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        if status.code() == tonic::Code::Unavailable && status.message().contains(LEAVING) {
            Self::Leaving
        } else {
            Self::Status(status)
        }
    }
}

const LEAVING: &str = "node is shutting down";

/// The `agentmesh.v1.Node` service.
#[derive(Debug, Clone)]
pub struct NodeService {
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
    /// Dial-in introductions go to membership through the discovery channel.
    introductions: mpsc::Sender<DiscoveryEvent>,
    /// Cancelled when the node starts shutting down: open `WatchInfo` streams end cleanly.
    leaving: CancellationToken,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
    /// For replication lag in `ListPeers`.
    memory: Option<Arc<crate::memory::Memory>>,
}

impl NodeService {
    /// Wires the service to the node's parts.
    pub fn new(
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
        }
    }

    /// Reports replication lag from `memory` in `ListPeers`.
    pub fn with_memory(mut self, memory: Arc<crate::memory::Memory>) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The tonic server for this service, with message size limits.
    pub fn into_server(self) -> pb::node_server::NodeServer<Self> {
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
                    state: pb_state(peer.state) as i32,
                    last_seen_ms: peer.last_seen_ms(),
                    source: peer.source.as_str().into(),
                    lag_records,
                    lag_ms,
                }
            })
            .collect();
        Ok(Response::new(pb::ListPeersResponse {
            node: Some((&self.caps.snapshot()).into()),
            peers,
        }))
    }
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

/// The identity in the client certificate of a request.
pub fn caller_identity<T>(request: &Request<T>) -> Result<CertIdentity, Status> {
    let certs = request.peer_certs().ok_or_else(|| {
        Status::unauthenticated("a client certificate from the mesh CA is required")
    })?;
    let first = certs.first().ok_or_else(|| {
        Status::unauthenticated("a client certificate from the mesh CA is required")
    })?;
    CertIdentity::from_der(first).map_err(|e| Status::unauthenticated(e.to_string()))
}

/// One kept-open channel per peer address, shared by the delegation and replication clients, so
/// a forwarded task or a push does not pay a TCP and TLS handshake.
#[derive(Debug, Clone)]
pub struct PeerChannels {
    dialer: crate::tls::Dialer,
    channels: Arc<std::sync::Mutex<std::collections::HashMap<String, Channel>>>,
}

impl PeerChannels {
    /// Dials with `dialer` on first use of an address.
    pub fn new(dialer: crate::tls::Dialer) -> Self {
        Self {
            dialer,
            channels: Arc::default(),
        }
    }

    /// The channel to `addr`, dialing it the first time.
    pub async fn get(&self, addr: &str) -> Result<Channel, crate::tls::DialError> {
        let cached = self
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(addr)
            .cloned();
        if let Some(channel) = cached {
            return Ok(channel);
        }
        let channel = self.dialer.connect(addr).await?.channel;
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Drops the channel to `addr` after a failure, so the next use dials afresh.
    pub fn forget(&self, addr: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(addr);
    }
}

/// A client for another node's `Node` service.
#[derive(Debug, Clone)]
pub struct PeerClient {
    inner: pb::node_client::NodeClient<Channel>,
}

/// A `WatchInfo` stream, yielding validated [`NodeInfo`].
#[derive(Debug)]
pub struct InfoStream {
    inner: tonic::Streaming<pb::NodeInfo>,
}

impl InfoStream {
    /// The next beat; `Ok(None)` when the peer closed the stream (it is leaving).
    pub async fn next(&mut self) -> Result<Option<NodeInfo>, RpcError> {
        match self.inner.message().await? {
            None => Ok(None),
            Some(info) => NodeInfo::try_from(info)
                .map(Some)
                .map_err(|status| RpcError::Invalid(status.message().to_owned())),
        }
    }
}

impl PeerClient {
    /// Wraps an open channel.
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: pb::node_client::NodeClient::new(channel)
                .max_decoding_message_size(4 * MAX_MESSAGE_BYTES),
        }
    }

    /// Opens `WatchInfo`, introducing ourselves.
    pub async fn watch(
        &mut self,
        hello: &Hello,
        interval: Duration,
    ) -> Result<InfoStream, RpcError> {
        let request = pb::WatchInfoRequest {
            hello: Some(pb::PeerHello {
                name: hello.name.clone(),
                id: hello.id.to_string(),
                port: u32::from(hello.port),
            }),
            interval_ms: interval.as_millis() as u32,
        };
        let inner = self.inner.watch_info(request).await?.into_inner();
        Ok(InfoStream { inner })
    }

    /// Calls `ListPeers`.
    pub async fn list_peers(&mut self) -> Result<FleetView, RpcError> {
        let response = self
            .inner
            .list_peers(pb::ListPeersRequest {})
            .await?
            .into_inner();
        let invalid = |s: Status| RpcError::Invalid(s.message().to_owned());
        let own = response
            .node
            .ok_or_else(|| RpcError::Invalid("ListPeersResponse.node is missing".into()))
            .and_then(|info| NodeInfo::try_from(info).map_err(invalid))?;
        let mut peers = Vec::new();
        for peer in response.peers.into_iter().take(MAX_LIST) {
            let Some(info) = peer.info else { continue };
            let Ok(info) = NodeInfo::try_from(info) else {
                continue;
            };
            let state = match pb::PeerState::try_from(peer.state) {
                Ok(pb::PeerState::Up) => PeerState::Up,
                Ok(pb::PeerState::Suspect) => PeerState::Suspect,
                _ => PeerState::Down,
            };
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

fn pb_state(state: PeerState) -> pb::PeerState {
    match state {
        PeerState::Up => pb::PeerState::Up,
        PeerState::Suspect => pb::PeerState::Suspect,
        PeerState::Down => pb::PeerState::Down,
    }
}

pub(crate) fn pb_tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Read => pb::Tier::Read,
        Tier::Write => pb::Tier::Write,
        Tier::Shell => pb::Tier::Shell,
    }
}

impl From<&NodeInfo> for pb::NodeInfo {
    fn from(info: &NodeInfo) -> Self {
        Self {
            name: info.name.clone(),
            id: info.id.to_string(),
            version: info.version.clone(),
            protocol: info.protocol,
            addrs: info.addrs.clone(),
            roles: info.roles.clone(),
            labels: info.labels.clone().into_iter().collect(),
            personas: info
                .personas
                .iter()
                .map(|p| pb::Persona {
                    name: p.name.clone(),
                    role: p.role.clone(),
                })
                .collect(),
            models: info
                .models
                .iter()
                .map(|m| pb::Model {
                    name: m.name.clone(),
                    backend: m.backend.clone(),
                    model: m.model.clone(),
                    base_url: m.base_url.clone(),
                    tokens_per_s: m.tokens_per_s,
                })
                .collect(),
            role_chains: info
                .role_chains
                .iter()
                .map(|(role, models)| pb::RoleChain {
                    role: role.clone(),
                    models: models.clone(),
                })
                .collect(),
            resources: Some(pb::Resources {
                cpu_count: info.resources.cpu_count,
                memory_total_bytes: info.resources.memory_total_bytes,
                memory_available_bytes: info.resources.memory_available_bytes,
                cpu_load: info.resources.cpu_load,
                gpus: info
                    .resources
                    .gpus
                    .iter()
                    .map(|g| pb::Gpu {
                        name: g.name.clone(),
                        vram_mb: g.vram_mb,
                        vram_free_mb: g.vram_free_mb,
                        source: g.source.clone(),
                    })
                    .collect(),
            }),
            load: Some(pb::Load {
                running: info.load.running,
                queued: info.load.queued,
                workers: info.load.workers,
                queue_capacity: info.load.queue_capacity,
            }),
            health: Some(pb::Health {
                status: match info.health.status {
                    HealthStatus::Healthy => pb::HealthStatus::Healthy,
                    HealthStatus::Degraded => pb::HealthStatus::Degraded,
                    HealthStatus::Unhealthy => pb::HealthStatus::Unhealthy,
                } as i32,
                reasons: info.health.reasons.clone(),
            }),
            cert_fingerprint: info.cert_fingerprint.clone(),
            started_at_ms: info.started_at_ms,
            remote_max_tier: pb_tier(info.remote_max_tier) as i32,
            memory_seq: info.memory_seq,
        }
    }
}

impl TryFrom<pb::NodeInfo> for NodeInfo {
    type Error = Status;

    fn try_from(info: pb::NodeInfo) -> Result<Self, Status> {
        check_len("name", &info.name, 63)?;
        if info.name.is_empty() {
            return Err(Status::invalid_argument("name: must not be empty"));
        }
        let id =
            NodeId::parse(&info.id).map_err(|e| Status::invalid_argument(format!("id: {e}")))?;
        check_len("version", &info.version, 64)?;
        check_len("cert_fingerprint", &info.cert_fingerprint, 64)?;
        check_list("addrs", &info.addrs)?;
        check_list("roles", &info.roles)?;
        check_count("personas", info.personas.len())?;
        check_count("models", info.models.len())?;
        check_count("role_chains", info.role_chains.len())?;
        check_count("labels", info.labels.len())?;
        for (k, v) in &info.labels {
            check_len("labels key", k, 63)?;
            check_len("labels value", v, 253)?;
        }
        let resources = info.resources.unwrap_or_default();
        check_count("resources.gpus", resources.gpus.len())?;
        let health = info.health.unwrap_or_default();
        check_list("health.reasons", &health.reasons)?;
        let load = info.load.unwrap_or_default();
        let mut role_chains = BTreeMap::new();
        for chain in info.role_chains {
            check_len("role_chains.role", &chain.role, 63)?;
            check_list("role_chains.models", &chain.models)?;
            role_chains.insert(chain.role, chain.models);
        }
        let mut models = Vec::with_capacity(info.models.len());
        for m in info.models {
            for (field, value) in [
                ("models.name", &m.name),
                ("models.backend", &m.backend),
                ("models.model", &m.model),
                ("models.base_url", &m.base_url),
            ] {
                check_len(field, value, MAX_STRING)?;
            }
            if !(m.tokens_per_s.is_finite() && m.tokens_per_s >= 0.0) {
                return Err(Status::invalid_argument(format!(
                    "models.tokens_per_s: {} is not a speed (a finite number, 0 or more)",
                    m.tokens_per_s
                )));
            }
            models.push(ModelInfo {
                name: m.name,
                backend: m.backend,
                model: m.model,
                base_url: m.base_url,
                tokens_per_s: m.tokens_per_s,
            });
        }
        let mut personas = Vec::with_capacity(info.personas.len());
        for p in info.personas {
            check_len("personas.name", &p.name, 63)?;
            check_len("personas.role", &p.role, 63)?;
            personas.push(PersonaInfo {
                name: p.name,
                role: p.role,
            });
        }
        let mut gpus = Vec::with_capacity(resources.gpus.len());
        for g in resources.gpus {
            check_len("resources.gpus.name", &g.name, 128)?;
            check_len("resources.gpus.source", &g.source, 32)?;
            gpus.push(Gpu {
                name: g.name,
                vram_mb: g.vram_mb,
                vram_free_mb: g.vram_free_mb,
                source: g.source,
            });
        }
        Ok(Self {
            name: info.name,
            id,
            version: info.version,
            protocol: info.protocol,
            addrs: info.addrs,
            roles: info.roles,
            labels: info.labels.into_iter().collect(),
            personas,
            models,
            role_chains,
            resources: Resources {
                cpu_count: resources.cpu_count,
                memory_total_bytes: resources.memory_total_bytes,
                memory_available_bytes: resources.memory_available_bytes,
                cpu_load: if resources.cpu_load.is_finite() {
                    resources.cpu_load
                } else {
                    0.0
                },
                gpus,
            },
            load: Load {
                running: load.running,
                queued: load.queued,
                workers: load.workers,
                queue_capacity: load.queue_capacity,
            },
            health: Health {
                status: match pb::HealthStatus::try_from(health.status) {
                    Ok(pb::HealthStatus::Healthy) => HealthStatus::Healthy,
                    Ok(pb::HealthStatus::Degraded) => HealthStatus::Degraded,
                    _ => HealthStatus::Unhealthy,
                },
                reasons: health.reasons,
            },
            cert_fingerprint: info.cert_fingerprint,
            started_at_ms: info.started_at_ms,
            remote_max_tier: match pb::Tier::try_from(info.remote_max_tier) {
                Ok(pb::Tier::Shell) => Tier::Shell,
                Ok(pb::Tier::Write) => Tier::Write,
                _ => Tier::Read,
            },
            memory_seq: info.memory_seq,
        })
    }
}

pub(crate) fn check_len(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        Err(Status::invalid_argument(format!(
            "{field}: {} bytes, at most {max} allowed",
            value.len()
        )))
    } else {
        Ok(())
    }
}

fn check_count(field: &str, count: usize) -> Result<(), Status> {
    if count > MAX_LIST {
        Err(Status::invalid_argument(format!(
            "{field}: {count} entries, at most {MAX_LIST} allowed"
        )))
    } else {
        Ok(())
    }
}

fn check_list(field: &str, values: &[String]) -> Result<(), Status> {
    check_count(field, values.len())?;
    values
        .iter()
        .try_for_each(|v| check_len(field, v, MAX_STRING))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeInfo {
        NodeInfo {
            name: "alpha".into(),
            id: NodeId::from_spki_der(b"alpha"),
            version: "0.1.0".into(),
            protocol: 1,
            addrs: vec!["127.0.0.1:7700".into()],
            roles: vec!["coder".into()],
            labels: [("site".to_owned(), "home".to_owned())].into(),
            personas: vec![PersonaInfo {
                name: "reviewer".into(),
                role: "coder".into(),
            }],
            models: vec![ModelInfo {
                name: "qwen".into(),
                backend: "openai".into(),
                model: "qwen2.5".into(),
                base_url: "http://x/v1".into(),
                tokens_per_s: 42.5,
            }],
            role_chains: [("coder".to_owned(), vec!["qwen".to_owned()])].into(),
            resources: Resources {
                cpu_count: 8,
                memory_total_bytes: 1 << 34,
                memory_available_bytes: 1 << 33,
                cpu_load: 0.5,
                gpus: vec![Gpu {
                    name: "RTX".into(),
                    vram_mb: 24576,
                    vram_free_mb: Some(100),
                    source: "declared".into(),
                }],
            },
            load: Load {
                running: 1,
                queued: 2,
                workers: 2,
                queue_capacity: 16,
            },
            health: Health {
                status: HealthStatus::Degraded,
                reasons: vec!["mdns: off".into()],
            },
            cert_fingerprint: "ab".repeat(32),
            started_at_ms: 42,
            remote_max_tier: Tier::Write,
            memory_seq: 9,
        }
    }

    #[test]
    fn node_info_round_trips_through_protobuf() {
        let info = sample();
        let back = NodeInfo::try_from(pb::NodeInfo::from(&info)).expect("valid");
        assert_eq!(back, info);
    }

    #[test]
    fn malformed_node_info_names_the_field() {
        type Mutation = Box<dyn Fn(&mut pb::NodeInfo)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|i| i.id = "nope".into()), "id"),
            (Box::new(|i| i.name = String::new()), "name"),
            (Box::new(|i| i.name = "x".repeat(64)), "name"),
            (Box::new(|i| i.roles = vec!["r".into(); 1000]), "roles"),
            (Box::new(|i| i.addrs = vec!["a".repeat(5000)]), "addrs"),
        ];
        for (mutate, field) in cases {
            let mut wire = pb::NodeInfo::from(&sample());
            mutate(&mut wire);
            let status = NodeInfo::try_from(wire).expect_err(field);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(field), "{}", status.message());
        }
    }
}
