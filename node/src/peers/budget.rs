//! What a membership datagram may cost before it is dropped unchecked: token buckets.
//!
//! - [`FailingSources`]: a bucket per source address of refused datagrams. Each refused datagram
//!   takes a token; a source with none left gets nothing checked with cryptography until its
//!   bucket refills, so a flood of made-up signatures from one socket costs at most
//!   [`FAILURE_BURST`] signature checks and then [`FAILURES_PER_SECOND`]. Keyed by address and
//!   port, not address alone: several nodes may share one host (or one NAT address), and a
//!   member's datagrams do not fail, so its bucket stays full.
//! - [`TokenBucket`] on its own: how many signature checks datagrams from strangers (anyone but
//!   a live member at its address) get per second, all sources together, so a flood from many
//!   ports, each with a burst of its own, still costs a bounded share of a core.
//!
//! Pure bookkeeping with the time passed in; it receives, checks and drops nothing itself.

use std::{
    collections::HashMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// Refused datagrams a source may send at once before its datagrams go unchecked.
pub const FAILURE_BURST: f64 = 32.0;
/// Refused datagrams a source may send per second after its burst.
pub const FAILURES_PER_SECOND: f64 = 8.0;
/// Most sources remembered; when full, sources whose bucket has refilled are forgotten (at most
/// every [`SWEEP_EVERY`]), and past that a new source's failures are not counted (the budget
/// of strangers' checks still bounds what it costs).
pub(crate) const MAX_SOURCES: usize = 4096;
/// How often a full table looks for sources to forget (a scan of [`MAX_SOURCES`]).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Tokens that refill at `rate` per second up to `burst`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    /// Tokens as of `at`.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub(crate) fn full(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Its tokens at `now`.
    fn level(&self, now: Instant) -> f64 {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        (self.tokens + refill).min(self.burst)
    }

    /// Whether a token is left at `now`.
    pub(crate) fn has_token(&self, now: Instant) -> bool {
        self.level(now) >= 1.0
    }

    /// Takes a token at `now` if one is left; whether it did.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let level = self.level(now);
        self.at = now;
        if level >= 1.0 {
            self.tokens = level - 1.0;
            true
        } else {
            self.tokens = level;
            false
        }
    }

    /// Whether it is full at `now` (as a new one would be).
    fn is_full(&self, now: Instant) -> bool {
        self.level(now) >= self.burst
    }
}

/// The failure buckets of the sources that sent refused datagrams; see the module doc.
#[derive(Debug, Default)]
pub(crate) struct FailingSources {
    buckets: HashMap<SocketAddr, TokenBucket>,
    last_sweep: Option<Instant>,
}

impl FailingSources {
    /// Whether a datagram from `from` may be checked now: its source has a failure left.
    pub(crate) fn admits(&self, from: SocketAddr, now: Instant) -> bool {
        self.buckets
            .get(&from)
            .is_none_or(|bucket| bucket.has_token(now))
    }

    /// Counts a refused datagram from `from` at `now`.
    pub(crate) fn failed(&mut self, from: SocketAddr, now: Instant) {
        if let Some(bucket) = self.buckets.get_mut(&from) {
            bucket.take(now);
            return;
        }
        if self.buckets.len() >= MAX_SOURCES
            && self
                .last_sweep
                .is_none_or(|last| now.saturating_duration_since(last) >= SWEEP_EVERY)
        {
            self.last_sweep = Some(now);
            self.buckets.retain(|_, bucket| !bucket.is_full(now));
        }
        if self.buckets.len() < MAX_SOURCES {
            let mut bucket = TokenBucket::full(FAILURES_PER_SECOND, FAILURE_BURST, now);
            bucket.take(now);
            self.buckets.insert(from, bucket);
        }
    }

    /// How many sources are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(10.0, 3.0, start);
        assert!((0..3).all(|_| bucket.take(start)));
        assert!(!bucket.take(start) && !bucket.has_token(start));
        let later = start + Duration::from_millis(100);
        assert!(bucket.take(later), "one token refilled");
        assert!(!bucket.take(later));
        assert!(bucket.is_full(later + Duration::from_secs(60)));
    }

    #[test]
    fn a_source_is_admitted_for_its_burst_then_at_the_refill_rate() {
        let mut sources = FailingSources::default();
        let start = Instant::now();
        let (flooder, member) = (source(1), source(2));
        for _ in 0..FAILURE_BURST as usize {
            assert!(sources.admits(flooder, start));
            sources.failed(flooder, start);
        }
        assert!(!sources.admits(flooder, start), "the burst is spent");
        assert!(sources.admits(member, start), "another source is not");
        let later = start + Duration::from_secs_f64(1.0 / FAILURES_PER_SECOND);
        assert!(sources.admits(flooder, later), "one failure refilled");
        sources.failed(flooder, later);
        assert!(!sources.admits(flooder, later));
        assert!(sources.admits(flooder, later + Duration::from_secs(60)));
    }

    #[test]
    fn a_full_table_forgets_refilled_sources_and_counts_no_more() {
        let mut sources = FailingSources::default();
        let start = Instant::now();
        for port in 0..MAX_SOURCES as u16 {
            sources.failed(source(port), start);
        }
        assert_eq!(sources.len(), MAX_SOURCES);
        let newcomer = source(u16::MAX);
        sources.failed(newcomer, start);
        assert_eq!(sources.len(), MAX_SOURCES, "nothing refilled: not counted");
        assert!(sources.admits(newcomer, start));
        // Refilled (one failure each, an eighth of a second): forgotten at the next sweep.
        let later = start + SWEEP_EVERY;
        sources.failed(newcomer, later);
        assert_eq!(sources.len(), 1, "{} remembered", sources.len());
    }
}
