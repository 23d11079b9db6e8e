//! The peer table and the liveness sessions that keep it true.
//!
//! [`PeerTable`] holds, per node id, the latest [`NodeInfo`] received, the address it is reached
//! at, its state (`up` / `suspect` / `down`) and when it was last heard from. [`Membership`]
//! turns discovery events into one watch session per peer: dial, check the presented identity
//! against what discovery claimed, then read the peer's `WatchInfo` stream. Every message is a
//! beat; a clean end of stream (the peer is leaving) or a refused connection marks it down at
//! once; a broken stream marks it suspect; silence marks it suspect after 2.5 s and down after
//! 5 s. Sessions also run peer exchange: each peer's `ListPeers` answer feeds the peers it knows
//! back in as candidates, so a few static peers are enough to learn the whole fleet. A
//! candidate that turns out to be a node of another mesh (its certificate is from another CA)
//! is named once in the log, with the way to bring it in ([`ForeignNodes`]). What an mDNS advert
//! may make this node dial is bounded by [`adverts`].
//!
//! This module decides liveness and membership only; it does not route or run anything.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime},
};

use mesh_domain::{
    BoxFuture, NodeId, NodeInfo, PeerState,
    sync::{MutexExt, RwLockExt},
    time::unix_ms,
};
use mesh_identity::{CertIdentity, CertRole, DialError};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_util::sync::CancellationToken;

use crate::{
    discovery::{Claim, DiscoveryEvent, PeerSource},
    metrics::{labels, metrics},
};

pub mod adverts;

use adverts::{AdvertGuard, Dropped, PendingSlot};

/// Beat interval asked of peers.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);
/// Silence after which a peer is suspect.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(2500);
/// Silence after which a peer is down.
pub const DOWN_AFTER: Duration = Duration::from_secs(5);
/// How often a session asks its peer for the peers it knows.
pub const EXCHANGE_INTERVAL: Duration = Duration::from_secs(5);
/// A session for a non-static peer gives up after failing this long; discovery or the peer's
/// own dial-in brings it back.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(600);
/// How often states are re-evaluated against the clock.
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// How many nodes of other meshes are remembered (and so named once each); past that, more are
/// met silently, so a LAN full of strangers cannot grow the set without bound.
const MAX_FOREIGN_NODES: usize = 256;

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

/// A node's view of the fleet (`ListPeers`).
#[derive(Debug, Clone)]
pub struct FleetView {
    /// The node that answered.
    pub own: NodeInfo,
    /// Its peers.
    pub peers: Vec<PeerView>,
}

/// Why a call on a link to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The peer answered with an error.
    #[error("{0}")]
    Failed(String),
    /// The peer is shutting down.
    #[error("peer is shutting down")]
    Leaving,
    /// The peer sent something that fails validation.
    #[error("invalid message from peer: {0}")]
    Invalid(String),
}

/// How membership reaches peers (a port: `rpc` implements it with the `Node` service over the
/// node's mTLS dialer).
pub trait PeerLink: Send + Sync + std::fmt::Debug {
    /// Dials `addr` and completes the handshake, so a wrong CA or a dead peer fails here.
    fn connect<'a>(
        &'a self,
        addr: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn PeerConnection>, DialError>>;
}

/// An open connection to a peer.
pub trait PeerConnection: Send {
    /// The identity in the certificate the peer presented; `None` in insecure mode.
    fn presented(&self) -> Option<&CertIdentity>;
    /// Opens the peer's stream of `NodeInfo` beats (`WatchInfo`), introducing ourselves.
    fn watch<'a>(
        &'a mut self,
        hello: &'a Hello,
        interval: Duration,
    ) -> BoxFuture<'a, Result<Box<dyn BeatStream>, LinkError>>;
    /// The peer's view of the fleet (`ListPeers`).
    fn list_peers(&mut self) -> BoxFuture<'_, Result<FleetView, LinkError>>;
}

/// A peer's stream of beats.
pub trait BeatStream: Send {
    /// The next beat, validated; `Ok(None)` when the peer closed the stream (it is leaving).
    fn next(&mut self) -> BoxFuture<'_, Result<Option<NodeInfo>, LinkError>>;
}

/// One row of the peer table.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The latest info the peer sent.
    pub info: NodeInfo,
    /// `host:port` it is reached at.
    pub addr: String,
    /// Whether its beats arrive (up), stopped lately (suspect) or stopped (down).
    pub state: PeerState,
    /// Wall-clock time of the last beat.
    pub last_seen: SystemTime,
    /// How it was found.
    pub source: PeerSource,
    /// Round-trip time of the latest `ListPeers` call to it, for the router.
    pub rtt_ms: Option<f64>,
    /// Monotonic time of the last beat, for the sweep.
    last_beat: Instant,
}

