//! What an mDNS advert may make this node do: bounded announcing for unauthenticated claims.
//!
//! Anyone on the LAN can send adverts, each claiming any node id at any address, and each one
//! makes membership announce itself there. [`AdvertGuard`] bounds that: announces started by
//! adverts whose member has not come yet ("pending") are keyed by the claimed id (a second
//! advert for an id pending starts nothing) and capped; an address whose announce brought no
//! member [`STRIKES`] times is not announced to for a back-off that starts at [`FIRST_BACKOFF`]
//! and doubles with each further failure up to [`MAX_BACKOFF`]; the failing addresses
//! remembered are capped too, the one that failed longest ago forgotten first. An advert dropped
//! at the cap is not remembered (that would be unbounded too); instead the first place freed
//! after such a drop asks the mDNS source, through the `reoffer` notification, to offer its
//! cached adverts again, so a real node whose advert came in a flood is announced to once the
//! flood leaves room. Only adverts go through here: static peers are the operator's word.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use mesh_domain::{NodeId, throttle::LogThrottle};
use tokio::sync::Notify;

/// Failures in a row after which an address is held back.
pub(crate) const STRIKES: u32 = 3;
/// How long an address is held back the first time.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(30);
/// The longest an address is held back.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// At most one log line about adverts dropped at the cap per this period.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why an advert started no dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A session for the claimed id is already dialing.
    AlreadyDialing,
    /// As many advert dials as allowed are pending.
    Cap,
    /// Every address in the advert is held back after failing.
    FailingAddress,
}

impl Dropped {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlreadyDialing => "already_dialing",
            Self::Cap => "cap",
            Self::FailingAddress => "failing_address",
        }
    }
}

/// One address whose dials failed.
#[derive(Debug, Clone, Copy)]
struct Failing {
    /// Failures since the last success.
    strikes: u32,
    /// Not dialed before this.
    held_until: Option<Instant>,
    /// The next hold's length.
    backoff: Duration,
    /// When it last failed (the eviction order).
    last: Instant,
}

/// The pending advert dials and the failing addresses; see the module doc.
#[derive(Debug)]
pub struct AdvertGuard {
    max_pending: usize,
    max_failing: usize,
    pending: HashSet<NodeId>,
    failing: HashMap<String, Failing>,
    /// Adverts dropped at the cap, counted between log lines.
    drops: LogThrottle,
    /// Whether an advert was dropped at the cap since the adverts were last offered again.
    reoffer_owed: bool,
    /// Tells the mDNS source to offer its adverts again.
    reoffer: Arc<Notify>,
}

impl AdvertGuard {
    /// `max_pending` (`discovery.max_advert_dials`) and `max_failing`
    /// (`discovery.max_failing_addrs`) are at least 1 (config checks it); `reoffer` is notified
    /// when adverts dropped at the cap should be offered again.
    pub fn new(max_pending: usize, max_failing: usize, reoffer: Arc<Notify>) -> Self {
        Self {
            max_pending: max_pending.max(1),
            max_failing: max_failing.max(1),
            pending: HashSet::new(),
            failing: HashMap::new(),
            drops: LogThrottle::new(DROP_LOG_INTERVAL),
            reoffer_owed: false,
            reoffer,
        }
    }

    /// Whether an advert claiming `id` at `addrs` may start a dial: on yes, the addresses worth
    /// trying (held-back ones left out) and `id` counts as pending until [`Self::release`].
    pub fn admit(
        &mut self,
        id: &NodeId,
        addrs: &[String],
        now: Instant,
    ) -> Result<Vec<String>, Dropped> {
        if self.pending.contains(id) {
            return Err(Dropped::AlreadyDialing);
        }
        let usable: Vec<String> = addrs
            .iter()
            .filter(|addr| self.usable(addr, now))
            .cloned()
            .collect();
        if usable.is_empty() {
            return Err(Dropped::FailingAddress);
        }
        if self.pending.len() >= self.max_pending {
            self.reoffer_owed = true;
            return Err(Dropped::Cap);
        }
        self.pending.insert(id.clone());
        Ok(usable)
    }

