//! A deterministic simulation of SWIM membership as the node runs it (the `foca` crate), to
//! project what a fleet of hundreds or thousands of members would see without running them.
//!
//! foca does no I/O and reads no clock: it hands what it wants sent, scheduled and announced
//! to a [`foca::Runtime`] ([`AccumulatingRuntime`] here). The simulation owns one `Foca` per
//! member, a simulated clock, and a simulated network (an event queue): each datagram is
//! dropped with the configured probability or delivered after a random LAN latency, each timer
//! fires at its simulated time, and a killed member neither receives nor fires anything. Every
//! random choice (foca's own, loss, latency, jitter) comes from seeded generators, so a run is
//! reproducible from its seed.
//!
//! Messages are encoded by foca's postcard codec with an identity the size of the node's (a
//! 32-byte node id, an IPv4 address and port, a renew counter), so byte counts are those of
//! foca's payloads; the node's authentication envelope comes on top of each datagram.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    net::{Ipv4Addr, SocketAddrV4},
    num::NonZeroU32,
    time::Duration,
};

use foca::{AccumulatingRuntime, Config, Foca, Identity, Member, OwnedNotification, PostcardCodec};
use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
use serde::{Deserialize, Serialize};

/// A member's identity, shaped like the node's: its node id (SHA-256 of its key), where it
/// listens, and a counter bumped when it must rejoin under a fresh identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimId {
    key: [u8; 32],
    addr: SocketAddrV4,
    bump: u16,
}

impl Identity for SimId {
    type Addr = SocketAddrV4;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        // The later incarnation of the same member wins, as after a restart.
        self.bump > adversary.bump
    }
}

/// Where member `index` listens: 10.x.y.z:7700, so the network finds a member from an address.
fn addr_of(index: usize) -> SocketAddrV4 {
    let i = index as u32 + 1;
    SocketAddrV4::new(Ipv4Addr::from(0x0a00_0000 | i), 7700)
}

/// The member listening on `addr` (the inverse of [`addr_of`]).
fn index_of(addr: &SocketAddrV4) -> usize {
    (u32::from(*addr.ip()) & 0x00ff_ffff) as usize - 1
}

/// Simulated network and fleet parameters.
#[derive(Debug, Clone)]
pub struct SimParams {
    /// Members, all alive and knowing each other at the start.
    pub members: usize,
    /// Probability that a datagram is lost, each one independently.
    pub loss: f64,
    /// One-way latency, drawn uniformly from this range.
    pub latency: (Duration, Duration),
    /// Seed of every random choice.
    pub seed: u64,
    /// Every member's foca configuration.
    pub config: Config,
}

impl SimParams {
    /// `members` on a LAN (0.2–2 ms one way) losing `loss` of the datagrams, configured by
    /// [`node_config`].
    pub fn lan(members: usize, loss: f64, seed: u64) -> Self {
        Self {
            members,
            loss,
            latency: (Duration::from_micros(200), Duration::from_millis(2)),
            seed,
            config: node_config(members),
        }
    }
}

/// The foca configuration the projections start from for `members`, foca's own for a LAN:
/// [`Config::new_lan`] (probe every 1 s, direct-probe timeout 500 ms, 3 indirect probes,
/// suspicion 4 × max(1, log10 N) s, gossip to 3 members every 200 ms, an announce to one member
/// every 30 s). The bench's arguments try faster timings against it.
pub fn node_config(members: usize) -> Config {
    let size =
        NonZeroU32::new(u32::try_from(members).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
    Config::new_lan(size)
}

/// One verdict: `observer` declared `subject` down (or up) at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Simulated time since the start.
    pub at: Duration,
    /// Member that declared it.
    pub observer: usize,
    /// Member declared down (or up).
    pub subject: usize,
}

/// What one member sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traffic {
    /// Datagrams sent.
    pub messages: u64,
    /// Their foca payload bytes.
    pub bytes: u64,
}

type SimFoca = Foca<SimId, PostcardCodec, Xoshiro256PlusPlus, foca::NoCustomBroadcast>;

/// What happens at a simulated instant.
#[derive(Debug)]
enum Event {
    Deliver {
        to: usize,
        data: Vec<u8>,
    },
    Timer {
        member: usize,
        timer: foca::Timer<SimId>,
    },
}