impl Peer {
    /// Unix ms of the last beat.
    pub fn last_seen_ms(&self) -> u64 {
        unix_ms(self.last_seen)
    }
}

/// The node's view of the fleet, keyed by node id.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: RwLock<HashMap<NodeId, Peer>>,
}

impl PeerTable {
    /// Records a beat: the peer is up, with this info. A revoked peer stays revoked.
    pub fn beat(&self, info: NodeInfo, addr: &str, source: PeerSource) {
        let mut peers = self.peers.write_unpoisoned();
        if peers
            .get(&info.id)
            .is_some_and(|p| p.state == PeerState::Revoked)
        {
            return;
        }
        let now = Instant::now();
        let id = info.id.clone();
        let rtt_ms = peers.get(&id).and_then(|p| p.rtt_ms);
        let previous = peers.insert(
            id.clone(),
            Peer {
                info,
                addr: addr.to_owned(),
                state: PeerState::Up,
                last_seen: SystemTime::now(),
                source,
                rtt_ms,
                last_beat: now,
            },
        );
        match previous {
            Some(p) if p.state == PeerState::Up => {}
            Some(p) => {
                tracing::info!(peer = %peers[&id].info.name, id = %id.short(), from = p.state.as_str(), "peer up")
            }
            None => {
                tracing::info!(peer = %peers[&id].info.name, id = %id.short(), addr, "peer joined")
            }
        }
    }

    /// Sets a known peer's state (no-op for unknown ids).
    pub fn mark(&self, id: &NodeId, state: PeerState, why: &str) {
        let mut peers = self.peers.write_unpoisoned();
        if let Some(peer) = peers.get_mut(id)
            && peer.state != state
        {
            tracing::info!(peer = %peer.info.name, id = %id.short(), from = peer.state.as_str(), to = state.as_str(), why, "peer state");
            peer.state = state;
        }
    }

    /// Marks a peer revoked: it stays listed as `revoked` and is never up again (its session
    /// ends at its next beat; see `stream_beats`).
    pub fn revoke(&self, id: &NodeId) {
        self.mark(id, PeerState::Revoked, "certificate revoked by the mesh CA");
    }

    /// Whether `id` is a revoked peer.
    pub fn is_revoked(&self, id: &NodeId) -> bool {
        self.get(id).is_some_and(|p| p.state == PeerState::Revoked)
    }

    /// Records a measured round-trip time.
    pub fn set_rtt(&self, id: &NodeId, rtt: std::time::Duration) {
        let mut peers = self.peers.write_unpoisoned();
        if let Some(peer) = peers.get_mut(id) {
            peer.rtt_ms = Some(rtt.as_secs_f64() * 1000.0);
        }
    }

    /// The id of the peer named `name`, if known.
    pub fn id_by_name(&self, name: &str) -> Option<NodeId> {
        let peers = self.peers.read_unpoisoned();
        peers
            .values()
            .find(|p| p.info.name == name)
            .map(|p| p.info.id.clone())
    }

    /// Re-evaluates states against the time since each peer's last beat.
    pub fn sweep(&self, now: Instant) {
        let mut peers = self.peers.write_unpoisoned();
        for peer in peers.values_mut() {
            let silent = now.saturating_duration_since(peer.last_beat);
            let state = match peer.state {
                PeerState::Down | PeerState::Revoked => continue,
                _ if silent >= DOWN_AFTER => PeerState::Down,
                _ if silent >= SUSPECT_AFTER => PeerState::Suspect,
                current => current,
            };
            if state != peer.state {
                tracing::info!(peer = %peer.info.name, from = peer.state.as_str(), to = state.as_str(), silent_ms = silent.as_millis() as u64, "peer state");
                peer.state = state;
            }
        }
    }

    /// All peers, sorted by name.
    pub fn snapshot(&self) -> Vec<Peer> {
        let peers = self.peers.read_unpoisoned();
        let mut list: Vec<Peer> = peers.values().cloned().collect();
        list.sort_by(|a, b| {
            a.info
                .name
                .cmp(&b.info.name)
                .then(a.info.id.cmp(&b.info.id))
        });
        list
    }

    /// One peer by id.
    pub fn get(&self, id: &NodeId) -> Option<Peer> {
        let peers = self.peers.read_unpoisoned();
        peers.get(id).cloned()
    }
}

/// What a session needs from the node.
#[derive(Debug)]
struct Shared {
    own_id: NodeId,
    hello: Hello,
    link: Arc<dyn PeerLink>,
    table: Arc<PeerTable>,
    /// Where sessions send peers learned by exchange.
    events: mpsc::Sender<DiscoveryEvent>,
    /// Which sessions run, so one peer gets one session.
    sessions: Mutex<Sessions>,
    /// Nodes of other meshes already named in the log.
    foreign: Mutex<ForeignNodes>,
    /// Pending advert dials and failing addresses.
    adverts: Arc<Mutex<AdvertGuard>>,
}

