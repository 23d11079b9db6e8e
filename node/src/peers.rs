//! The peer table and the membership that keeps it true.
//!
//! [`PeerTable`] holds, per node id, the latest [`NodeInfo`] fetched, the address it is reached
//! at, its state (`up` / `suspect` / `down` / `revoked`) and when it was last heard from.
//! [`swim::Membership`] keeps it: SWIM (the `foca` crate) over sealed UDP datagrams
//! ([`envelope`]) decides who is up, suspect or down, and a member's `NodeInfo` is fetched over
//! the [`PeerLink`] port only when its gossiped version changes. Discovery (static peers, mDNS
//! adverts, whose volume [`adverts`] bounds) only names where a first member may be.
//!
//! This module decides liveness and membership only; it does not route or run anything.

use std::{
    collections::HashMap,
    sync::{Mutex, RwLock},
    time::SystemTime,
};

use mesh_domain::{
    BoxFuture, NodeId, NodeInfo, PeerState,
    sync::{MutexExt, RwLockExt},
    time::unix_ms,
};
use tokio::sync::{mpsc, watch};

use crate::discovery::PeerSource;

pub(crate) mod adverts;
pub(crate) mod budget;
pub(crate) mod envelope;
pub(crate) mod icmp;
pub(crate) mod swim;

/// Why a peer is marked revoked (the one reason that may change a revoked row).
const REVOKED: &str = "certificate revoked by the mesh CA";

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

/// How membership fetches a member's `NodeInfo` (a port: `rpc` implements it with
/// `Node.GetInfo` over the node's mTLS dialer, with the mesh's deadlines).
pub trait PeerLink: Send + Sync + std::fmt::Debug {
    /// The `NodeInfo` of node `id` at `addr`; fails when the node there is not `id` (its
    /// certificate or its answer names another).
    fn info<'a>(
        &'a self,
        addr: &'a str,
        id: &'a NodeId,
    ) -> BoxFuture<'a, Result<NodeInfo, LinkError>>;

    /// The members node `id` at `addr` lists as up or suspect (`Node.ListPeers`), by id and
    /// address: where a joining node announces itself, and how a view that missed a join is
    /// repaired. Fails when the node there is not `id`.
    fn members<'a>(
        &'a self,
        addr: &'a str,
        id: &'a NodeId,
    ) -> BoxFuture<'a, Result<Vec<(NodeId, String)>, LinkError>>;
}

/// An up peer as replication sees it ([`PeerTable::up_peers`]).
#[derive(Debug, Clone)]
pub struct UpPeer {
    /// Its node id.
    pub id: NodeId,
    /// Its name, for logs.
    pub name: String,
    /// `host:port` it is reached at.
    pub addr: String,
    /// Its `NodeInfo.memory_seq`: its latest own write.
    pub memory_seq: u64,
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
    /// Wall-clock time of the last datagram heard from it.
    pub last_seen: SystemTime,
    /// How it was found.
    pub source: PeerSource,
    /// Round-trip time measured to it, for the router.
    pub rtt_ms: Option<f64>,
}

impl Peer {
    /// Unix ms of the last beat.
    pub fn last_seen_ms(&self) -> u64 {
        unix_ms(self.last_seen)
    }
}

/// A peer's `NodeInfo` refused because its name is held by this node or by another live peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the name `{name}` is held by {} ({}); a node name belongs to one live node at a time",
    if *own { "this node" } else { "a live member" },
    holder.short()
)]
pub struct NameTaken {
    /// The name claimed.
    pub name: String,
    /// Who holds it.
    pub holder: NodeId,
    /// Whether the holder is this node.
    pub own: bool,
}

/// The node's view of the fleet, keyed by node id.
///
/// A name belongs to one live node: a `NodeInfo` whose name this node or an `up` or `suspect`
/// peer holds is refused ([`PeerTable::beat`]), so `--on NAME` names one node. First come,
/// first served: a node that held the name and went down gets it back only once the other
/// holder is down too.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: RwLock<HashMap<NodeId, Peer>>,
    /// Where reports of peers found unreachable go (membership reads them).
    unreachable: Mutex<Option<mpsc::Sender<NodeId>>>,
    /// Counts changes of who is live and as what ([`PeerTable::liveness`]).
    liveness: watch::Sender<u64>,
    /// This node's id and name (`None` in tests that need no own name).
    own: Option<(NodeId, String)>,
    /// Counts the changes a person watching the fleet would see (a peer joins, changes state
    /// or sends new info), so `WatchPeers` answers on change instead of on a timer.
    changes: watch::Sender<u64>,
}

