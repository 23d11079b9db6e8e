//! Who holds what: this node's own write sequence, what it has pulled from each peer about each
//! origin (watermarks), what each peer says it holds (frontiers), the nodes heard of within the
//! tombstone window (`known`), the contact clock, and how far behind a peer this node is (lag).
//! Bookkeeping kept in the store's meta tree: it must not read or write records, collect
//! tombstones (`gc` reads these counters to decide) or talk to peers (`sync` feeds them).

use std::{collections::BTreeMap, time::Duration};

use mesh_domain::{NodeId, sync::MutexExt, time::now_ms};
use tokio::sync::watch;

use super::{
    error::MemoryError,
    store::{META, Memory},
};
use crate::storage::Write;

/// Meta key of when this node was last in touch (Unix ms): its last completed sync, or the first
/// record pushed to a node that never synced; [`Memory::stale`] reads it.
pub(super) const CONTACT_KEY: &[u8] = b"contact";

impl Memory {
    /// This node's own latest write sequence number.
    pub fn own_seq(&self) -> u64 {
        *self.own_seq.borrow()
    }

    /// Follows this node's own latest write sequence number as writes happen.
    pub fn follow_own_seq(&self) -> watch::Receiver<u64> {
        self.own_seq.subscribe()
    }

    /// What we have pulled from `peer` about `origin`.
    pub fn watermark(&self, peer: &NodeId, origin: &NodeId) -> u64 {
        self.meta_u64(watermark_key(peer, origin)).unwrap_or(0)
    }

    /// Raises what we have pulled from `peer` about `origin` (watermarks never go back).
    pub(super) fn set_watermark(
        &self,
        peer: &NodeId,
        origin: &NodeId,
        seq: u64,
    ) -> Result<(), MemoryError> {
        self.raise_meta(watermark_key(peer, origin), seq)
    }

    /// Every watermark we hold for `peer`.
    pub fn watermarks(&self, peer: &NodeId) -> BTreeMap<NodeId, u64> {
        self.meta_under(&format!("wm/{}/", peer.as_str()))
            .into_iter()
            .filter_map(|(origin, seq)| Some((NodeId::parse(&origin).ok()?, seq)))
            .collect()
    }

    /// How far behind this node is on `peer`'s writes: records it lacks (the peer's latest
    /// sequence minus what it holds) and, while behind, milliseconds since it last synced
    /// with the peer.
    pub fn lag(&self, peer: &NodeId, peer_seq: u64) -> (u64, u64) {
        let have = self.watermark(peer, peer).max(self.highest_from(peer));
        let records = peer_seq.saturating_sub(have);
        if records == 0 {
            return (0, 0);
        }
        let since = self
            .synced_at
            .lock_unpoisoned()
            .get(peer)
            .map(|at| at.elapsed().as_millis() as u64)
            .unwrap_or(0);
        (records, since)
    }

    /// Time since the last complete sync with `peer` (`MAX` when never).
    pub fn since_sync(&self, peer: &NodeId) -> Duration {
        self.synced_at
            .lock_unpoisoned()
            .get(peer)
            .map_or(Duration::MAX, |at| at.elapsed())
    }

    /// This node's frontier: per origin, the sequence up to which it holds every write of that
    /// origin or what overwrote it — its watermark from the origin itself, whose index walks in
    /// order — and its own last write.
    pub fn frontier(&self) -> BTreeMap<NodeId, u64> {
        let mut out: BTreeMap<NodeId, u64> = self
            .meta_under("wm/")
            .into_iter()
            .filter_map(|(pair, seq)| {
                let (peer, origin) = pair.split_once('/')?;
                (peer == origin).then_some(())?;
                Some((NodeId::parse(origin).ok()?, seq))
            })
            .collect();
        let own = self.own_seq();
        if own > 0 {
            out.insert(self.own.clone(), own);
        }
        out
    }

    /// Records what `peer` says it holds (its frontier) and that we heard from it now. Only
    /// origins this node holds records of count (the frontiers only ever decide about those
    /// records' tombstones), and no peer holds more of this node's writes than it made: a peer
    /// naming thousands of made-up origins, or `u64::MAX`, stores nothing for them. One commit.
    pub fn note_peer(
        &self,
        peer: &NodeId,
        frontier: &BTreeMap<NodeId, u64>,
    ) -> Result<(), MemoryError> {
        if peer == &self.own {
            return Ok(());
        }
        let origins = self.origins()?;
        let mut raised = vec![(seen_key(peer), now_ms())];
        for (origin, seq) in frontier {
            if origin == &self.own {
                raised.push((frontier_key(peer, origin), (*seq).min(self.own_seq())));
            } else if origins.contains_key(origin) {
                raised.push((frontier_key(peer, origin), *seq));
            }
        }
        self.raise_metas(raised)
    }

