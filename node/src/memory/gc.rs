//! Tombstones and their end: collecting a delete once every node heard of within the window
//! holds it (by the frontiers they reported) or once it is older than the window, forgetting
//! nodes not heard of within the window, telling when this node itself was away too long
//! (`stale`), and after a full resync dropping what the peer deleted meanwhile
//! (`drop_collected`). It decides what may go and removes it from the store; it must not fetch
//! anything from peers (`sync` runs the resync and calls it).

use std::{collections::BTreeMap, ops::Bound, time::Duration};

use mesh_domain::{NodeId, time::now_ms};

use super::{
    error::MemoryError,
    frontier::CONTACT_KEY,
    index::{TOMBS, index_value, split_index_key, split_index_value},
    record::Record,
    store::{META, Memory, RESYNC, ns_tree},
};
use crate::storage::Write;

impl Memory {
    /// Whether this node has been out of touch longer than the tombstone window allows (less a
    /// margin): peers may have collected deletes it never saw, so it must resync before it
    /// serves or trusts its old records.
    pub fn stale(&self) -> bool {
        let Some(contact) = self.meta_u64(CONTACT_KEY) else {
            return false;
        };
        let margin = (self.tombstone_window / 10).min(Duration::from_secs(3600));
        let allowed = self.tombstone_window.saturating_sub(margin).as_millis() as u64;
        now_ms().saturating_sub(contact) > allowed
    }

    /// Collects tombstones that every node heard of within the window holds (by the frontiers
    /// they reported), or that are older than the window. `also_up` are peers up right now;
    /// they count as known even before their first sync. Returns how many went.
    pub fn collect_tombstones(&self, also_up: &[NodeId]) -> Result<usize, MemoryError> {
        let mut known: Vec<NodeId> = self.known().into_keys().collect();
        known.extend(also_up.iter().cloned());
        known.retain(|n| n != &self.own);
        known.sort();
        known.dedup();
        let horizon = uhlc::NTP64::from(
            (std::time::SystemTime::now() - self.tombstone_window)
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
        )
        .as_u64();
        let mut held_by_all: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut collected = 0;
        for item in self.store.range(TOMBS, Bound::Unbounded, Bound::Unbounded) {
            let (place_key, place) = item?;
            let forget = || {
                self.store
                    .commit(vec![Write::Delete(TOMBS.into(), place_key.clone())])
            };
            let (Some((origin, seq)), Some((ns, key))) =
                (split_index_key(&place_key), split_index_value(&place))
            else {
                forget()?;
                continue;
            };
            let floor = *held_by_all.entry(origin.clone()).or_insert_with(|| {
                known
                    .iter()
                    .map(|peer| self.peer_frontier(peer, &origin))
                    .min()
                    .unwrap_or(u64::MAX)
            });
            let tree = ns_tree(&ns);
            let Some(bytes) = self.store.get(&tree, key.as_bytes())? else {
                forget()?;
                continue;
            };
            let record = Record::decode(&bytes)?;
            if seq <= floor || record.hlc < horizon {
                let gone = self.remove_if_unchanged(&tree, key.as_bytes(), &bytes, &record)?;
                collected += usize::from(gone);
            }
        }
        self.forget_expired()?;
        if collected > 0 {
            tracing::debug!(collected, "collected tombstones");
        }
        Ok(collected)
    }

    /// Drops what we remember of nodes not heard of within the window.
    fn forget_expired(&self) -> Result<(), MemoryError> {
        let known = self.known();
        let mut writes = Vec::new();
        for (id, _) in self.meta_under("seen/") {
            if NodeId::parse(&id).is_ok_and(|id| !known.contains_key(&id)) {
                writes.push(Write::Delete(
                    META.into(),
                    format!("seen/{id}").into_bytes(),
                ));
                writes.push(Write::Delete(META.into(), format!("of/{id}").into_bytes()));
                for (origin, _) in self.meta_under(&format!("fr/{id}/")) {
                    writes.push(Write::Delete(
                        META.into(),
                        format!("fr/{id}/{origin}").into_bytes(),
                    ));
                }
            }
        }
        self.store.commit(writes)?;
        Ok(())
    }

