//! The membership loop: [`Membership`] (made from [`MembershipParts`]) starts a run of this
//! node (foca, its timers, the signature checker) and turns everything that happens (datagrams,
//! timers, discovery, fetches, refused connections, our own changes) into foca calls and table
//! rows until it is cancelled, then leaves. Liveness decisions of our own (a member suspected
//! for a refused connection or an unreachable port) and the table's sync are here too.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use foca::{AccumulatingRuntime, Config, Foca, OwnedNotification, PostcardCodec, State, Timer};
use mesh_domain::{NodeId, PeerState, sync::MutexExt, throttle::LogThrottle};
use rand::rngs::StdRng;
use tokio::{io::Interest, net::UdpSocket, sync::mpsc, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    inbox::{
        CHECKED_QUEUE, Checked, DROP_LOG_EVERY, DropCounters, ForeignNodes, MEMBER_QUEUE, Queues,
        STRANGER_CHECKS_BURST, STRANGER_CHECKS_PER_SECOND, STRANGER_QUEUE, check_signatures,
    },
    member::Member,
    versions::{FetchDone, Fetched, VERSION_EVERY, Versions},
};
use crate::{
    discovery::{DiscoveryEvent, PeerSource},
    peers::{
        LinkError, PeerLink, PeerTable,
        adverts::AdvertGuard,
        budget::{FailingSources, TokenBucket},
        envelope::{MAX_DATAGRAM, Opener, Sealer},
        icmp,
    },
};

/// How often the table's states are brought in line with foca's (suspicion is not notified).
pub(super) const SYNC_EVERY: Duration = Duration::from_millis(250);
/// How often a node asks one random member for its list of members and announces itself to
/// those it does not know (memberlist's push-pull, for what gossip missed: a join whose
/// updates never reached it). Right after joining, and [`REPAIR_AGAIN`] after a member came
/// up, a list failed or named members this node did not know: a fleet that starts together,
/// or a partition that heals, learns itself fast.
pub(super) const REPAIR_EVERY: Duration = Duration::from_secs(30);
/// See [`REPAIR_EVERY`].
pub(super) const REPAIR_AGAIN: Duration = Duration::from_secs(3);
/// Most datagrams read at one wake-up of the loop (a flood is read in batches, not one select
/// per datagram); the loop then sends, fires timers and looks at everything else.
pub(super) const RECEIVE_BATCH: usize = 64;

pub(super) type Swim = Foca<Member, PostcardCodec, StdRng, Versions>;

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
    pub(super) own: Member,
    pub(super) socket: Arc<UdpSocket>,
    pub(super) sealer: Arc<Sealer>,
    pub(super) opener: Arc<Opener>,
    pub(super) link: Arc<dyn PeerLink>,
    pub(super) table: Arc<PeerTable>,
    pub(super) changes: tokio::sync::watch::Receiver<u64>,
    pub(super) config: Config,
    /// How often [`Membership::run`] started; each start is a new run (bump) of this node.
    pub(super) restarts: std::sync::atomic::AtomicU64,
    pub(super) adverts: Mutex<AdvertGuard>,
}

/// A finished list of a member's members (see [`REPAIR_EVERY`]).
pub(super) type Listed = Result<Vec<(NodeId, String)>, LinkError>;

/// The loop's mutable state besides foca.
pub(super) struct Run<'a> {
    pub(super) parts: &'a Membership,
    pub(super) foca: Swim,
    pub(super) runtime: AccumulatingRuntime<Member>,
    pub(super) timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pub(super) pending: HashMap<u64, Timer<Member>>,
    pub(super) next_timer: u64,
    pub(super) fetched: HashMap<NodeId, Fetched>,
    pub(super) fetches: JoinSet<FetchDone>,
    /// The running list of a member's members, if any (one at a time).
    pub(super) repair: JoinSet<Listed>,
    /// When the next list is due (now, at joining).
    pub(super) next_repair: Instant,
    pub(super) rng: StdRng,
    pub(super) announced: HashMap<SocketAddr, (Instant, PeerSource)>,
    /// Advert announces waiting for their member: the address and when it counts as failed.
    pub(super) advert_pending: HashMap<NodeId, (String, Instant)>,
    /// Members this node suspected itself (a refused connection), with the incarnation
    /// suspected and when they are declared down unless they refuted. foca runs this timer
    /// only for the suspicions its own probes raise.
    pub(super) suspected: HashMap<Member, (foca::Incarnation, Instant)>,
    pub(super) version: u64,
    pub(super) versions: Versions,
    /// Nodes of other meshes already named in the log.
    pub(super) foreign: ForeignNodes,
    /// Refused datagrams per source: a source out of tokens gets nothing checked.
    pub(super) failing: FailingSources,
    /// Signature checks left for strangers' datagrams.
    pub(super) stranger_checks: TokenBucket,
    /// Where screened datagrams wait for their signature check.
    pub(super) to_check: Queues,
    /// The checked datagrams, opened or refused.
    pub(super) checked: mpsc::Receiver<Checked>,
    /// The signature checker ([`check_signatures`]), stopped with the run (also when a panic
    /// ends it: the set aborts it on drop).
    pub(super) checker: JoinSet<()>,
    /// When the next line about dropped datagrams is due.
    pub(super) drop_log: LogThrottle,
    /// What dropped datagrams are counted in.
    pub(super) drops: DropCounters,
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
    pub(super) fn start(&self) -> Run<'_> {
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

/// Declares down the members this node suspected whose suspicion ran out by `now` unrefuted
/// (their incarnation did not rise), as foca does for the suspicions its probes raise.
pub(super) fn expire_suspicions(
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

pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Run<'_> {
    pub(super) fn fire_timers(&mut self) {
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

    /// Suspects the live member `id` (a connection to it was refused): it refutes if alive,
    /// else it is down within the suspicion time.
    pub(super) fn suspect(&mut self, id: &NodeId) {
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

    pub(super) fn expire_suspicions(&mut self) {
        expire_suspicions(
            &mut self.foca,
            &mut self.suspected,
            Instant::now(),
            &mut self.runtime,
        );
    }

    /// Nothing listens at `addr` any more (an ICMP port unreachable for our datagram): the
    /// live member there, if any, is suspected at once ([`super::icmp`]).
    pub(super) fn port_unreachable(&mut self, addr: SocketAddr) {
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

    /// Sends, schedules and reacts to what foca asked for.
    pub(super) async fn drain(&mut self) {
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

    pub(super) fn notified(&mut self, notification: OwnedNotification<Member>) {
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

    pub(super) fn alive(&self, id: &NodeId) -> bool {
        self.foca.iter_members().any(|m| m.id().id == *id)
    }

    /// The live member with node id `id` (the newest run, if several).
    pub(super) fn member(&self, id: &NodeId) -> Option<Member> {
        self.foca
            .iter_members()
            .filter(|m| m.id().id == *id)
            .max_by_key(|m| m.id().bump)
            .map(|m| m.id().clone())
    }

    /// Brings the table's states in line with foca's members, and fetches again the `NodeInfo`
    /// of live members whose last fetch failed (once their backoff has passed).
    pub(super) fn sync_table(&mut self) {
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
    use crate::peers::swim::member::{SUSPECT_TO_DOWN, lan_config};

    fn member(n: u8) -> Member {
        Member {
            id: NodeId::from_spki_der(&[n]),
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(n))),
            bump: 1,
        }
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
}