    /// Takes in the nodes a peer has heard of (and when), so that a node we never met but
    /// that may still hold old values also holds back early tombstone collection. Only nodes
    /// this node holds records of, or has heard of itself, are taken: a node's records are
    /// signed, so a peer cannot make up a node that holds back collection here (or fill the
    /// meta tree with made-up ids).
    pub fn merge_known(&self, known: &BTreeMap<NodeId, u64>) -> Result<(), MemoryError> {
        let now = now_ms();
        let origins = self.origins()?;
        let raised = known
            .iter()
            .filter(|(node, _)| *node != &self.own)
            .filter(|(node, _)| {
                origins.contains_key(*node) || self.meta_u64(seen_key(node)).is_some()
            })
            .map(|(node, at)| (seen_key(node), (*at).min(now)))
            .collect();
        self.raise_metas(raised)
    }

    /// The highest of this node's own writes it gave `peer` (in a `Sync` answer or a push):
    /// what `peer` can have seen of them.
    pub(super) fn offered(&self, peer: &NodeId) -> u64 {
        self.meta_u64(offered_key(peer)).unwrap_or(0)
    }

    /// Records that `peer` was given this node's writes up to `seq`.
    pub(super) fn note_offered(&self, peer: &NodeId, seq: u64) -> Result<(), MemoryError> {
        if seq == 0 || peer == &self.own {
            return Ok(());
        }
        self.raise_meta(offered_key(peer), seq)
    }

    /// The nodes heard of within the tombstone window, with when (Unix ms).
    pub fn known(&self) -> BTreeMap<NodeId, u64> {
        let horizon = now_ms().saturating_sub(self.tombstone_window.as_millis() as u64);
        self.meta_under("seen/")
            .into_iter()
            .filter(|(_, at)| *at >= horizon)
            .filter_map(|(id, at)| Some((NodeId::parse(&id).ok()?, at)))
            .collect()
    }

    /// How far `peer` said it holds `origin`'s writes.
    pub(super) fn peer_frontier(&self, peer: &NodeId, origin: &NodeId) -> u64 {
        self.meta_u64(frontier_key(peer, origin)).unwrap_or(0)
    }

    /// Records that this node is in touch now (a sync completed).
    pub(super) fn touch_contact(&self) -> Result<(), MemoryError> {
        self.raise_meta(CONTACT_KEY, now_ms())
    }

    /// Records "in touch now" unless a contact time is already recorded.
    pub(super) fn start_contact_clock(&self) -> Result<(), MemoryError> {
        let _writer = self.write_lock();
        if self.store.get(META, CONTACT_KEY)?.is_none() {
            self.store.commit(vec![Write::Put(
                META.into(),
                CONTACT_KEY.to_vec(),
                now_ms().to_be_bytes().to_vec(),
            )])?;
        }
        Ok(())
    }
}

fn frontier_key(peer: &NodeId, origin: &NodeId) -> Vec<u8> {
    format!("fr/{}/{}", peer.as_str(), origin.as_str()).into_bytes()
}

/// Meta key of when `peer` was last heard of (Unix ms).
pub(super) fn seen_key(peer: &NodeId) -> Vec<u8> {
    format!("seen/{}", peer.as_str()).into_bytes()
}

/// Meta key of the highest own write this node gave `peer` ([`Memory::offered`]).
pub(super) fn offered_key(peer: &NodeId) -> Vec<u8> {
    format!("of/{}", peer.as_str()).into_bytes()
}

fn watermark_key(peer: &NodeId, origin: &NodeId) -> Vec<u8> {
    format!("wm/{}/{}", peer.as_str(), origin.as_str()).into_bytes()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        memory::{
            record::{Entry, Record},
            store::MemoryOptions,
            test_support::{id, record, signer, verifier},
        },
        storage::{SledStore, Store},
    };

    #[tokio::test]
    async fn lag_is_what_a_peer_wrote_that_we_do_not_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
        let (memory, _writes) =
            Memory::open(db, signer(&id("me")), verifier(), MemoryOptions::default());
        let peer = id("peer");
        assert_eq!(memory.lag(&peer, 0), (0, 0));
        assert_eq!(memory.lag(&peer, 5).0, 5);
        let entry = Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: Record {
                seq: 3,
                ..record(uhlc::system_time_clock().as_u64(), &peer, false)
            },
        };
        assert!(memory.apply(&entry).expect("apply"));
        assert_eq!(memory.lag(&peer, 5).0, 2);
        assert_eq!(memory.lag(&peer, 3), (0, 0));
    }
}