/// The nodes of other meshes this node has met, by (name, certificate fingerprint), so that the
/// hint about each is logged once, not at every retry of its session. Bounded by
/// [`MAX_FOREIGN_NODES`].
#[derive(Debug, Default)]
struct ForeignNodes {
    seen: HashSet<(String, String)>,
}

impl ForeignNodes {
    /// Whether this is the first meeting with the node `name` presenting the certificate
    /// `fingerprint`; false for one met before, and for every node once the set is full.
    fn first_meeting(&mut self, name: &str, fingerprint: &str) -> bool {
        let key = (name.to_owned(), fingerprint.to_owned());
        if self.seen.len() >= MAX_FOREIGN_NODES || self.seen.contains(&key) {
            return false;
        }
        self.seen.insert(key)
    }
}

#[derive(Debug, Default)]
struct Sessions {
    /// Addresses some session is dialing or watching.
    addrs: HashSet<String>,
    /// Ids some session is watching.
    ids: HashSet<NodeId>,
    /// Addresses found to belong to an id (ourselves, or a peer already watched elsewhere).
    aliases: HashMap<String, NodeId>,
}

/// Turns discovery events into watch sessions and keeps the table's states current.
#[derive(Debug, Clone)]
pub struct Membership {
    shared: Arc<Shared>,
}

impl Membership {
    /// `events` is the sender side of the channel `run` reads; sessions feed exchanged peers into
    /// it. `adverts` bounds what mDNS adverts may dial.
    pub fn new(
        own_id: NodeId,
        hello: Hello,
        link: Arc<dyn PeerLink>,
        table: Arc<PeerTable>,
        events: mpsc::Sender<DiscoveryEvent>,
        adverts: AdvertGuard,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                own_id,
                hello,
                link,
                table,
                events,
                sessions: Mutex::default(),
                foreign: Mutex::default(),
                adverts: Arc::new(Mutex::new(adverts)),
            }),
        }
    }

    /// Runs until `cancel`: reads discovery events, starts sessions, sweeps states. Returns after
    /// every session has closed its stream.
    pub async fn run(
        &self,
        events: &mut mpsc::Receiver<DiscoveryEvent>,
        cancel: CancellationToken,
    ) {
        // No session runs yet: after a restart (the supervisor's, following a panic) the
        // aborted sessions of the last run must not keep their peers from being dialed again.
        {
            let mut running = self.shared.lock();
            running.addrs.clear();
            running.ids.clear();
        }
        let mut sessions = JoinSet::new();
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = sweep.tick() => self.shared.table.sweep(Instant::now()),
                Some(done) = sessions.join_next(), if !sessions.is_empty() => {
                    if let Err(e) = done && e.is_panic() {
                        tracing::error!(error = %e, "peer session panicked");
                    }
                }
                event = events.recv() => match event {
                    None => break,
                    Some(DiscoveryEvent::Gone { name }) => self.gone(&name),
                    Some(DiscoveryEvent::Seen { addrs, name, claim, source }) => {
                        if !self.should_dial(&addrs, claim.as_ref()) {
                            continue;
                        }
                        let Some((addrs, slot)) = self.admit(addrs, claim.as_ref(), source) else {
                            continue;
                        };
                        let shared = self.shared.clone();
                        let cancel = cancel.child_token();
                        tracing::debug!(?addrs, ?name, source = source.as_str(), "dialing candidate peer");
                        sessions.spawn(session(shared, addrs, claim, source, slot, cancel));
                    }
                },
            }
        }
        cancel.cancel();
        while sessions.join_next().await.is_some() {}
    }

    fn gone(&self, name: &str) {
        let Some(id) = self.shared.table.id_by_name(name) else {
            return;
        };
        // A live stream outranks a goodbye that may be stale; only an idle peer is marked down.
        let watched = self.shared.lock().ids.contains(&id);
        if !watched {
            self.shared.table.mark(&id, PeerState::Down, "mdns goodbye");
        }
    }

    /// Holds an mDNS advert to [`AdvertGuard`]: the addresses to dial and the pending place it
    /// takes, or `None` when it is dropped (counted, and named in the log at most every 10 s
    /// when the cap is reached). Other sources pass as they are.
    fn admit(
        &self,
        addrs: Vec<String>,
        claim: Option<&Claim>,
        source: PeerSource,
    ) -> Option<(Vec<String>, Option<PendingSlot>)> {
        if source != PeerSource::Mdns {
            return Some((addrs, None));
        }
        // An advert always claims an id (`Mdns::seen`); one without is nothing to dial.
        let id = &claim?.id;
        let now = Instant::now();
        let mut guard = self.shared.adverts.lock_unpoisoned();
        match guard.admit(id, &addrs, now) {
            Ok(addrs) => {
                drop(guard);
                let slot = PendingSlot::new(self.shared.adverts.clone(), id.clone());
                Some((addrs, Some(slot)))
            }
            Err(why) => {
                metrics()
                    .adverts_dropped
                    .get_or_create(&labels(&[("reason", why.as_str())]))
                    .inc();
                if why == Dropped::Cap
                    && let Some(dropped) = guard.note_cap_drop(now)
                {
                    tracing::warn!(
                        dropped,
                        pending = guard.pending(),
                        "mDNS adverts dropped: as many advert dials as discovery.max_advert_dials allows are pending (a flood of adverts, or raise the limit for a LAN where that many nodes appear at once)"
                    );
                }
                None
            }
        }
    }

    fn should_dial(&self, addrs: &[String], claim: Option<&Claim>) -> bool {
        let sessions = self.shared.lock();
        if let Some(claim) = claim
            && (claim.id == self.shared.own_id || sessions.ids.contains(&claim.id))
        {
            return false;
        }
        !addrs.iter().any(|addr| {
            sessions.addrs.contains(addr)
                || sessions
                    .aliases
                    .get(addr)
                    .is_some_and(|id| *id == self.shared.own_id || sessions.ids.contains(id))
        })
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock_unpoisoned()
    }
}

