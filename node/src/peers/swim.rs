//! Membership by SWIM: the `foca` crate runs the protocol (a constant number of probes per
//! period, indirect probes, suspicion that a live member refutes by raising its incarnation,
//! membership changes piggybacked on the probes and gossip), over UDP on the node's port, every
//! datagram sealed with the node's key ([`super::envelope`]). [`Membership::run`] owns foca and
//! its socket and timers; it turns foca's members into the [`PeerTable`]'s rows.
//!
//! A member's identity is its node id, its address and a start stamp that a restart (or a
//! rejoin after being declared down) raises. Capabilities do not travel in SWIM messages:
//! each node gossips a small version number of its `NodeInfo` (raised at most every
//! [`VERSION_EVERY`] when its load, health or memory write sequence changed), and a node fetches a peer's full
//! `NodeInfo` over the mTLS `Node.GetInfo` only when that number changes ([`PeerLink`]).
//! Discovery (static peers, mDNS adverts) only says where a first member may be: the node
//! announces itself there. On shutdown the node leaves (a goodbye every member hears), so peers
//! mark it down at once.
//!
//! A received datagram is screened on the loop, without cryptography
//! ([`super::envelope::Opener::screen`]: layout, stamp window, replay mark), and its source's
//! failures are counted ([`super::budget`]); what passes waits for its certificate and
//! signature check on a task of its own ([`check_signatures`]), in one of two bounded queues:
//! one for datagrams from a live member's address with that member's certificate, served
//! first, one for everyone else, which gets at most [`STRANGER_CHECKS_PER_SECOND`]. A full
//! queue drops the datagram. So the loop that answers probes never spends a signature check on
//! a stranger, a flood of made-up signatures cannot delay the members' probes and acks behind
//! it, and what it costs is bounded however many sources it comes from.
//!
//! This module decides membership only; it routes nothing and trusts nothing a datagram says
//! before [`super::envelope::Opener`] has checked who sealed it.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    sync::{Arc, Mutex},
    time::Duration,
};

use foca::{
    AccumulatingRuntime, BroadcastHandler, Codec, Config, Foca, Invalidates, OwnedNotification,
    PostcardCodec, State, Timer,
};
use mesh_domain::{NodeId, NodeInfo, PeerState, sync::MutexExt, throttle::LogThrottle};
use prometheus_client::metrics::counter::Counter;
use rand::{rngs::StdRng, seq::IndexedRandom};
use tokio::{io::Interest, net::UdpSocket, sync::mpsc, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    LinkError, NameTaken, PeerLink, PeerTable,
    adverts::{AdvertGuard, Dropped},
    budget::{FailingSources, TokenBucket},
    envelope::{MAX_DATAGRAM, Opener, Refusal, Sealer},
    icmp,
};
use crate::{
    discovery::{Claim, DiscoveryEvent, PeerSource},
    metrics::{labels, metrics},
};

/// The fleet size foca's settings are derived from (how often an update is retransmitted,
/// how long a suspect has to refute): memberlist's LAN defaults for up to ~50 nodes.
pub const CLUSTER_SIZE: u32 = 50;
/// A node raises its `NodeInfo` version at most this often, however often its load changes.
pub const VERSION_EVERY: Duration = Duration::from_secs(2);
/// The same address is announced to at most this often (static peers are offered every
/// second; an advert may repeat).
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);
/// An mDNS advert's announce that brings no member of the advertised id within this long has
/// failed (it counts against the address, as a refused dial did).
pub const ADVERT_ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// First wait before fetching again a `NodeInfo` whose fetch failed (a member is often heard
/// on UDP a moment before its gRPC listener answers, or on a busy machine its handshake times
/// out); it doubles at each failure.
const FETCH_BACKOFF_FIRST: Duration = Duration::from_millis(250);
/// Longest wait before fetching again a `NodeInfo` whose fetch failed for want of an answer
/// (refused, timed out: a busy or starting node): the member is alive in SWIM, so it is
/// expected to answer soon.
const FETCH_BACKOFF_MAX: Duration = Duration::from_secs(4);
/// Longest wait before fetching again a `NodeInfo` that was refused (not the member's own, or
/// a name another live node holds).
const FETCH_BACKOFF_INVALID: Duration = Duration::from_secs(60);
/// How often the table's states are brought in line with foca's (suspicion is not notified).
const SYNC_EVERY: Duration = Duration::from_millis(250);
/// Most addresses whose last announce is remembered.
const MAX_ANNOUNCED: usize = 1024;
/// How often a node asks one random member for its list of members and announces itself to
/// those it does not know (memberlist's push-pull, for what gossip missed: a join whose
/// updates never reached it). Right after joining, and [`REPAIR_AGAIN`] after a member came
/// up, a list failed or named members this node did not know: a fleet that starts together,
/// or a partition that heals, learns itself fast.
const REPAIR_EVERY: Duration = Duration::from_secs(30);
/// See [`REPAIR_EVERY`].
const REPAIR_AGAIN: Duration = Duration::from_secs(3);
/// Most members announced to after one list (a member's list is not trusted to be short).
const MAX_REPAIR_ANNOUNCES: usize = 256;
/// Datagrams from live members waiting for their signature check; past it they are dropped.
/// Members send a few a second each, so this fills only if a member's address is spoofed.
const MEMBER_QUEUE: usize = 256;
/// Datagrams from anyone else (an announce, a node not yet a member, a flood) waiting for their
/// signature check; past it they are dropped. Checked only when no member's datagram waits.
const STRANGER_QUEUE: usize = 64;
/// Signature checks per second for datagrams from anyone but a live member (announces of
/// nodes joining, a flood from many ports), all together, and how many at once: a join needs a
/// few, and at ~60 µs a check this is a few per cent of a core at most.
pub const STRANGER_CHECKS_PER_SECOND: f64 = 1000.0;
/// See [`STRANGER_CHECKS_PER_SECOND`].
const STRANGER_CHECKS_BURST: f64 = 256.0;
/// Checked datagrams waiting for the loop (the checker waits when it is full).
const CHECKED_QUEUE: usize = 64;
/// Most datagrams read at one wake-up of the loop (a flood is read in batches, not one select
/// per datagram); the loop then sends, fires timers and looks at everything else.
const RECEIVE_BATCH: usize = 64;
/// The membership socket's receive buffer: a flood the loop reads a little slower than it
/// comes (a busy machine) fills the kernel's buffer, which then drops what comes next, members'
/// probes as much as the flood; 4 MiB holds about 2,000 datagrams, a few milliseconds of a
/// flood. The kernel caps it at `net.core.rmem_max` (often 208 KiB; raise it for more).
const RECEIVE_BUFFER: usize = 4 << 20;
/// At most one log line per this long about dropped datagrams (with the count since the last):
/// a flood must not flood the log.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// A member's identity in foca: who, where, and which run of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// The node id (its certificate's key).
    pub id: NodeId,
    /// Where its SWIM socket (and gRPC listener) is.
    pub addr: SocketAddr,
    /// Raised at every start (Unix ms) and every rejoin, so the newest run of a node wins.
    pub bump: u64,
}