/// An event with its time; ordered by time, then by when it was scheduled, so runs repeat.
#[derive(Debug)]
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A simulated fleet: members, clock, network.
pub struct Sim {
    params: SimParams,
    members: Vec<SimFoca>,
    alive: Vec<bool>,
    /// Simulated microseconds since the start.
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    net: Xoshiro256PlusPlus,
    runtime: AccumulatingRuntime<SimId>,
    traffic: Vec<Traffic>,
    downs: Vec<Verdict>,
    ups: Vec<Verdict>,
    /// Node ids of members that join later.
    keys: Xoshiro256PlusPlus,
    /// Calls foca refused (a datagram it could not decode, a probe cycle cut short).
    pub errors: u64,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // foca's instances and runtime do not print; their number and the clock say enough.
        f.debug_struct("Sim")
            .field("members", &self.members.len())
            .field("now", &self.now())
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// Micro-seconds of `d`, the simulation's time unit.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Sim {
    /// `params.members` members that all know each other (as after the fleet formed), their
    /// first probes spread over one probe period as real nodes' would be.
    pub fn new(params: SimParams) -> Self {
        let config = params.config.clone();
        let mut ids_rng = Xoshiro256PlusPlus::seed_from_u64(params.seed);
        let ids: Vec<SimId> = (0..params.members)
            .map(|i| SimId {
                key: ids_rng.random(),
                addr: addr_of(i),
                bump: 0,
            })
            .collect();
        let members = ids
            .iter()
            .enumerate()
            .map(|(i, id)| Self::member(&params, i, id.clone()))
            .collect();
        let mut sim = Self {
            net: Xoshiro256PlusPlus::seed_from_u64(!params.seed),
            alive: vec![true; params.members],
            traffic: vec![Traffic::default(); params.members],
            params,
            members,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            runtime: AccumulatingRuntime::new(),
            downs: Vec::new(),
            ups: Vec::new(),
            keys: ids_rng,
            errors: 0,
        };
        let period = micros(config.probe_period);
        for i in 0..sim.members.len() {
            let others = ids
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, id)| Member::alive(id.clone()));
            let result = sim.members[i].apply_many(others, false, &mut sim.runtime);
            let jitter = sim.net.random_range(0..period);
            sim.record(result.is_err());
            sim.drain(i, jitter);
        }
        sim
    }

    /// Member `index`'s foca, with a generator of its own so runs repeat.
    fn member(params: &SimParams, index: usize, id: SimId) -> SimFoca {
        let rng = Xoshiro256PlusPlus::seed_from_u64(params.seed ^ ((index as u64 + 1) << 20));
        Foca::new(id, params.config.clone(), rng, PostcardCodec)
    }

    /// Starts a new member that knows only `seed` and announces itself to it, as a node
    /// started with one static peer does; returns its index.
    pub fn join(&mut self, seed: usize) -> usize {
        let index = self.members.len();
        let id = SimId {
            key: self.keys.random(),
            addr: addr_of(index),
            bump: 0,
        };
        let seed_id = self.members[seed].identity().clone();
        self.members.push(Self::member(&self.params, index, id));
        self.alive.push(true);
        self.traffic.push(Traffic::default());
        let result = self.members[index].announce(seed_id, &mut self.runtime);
        self.record(result.is_err());
        self.drain(index, 0);
        index
    }

    /// Simulated time since the start.
    pub fn now(&self) -> Duration {
        Duration::from_micros(self.now)
    }

    /// Members in the simulation.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the simulation has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `member` runs (was not killed).
    pub fn is_alive(&self, member: usize) -> bool {
        self.alive[member]
    }

    /// Stops `member` at once, as SIGKILL does: it sends, receives and fires nothing more.
    pub fn kill(&mut self, member: usize) {
        self.alive[member] = false;
    }

    /// Every `down` verdict so far.
    pub fn downs(&self) -> &[Verdict] {
        &self.downs
    }

    /// Every `up` verdict so far (a member learning of another, or of its return).
    pub fn ups(&self) -> &[Verdict] {
        &self.ups
    }

    /// What each member sent so far.
    pub fn traffic(&self) -> &[Traffic] {
        &self.traffic
    }

    /// Forgets the traffic counted so far (to measure a window).
    pub fn reset_traffic(&mut self) {
        self.traffic.fill(Traffic::default());
    }

    /// Runs the simulation for `span` of simulated time.
    pub fn run_for(&mut self, span: Duration) {
        let end = self.now + micros(span);
        self.run_until(end, |_| false);
    }

    /// Runs until `done(self)` holds after an event, or `span` passes; whether it held.
    pub fn run_while_not(&mut self, span: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let end = self.now + micros(span);
        self.run_until(end, done)
    }

    fn run_until(&mut self, end: u64, done: impl Fn(&Self) -> bool) -> bool {
        while let Some(Reverse(next)) = self.queue.peek() {
            if next.at > end {
                break;
            }
            let Some(Reverse(next)) = self.queue.pop() else {
                break;
            };
            self.now = next.at;
            match next.event {
                Event::Deliver { to, data } => {
                    if self.alive[to] {
                        let result = self.members[to].handle_data(&data, &mut self.runtime);
                        self.record(result.is_err());
                        self.drain(to, 0);
                    }
                }
                Event::Timer { member, timer } => {
                    if self.alive[member] {
                        let result = self.members[member].handle_timer(timer, &mut self.runtime);
                        self.record(result.is_err());
                        self.drain(member, 0);
                    }
                }
            }
            if done(self) {
                return true;
            }
        }
        self.now = self.now.max(end);
        false
    }

    fn record(&mut self, failed: bool) {
        if failed {
            self.errors += 1;
        }
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// Moves what member `from`'s foca asked for into the network and the timer queue, timers
    /// shifted by `jitter` µs.
    fn drain(&mut self, from: usize, jitter: u64) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.traffic[from].messages += 1;
            self.traffic[from].bytes += data.len() as u64;
            if self.net.random::<f64>() < self.params.loss {
                continue;
            }
            let (low, high) = self.params.latency;
            let delay = self.net.random_range(micros(low)..=micros(high));
            let to = index_of(&to.addr);
            self.schedule(
                self.now + delay,
                Event::Deliver {
                    to,
                    data: data.to_vec(),
                },
            );
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.schedule(
                self.now + micros(after) + jitter,
                Event::Timer {
                    member: from,
                    timer,
                },
            );
        }
        while let Some(notification) = self.runtime.to_notify() {
            let (verdicts, id) = match notification {
                OwnedNotification::MemberDown(id) => (&mut self.downs, id),
                OwnedNotification::MemberUp(id) => (&mut self.ups, id),
                _ => continue,
            };
            verdicts.push(Verdict {
                at: Duration::from_micros(self.now),
                observer: from,
                subject: index_of(&id.addr),
            });
        }
    }
}

