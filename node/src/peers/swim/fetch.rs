//! Fetching members' `NodeInfo`: our own version raised and gossiped, and a member's info
//! fetched over mTLS when its gossiped version rose, put in the table, and fetched again with
//! a backoff when the fetch failed or its answer was refused.

use std::time::Duration;

use mesh_domain::{NodeId, NodeInfo, PeerState, sync::MutexExt};
use tokio::time::Instant;

use super::{member::Member, run::Run, versions::InfoVersion};
use crate::{
    discovery::PeerSource,
    peers::{LinkError, NameTaken},
};

/// First wait before fetching again a `NodeInfo` whose fetch failed (a member is often heard
/// on UDP a moment before its gRPC listener answers, or on a busy machine its handshake times
/// out); it doubles at each failure.
pub(super) const FETCH_BACKOFF_FIRST: Duration = Duration::from_millis(250);
/// Longest wait before fetching again a `NodeInfo` whose fetch failed for want of an answer
/// (refused, timed out: a busy or starting node): the member is alive in SWIM, so it is
/// expected to answer soon.
pub(super) const FETCH_BACKOFF_MAX: Duration = Duration::from_secs(4);
/// Longest wait before fetching again a `NodeInfo` that was refused (not the member's own, or
/// a name another live node holds).
pub(super) const FETCH_BACKOFF_INVALID: Duration = Duration::from_secs(60);

/// Why a member's fetched `NodeInfo` is not in the table.
pub(super) enum Ignored {
    /// The fetch failed, or its answer was not the member's.
    Link(LinkError),
    /// Another live node holds its name.
    Name(NameTaken),
}

impl Run<'_> {
    /// Raises our `NodeInfo` version and gossips it.
    pub(super) fn raise_version(&mut self) {
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

    /// Starts fetching `id`'s `NodeInfo` unless the table has its latest version or a fetch runs.
    pub(super) fn maybe_fetch(&mut self, id: &NodeId) {
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

    pub(super) fn fetched_info(
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
}