impl Member {
    /// Someone unknown at `addr`: what the node announces to (foca accepts an announce by
    /// address alone).
    fn at(addr: SocketAddr) -> Self {
        Self {
            id: NodeId::parse(&"0".repeat(64)).expect("64 zeros are a node id"),
            addr,
            bump: 0,
        }
    }
}

impl foca::Identity for Member {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump + 1,
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}

/// A gossiped `NodeInfo` version: run `bump` of node `id` is at `version`. A restarted node
/// counts again from 1 under a higher bump, so versions compare as `(bump, version)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoVersion {
    id: NodeId,
    bump: u64,
    version: u64,
}

impl Invalidates for InfoVersion {
    fn invalidates(&self, other: &Self) -> bool {
        self.id == other.id && (self.bump, self.version) >= (other.bump, other.version)
    }
}

impl InfoVersion {
    /// 64 id characters, then bump and version big-endian.
    fn encode(&self) -> Vec<u8> {
        let mut out = self.id.as_str().as_bytes().to_vec();
        out.extend_from_slice(&self.bump.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out
    }

    fn decode(data: &[u8]) -> Result<Self, BadVersion> {
        if data.len() != 80 {
            return Err(BadVersion("length is not 80"));
        }
        let id = std::str::from_utf8(&data[..64])
            .ok()
            .and_then(|s| NodeId::parse(s).ok())
            .ok_or(BadVersion("not a node id"))?;
        let number = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&data[at..at + 8]);
            u64::from_be_bytes(bytes)
        };
        Ok(Self {
            id,
            bump: number(64),
            version: number(72),
        })
    }
}

/// A gossiped version item that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("bad NodeInfo version item: {0}")]
pub struct BadVersion(&'static str);

/// The newest `NodeInfo` version heard of per node; ids whose version rose since the loop last
/// looked wait in `raised`.
#[derive(Debug, Default)]
struct VersionBook {
    latest: HashMap<NodeId, (u64, u64)>,
    raised: Vec<NodeId>,
}

/// foca's handler of gossiped versions; it shares its book with the loop (foca owns the
/// handler and lends it to no one).
#[derive(Debug, Default, Clone)]
pub struct Versions {
    book: Arc<Mutex<VersionBook>>,
}

impl BroadcastHandler<Member> for Versions {
    type Key = InfoVersion;
    type Error = BadVersion;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&Member>,
    ) -> Result<Option<InfoVersion>, BadVersion> {
        let item = InfoVersion::decode(data)?;
        let mut book = self.book.lock_unpoisoned();
        let newer = book
            .latest
            .get(&item.id)
            .is_none_or(|known| (item.bump, item.version) > *known);
        if !newer {
            return Ok(None);
        }
        book.latest
            .insert(item.id.clone(), (item.bump, item.version));
        book.raised.push(item.id.clone());
        Ok(Some(item))
    }
}

type Swim = Foca<Member, PostcardCodec, StdRng, Versions>;

/// Where a member's `NodeInfo` stands.
#[derive(Debug, Default)]
struct Fetched {
    /// The run (bump) and `(bump, version)` the table's row was fetched at (`None`: never).
    at: Option<(u64, (u64, u64))>,
    /// A fetch is under way.
    fetching: bool,
    /// After a failed fetch: not before then, and how long the next wait is.
    retry: Option<(Instant, Duration)>,
}

/// What a [`Membership`] is made of: the node's parts it runs with.
#[derive(Debug)]
pub struct MembershipParts {
    /// This node as a member (its `bump` is its start time).
    pub own: Member,
    /// The bound UDP socket on the node's address.
    pub socket: Arc<UdpSocket>,
    /// Seals our datagrams.
    pub sealer: Arc<Sealer>,
    /// Opens theirs.
    pub opener: Arc<Opener>,
    /// Fetches a member's `NodeInfo`.
    pub link: Arc<dyn PeerLink>,
    /// Where the rows go.
    pub table: Arc<PeerTable>,
    /// Changes of our own `NodeInfo` (load, health), which raise our version.
    pub changes: tokio::sync::watch::Receiver<u64>,
    /// foca's settings.
    pub config: Config,
    /// Bounds what mDNS adverts may make this node announce to (pending announces, failing
    /// addresses held back).
    pub adverts: AdvertGuard,
}

/// What [`Membership::run`] needs from the node, and how often it ran.
#[derive(Debug)]
pub struct Membership {
    own: Member,
    socket: Arc<UdpSocket>,
    sealer: Arc<Sealer>,
    opener: Arc<Opener>,
    link: Arc<dyn PeerLink>,
    table: Arc<PeerTable>,
    changes: tokio::sync::watch::Receiver<u64>,
    config: Config,
    /// How often [`Membership::run`] started; each start is a new run (bump) of this node.
    restarts: std::sync::atomic::AtomicU64,
    adverts: Mutex<AdvertGuard>,
}

/// How long a suspect has to refute before it is declared down. memberlist's LAN rule would
/// give ~7 s at 50 nodes; the mesh wants a dead node down everywhere within ~3 s, and a live
/// node refutes within one round trip of hearing the suspicion.
pub const SUSPECT_TO_DOWN: Duration = Duration::from_secs(2);

/// How often a node probes one member, and how long it waits for the direct answer before
/// asking others to probe too (the rest of the period). memberlist's LAN values are 1 s and
/// 500 ms; halved, a dead node is suspected about a second sooner, for one more probe a second
/// per node (a few hundred µs of CPU).
pub const PROBE_PERIOD: Duration = Duration::from_millis(500);
/// See [`PROBE_PERIOD`].
pub const PROBE_RTT: Duration = Duration::from_millis(250);
/// How many times each membership update is sent (see [`lan_config`]).
pub const MAX_TRANSMISSIONS: u8 = 12;