/// Why a session stopped for good.
#[derive(Debug)]
enum End {
    /// Node shutting down.
    Cancelled,
    /// The address is ourselves, or a peer another session already watches.
    Alias(NodeId),
    /// The peer is not who discovery said (wrong id or certificate fingerprint).
    Rejected,
    /// The stream ended or failed; try again.
    Retry { refused: bool },
}

async fn session(
    shared: Arc<Shared>,
    addrs: Vec<String>,
    claim: Option<Claim>,
    source: PeerSource,
    mut slot: Option<PendingSlot>,
    cancel: CancellationToken,
) {
    {
        let mut sessions = shared.lock();
        sessions.addrs.extend(addrs.iter().cloned());
    }
    let mut known: Option<NodeId> = claim.as_ref().map(|c| c.id.clone());
    let mut backoff = Duration::from_millis(100);
    let mut last_success = Instant::now();
    loop {
        let outcome = watch_once(
            &shared,
            &addrs,
            claim.as_ref(),
            source,
            &mut slot,
            &cancel,
            &mut known,
        )
        .await;
        match outcome {
            End::Cancelled | End::Rejected => break,
            End::Alias(id) => {
                let mut sessions = shared.lock();
                for addr in &addrs {
                    sessions.aliases.insert(addr.clone(), id.clone());
                }
                break;
            }
            End::Retry { refused } => {
                // Another session watching the same id means the peer now lives at another
                // address (it restarted on a new port); this one is stale and must not mark it.
                if let Some(id) = &known {
                    if shared.lock().ids.contains(id) {
                        break;
                    }
                    if refused {
                        shared.table.mark(id, PeerState::Down, "connection refused");
                    }
                }
                // A session that got beats since the last failure starts its backoff afresh.
                if let Some(beat) = known
                    .as_ref()
                    .and_then(|id| shared.table.get(id))
                    .map(|p| p.last_beat)
                    .filter(|beat| *beat > last_success)
                {
                    last_success = beat;
                    backoff = Duration::from_millis(100);
                }
                // Static peers are re-offered every second by discovery; the others retry here.
                // An advert that never came up retries only while one of its addresses is not
                // held back, and not at all when refused: nothing listens where it says.
                if source == PeerSource::Static
                    || last_success.elapsed() > GIVE_UP_AFTER
                    || slot
                        .as_ref()
                        .is_some_and(|slot| refused || !addrs.iter().any(|addr| slot.usable(addr)))
                {
                    break;
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    let mut sessions = shared.lock();
    for addr in &addrs {
        sessions.addrs.remove(addr);
    }
}

/// One connection: dial, verify, stream beats until the stream ends. While `slot` holds a
/// pending advert dial, every failure before the first beat counts against the address, held-back
/// addresses are skipped, and the first beat releases the slot.
async fn watch_once(
    shared: &Shared,
    addrs: &[String],
    claim: Option<&Claim>,
    source: PeerSource,
    slot: &mut Option<PendingSlot>,
    cancel: &CancellationToken,
    known: &mut Option<NodeId>,
) -> End {
    let mut refused = true;
    let mut connected = None;
    for addr in addrs {
        if slot.as_ref().is_some_and(|slot| !slot.usable(addr)) {
            continue;
        }
        let attempt = tokio::select! {
            () = cancel.cancelled() => return End::Cancelled,
            attempt = shared.link.connect(addr) => attempt,
        };
        match attempt {
            Ok(conn) => {
                connected = Some((addr.clone(), conn));
                break;
            }
            Err(DialError::Refused(_)) => {
                if let Some(slot) = slot {
                    slot.failed(addr);
                }
            }
            Err(e) => {
                if let Some(slot) = slot {
                    slot.failed(addr);
                }
                refused = false;
                tracing::debug!(error = %e, "dial peer");
                if let DialError::ForeignMesh { addr, presented } = &e {
                    hint_foreign(shared, addr, presented, source);
                }
            }
        }
    }
    let Some((addr, mut conn)) = connected else {
        return End::Retry { refused };
    };
    let end = verify_and_watch(
        shared,
        &addr,
        conn.as_mut(),
        claim,
        source,
        slot,
        cancel,
        known,
    )
    .await;
    if let (Some(slot), End::Rejected | End::Retry { .. }) = (slot.as_ref(), &end) {
        slot.failed(&addr);
    }
    end
}

/// The part of [`watch_once`] after the dial: check the presented identity against the claim,
/// open `WatchInfo`, take the first beat, then stream beats. Split from it so that every early
/// end before the first beat is counted against the address in one place; the arguments are
/// the session's, passed on as they are.
#[allow(clippy::too_many_arguments)]
async fn verify_and_watch(
    shared: &Shared,
    addr: &str,
    conn: &mut dyn PeerConnection,
    claim: Option<&Claim>,
    source: PeerSource,
    slot: &mut Option<PendingSlot>,
    cancel: &CancellationToken,
    known: &mut Option<NodeId>,
) -> End {
    if let Some(presented) = conn.presented()
        && presented.role == Some(CertRole::Client)
    {
        tracing::warn!(%addr, id = %presented.id.short(), source = source.as_str(), "ignoring peer: it presents a client certificate, which may never serve as a node");
        return End::Rejected;
    }
    if let (Some(presented), Some(claim)) = (conn.presented(), claim) {
        if presented.id != claim.id {
            tracing::warn!(%addr, advertised = %claim.id.short(), presented = %presented.id.short(), source = source.as_str(), "ignoring peer: its certificate does not match the advertised id");
            return End::Rejected;
        }
        if let Some(fp) = &claim.fingerprint
            && *fp != presented.fingerprint
        {
            tracing::warn!(%addr, id = %claim.id.short(), source = source.as_str(), "ignoring advert: its `fp` does not match the certificate the peer presents");
            return End::Rejected;
        }
    }

    let mut stream = match conn.watch(&shared.hello, BEAT_INTERVAL).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(%addr, error = %e, "open WatchInfo");
            return End::Retry { refused: false };
        }
    };
    let first = tokio::select! {
        () = cancel.cancelled() => return End::Cancelled,
        first = tokio::time::timeout(DOWN_AFTER, stream.next()) => first,
    };
    let info = match first {
        Ok(Ok(Some(info))) => info,
        Ok(Ok(None)) => return End::Retry { refused: false },
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "first WatchInfo message");
            return End::Retry { refused: false };
        }
        Err(_) => return End::Retry { refused: false },
    };
    if let Some(presented) = conn.presented()
        && presented.id != info.id
    {
        tracing::warn!(%addr, claimed = %info.id.short(), presented = %presented.id.short(), "ignoring peer: NodeInfo id does not match its certificate");
        return End::Rejected;
    }
    if let Some(claim) = claim
        && claim.id != info.id
    {
        tracing::warn!(%addr, advertised = %claim.id.short(), answered = %info.id.short(), "ignoring peer: it is not the node that was advertised");
        return End::Rejected;
    }
    let id = info.id.clone();
    if id == shared.own_id {
        return End::Alias(id);
    }
    {
        let mut sessions = shared.lock();
        if !sessions.ids.insert(id.clone()) {
            return End::Alias(id);
        }
    }
    *known = Some(id.clone());
    // Up: the advert was true. Its address is forgotten as failing and its pending place freed;
    // later failures of this session are a real peer's, which this guard does not count.
    if let Some(slot) = slot.take() {
        slot.succeeded(addr);
    }
    shared.table.beat(info, addr, source);

    let end = stream_beats(shared, conn, stream.as_mut(), addr, &id, source, cancel).await;
    shared.lock().ids.remove(&id);
    end
}