/// Most unreachable reports waiting for membership; past it more are dropped (membership's own
/// probes find those peers).
const UNREACHABLE_REPORTS: usize = 64;

impl PeerTable {
    /// Follows changes of the live set: a peer joined, changed state, or now advertises another
    /// name or `remote_max_tier`. Not a beat that changes nothing of that (load, last seen), so
    /// a reader that depends on who is live (cron's owners) wakes only when that may differ.
    pub fn liveness(&self) -> watch::Receiver<u64> {
        self.liveness.subscribe()
    }

    fn live_set_changed(&self) {
        self.liveness.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The table of the node `id` named `name`: no peer may claim that name.
    pub fn for_node(id: NodeId, name: String) -> Self {
        Self {
            own: Some((id, name)),
            ..Self::default()
        }
    }

    /// Who holds `name` now, other than `except`: this node, or an `up` or `suspect` peer.
    fn holder_in(
        &self,
        peers: &HashMap<NodeId, Peer>,
        name: &str,
        except: Option<&NodeId>,
    ) -> Option<NameTaken> {
        let taken = |holder: &NodeId, own| NameTaken {
            name: name.to_owned(),
            holder: holder.clone(),
            own,
        };
        if let Some((own, own_name)) = &self.own
            && own_name == name
            && except != Some(own)
        {
            return Some(taken(own, true));
        }
        peers
            .values()
            .find(|p| {
                p.info.name == name
                    && except != Some(&p.info.id)
                    && matches!(p.state, PeerState::Up | PeerState::Suspect)
            })
            .map(|p| taken(&p.info.id, false))
    }

    /// Who holds `name` now: this node or a live (`up` or `suspect`) peer; `None` when it is
    /// free (what the issuer asks before it issues a node certificate).
    pub fn holder_of(&self, name: &str) -> Option<NameTaken> {
        self.holder_in(&self.peers.read_unpoisoned(), name, None)
    }

    /// Wakes at every change of the table (a peer joined, changed state, or sent new info);
    /// not at a datagram that only says a peer is still there.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The reports of [`PeerTable::report_unreachable`], from now on (a later call takes them
    /// over: membership calls it each time it starts).
    pub fn unreachable_reports(&self) -> mpsc::Receiver<NodeId> {
        let (tx, rx) = mpsc::channel(UNREACHABLE_REPORTS);
        *self.unreachable.lock_unpoisoned() = Some(tx);
        rx
    }

    /// A connection to `addr` was refused: the `up` peer there is `suspect` at once, and
    /// membership suspects it in SWIM too (it is `down` within the suspicion time unless it
    /// refutes), so the router stops picking a node that is gone before the next probe finds
    /// it.
    pub fn report_unreachable(&self, addr: &str) {
        let id = {
            let peers = self.peers.read_unpoisoned();
            peers
                .values()
                .find(|p| p.addr == addr && p.state == PeerState::Up)
                .map(|p| p.info.id.clone())
        };
        let Some(id) = id else { return };
        self.mark(&id, PeerState::Suspect, "connection refused");
        if let Some(tx) = self.unreachable.lock_unpoisoned().as_ref() {
            let _ = tx.try_send(id);
        }
    }

    /// Records a fetched `NodeInfo`: the peer is up, with this info. A revoked peer stays
    /// revoked. Refused when another live node holds the name: the peer's row, if any, is
    /// removed (it is in no one's way, and nothing routes to it).
    pub fn beat(&self, info: NodeInfo, addr: &str, source: PeerSource) -> Result<(), NameTaken> {
        let mut peers = self.peers.write_unpoisoned();
        if peers
            .get(&info.id)
            .is_some_and(|p| p.state == PeerState::Revoked)
        {
            return Ok(());
        }
        if let Some(taken) = self.holder_in(&peers, &info.name, Some(&info.id)) {
            peers.remove(&info.id);
            return Err(taken);
        }
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
            },
        );
        let same = previous.as_ref().is_some_and(|p| {
            p.state == PeerState::Up
                && p.info.name == peers[&id].info.name
                && p.info.remote_max_tier == peers[&id].info.remote_max_tier
        });
        if !same {
            self.live_set_changed();
        }
        match previous {
            Some(p) if p.state == PeerState::Up => {}
            Some(p) => {
                tracing::info!(peer = %peers[&id].info.name, id = %id.short(), from = p.state.as_str(), "peer up")
            }
            None => {
                tracing::info!(peer = %peers[&id].info.name, id = %id.short(), addr, "peer joined")
            }
        }
        drop(peers);
        self.changed();
        Ok(())
    }

    /// Notes that a datagram of `id` was heard now (`last_seen_ms`).
    pub fn heard(&self, id: &NodeId) {
        if let Some(peer) = self.peers.write_unpoisoned().get_mut(id) {
            peer.last_seen = SystemTime::now();
        }
    }

    /// Sets a known peer's state (no-op for unknown ids). Only [`PeerTable::revoke`] changes a
    /// revoked peer: nothing membership hears brings it back.
    pub fn mark(&self, id: &NodeId, state: PeerState, why: &str) {
        let mut peers = self.peers.write_unpoisoned();
        // A peer that comes back while another live node holds its name stays as it is; its
        // next `NodeInfo` is refused and removes it.
        if state == PeerState::Up
            && let Some(peer) = peers.get(id)
            && peer.state != PeerState::Up
            && self.holder_in(&peers, &peer.info.name, Some(id)).is_some()
        {
            return;
        }
        if let Some(peer) = peers.get_mut(id)
            && peer.state != state
            && (peer.state != PeerState::Revoked || why == REVOKED)
        {
            tracing::info!(peer = %peer.info.name, id = %id.short(), from = peer.state.as_str(), to = state.as_str(), why, "peer state");
            peer.state = state;
            self.live_set_changed();
            drop(peers);
            self.changed();
        }
    }

    /// Marks a peer revoked: it stays listed as `revoked` and is never up again (its datagrams
    /// are dropped from now on).
    pub fn revoke(&self, id: &NodeId) {
        self.mark(id, PeerState::Revoked, REVOKED);
    }

    /// Whether `id` is a revoked peer (asked for every membership datagram: no copy made).
    pub fn is_revoked(&self, id: &NodeId) -> bool {
        self.peers
            .read_unpoisoned()
            .get(id)
            .is_some_and(|p| p.state == PeerState::Revoked)
    }

    /// The peers that are up, with only what replication reads of them (`snapshot` copies
    /// every `NodeInfo`, too much for a loop that looks twice a second).
    pub fn up_peers(&self) -> Vec<UpPeer> {
        self.peers
            .read_unpoisoned()
            .values()
            .filter(|p| p.state == PeerState::Up)
            .map(|p| UpPeer {
                id: p.info.id.clone(),
                name: p.info.name.clone(),
                addr: p.addr.clone(),
                memory_seq: p.info.memory_seq,
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_domain::{Health, Load, Resources};

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
            mcp_tools: Default::default(),
            draining: false,
        }
    }

    #[test]
    fn a_revoked_peer_stays_revoked_whatever_membership_says() {
        let table = PeerTable::default();
        let alpha = info("alpha");
        let id = alpha.id.clone();
        table
            .beat(alpha, "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        table.mark(&id, PeerState::Suspect, "SWIM");
        assert_eq!(table.get(&id).expect("present").state, PeerState::Suspect);
        table.revoke(&id);
        table.mark(&id, PeerState::Up, "SWIM");
        table
            .beat(info("alpha"), "127.0.0.1:1", PeerSource::Static)
            .expect("still revoked, not refused");
        assert_eq!(table.get(&id).expect("present").state, PeerState::Revoked);
    }

    #[test]
    fn a_refused_connection_makes_an_up_peer_suspect_and_tells_membership() {
        let table = PeerTable::default();
        let mut reports = table.unreachable_reports();
        let alpha = info("alpha");
        let id = alpha.id.clone();
        table
            .beat(alpha, "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        table.report_unreachable("127.0.0.1:2");
        assert_eq!(table.get(&id).expect("present").state, PeerState::Up);
        table.report_unreachable("127.0.0.1:1");
        assert_eq!(table.get(&id).expect("present").state, PeerState::Suspect);
        assert_eq!(reports.try_recv().ok(), Some(id.clone()));
        // Only an up peer is reported: a suspect or down one is membership's already.
        table.report_unreachable("127.0.0.1:1");
        assert!(reports.try_recv().is_err());
    }

    /// Cron's scheduler wakes on these instead of polling the table: a join, a state change and
    /// a changed `remote_max_tier` wake it; a beat with only a new load does not.
    #[test]
    fn the_live_set_signals_joins_state_and_tier_changes_but_not_load() {
        let table = PeerTable::default();
        let mut live = table.liveness();
        let alpha = info("alpha");
        let id = alpha.id.clone();
        table
            .beat(alpha.clone(), "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        assert!(live.has_changed().expect("open"), "joined");
        live.mark_unchanged();
        let mut busier = alpha.clone();
        busier.load.running = 3;
        table
            .beat(busier, "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        assert!(!live.has_changed().expect("open"), "only its load changed");
        table.mark(&id, PeerState::Down, "SWIM");
        assert!(live.has_changed().expect("open"), "down");
        live.mark_unchanged();
        table
            .beat(alpha.clone(), "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        assert!(live.has_changed().expect("open"), "up again");
        live.mark_unchanged();
        let mut writer = alpha;
        writer.remote_max_tier = mesh_domain::Tier::Write;
        table
            .beat(writer, "127.0.0.1:1", PeerSource::Static)
            .expect("free");
        assert!(live.has_changed().expect("open"), "another remote_max_tier");
    }

    /// `name` under another key: what a second certificate issued for the same name presents.
    fn twin(name: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId::from_spki_der(format!("{name} again").as_bytes()),
            ..info(name)
        }
    }

    /// Issue 26: a name belongs to one live node. A second member claiming a live peer's name,
    /// or this node's, is refused and not listed; once the holder is down the name is free.
    #[test]
    fn a_second_live_member_with_a_name_already_held_is_refused() {
        let me = info("me");
        let table = PeerTable::for_node(me.id.clone(), me.name.clone());
        let alpha = info("alpha");
        table
            .beat(alpha.clone(), "a:1", PeerSource::Static)
            .expect("free");
        let refused = table
            .beat(twin("alpha"), "b:1", PeerSource::Static)
            .expect_err("alpha is up");
        assert_eq!((&refused.holder, refused.own), (&alpha.id, false));
        assert!(
            refused.to_string().contains("held by a live member"),
            "{refused}"
        );
        let refused = table
            .beat(twin("me"), "c:1", PeerSource::Static)
            .expect_err("this node's name");
        assert!(
            refused.own && refused.to_string().contains("this node"),
            "{refused}"
        );
        assert_eq!(table.snapshot().len(), 1, "neither is listed");
        assert_eq!(
            table.holder_of("alpha").map(|t| t.holder),
            Some(alpha.id.clone())
        );
        assert_eq!(table.holder_of("me").map(|t| t.holder), Some(me.id.clone()));
        assert_eq!(table.holder_of("beta"), None);

        // A suspect still holds its name; a peer that is down does not.
        table.mark(&alpha.id, PeerState::Suspect, "SWIM");
        assert!(
            table
                .beat(twin("alpha"), "b:1", PeerSource::Static)
                .is_err()
        );
        table.mark(&alpha.id, PeerState::Down, "SWIM");
        table
            .beat(twin("alpha"), "b:1", PeerSource::Static)
            .expect("the holder is down");
        // The first holder comes back: not up while the name is held, and its next NodeInfo
        // is refused and removes it.
        table.mark(&alpha.id, PeerState::Up, "alive (SWIM)");
        assert_eq!(table.get(&alpha.id).expect("listed").state, PeerState::Down);
        assert!(
            table
                .beat(alpha.clone(), "a:1", PeerSource::Static)
                .is_err()
        );
        assert!(table.get(&alpha.id).is_none());
        // The holder itself may change its info at will.
        table
            .beat(twin("alpha"), "b:2", PeerSource::Static)
            .expect("its own name");
    }

    /// `WatchPeers` answers on these changes: a join, a state change, new info; not on a
    /// datagram that only says a peer is there, nor on a state it already has.
    #[test]
    fn watchers_wake_at_joins_state_changes_and_new_info_only() {
        let table = PeerTable::default();
        let mut changes = table.subscribe();
        let alpha = info("alpha");
        let id = alpha.id.clone();
        table.beat(alpha, "x:1", PeerSource::Mdns).expect("free");
        assert!(changes.has_changed().expect("open"), "a join");
        changes.mark_unchanged();
        table.heard(&id);
        table.mark(&id, PeerState::Up, "SWIM");
        assert!(!changes.has_changed().expect("open"), "nothing new");
        table.mark(&id, PeerState::Down, "SWIM");
        assert!(changes.has_changed().expect("open"), "a state change");
        changes.mark_unchanged();
        table
            .beat(info("alpha"), "x:1", PeerSource::Mdns)
            .expect("its own name");
        assert!(changes.has_changed().expect("open"), "new info");
    }

    #[test]
    fn snapshot_is_sorted_by_name() {
        let table = PeerTable::default();
        for name in ["gamma", "alpha", "beta"] {
            table
                .beat(info(name), "x:1", PeerSource::Mdns)
                .expect("free");
        }
        let names: Vec<_> = table.snapshot().into_iter().map(|p| p.info.name).collect();
        assert_eq!(names, ["alpha", "beta", "gamma"]);
    }
}