    /// `id`'s advert dial came up or ended. The first place freed after adverts were dropped at
    /// the cap asks for them again.
    pub fn release(&mut self, id: &NodeId) {
        if self.pending.remove(id) && std::mem::take(&mut self.reoffer_owed) {
            self.reoffer.notify_one();
        }
    }

    /// How many advert dials are pending.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether `addr` may be dialed now (it is not held back).
    pub fn usable(&self, addr: &str, now: Instant) -> bool {
        self.failing
            .get(addr)
            .and_then(|f| f.held_until)
            .is_none_or(|until| now >= until)
    }

    /// A dial of `addr` failed: the [`STRIKES`]th failure in a row holds it back, and each one
    /// after that holds it back twice as long as the last, up to [`MAX_BACKOFF`].
    pub fn failed(&mut self, addr: &str, now: Instant) {
        if !self.failing.contains_key(addr) && self.failing.len() >= self.max_failing {
            // Full: forget the address that failed longest ago (O(n), only when full and a new
            // address fails, so a flood costs time bounded by the cap, never memory).
            if let Some(oldest) = self
                .failing
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(a, _)| a.clone())
            {
                self.failing.remove(&oldest);
            }
        }
        let entry = self.failing.entry(addr.to_owned()).or_insert(Failing {
            strikes: 0,
            held_until: None,
            backoff: FIRST_BACKOFF,
            last: now,
        });
        entry.strikes = entry.strikes.saturating_add(1);
        entry.last = now;
        if entry.strikes >= STRIKES {
            entry.held_until = now.checked_add(entry.backoff);
            entry.backoff = entry.backoff.saturating_mul(2).min(MAX_BACKOFF);
        }
    }

    /// `addr` answered as the node it was advertised as: its failures are forgotten.
    pub fn succeeded(&mut self, addr: &str) {
        self.failing.remove(addr);
    }

    /// How many failing addresses are remembered.
    pub fn failing(&self) -> usize {
        self.failing.len()
    }

    /// Counts an advert dropped at the cap; returns how many to name in a log line when one is
    /// due (at most one per [`DROP_LOG_INTERVAL`]), so a flood cannot flood the log too.
    pub fn note_cap_drop(&mut self, now: Instant) -> Option<u64> {
        self.drops.note(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> NodeId {
        NodeId::from_spki_der(&n.to_be_bytes())
    }

    fn guard(max_pending: usize, max_failing: usize) -> AdvertGuard {
        AdvertGuard::new(max_pending, max_failing, Arc::new(Notify::new()))
    }

    fn addrs(a: &str) -> Vec<String> {
        vec![a.to_owned()]
    }

    #[test]
    fn pending_dials_are_keyed_by_the_claimed_id_and_capped() {
        let now = Instant::now();
        let mut guard = guard(2, 16);
        assert_eq!(guard.admit(&id(1), &addrs("a:1"), now), Ok(addrs("a:1")));
        // A second advert for the same id, even at another address, starts nothing.
        assert_eq!(
            guard.admit(&id(1), &addrs("b:1"), now),
            Err(Dropped::AlreadyDialing)
        );
        assert!(guard.admit(&id(2), &addrs("c:1"), now).is_ok());
        assert_eq!(guard.admit(&id(3), &addrs("d:1"), now), Err(Dropped::Cap));
        assert_eq!(guard.pending(), 2);
        // A place frees when a dial ends.
        guard.release(&id(1));
        assert!(guard.admit(&id(3), &addrs("d:1"), now).is_ok());
        assert_eq!(guard.pending(), 2);
    }

    #[test]
    fn the_first_place_freed_after_a_drop_at_the_cap_asks_for_the_adverts_again() {
        let reoffer = Arc::new(Notify::new());
        let mut guard = AdvertGuard::new(1, 16, reoffer.clone());
        let now = Instant::now();
        let asked = || {
            let notified = reoffer.notified();
            tokio::pin!(notified);
            // `enable` takes a stored permit, so this is true only if one was stored.
            notified.as_mut().enable()
        };
        assert!(guard.admit(&id(1), &addrs("a:1"), now).is_ok());
        guard.release(&id(1));
        assert!(!asked(), "nothing was dropped: nothing to offer again");
        assert!(guard.admit(&id(1), &addrs("a:1"), now).is_ok());
        assert_eq!(guard.admit(&id(2), &addrs("b:1"), now), Err(Dropped::Cap));
        assert_eq!(guard.admit(&id(3), &addrs("c:1"), now), Err(Dropped::Cap));
        guard.release(&id(1));
        assert!(asked(), "the drops are owed a re-offer");
        assert!(guard.admit(&id(2), &addrs("b:1"), now).is_ok());
        guard.release(&id(2));
        assert!(!asked(), "once per run of drops");
    }

    #[test]
    fn an_address_that_keeps_failing_is_held_back_longer_each_time() {
        let start = Instant::now();
        let mut guard = guard(8, 16);
        for _ in 1..STRIKES {
            guard.failed("bad:1", start);
            assert!(guard.usable("bad:1", start), "held back too early");
        }
        guard.failed("bad:1", start);
        assert!(!guard.usable("bad:1", start));
        assert_eq!(
            guard.admit(&id(1), &addrs("bad:1"), start),
            Err(Dropped::FailingAddress)
        );
        // An advert with another, usable address keeps only that one.
        let both = vec!["bad:1".to_owned(), "good:1".to_owned()];
        assert_eq!(guard.admit(&id(1), &both, start), Ok(addrs("good:1")));
        guard.release(&id(1));

        let after_first = start + FIRST_BACKOFF;
        assert!(guard.usable("bad:1", after_first));
        // One more failure holds it back twice as long.
        guard.failed("bad:1", after_first);
        assert!(!guard.usable("bad:1", after_first + FIRST_BACKOFF));
        assert!(guard.usable("bad:1", after_first + FIRST_BACKOFF * 2));
        // The hold never exceeds the maximum, however often it fails.
        let mut now = after_first + FIRST_BACKOFF * 2;
        for _ in 0..40 {
            guard.failed("bad:1", now);
            now += MAX_BACKOFF;
        }
        assert!(guard.usable("bad:1", now));
        // A success forgets it.
        guard.failed("bad:1", now);
        guard.succeeded("bad:1");
        assert!(guard.usable("bad:1", now));
    }

    #[test]
    fn the_failing_addresses_are_capped_and_the_oldest_is_forgotten() {
        let start = Instant::now();
        let mut guard = guard(8, 3);
        for (i, addr) in ["a:1", "b:1", "c:1", "d:1"].into_iter().enumerate() {
            for _ in 0..STRIKES {
                guard.failed(addr, start + Duration::from_millis(i as u64));
            }
        }
        assert_eq!(guard.failing(), 3);
        assert!(guard.usable("a:1", start), "the oldest was forgotten");
        for addr in ["b:1", "c:1", "d:1"] {
            assert!(
                !guard.usable(addr, start + Duration::from_millis(5)),
                "{addr}"
            );
        }
    }

    #[test]
    fn drops_at_the_cap_are_logged_at_most_once_per_interval() {
        let start = Instant::now();
        let mut guard = guard(1, 1);
        assert_eq!(guard.note_cap_drop(start), Some(1));
        for _ in 0..999 {
            assert_eq!(guard.note_cap_drop(start + Duration::from_secs(1)), None);
        }
        assert_eq!(guard.note_cap_drop(start + DROP_LOG_INTERVAL), Some(1000));
    }
}