/// Tells the operator, once per node, that `presented` at `addr` is a node of another mesh and
/// how to bring it in. Today such a node is refused silently at every retry; a newcomer
/// started without the mesh's certificate is the usual cause.
fn hint_foreign(shared: &Shared, addr: &str, presented: &CertIdentity, source: PeerSource) {
    let name = presented.common_name.as_deref().unwrap_or("a node");
    if !shared
        .foreign
        .lock_unpoisoned()
        .first_meeting(name, &presented.fingerprint)
    {
        return;
    }
    tracing::warn!(
        node = name,
        %addr,
        id = %presented.id.short(),
        source = source.as_str(),
        "`{name}` at {addr} belongs to another mesh (its certificate is not from this mesh's CA); to bring it in, run `mesh-cli token create --role node` where this mesh's CA key is and start it with `mesh-node --join TOKEN`"
    );
}

async fn stream_beats(
    shared: &Shared,
    conn: &mut dyn PeerConnection,
    stream: &mut dyn BeatStream,
    addr: &str,
    id: &NodeId,
    source: PeerSource,
    cancel: &CancellationToken,
) -> End {
    let mut exchange = tokio::time::interval(EXCHANGE_INTERVAL);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return End::Cancelled,
            _ = exchange.tick() => {
                if let Err(e) = exchange_peers(shared, conn).await {
                    tracing::debug!(%addr, error = %e, "peer exchange");
                }
            }
            message = tokio::time::timeout(DOWN_AFTER, stream.next()) => match message {
                Ok(Ok(Some(_))) if shared.table.is_revoked(id) => {
                    tracing::warn!(%addr, id = %id.short(), "dropping the connection to a revoked peer");
                    return End::Rejected;
                }
                Ok(Ok(Some(info))) if info.id == *id => shared.table.beat(info, addr, source),
                Ok(Ok(Some(_))) => {
                    tracing::warn!(%addr, "peer changed its id mid-stream; dropping the connection");
                    shared.table.mark(id, PeerState::Suspect, "id changed");
                    return End::Retry { refused: false };
                }
                Ok(Ok(None)) => {
                    shared.table.mark(id, PeerState::Down, "left (stream closed)");
                    return End::Retry { refused: false };
                }
                Ok(Err(e)) => {
                    let why = e.to_string();
                    let state = if matches!(e, LinkError::Leaving) { PeerState::Down } else { PeerState::Suspect };
                    shared.table.mark(id, state, &why);
                    return End::Retry { refused: false };
                }
                Err(_) => {
                    shared.table.mark(id, PeerState::Down, "no beat within 5 s");
                    return End::Retry { refused: false };
                }
            },
        }
    }
}