    /// After a full sync from `peer`: drops every record the peer has seen (its frontier
    /// covers it) but no longer holds (not in [`RESYNC`]) — deleted while we were away, and the
    /// tombstone since collected. Records the peer never saw are kept; they reach it by the
    /// usual replication. Of this node's own writes the peer can only have seen those this
    /// node gave it ([`Memory::offered`]): its claim is capped there, so a peer that claims to
    /// hold them all (`u64::MAX`) cannot make this node drop writes nobody has seen.
    pub(super) fn drop_collected(
        &self,
        peer: &NodeId,
        peer_frontier: &BTreeMap<NodeId, u64>,
    ) -> Result<usize, MemoryError> {
        let own_seen = peer_frontier
            .get(&self.own)
            .copied()
            .unwrap_or(0)
            .min(self.offered(peer));
        let mut dropped = 0;
        for ns in self.replicated_namespaces()? {
            let tree = ns_tree(&ns);
            for item in self.store.range(&tree, Bound::Unbounded, Bound::Unbounded) {
                let (key, bytes) = item?;
                let place = index_value(&ns, &String::from_utf8_lossy(&key));
                if self.store.get(RESYNC, &place)?.is_some() {
                    continue;
                }
                let Ok(record) = Record::decode(&bytes) else {
                    continue;
                };
                let seen = if record.origin == self.own {
                    own_seen
                } else {
                    peer_frontier.get(&record.origin).copied().unwrap_or(0)
                };
                if record.seq == 0 || record.seq > seen {
                    continue;
                }
                dropped += usize::from(self.remove_if_unchanged(&tree, &key, &bytes, &record)?);
            }
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{
        record::Entry,
        store::MemoryOptions,
        sync::{SyncRequest, answer_sync, sync_from},
        test_support::{
            InProcess, age_contact, certificate, id, open_memory, record, signed, tombstone_of,
        },
    };

    #[tokio::test]
    async fn a_tombstone_goes_once_every_known_peer_reports_holding_it() {
        let (a, b, c) = (id("a"), id("b"), id("c"));
        let (_da, ma) = open_memory(&a, MemoryOptions::default());
        let (_db, mb) = open_memory(&b, MemoryOptions::default());
        let link = InProcess::default();
        link.0
            .lock()
            .expect("lock")
            .insert(a.to_string(), ma.clone());
        ma.put("notes", "k", Some(b"v".to_vec()))
            .await
            .expect("put");
        let deleted = ma.put("notes", "k", None).await.expect("delete");
        // b pulls from a, then a hears of c through b: c has not reported anything yet. Both
        // hold a record c wrote (a node is taken from a peer's `known` only when its records
        // vouch for it).
        let from_c = Entry {
            namespace: "notes".into(),
            key: "by-c".into(),
            record: record(uhlc::system_time_clock().as_u64(), &c, false),
        };
        for memory in [&ma, &mb] {
            assert!(memory.apply(&from_c).expect("c's record"));
        }
        mb.merge_known(&BTreeMap::from([(c.clone(), now_ms())]))
            .expect("known");
        sync_from(&mb, &link, &a, a.as_str()).await.expect("sync");
        assert_eq!(tombstone_of(&mb, "k"), Some(true));
        assert_eq!(mb.frontier()[&a], deleted.seq);
        let answer = answer_sync(
            &mb,
            &SyncRequest {
                node: Some(a.clone()),
                ..Default::default()
            },
        )
        .expect("answer");
        ma.merge_known(&answer.known).expect("known");
        ma.note_peer(&b, &mb.frontier()).expect("note b");
        assert_eq!(
            ma.collect_tombstones(&[]).expect("collect"),
            0,
            "c has not reported"
        );
        assert_eq!(tombstone_of(&ma, "k"), Some(true));
        // A peer that is up right now counts even before it reports.
        let d = id("d");
        ma.note_peer(&c, &BTreeMap::from([(a.clone(), deleted.seq)]))
            .expect("note c");
        assert_eq!(
            ma.collect_tombstones(std::slice::from_ref(&d))
                .expect("collect"),
            0
        );
        assert_eq!(ma.collect_tombstones(&[]).expect("collect"), 1);
        assert_eq!(tombstone_of(&ma, "k"), None);
        assert!(
            ma.since(&a, 0, 10).expect("since").is_empty(),
            "index entry gone"
        );
        assert_eq!(ma.store.scan_prefix(TOMBS, b"").count(), 0);
    }

    /// A peer (a real node, or anyone with a node certificate) that names thousands of made-up
    /// nodes in its `known` map and made-up origins in its frontier stores nothing for them,
    /// and cannot hold back the collection of a tombstone that every real node holds.
    #[tokio::test]
    async fn made_up_nodes_in_a_peers_maps_hold_back_no_collection_and_store_nothing() {
        let (me, honest, liar) = (id("gc-me"), id("gc-honest"), id("gc-liar"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        memory
            .put("notes", "k", Some(b"v".to_vec()))
            .await
            .expect("put");
        let deleted = memory.put("notes", "k", None).await.expect("delete");
        let made_up: BTreeMap<NodeId, u64> = (0..10_000u64)
            .map(|i| {
                let id = NodeId::parse(&format!("{i:064x}")).expect("an id");
                (id, now_ms())
            })
            .collect();
        memory.merge_known(&made_up).expect("known");
        let mut frontier: BTreeMap<NodeId, u64> =
            made_up.keys().map(|id| (id.clone(), u64::MAX)).collect();
        frontier.insert(me.clone(), u64::MAX);
        memory.note_peer(&liar, &frontier).expect("note liar");
        memory
            .note_peer(&honest, &BTreeMap::from([(me.clone(), deleted.seq)]))
            .expect("note honest");
        assert_eq!(
            memory.known().into_keys().collect::<Vec<_>>(),
            {
                let mut real = vec![honest.clone(), liar.clone()];
                real.sort();
                real
            },
            "only the nodes heard of directly"
        );
        assert_eq!(memory.meta_under("fr/").len(), 2, "one own entry per peer");
        assert_eq!(
            memory.peer_frontier(&liar, &me),
            deleted.seq,
            "capped at this node's own writes"
        );
        assert_eq!(memory.collect_tombstones(&[]).expect("collect"), 1);
        assert_eq!(tombstone_of(&memory, "k"), None);
    }

    #[tokio::test]
    async fn a_tombstone_older_than_the_window_goes_even_when_a_peer_never_reported() {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(60),
            ..MemoryOptions::default()
        };
        let (me, other) = (id("me"), id("other"));
        let (_dir, memory) = open_memory(&me, options);
        memory.note_peer(&other, &BTreeMap::new()).expect("note");
        let now = uhlc::system_time_clock().as_u64();
        let old = now - uhlc::NTP64::from(Duration::from_secs(120)).as_u64();
        let recent = now - uhlc::NTP64::from(Duration::from_secs(1)).as_u64();
        for (key, hlc, seq) in [("old", old, 1), ("recent", recent, 2)] {
            let entry = Entry {
                namespace: "notes".into(),
                key: key.into(),
                record: Record {
                    seq,
                    ..record(hlc, &other, true)
                },
            };
            assert!(memory.apply(&entry).expect("apply"));
        }
        assert_eq!(memory.collect_tombstones(&[]).expect("collect"), 1);
        assert_eq!(tombstone_of(&memory, "old"), None);
        assert_eq!(tombstone_of(&memory, "recent"), Some(true));
        // A local namespace keeps no tombstones at all.
        let (_dir, local) = open_memory(
            &me,
            MemoryOptions {
                local_namespaces: vec!["notes".into()],
                ..MemoryOptions::default()
            },
        );
        local
            .put("notes", "k", Some(b"v".to_vec()))
            .await
            .expect("put");
        assert!(
            local
                .put("notes", "k", None)
                .await
                .expect("delete")
                .tombstone
        );
        assert_eq!(tombstone_of(&local, "k"), None);
    }

    #[tokio::test]
    async fn a_node_that_only_ever_got_pushes_can_still_tell_it_was_away_too_long() {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(3600),
            ..MemoryOptions::default()
        };
        let (me, sender) = (id("me"), id("sender"));
        let (_dir, memory) = open_memory(&me, options);
        assert!(!memory.stale(), "a new node with nothing is not stale");
        assert_eq!(memory.meta_u64(CONTACT_KEY), None);
        let write = Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: Record {
                seq: 1,
                ..record(uhlc::system_time_clock().as_u64(), &sender, false)
            },
        };
        assert_eq!(
            memory
                .accept_push(Some(&sender), &[signed(write)], &certificate(&sender))
                .0,
            1
        );
        let started = memory
            .meta_u64(CONTACT_KEY)
            .expect("the first record starts the clock");
        assert!(!memory.stale());
        // Later pushes do not move it: only a completed sync does.
        memory.start_contact_clock().expect("again");
        assert_eq!(memory.meta_u64(CONTACT_KEY), Some(started));
        age_contact(&memory);
        assert!(memory.stale(), "away longer than the window: resync first");
    }
}