/// How news of one member spread (it was killed, or it joined): when each live member learned
/// it, and so when the first and the last did.
#[derive(Debug, Clone)]
pub struct Detection {
    /// Per live member, the time from the kill (the join) to its `down` (`up`) verdict; None:
    /// not in time.
    pub learned: Vec<Option<Duration>>,
}

impl Detection {
    /// When every live member knew, if all did.
    pub fn everyone(&self) -> Option<Duration> {
        self.learned
            .iter()
            .try_fold(Duration::ZERO, |max, t| t.map(|t| max.max(t)))
    }
}

/// Kills `victim` and runs until every other live member declared it down, or `timeout`.
pub fn detect(sim: &mut Sim, victim: usize, timeout: Duration) -> Detection {
    let from = sim.downs().len();
    sim.kill(victim);
    spread(sim, victim, timeout, |sim| &sim.downs()[from..])
}

/// Starts a member that announces itself to `seed` and runs until every other live member
/// knows it is up, or `timeout`; when each learned it, from the start.
pub fn join(sim: &mut Sim, seed: usize, timeout: Duration) -> Detection {
    let from = sim.ups().len();
    let newcomer = sim.join(seed);
    spread(sim, newcomer, timeout, |sim| &sim.ups()[from..])
}

/// Runs until every live member other than `subject` has a verdict on it in `verdicts`, or
/// `timeout`; per live member, the time from now until its first one.
fn spread(
    sim: &mut Sim,
    subject: usize,
    timeout: Duration,
    verdicts: impl Fn(&Sim) -> &[Verdict],
) -> Detection {
    let started = sim.now();
    let observers = |sim: &Sim| {
        (0..sim.len())
            .filter(|m| *m != subject && sim.is_alive(*m))
            .count()
    };
    let knows = |sim: &Sim| {
        let mut seen: Vec<usize> = verdicts(sim)
            .iter()
            .filter(|v| v.subject == subject)
            .map(|v| v.observer)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    sim.run_while_not(timeout, |sim| knows(sim) >= observers(sim));
    let mut learned = vec![None; sim.len()];
    for v in verdicts(sim).iter().filter(|v| v.subject == subject) {
        let slot = &mut learned[v.observer];
        if slot.is_none() {
            *slot = Some(v.at - started);
        }
    }
    Detection {
        learned: learned
            .into_iter()
            .enumerate()
            .filter(|(m, _)| *m != subject && sim.is_alive(*m))
            .map(|(_, t)| t)
            .collect(),
    }
}