/// memberlist's LAN settings for [`CLUSTER_SIZE`] nodes, probing twice as often
/// ([`PROBE_PERIOD`]) with a shorter suspicion ([`SUSPECT_TO_DOWN`]).
pub fn lan_config() -> Config {
    let mut config = Config::new_lan(NonZeroU32::new(CLUSTER_SIZE).expect("non-zero"));
    config.probe_period = PROBE_PERIOD;
    config.probe_rtt = PROBE_RTT;
    // Each update (a join, a goodbye, a verdict, a version) is sent 12 times, not memberlist's
    // ~7 at 50 members: a member that misses every copy learns a goodbye only by its own probe
    // (seen once: 12.6 s instead of 0.3 s). Costs datagrams only while something changes.
    config.max_transmissions = std::num::NonZeroU8::new(MAX_TRANSMISSIONS).expect("non-zero");
    config.suspect_to_down_after = SUSPECT_TO_DOWN;
    // Members on the two sides of a healed partition find each other by announcing to the
    // members they hold down: every 5 s, not memberlist's 65 s, so a heal shows within seconds.
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(5),
        num_members: NonZeroUsize::new(2).expect("non-zero"),
    });
    // A sealed datagram adds a certificate and a signature (~600 bytes) to foca's packet.
    config.max_packet_size = NonZeroUsize::new(1200).expect("non-zero");
    config
}

/// The `agentmesh_swim_dropped_total` counter of each reason, each looked up once: a flood is
/// counted tens of thousands of times a second.
#[derive(Debug, Default)]
struct DropCounters(Vec<(&'static str, Counter)>);

impl DropCounters {
    /// Counts a datagram dropped for `reason`.
    fn inc(&mut self, reason: &'static str) {
        if let Some((_, counter)) = self.0.iter().find(|(r, _)| *r == reason) {
            counter.inc();
            return;
        }
        let counter = metrics()
            .swim_dropped
            .get_or_create(&labels(&[("reason", reason)]))
            .clone();
        counter.inc();
        self.0.push((reason, counter));
    }
}

/// Asks for a receive buffer of [`RECEIVE_BUFFER`] on the membership socket (the kernel caps
/// it at `net.core.rmem_max`).
pub fn enlarge_receive_buffer(socket: &UdpSocket) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
        .map_err(std::io::Error::from)
}

/// Why a member's fetched `NodeInfo` is not in the table.
enum Ignored {
    /// The fetch failed, or its answer was not the member's.
    Link(LinkError),
    /// Another live node holds its name.
    Name(NameTaken),
}

/// A finished list of a member's members (see [`REPAIR_EVERY`]).
type Listed = Result<Vec<(NodeId, String)>, LinkError>;

/// A finished `NodeInfo` fetch: the member, the `(bump, version)` it was fetched for, and the
/// info with the fetch's time.
type FetchDone = (Member, (u64, u64), Result<(NodeInfo, Duration), LinkError>);

/// The loop's mutable state besides foca.
struct Run<'a> {
    parts: &'a Membership,
    foca: Swim,
    runtime: AccumulatingRuntime<Member>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Timer<Member>>,
    next_timer: u64,
    fetched: HashMap<NodeId, Fetched>,
    fetches: JoinSet<FetchDone>,
    /// The running list of a member's members, if any (one at a time).
    repair: JoinSet<Listed>,
    /// When the next list is due (now, at joining).
    next_repair: Instant,
    rng: StdRng,
    announced: HashMap<SocketAddr, (Instant, PeerSource)>,
    /// Advert announces waiting for their member: the address and when it counts as failed.
    advert_pending: HashMap<NodeId, (String, Instant)>,
    /// Members this node suspected itself (a refused connection), with the incarnation
    /// suspected and when they are declared down unless they refuted. foca runs this timer
    /// only for the suspicions its own probes raise.
    suspected: HashMap<Member, (foca::Incarnation, Instant)>,
    version: u64,
    versions: Versions,
    /// Nodes of other meshes already named in the log.
    foreign: ForeignNodes,
    /// Refused datagrams per source: a source out of tokens gets nothing checked.
    failing: FailingSources,
    /// Signature checks left for strangers' datagrams.
    stranger_checks: TokenBucket,
    /// Where screened datagrams wait for their signature check.
    to_check: Queues,
    /// The checked datagrams, opened or refused.
    checked: mpsc::Receiver<Checked>,
    /// The signature checker ([`check_signatures`]), stopped with the run (also when a panic
    /// ends it: the set aborts it on drop).
    checker: JoinSet<()>,
    /// When the next line about dropped datagrams is due.
    drop_log: LogThrottle,
    /// What dropped datagrams are counted in.
    drops: DropCounters,
}

/// A screened datagram waiting for its signature check.
#[derive(Debug)]
struct Job {
    datagram: Box<[u8]>,
    from: SocketAddr,
}

/// The two queues of [`Job`]s; see the module doc.
#[derive(Debug)]
struct Queues {
    members: mpsc::Sender<Job>,
    strangers: mpsc::Sender<Job>,
}

/// A checked datagram: its sender and the foca message inside, or why it is refused.
#[derive(Debug)]
struct Checked {
    from: SocketAddr,
    result: Result<(NodeId, Vec<u8>), Refusal>,
}

/// Checks the certificate and signature of each queued datagram, members' first, and hands the
/// result to the loop; ends when the loop's side of any queue is gone.
async fn check_signatures(
    opener: Arc<Opener>,
    mut members: mpsc::Receiver<Job>,
    mut strangers: mpsc::Receiver<Job>,
    checked: mpsc::Sender<Checked>,
) {
    loop {
        let job = tokio::select! {
            biased;
            Some(job) = members.recv() => job,
            Some(job) = strangers.recv() => job,
            else => return,
        };
        metrics().swim_signature_checks.inc();
        let result = opener
            .verify(&job.datagram)
            .map(|opened| (opened.sender, opened.payload.to_vec()));
        let from = job.from;
        if checked.send(Checked { from, result }).await.is_err() {
            return;
        }
    }
}

/// How many nodes of other meshes are remembered (and so named once each); past that, more are
/// met silently, so a LAN full of strangers cannot grow the set without bound.
const MAX_FOREIGN_NODES: usize = 256;