/// Feeds the peers our peer knows (and considers up) back into discovery.
async fn exchange_peers(shared: &Shared, conn: &mut dyn PeerConnection) -> Result<(), LinkError> {
    // The exchange call doubles as the round-trip measurement the router ranks by.
    let started = Instant::now();
    let fleet = conn.list_peers().await?;
    shared.table.set_rtt(&fleet.own.id, started.elapsed());
    for peer in fleet.peers {
        if peer.state != PeerState::Up || peer.info.id == shared.own_id {
            continue;
        }
        let fingerprint = Some(peer.info.cert_fingerprint.clone()).filter(|fp| !fp.is_empty());
        let event = DiscoveryEvent::Seen {
            addrs: vec![peer.addr],
            name: Some(peer.info.name),
            claim: Some(Claim {
                id: peer.info.id,
                fingerprint,
            }),
            source: PeerSource::Exchange,
        };
        if shared.events.try_send(event).is_err() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_domain::{Health, Load, Resources};

    /// A link whose dials never complete; counts them per address.
    #[derive(Debug, Default)]
    struct Unanswered(Mutex<HashMap<String, usize>>);

    impl Unanswered {
        fn dials(&self, addr: &str) -> usize {
            self.0.lock_unpoisoned().get(addr).copied().unwrap_or(0)
        }
    }

    impl PeerLink for Unanswered {
        fn connect<'a>(
            &'a self,
            addr: &'a str,
        ) -> BoxFuture<'a, Result<Box<dyn PeerConnection>, DialError>> {
            *self.0.lock_unpoisoned().entry(addr.to_owned()).or_default() += 1;
            Box::pin(std::future::pending())
        }
    }

    /// Polls `check` every 10 ms for up to 5 s.
    async fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await; // poll until the deadline
        }
    }

    /// Issue 16, point 5: membership restarted by the supervisor after a panic found the
    /// addresses of its aborted sessions still marked as dialed, and never dialed them again.
    #[tokio::test]
    async fn a_restarted_membership_dials_the_peers_of_its_aborted_sessions_again() {
        let link = Arc::new(Unanswered::default());
        let own = info("me").id;
        let (events_tx, events_rx) = mpsc::channel(16);
        let membership = Membership::new(
            own.clone(),
            Hello {
                name: "me".into(),
                id: own,
                port: 7700,
            },
            link.clone(),
            Arc::new(PeerTable::default()),
            events_tx.clone(),
            AdvertGuard::new(64, 64, Arc::new(tokio::sync::Notify::new())),
        );
        let events_rx = Arc::new(tokio::sync::Mutex::new(events_rx));
        let seen = || DiscoveryEvent::Seen {
            addrs: vec!["192.0.2.1:7700".into()],
            name: None,
            claim: None,
            source: PeerSource::Static,
        };
        for run in 1..=2 {
            let (membership, events_rx) = (membership.clone(), events_rx.clone());
            let task = tokio::spawn(async move {
                let mut events_rx = events_rx.lock_owned().await;
                membership
                    .run(&mut events_rx, CancellationToken::new())
                    .await;
            });
            events_tx.send(seen()).await.expect("send");
            eventually(&format!("dial {run}"), || {
                link.dials("192.0.2.1:7700") == run
            })
            .await;
            // What a panic does to the run: its future, and its sessions, are dropped.
            task.abort();
            let _ = task.await;
        }
    }

    fn info(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            id: NodeId::from_spki_der(name.as_bytes()),
            version: "0".into(),
            protocol: 1,
            addrs: vec![],
            roles: vec![],
            labels: Default::default(),
            personas: vec![],
            models: vec![],
            role_chains: Default::default(),
            resources: Resources::default(),
            load: Load::default(),
            health: Health::default(),
            cert_fingerprint: String::new(),
            started_at_ms: 0,
            remote_max_tier: mesh_domain::Tier::Read,
            memory_seq: 0,
        }
    }

    #[test]
    fn silence_makes_a_peer_suspect_then_down() {
        let table = PeerTable::default();
        let alpha = info("alpha");
        let id = alpha.id.clone();
        table.beat(alpha, "127.0.0.1:1", PeerSource::Static);
        let start = table.get(&id).expect("present").last_beat;
        table.sweep(start + Duration::from_secs(1));
        assert_eq!(table.get(&id).expect("present").state, PeerState::Up);
        table.sweep(start + SUSPECT_AFTER);
        assert_eq!(table.get(&id).expect("present").state, PeerState::Suspect);
        table.sweep(start + DOWN_AFTER);
        assert_eq!(table.get(&id).expect("present").state, PeerState::Down);
        table.beat(info("alpha"), "127.0.0.1:1", PeerSource::Static);
        assert_eq!(table.get(&id).expect("present").state, PeerState::Up);
    }

    #[test]
    fn a_node_of_another_mesh_is_met_once_and_the_set_stays_bounded() {
        let mut foreign = ForeignNodes::default();
        assert!(foreign.first_meeting("mallory", "fp1"));
        assert!(
            !foreign.first_meeting("mallory", "fp1"),
            "a retry is no new meeting"
        );
        // A new certificate (re-issued elsewhere) or another name is a new node to name.
        assert!(foreign.first_meeting("mallory", "fp2"));
        assert!(foreign.first_meeting("eve", "fp1"));
        for i in foreign.seen.len()..MAX_FOREIGN_NODES {
            assert!(foreign.first_meeting(&format!("n{i}"), "fp"));
        }
        assert!(
            !foreign.first_meeting("one-too-many", "fp"),
            "the set is full"
        );
        assert_eq!(foreign.seen.len(), MAX_FOREIGN_NODES);
    }

    /// A link that records every dial; each is refused at once, never answers (`hang`), or
    /// times out (`time_out`).
    #[derive(Debug, Default)]
    struct FakeLink {
        dials: Mutex<Vec<String>>,
        hang: bool,
        time_out: bool,
    }

    impl PeerLink for FakeLink {
        fn connect<'a>(
            &'a self,
            addr: &'a str,
        ) -> BoxFuture<'a, Result<Box<dyn PeerConnection>, DialError>> {
            self.dials.lock_unpoisoned().push(addr.to_owned());
            Box::pin(async move {
                if self.hang {
                    std::future::pending::<()>().await;
                }
                if self.time_out {
                    return Err(DialError::Timeout(addr.to_owned()));
                }
                Err(DialError::Refused(addr.to_owned()))
            })
        }
    }

    impl FakeLink {
        fn dials(&self) -> Vec<String> {
            self.dials.lock_unpoisoned().clone()
        }
    }

    /// Membership over `link` with room for `max_pending` advert dials, running.
    fn membership(
        link: Arc<FakeLink>,
        max_pending: usize,
    ) -> (
        mpsc::Sender<DiscoveryEvent>,
        Arc<Mutex<AdvertGuard>>,
        CancellationToken,
    ) {
        let (tx, rx) = mpsc::channel(1024);
        let own = info("self");
        let membership = Membership::new(
            own.id.clone(),
            Hello {
                name: own.name,
                id: own.id,
                port: 1,
            },
            link,
            Arc::new(PeerTable::default()),
            tx.clone(),
            AdvertGuard::new(max_pending, 64, Arc::new(tokio::sync::Notify::new())),
        );
        let guard = membership.shared.adverts.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let mut rx = rx;
            membership.run(&mut rx, stop).await;
        });
        (tx, guard, cancel)
    }

    fn advert(n: u32, addrs: &[&str]) -> DiscoveryEvent {
        DiscoveryEvent::Seen {
            addrs: addrs.iter().map(|a| (*a).to_owned()).collect(),
            name: Some(format!("n{n}")),
            claim: Some(Claim {
                id: NodeId::from_spki_der(&n.to_be_bytes()),
                fingerprint: None,
            }),
            source: PeerSource::Mdns,
        }
    }

    /// Lets the spawned tasks run for `d` of (paused, auto-advancing) time: for checks that
    /// nothing more happens in that time.
    async fn settle(d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Lets paused time run (10 ms a step, at most a minute) until `check` holds.
    async fn until(what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..6_000 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} never happened");
    }

    #[tokio::test(start_paused = true)]
    async fn adverts_start_at_most_the_cap_of_pending_dials_one_per_claimed_id() {
        let link = Arc::new(FakeLink {
            hang: true,
            ..FakeLink::default()
        });
        let (tx, guard, cancel) = membership(link.clone(), 4);
        // The same id advertised again, at other addresses, while it is being dialed.
        for port in 1..=5 {
            tx.send(advert(0, &[&format!("10.0.0.1:{port}")]))
                .await
                .expect("send");
        }
        for n in 1..100 {
            tx.send(advert(n, &[&format!("10.0.1.{n}:7700")]))
                .await
                .expect("send");
        }
        until("4 dials", || link.dials().len() >= 4).await;
        // No more than the cap, however long the dials hang.
        settle(Duration::from_secs(10)).await;
        let dials = link.dials();
        assert_eq!(dials.len(), 4, "{dials:?}");
        assert_eq!(dials[0], "10.0.0.1:1", "{dials:?}");
        assert_eq!(guard.lock_unpoisoned().pending(), 4);
        // A static peer is the operator's word: it is dialed whatever the adverts did.
        tx.send(DiscoveryEvent::Seen {
            addrs: vec!["10.0.2.1:7700".into()],
            name: None,
            claim: None,
            source: PeerSource::Static,
        })
        .await
        .expect("send");
        until("the static peer dialed", || {
            link.dials().last().map(String::as_str) == Some("10.0.2.1:7700")
        })
        .await;
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_advertised_address_that_keeps_failing_is_no_longer_dialed() {
        let link = Arc::new(FakeLink::default());
        let (tx, guard, cancel) = membership(link.clone(), 4);
        // A refused dial ends an advert's session at once (nothing listens where it says) and
        // frees its place; the advert coming again is dialed again, until the address is held.
        for _ in 0..adverts::STRIKES + 2 {
            tx.send(advert(1, &["10.0.0.9:7700"])).await.expect("send");
            settle(Duration::from_secs(1)).await;
            assert_eq!(guard.lock_unpoisoned().pending(), 0);
        }
        assert_eq!(link.dials().len(), adverts::STRIKES as usize);
        // Other adverts naming that address dial only their other addresses.
        tx.send(advert(2, &["10.0.0.9:7700"])).await.expect("send");
        tx.send(advert(3, &["10.0.0.9:7700", "10.0.0.10:7700"]))
            .await
            .expect("send");
        settle(Duration::from_millis(50)).await;
        let dials = link.dials();
        assert_eq!(dials.len(), adverts::STRIKES as usize + 1, "{dials:?}");
        assert_eq!(dials.last().map(String::as_str), Some("10.0.0.10:7700"));
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_advert_whose_address_times_out_is_retried_until_the_address_is_held_back() {
        let link = Arc::new(FakeLink {
            time_out: true,
            ..FakeLink::default()
        });
        let (tx, guard, cancel) = membership(link.clone(), 4);
        tx.send(advert(1, &["10.0.0.9:7700"])).await.expect("send");
        until("the place freed after the strikes", || {
            link.dials().len() == adverts::STRIKES as usize
                && guard.lock_unpoisoned().pending() == 0
        })
        .await;
        // Held back: no further retry.
        settle(Duration::from_secs(10)).await;
        assert_eq!(link.dials().len(), adverts::STRIKES as usize);
        tx.send(advert(2, &["10.0.0.9:7700"])).await.expect("send");
        settle(Duration::from_secs(10)).await;
        assert_eq!(link.dials().len(), adverts::STRIKES as usize, "held back");
        cancel.cancel();
    }

    #[test]
    fn snapshot_is_sorted_by_name() {
        let table = PeerTable::default();
        for name in ["gamma", "alpha", "beta"] {
            table.beat(info(name), "x:1", PeerSource::Mdns);
        }
        let names: Vec<_> = table.snapshot().into_iter().map(|p| p.info.name).collect();
        assert_eq!(names, ["alpha", "beta", "gamma"]);
    }
}