/// The nodes of other meshes this node has met, by (name, certificate fingerprint), so that
/// the hint about each is logged once, not at every datagram. Bounded by [`MAX_FOREIGN_NODES`].
#[derive(Debug, Default)]
struct ForeignNodes {
    seen: std::collections::HashSet<(String, String)>,
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

impl Membership {
    /// A membership of `parts.own` that has not run yet.
    pub fn new(parts: MembershipParts) -> Self {
        let MembershipParts {
            own,
            socket,
            sealer,
            opener,
            link,
            table,
            changes,
            config,
            adverts,
        } = parts;
        Self {
            own,
            socket,
            sealer,
            opener,
            link,
            table,
            changes,
            config,
            restarts: std::sync::atomic::AtomicU64::new(0),
            adverts: Mutex::new(adverts),
        }
    }

    /// A new run of this node: foca and the loop's state, before anything is sent. A restarted
    /// loop (after a panic) is a new run of this node: its bump must win.
    fn start(&self) -> Run<'_> {
        let own = Member {
            bump: self.own.bump
                + 1000
                    * self
                        .restarts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..self.own.clone()
        };
        let versions = Versions::default();
        let foca = Foca::with_custom_broadcast(
            own,
            self.config.clone(),
            rand::make_rng::<StdRng>(),
            PostcardCodec,
            versions.clone(),
        );
        let (members, members_rx) = mpsc::channel(MEMBER_QUEUE);
        let (strangers, strangers_rx) = mpsc::channel(STRANGER_QUEUE);
        let (checked_tx, checked) = mpsc::channel(CHECKED_QUEUE);
        let mut checker = JoinSet::new();
        checker.spawn(check_signatures(
            self.opener.clone(),
            members_rx,
            strangers_rx,
            checked_tx,
        ));
        Run {
            parts: self,
            foca,
            runtime: AccumulatingRuntime::new(),
            timers: BinaryHeap::new(),
            pending: HashMap::new(),
            next_timer: 0,
            fetched: HashMap::new(),
            fetches: JoinSet::new(),
            repair: JoinSet::new(),
            next_repair: Instant::now(),
            rng: rand::make_rng::<StdRng>(),
            announced: HashMap::new(),
            advert_pending: HashMap::new(),
            suspected: HashMap::new(),
            version: 0,
            versions,
            foreign: ForeignNodes::default(),
            failing: FailingSources::default(),
            stranger_checks: TokenBucket::full(
                STRANGER_CHECKS_PER_SECOND,
                STRANGER_CHECKS_BURST,
                Instant::now().into_std(),
            ),
            to_check: Queues { members, strangers },
            checked,
            checker,
            drop_log: LogThrottle::new(DROP_LOG_EVERY),
            drops: DropCounters::default(),
        }
    }

    /// Runs SWIM until `cancel`, then leaves the cluster (a goodbye to the members) and returns.
    /// `events` are discovery's: where a first member may be.
    pub async fn run(
        &self,
        events: &mut mpsc::Receiver<DiscoveryEvent>,
        cancel: CancellationToken,
    ) {
        let mut run = self.start();
        run.raise_version();
        let mut changes = self.changes.clone();
        let mut unreachable = self.table.unreachable_reports();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut sync = tokio::time::interval(SYNC_EVERY);
        // A change of our `NodeInfo` raises the version at once if the last raise is
        // VERSION_EVERY old, else at the first sync tick after that: a lone write is known
        // within a round trip of gossip, a busy node raises every VERSION_EVERY at most.
        let mut last_raise = Instant::now();
        let mut changed = false;
        loop {
            let next_timer = run.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                () = cancel.cancelled() => break,
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => {
                        run.screen(&buf[..len], from);
                        // The rest of what is waiting, up to a batch, without a select each.
                        for _ in 1..RECEIVE_BATCH {
                            let Ok((len, from)) = self.socket.try_recv_from(&mut buf) else {
                                break;
                            };
                            run.screen(&buf[..len], from);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "receive membership datagram");
                    }
                },
                Some(checked) = run.checked.recv() => run.deliver(checked),
                () = sleep_until(next_timer) => run.fire_timers(),
                event = events.recv() => match event {
                    None => break,
                    Some(DiscoveryEvent::Seen { addrs, claim, source, .. }) => {
                        run.discovered(addrs, claim.as_ref(), source);
                    }
                    // SWIM hears the node's own goodbye; an mDNS goodbye adds nothing.
                    Some(DiscoveryEvent::Gone { .. }) => {}
                },
                Some(done) = run.fetches.join_next(), if !run.fetches.is_empty() => {
                    if let Ok((member, version, result)) = done {
                        run.fetched_info(member, version, result);
                    }
                }
                Some(listed) = run.repair.join_next(), if !run.repair.is_empty() => {
                    if let Ok(listed) = listed {
                        run.listed(listed);
                    }
                }
                Some(id) = unreachable.recv() => run.suspect(&id),
                refused = self.socket.async_io(Interest::ERROR, || icmp::take_unreachable(&self.socket)) => {
                    if let Ok(Some(addr)) = refused {
                        run.port_unreachable(addr);
                    }
                }
                _ = sync.tick() => {
                    run.expire_suspicions();
                    run.repair_view();
                    run.sync_table();
                    run.expire_adverts();
                }
                Ok(()) = changes.changed() => changed = true,
            }
            if changed && last_raise.elapsed() >= VERSION_EVERY {
                changed = false;
                last_raise = Instant::now();
                run.raise_version();
            }
            run.drain().await;
        }
        if let Err(e) = run.foca.leave_cluster(&mut run.runtime) {
            tracing::debug!(error = %e, "leave the cluster");
        }
        run.drain().await;
        run.checker.abort_all();
        tracing::info!("left the mesh (goodbye sent to the members)");
    }
}

/// What a node logs the first time it hears `name` at `from`, a node of another mesh. A node
/// with members is in a fleet, so the stranger is the one to bring in. A node alone in its
/// mesh may be the stray itself (a device started without `--join` makes a CA of its own), so
/// it says first how *it* joins the other mesh, then the way round.
fn foreign_hint(name: &str, from: SocketAddr, alone: bool) -> String {
    let other = format!(
        "`{name}` at {from} belongs to another mesh (its certificate is not from this mesh's CA)"
    );
    let bring_in = format!(
        "to bring `{name}` in, run `mesh-cli token create --role node` where this mesh's CA key is and start `{name}` with `mesh-node --join TOKEN`"
    );
    if alone {
        format!(
            "{other}, and this node is alone in a mesh of its own (a device started without --join makes its own CA). If this device belongs to `{name}`'s mesh: run `mesh-cli token create --role node` on that mesh's issuer, stop this node, move its data dir's `tls` directory aside, and start it with `mesh-node --join TOKEN`. Or, {bring_in}"
        )
    } else {
        format!("{other}; {bring_in}")
    }
}

/// Declares down the members this node suspected whose suspicion ran out by `now` unrefuted
/// (their incarnation did not rise), as foca does for the suspicions its probes raise.
fn expire_suspicions(
    foca: &mut Swim,
    suspected: &mut HashMap<Member, (foca::Incarnation, Instant)>,
    now: Instant,
    runtime: &mut AccumulatingRuntime<Member>,
) {
    let expired: Vec<(Member, foca::Incarnation)> = suspected
        .iter()
        .filter(|(_, (_, until))| *until <= now)
        .map(|(member, (incarnation, _))| (member.clone(), *incarnation))
        .collect();
    for (member, incarnation) in expired {
        suspected.remove(&member);
        let unrefuted = foca.iter_membership_state().any(|m| {
            *m.id() == member && m.state() == State::Suspect && m.incarnation() == incarnation
        });
        if !unrefuted {
            continue;
        }
        let down = foca::Member::new(member, incarnation, State::Down);
        if let Err(e) = foca.apply_many(std::iter::once(down), true, &mut *runtime) {
            tracing::debug!(error = %e, "declare an unreachable member down");
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Run<'_> {
    /// Screens a received datagram without cryptography and queues it for its signature check
    /// (a live member's in the members' queue), or drops it and counts why.
    fn screen(&mut self, datagram: &[u8], from: SocketAddr) {
        let known = match self.parts.opener.screen(datagram) {
            Ok(known) => known,
            Err(refusal) => return self.refused(&refusal, from, true),
        };
        let now = Instant::now().into_std();
        if !self.failing.admits(from, now) {
            return self.drop_unchecked("throttled", from);
        }
        let member = known.is_some_and(|id| {
            self.foca
                .iter_members()
                .any(|m| m.id().addr == from && m.id().id == id)
        });
        let queue = if member {
            &self.to_check.members
        } else if self.stranger_checks.take(now) {
            &self.to_check.strangers
        } else {
            return self.drop_unchecked("busy", from);
        };
        let job = Job {
            datagram: datagram.into(),
            from,
        };
        if queue.try_send(job).is_err() {
            self.drop_unchecked("busy", from);
        }
    }

    /// A datagram dropped before its signature check for want of room (`busy`) or because its
    /// source fails too often (`throttled`).
    fn drop_unchecked(&mut self, reason: &'static str, from: SocketAddr) {
        self.drops.inc(reason);
        if let Some(count) = self.drop_log.note(std::time::Instant::now()) {
            tracing::debug!(reason, %from, count, "membership datagrams dropped unchecked");
        }
    }

    /// Counts a refused datagram against its source and names a node of another mesh once.
    /// `screened`: refused by the screen, at no cost, so possibly at a flood's rate: logged at
    /// most every [`DROP_LOG_EVERY`]; one refused after its check is logged each time (a source
    /// gets few checks: [`FailingSources`]).
    fn refused(&mut self, refusal: &Refusal, from: SocketAddr, screened: bool) {
        self.drops.inc(refusal.reason());
        self.failing.failed(from, Instant::now().into_std());
        if let Refusal::Foreign { name, fingerprint } = refusal
            && self.foreign.first_meeting(name, fingerprint)
        {
            let alone = self.parts.table.up_peers().is_empty();
            tracing::warn!(
                node = name.as_str(),
                addr = %from,
                "{}",
                foreign_hint(name, from, alone)
            );
        }
        if !screened {
            tracing::debug!(%refusal, %from, "membership datagram dropped");
        } else if let Some(count) = self.drop_log.note(std::time::Instant::now()) {
            tracing::debug!(%refusal, %from, count, "membership datagrams dropped by the screen");
        }
    }

    /// A checked datagram: handed to foca if it opened and speaks for its sealer.
    fn deliver(&mut self, checked: Checked) {
        let (sender, payload) = match checked.result {
            Ok(opened) => opened,
            Err(refusal) => return self.refused(&refusal, checked.from, false),
        };
        // The message must speak for its sealer: nobody announces, acks or leaves as another.
        let header: Result<foca::Header<Member>, _> =
            PostcardCodec.decode_header(payload.as_slice());
        let failed = match header {
            Ok(header) if header.src.id == sender => None,
            Ok(_) => {
                tracing::debug!(sender = %sender.short(), "membership datagram names another node as its source");
                Some("impersonation")
            }
            Err(_) => Some("malformed"),
        };
        if let Some(reason) = failed {
            self.drops.inc(reason);
            self.failing.failed(checked.from, Instant::now().into_std());
            return;
        }
        if self.parts.table.is_revoked(&sender) {
            self.drops.inc("revoked");
            return;
        }
        self.parts.table.heard(&sender);
        if let Err(e) = self.foca.handle_data(payload.as_slice(), &mut self.runtime) {
            tracing::debug!(error = %e, "membership message");
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, key))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(timer) = self.pending.remove(&key)
                && let Err(e) = self.foca.handle_timer(timer, &mut self.runtime)
            {
                tracing::debug!(error = %e, "membership timer");
            }
        }
    }

    /// A discovery event: announce to it, through [`AdvertGuard`] when it is an mDNS advert.
    fn discovered(&mut self, addrs: Vec<String>, claim: Option<&Claim>, source: PeerSource) {
        if let Some(claim) = claim
            && (claim.id == self.foca.identity().id || self.alive(&claim.id))
        {
            return;
        }
        if source != PeerSource::Mdns {
            self.announce(&addrs, source);
            return;
        }
        // An advert always claims an id (`Mdns::seen`); one without is nothing to announce to.
        let Some(id) = claim.map(|c| c.id.clone()) else {
            return;
        };
        let now = std::time::Instant::now();
        let admitted = {
            let mut guard = self.parts.adverts.lock_unpoisoned();
            match guard.admit(&id, &addrs, now) {
                Ok(usable) => Ok(usable),
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
                    Err(why)
                }
            }
        };
        let Ok(usable) = admitted else { return };
        let Some(addr) = usable.first().cloned() else {
            self.parts.adverts.lock_unpoisoned().release(&id);
            return;
        };
        self.advert_pending
            .insert(id, (addr.clone(), Instant::now() + ADVERT_ANSWER_WITHIN));
        self.announce(&[addr], source);
    }

    /// Advert announces whose member did not come within [`ADVERT_ANSWER_WITHIN`]: a failure
    /// of the address; the pending place is freed.
    fn expire_adverts(&mut self) {
        let now = Instant::now();
        let expired: Vec<NodeId> = self
            .advert_pending
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        let mut guard = self.parts.adverts.lock_unpoisoned();
        for id in expired {
            if let Some((addr, _)) = self.advert_pending.remove(&id) {
                guard.failed(&addr, now.into_std());
                guard.release(&id);
            }
        }
    }

    /// An advertised member came: the advert was true.
    fn advert_answered(&mut self, id: &NodeId) {
        if let Some((addr, _)) = self.advert_pending.remove(id) {
            let mut guard = self.parts.adverts.lock_unpoisoned();
            guard.succeeded(&addr);
            guard.release(id);
        }
    }

    /// Announces to the first parseable address of a discovery event, at most every
    /// [`ANNOUNCE_EVERY`] per address, and not to an address of a live member.
    fn announce(&mut self, addrs: &[String], source: PeerSource) {
        let Some(addr) = addrs.iter().find_map(|a| a.parse::<SocketAddr>().ok()) else {
            tracing::debug!(
                ?addrs,
                source = source.as_str(),
                "no IP address to announce to"
            );
            return;
        };
        if addr == self.foca.identity().addr
            || self.foca.iter_members().any(|m| m.id().addr == addr)
        {
            return;
        }
        let now = Instant::now();
        if self
            .announced
            .get(&addr)
            .is_some_and(|(at, _)| now.duration_since(*at) < ANNOUNCE_EVERY)
        {
            return;
        }
        if self.announced.len() >= MAX_ANNOUNCED {
            self.announced.clear();
        }
        self.announced.insert(addr, (now, source));
        tracing::debug!(%addr, source = source.as_str(), "announcing to a candidate member");
        if let Err(e) = self.foca.announce(Member::at(addr), &mut self.runtime) {
            tracing::debug!(error = %e, "announce");
        }
    }

    /// Suspects the live member `id` (a connection to it was refused): it refutes if alive,
    /// else it is down within the suspicion time.
    fn suspect(&mut self, id: &NodeId) {
        let update = self
            .foca
            .iter_members()
            .filter(|m| m.id().id == *id && m.state() == State::Alive)
            .max_by_key(|m| m.id().bump)
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), State::Suspect));
        let Some(update) = update else { return };
        self.suspected.insert(
            update.id().clone(),
            (
                update.incarnation(),
                Instant::now() + self.parts.config.suspect_to_down_after,
            ),
        );
        if let Err(e) = self
            .foca
            .apply_many(std::iter::once(update), true, &mut self.runtime)
        {
            tracing::debug!(error = %e, "suspect an unreachable member");
        }
    }

    fn expire_suspicions(&mut self) {
        expire_suspicions(
            &mut self.foca,
            &mut self.suspected,
            Instant::now(),
            &mut self.runtime,
        );
    }

    /// Nothing listens at `addr` any more (an ICMP port unreachable for our datagram): the
    /// live member there, if any, is suspected at once ([`super::icmp`]).
    fn port_unreachable(&mut self, addr: SocketAddr) {
        let id = self
            .foca
            .iter_members()
            .find(|m| m.id().addr == addr && m.state() == State::Alive)
            .map(|m| m.id().id.clone());
        if let Some(id) = id {
            tracing::debug!(%addr, peer = %id.short(), "port unreachable: suspecting the member");
            self.suspect(&id);
        }
    }

    /// Raises our `NodeInfo` version and gossips it.
    fn raise_version(&mut self) {
        self.version += 1;
        let own = self.foca.identity();
        let item = InfoVersion {
            id: own.id.clone(),
            bump: own.bump,
            version: self.version,
        };
        if let Err(e) = self.foca.add_broadcast(&item.encode()) {
            tracing::debug!(error = %e, "gossip our NodeInfo version");
        }
    }

    /// Sends, schedules and reacts to what foca asked for.
    async fn drain(&mut self) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.send(to.addr, &data).await;
        }
        let now = Instant::now();
        while let Some((after, timer)) = self.runtime.to_schedule() {
            let key = self.next_timer;
            self.next_timer += 1;
            self.timers.push(Reverse((now + after, key)));
            self.pending.insert(key, timer);
        }
        while let Some(notification) = self.runtime.to_notify() {
            self.notified(notification);
        }
        let raised = std::mem::take(&mut self.versions.book.lock_unpoisoned().raised);
        for id in raised {
            self.maybe_fetch(&id);
        }
    }

    async fn send(&self, addr: SocketAddr, payload: &[u8]) {
        let datagram = match self.parts.sealer.seal(payload) {
            Ok(datagram) => datagram,
            Err(e) => {
                tracing::warn!(error = %e, "seal membership datagram");
                return;
            }
        };
        if let Err(e) = self.parts.socket.send_to(&datagram, addr).await {
            tracing::debug!(%addr, error = %e, "send membership datagram");
        }
    }

    fn notified(&mut self, notification: OwnedNotification<Member>) {
        match notification {
            OwnedNotification::MemberUp(member) => {
                self.parts
                    .table
                    .mark(&member.id, PeerState::Up, "alive (SWIM)");
                self.advert_answered(&member.id);
                self.maybe_fetch(&member.id);
                // A member came (a join, a healed partition): what else does it know?
                self.next_repair = self.next_repair.min(Instant::now() + REPAIR_AGAIN);
            }
            OwnedNotification::MemberDown(member) => {
                // A newer run of the same node may be alive at the same time.
                if !self.alive(&member.id) {
                    self.parts
                        .table
                        .mark(&member.id, PeerState::Down, "declared down (SWIM)");
                }
            }
            OwnedNotification::Rename(before, after) => {
                tracing::debug!(from = ?before, to = ?after, "member restarted");
            }
            OwnedNotification::Rejoin(own) => {
                tracing::info!(bump = own.bump, "this node was declared down; rejoined");
            }
            // Joined (the first member answered): learn the rest from it at once.
            OwnedNotification::Active => self.next_repair = Instant::now(),
            OwnedNotification::Idle | OwnedNotification::Defunct => {}
        }
    }

    /// When due and none runs, asks one random live member for its members
    /// ([`REPAIR_EVERY`]).
    fn repair_view(&mut self) {
        let now = Instant::now();
        if now < self.next_repair || !self.repair.is_empty() {
            return;
        }
        let members: Vec<Member> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        let Some(member) = members.choose(&mut self.rng).cloned() else {
            return;
        };
        self.next_repair = now + REPAIR_EVERY;
        let link = self.parts.link.clone();
        self.repair
            .spawn(async move { link.members(&member.addr.to_string(), &member.id).await });
    }

    /// A member's list came: announce to the members in it this node does not know.
    fn listed(&mut self, listed: Listed) {
        let members = match listed {
            Ok(members) => members,
            Err(e) => {
                tracing::debug!(error = %e, "list a member's members");
                self.next_repair = self.next_repair.min(Instant::now() + REPAIR_AGAIN);
                return;
            }
        };
        let own = self.foca.identity().id.clone();
        let unknown: Vec<String> = members
            .into_iter()
            .filter(|(id, _)| *id != own && !self.alive(id) && !self.parts.table.is_revoked(id))
            .map(|(_, addr)| addr)
            .take(MAX_REPAIR_ANNOUNCES)
            .collect();
        if !unknown.is_empty() {
            tracing::debug!(
                count = unknown.len(),
                "announcing to members gossip did not bring"
            );
            self.next_repair = self.next_repair.min(Instant::now() + REPAIR_AGAIN);
        }
        for addr in unknown {
            self.announce(&[addr], PeerSource::Exchange);
        }
    }

    fn alive(&self, id: &NodeId) -> bool {
        self.foca.iter_members().any(|m| m.id().id == *id)
    }

    /// The live member with node id `id` (the newest run, if several).
    fn member(&self, id: &NodeId) -> Option<Member> {
        self.foca
            .iter_members()
            .filter(|m| m.id().id == *id)
            .max_by_key(|m| m.id().bump)
            .map(|m| m.id().clone())
    }

    /// Starts fetching `id`'s `NodeInfo` unless the table has its latest version or a fetch runs.
    fn maybe_fetch(&mut self, id: &NodeId) {
        if self.parts.table.is_revoked(id) {
            return;
        }
        let Some(member) = self.member(id) else {
            return;
        };
        let version = self
            .versions
            .book
            .lock_unpoisoned()
            .latest
            .get(id)
            .copied()
            .unwrap_or_default();
        let state = self.fetched.entry(id.clone()).or_default();
        let current = state
            .at
            .is_some_and(|(bump, fetched)| bump == member.bump && fetched >= version);
        let waiting = state.retry.is_some_and(|(at, _)| Instant::now() < at);
        if state.fetching || current || waiting {
            return;
        }
        state.fetching = true;
        let link = self.parts.link.clone();
        self.fetches.spawn(async move {
            // The fetch's time (dial, handshake, call) is the round trip the router ranks by.
            let started = Instant::now();
            let result = link.info(&member.addr.to_string(), &member.id).await;
            (
                member,
                version,
                result.map(|info| (info, started.elapsed())),
            )
        });
    }

    fn fetched_info(
        &mut self,
        member: Member,
        version: (u64, u64),
        result: Result<(NodeInfo, Duration), LinkError>,
    ) {
        let (id, addr) = (member.id.clone(), member.addr);
        // Found where discovery pointed, or through another member.
        let source = self
            .announced
            .get(&addr)
            .map_or(PeerSource::Exchange, |(_, source)| *source);
        let result = result.map_err(Ignored::Link).and_then(|(info, rtt)| {
            let table = &self.parts.table;
            match table.beat(info, &addr.to_string(), source) {
                Ok(()) => Ok(rtt),
                Err(taken) => Err(Ignored::Name(taken)),
            }
        });
        let state = self.fetched.entry(id.clone()).or_default();
        state.fetching = false;
        match result {
            Ok(rtt) => {
                state.at = Some((member.bump, version));
                state.retry = None;
                self.parts.table.set_rtt(&id, rtt);
                if !self.alive(&id) {
                    self.parts
                        .table
                        .mark(&id, PeerState::Down, "declared down (SWIM)");
                }
            }
            Err(e) => {
                // Tried again by the sync tick, backing off: 250 ms, doubling up to 4 s (60 s
                // for a member whose answer was refused).
                let most = match e {
                    Ignored::Link(LinkError::Invalid(_)) | Ignored::Name(_) => {
                        FETCH_BACKOFF_INVALID
                    }
                    Ignored::Link(_) => FETCH_BACKOFF_MAX,
                };
                let wait = state
                    .retry
                    .map_or(FETCH_BACKOFF_FIRST, |(_, last)| (last * 2).min(most));
                state.retry = Some((Instant::now() + wait, wait));
                match e {
                    Ignored::Link(LinkError::Invalid(why)) => {
                        tracing::warn!(peer = %id.short(), %addr, "ignoring member: its NodeInfo is not its own ({why})")
                    }
                    Ignored::Name(taken) => {
                        tracing::warn!(peer = %id.short(), %addr, "ignoring member: {taken}; stop one of the two nodes, or give one another name and a certificate for it")
                    }
                    Ignored::Link(other) => {
                        tracing::debug!(peer = %id.short(), %addr, error = %other, "fetch NodeInfo")
                    }
                }
                return;
            }
        }
        // A version that rose while fetching is fetched again.
        self.maybe_fetch(&id);
    }

    /// Brings the table's states in line with foca's members, and fetches again the `NodeInfo`
    /// of live members whose last fetch failed (once their backoff has passed).
    fn sync_table(&mut self) {
        let retry: Vec<NodeId> = self
            .fetched
            .iter()
            .filter(|(_, f)| f.retry.is_some_and(|(at, _)| Instant::now() >= at))
            .map(|(id, _)| id.clone())
            .collect();
        for id in retry {
            self.maybe_fetch(&id);
        }
        let mut states: HashMap<&NodeId, (u64, State)> = HashMap::new();
        for member in self.foca.iter_membership_state() {
            let id = member.id();
            let entry = states.entry(&id.id).or_insert((id.bump, member.state()));
            if id.bump >= entry.0 {
                *entry = (id.bump, member.state());
            }
        }
        for (id, (_, state)) in states {
            let state = match state {
                State::Alive => PeerState::Up,
                State::Suspect => PeerState::Suspect,
                State::Down => PeerState::Down,
            };
            self.parts.table.mark(id, state, "SWIM");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: u8) -> Member {
        Member {
            id: NodeId::from_spki_der(&[n]),
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(n))),
            bump: 1,
        }
    }

    /// A link that reaches nobody.
    #[derive(Debug)]
    struct NoLink;

    impl PeerLink for NoLink {
        fn info<'a>(
            &'a self,
            _: &'a str,
            _: &'a NodeId,
        ) -> mesh_domain::BoxFuture<'a, Result<NodeInfo, LinkError>> {
            Box::pin(async { Err(LinkError::Failed("no link".into())) })
        }

        fn members<'a>(
            &'a self,
            _: &'a str,
            _: &'a NodeId,
        ) -> mesh_domain::BoxFuture<'a, Result<Vec<(NodeId, String)>, LinkError>> {
            Box::pin(async { Err(LinkError::Failed("no link".into())) })
        }
    }

    /// Issue 17: the push-pull repair. A member's list makes the node announce itself to the
    /// members in it that it lacks, and to no one else (not itself, not a member it has).
    #[tokio::test]
    async fn a_members_list_makes_the_node_announce_to_the_members_it_lacks() {
        let signer = Arc::new(mesh_cert::OriginSigner::generate().expect("key"));
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let own_addr = socket.local_addr().expect("addr");
        let membership = Membership::new(MembershipParts {
            own: Member {
                id: signer.id().clone(),
                addr: own_addr,
                bump: 1,
            },
            socket,
            sealer: Arc::new(Sealer::new(signer.clone())),
            opener: Arc::new(Opener::new(Arc::new(
                mesh_cert::OriginVerifier::self_certified(),
            ))),
            link: Arc::new(NoLink),
            table: Arc::new(PeerTable::default()),
            changes: tokio::sync::watch::channel(0).1,
            config: lan_config(),
            adverts: AdvertGuard::new(64, 64, Arc::new(tokio::sync::Notify::new())),
        });
        let mut run = membership.start();
        let known = member(1);
        run.foca
            .apply_many(
                std::iter::once(foca::Member::alive(known.clone())),
                true,
                &mut run.runtime,
            )
            .expect("apply");
        while run.runtime.to_send().is_some() {}
        let lacking = member(2);
        run.listed(Ok(vec![
            (signer.id().clone(), own_addr.to_string()),
            (known.id.clone(), known.addr.to_string()),
            (lacking.id.clone(), lacking.addr.to_string()),
        ]));
        let mut sent = Vec::new();
        while let Some((to, _)) = run.runtime.to_send() {
            sent.push(to.addr);
        }
        assert_eq!(sent, [lacking.addr], "announced to the lacking member only");
        assert!(
            run.next_repair <= Instant::now() + REPAIR_AGAIN,
            "a list that named a stranger is asked for again soon"
        );
    }

    fn state_of(foca: &Swim, who: &Member) -> Option<(State, foca::Incarnation)> {
        foca.iter_membership_state()
            .find(|m| m.id() == who)
            .map(|m| (m.state(), m.incarnation()))
    }

    #[test]
    fn a_member_suspected_for_a_refused_connection_is_down_after_the_suspicion_unless_it_refutes() {
        let mut foca = Swim::with_custom_broadcast(
            member(0),
            lan_config(),
            rand::make_rng::<StdRng>(),
            PostcardCodec,
            Versions::default(),
        );
        let mut runtime = AccumulatingRuntime::new();
        let (dead, alive) = (member(1), member(2));
        for who in [&dead, &alive] {
            foca.apply_many(
                std::iter::once(foca::Member::alive(who.clone())),
                true,
                &mut runtime,
            )
            .expect("apply");
        }
        let start = Instant::now();
        let until = start + SUSPECT_TO_DOWN;
        let mut suspected = HashMap::new();
        for who in [&dead, &alive] {
            suspected.insert(who.clone(), (0, until));
            foca.apply_many(
                std::iter::once(foca::Member::new(who.clone(), 0, State::Suspect)),
                true,
                &mut runtime,
            )
            .expect("suspect");
        }
        // `alive` refutes: its incarnation rises.
        foca.apply_many(
            std::iter::once(foca::Member::new(alive.clone(), 1, State::Alive)),
            true,
            &mut runtime,
        )
        .expect("refute");

        expire_suspicions(&mut foca, &mut suspected, start, &mut runtime);
        assert_eq!(state_of(&foca, &dead), Some((State::Suspect, 0)), "not yet");
        expire_suspicions(&mut foca, &mut suspected, until, &mut runtime);
        assert_eq!(state_of(&foca, &dead), Some((State::Down, 0)));
        assert_eq!(state_of(&foca, &alive), Some((State::Alive, 1)));
        assert!(suspected.is_empty(), "every ended suspicion is forgotten");
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

    #[test]
    fn a_gossiped_version_round_trips_and_orders_by_run_then_version() {
        let id = NodeId::from_spki_der(b"alpha");
        let item = InfoVersion {
            id: id.clone(),
            bump: 7,
            version: 3,
        };
        assert_eq!(InfoVersion::decode(&item.encode()).expect("decodes"), item);
        assert!(InfoVersion::decode(&item.encode()[1..]).is_err());
        let versions = Versions::default();
        let mut handler = versions.clone();
        let newer_run = InfoVersion {
            id: id.clone(),
            bump: 8,
            version: 1,
        };
        assert!(
            handler
                .receive_item(&item.encode(), None)
                .expect("ok")
                .is_some()
        );
        assert!(
            handler
                .receive_item(&item.encode(), None)
                .expect("ok")
                .is_none(),
            "not newer"
        );
        assert!(
            handler
                .receive_item(&newer_run.encode(), None)
                .expect("ok")
                .is_some()
        );
        let stale = InfoVersion {
            id,
            bump: 7,
            version: 9,
        };
        assert!(
            handler
                .receive_item(&stale.encode(), None)
                .expect("ok")
                .is_none(),
            "older run"
        );
        assert_eq!(versions.book.lock_unpoisoned().raised.len(), 2);
    }
}
