//! Shared memory: namespaced key-value records in sled, ordered by a hybrid logical clock and
//! replicated to every peer.
//!
//! A [`Record`] carries its value, an HLC timestamp, the writing node's id, that node's write
//! sequence number and a tombstone flag; the greater `(timestamp, node id)` wins, the same on
//! every node ([`Record::wins_over`]). Each node numbers its own writes; the index tree maps
//! `(origin, seq)` to the one key whose latest record has it, so "records from origin X after
//! sequence n" is a range scan whose size is bounded by the data, not by history. Peers pull
//! with `Sync` (when they come up and every 30 s) and are pushed new writes at once. A remote
//! record stamped further ahead of our clock than the allowed skew is refused and logged.
//!
//! This module owns the stores and the replication loop; `rpc::memory` translates the wire
//! format, and decides nothing.

use std::{
    collections::{BTreeMap, HashSet},
    fmt,
    ops::Bound,
    sync::Arc,
    time::Duration,
};

use mesh_domain::{
    BoxFuture, NodeId, PeerState,
    keys::{self, MAX_VALUE},
    sync::MutexExt,
    time::now_ms,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::{
    peers::PeerTable,
    storage::{Store, Write},
};

mod error;
mod record;
#[cfg(test)]
mod test_support;

pub use error::MemoryError;
pub use record::{Entry, Record};

/// Most records one `Sync` answer or `Push` carries; the rest follows in the next one.
pub const SYNC_BATCH: usize = 512;
/// Most value bytes one `Sync` answer or `Push` carries (well under the 16 MiB message limit).
pub const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How a node's memory behaves (`[memory]` in the config).
#[derive(Debug, Clone)]
pub struct MemoryOptions {
    /// Namespaces kept on this node only.
    pub local_namespaces: Vec<String>,
    /// How far ahead of our clock a record from a peer may be stamped.
    pub max_skew: Duration,
    /// How long a tombstone is kept at most; a node away longer resyncs.
    pub tombstone_window: Duration,
    /// How often every up peer is synced even without news (and tombstones are collected).
    pub sync_interval: Duration,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            local_namespaces: Vec::new(),
            max_skew: Duration::from_millis(500),
            tombstone_window: Duration::from_secs(7 * 24 * 3600),
            sync_interval: Duration::from_secs(30),
        }
    }
}

/// The node's memory.
pub struct Memory {
    store: Arc<dyn Store>,
    /// Serialises writers: each reads what it replaces, then commits.
    writer: std::sync::Mutex<()>,
    own: NodeId,
    hlc: uhlc::HLC,
    max_skew: Duration,
    local_namespaces: HashSet<String>,
    tombstone_window: Duration,
    sync_interval: Duration,
    /// New local writes, for the replicator to push.
    pushes: mpsc::UnboundedSender<Entry>,
    /// This node's latest write sequence number, published for whoever reports it.
    own_seq: watch::Sender<u64>,
    /// When each peer was last synced successfully (for lag reporting).
    synced_at: std::sync::Mutex<BTreeMap<NodeId, std::time::Instant>>,
    /// Writers whose records were last refused as stamped too far ahead: how far, and when.
    ahead: std::sync::Mutex<BTreeMap<NodeId, (Duration, std::time::Instant)>>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

const SEQ_KEY: &[u8] = b"seq";
/// `(origin, seq)` → `ns\0key` of the one record that has it.
const INDEX: &str = "mem_index";
/// The tombstones among [`INDEX`], for collection.
const TOMBS: &str = "mem_tombs";
/// Counters: own sequence, watermarks, peers' frontiers, when peers were seen.
const META: &str = "mem_meta";
/// During a full resync: the places the peer holds.
const RESYNC: &str = "mem_resync";
/// Namespace trees are named `mem/<namespace>`.
const NS_PREFIX: &str = "mem/";

fn ns_tree(ns: &str) -> String {
    format!("{NS_PREFIX}{ns}")
}

fn hlc_id(id: &NodeId) -> uhlc::ID {
    let bytes = hex_prefix(id);
    uhlc::ID::try_from(&bytes[..]).unwrap_or_else(|_| uhlc::ID::rand())
}

fn hex_prefix(id: &NodeId) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, chunk) in id.as_str().as_bytes().chunks(2).take(16).enumerate() {
        let text = std::str::from_utf8(chunk).unwrap_or("00");
        out[i] = u8::from_str_radix(text, 16).unwrap_or(0);
    }
    if out.iter().all(|b| *b == 0) {
        out[0] = 1;
    }
    out
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    bytes.try_into().ok().map(u64::from_be_bytes)
}

impl Memory {
    /// Opens the memory kept in `store`. Returns the memory and the stream of local writes the
    /// replicator pushes.
    pub fn open(
        store: Arc<dyn Store>,
        own: NodeId,
        options: MemoryOptions,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Entry>) {
        let hlc = uhlc::HLCBuilder::new()
            .with_id(hlc_id(&own))
            .with_max_delta(options.max_skew)
            .build();
        let (pushes, rx) = mpsc::unbounded_channel();
        let stored_seq = store
            .get(META, SEQ_KEY)
            .ok()
            .flatten()
            .and_then(|v| be_u64(&v))
            .unwrap_or(0);
        let memory = Self {
            store,
            writer: std::sync::Mutex::default(),
            own,
            hlc,
            max_skew: options.max_skew,
            local_namespaces: options.local_namespaces.into_iter().collect(),
            tombstone_window: options.tombstone_window,
            sync_interval: options.sync_interval,
            pushes,
            own_seq: watch::Sender::new(stored_seq),
            synced_at: std::sync::Mutex::default(),
            ahead: std::sync::Mutex::default(),
        };
        (Arc::new(memory), rx)
    }

    /// This node's id.
    pub fn own_id(&self) -> &NodeId {
        &self.own
    }

    /// The writers whose records this node refused lately as stamped too far ahead of its
    /// clock, as a health reason (`None` once none was refused for two sync rounds, since a
    /// refused record is fetched again every round).
    pub fn clock_problem(&self) -> Option<String> {
        let recent = self.sync_interval * 2 + Duration::from_secs(5);
        let mut ahead = self.ahead.lock_unpoisoned();
        ahead.retain(|_, (_, at)| at.elapsed() < recent);
        if ahead.is_empty() {
            return None;
        }
        let writers: Vec<String> = ahead
            .iter()
            .map(|(origin, (by, _))| format!("{} by {} ms", origin.short(), by.as_millis()))
            .collect();
        Some(format!(
            "records from {} are stamped ahead of this node's clock by more than \
             memory.max_clock_skew_ms = {}; they are refused until the clocks agree: check the \
             clocks of these nodes and this one (NTP)",
            writers.join(", "),
            self.max_skew.as_millis()
        ))
    }

    fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writer.lock_unpoisoned()
    }

    fn replicated(&self, ns: &str) -> bool {
        !self.local_namespaces.contains(ns)
    }

    /// The record stored at `key` of namespace tree `tree`; a corrupt one counts as absent.
    fn stored(&self, tree: &str, key: &str) -> Result<Option<Record>, MemoryError> {
        Ok(self
            .store
            .get(tree, key.as_bytes())?
            .and_then(|bytes| Record::decode(&bytes).ok()))
    }

    /// Writes a value (or a tombstone) and returns the record once it is durable.
    pub async fn put(
        &self,
        ns: &str,
        key: &str,
        value: Option<Vec<u8>>,
    ) -> Result<Record, MemoryError> {
        keys::check_namespace(ns)?;
        keys::check_key(key)?;
        if value.as_ref().is_some_and(|v| v.len() > MAX_VALUE) {
            return Err(MemoryError::Invalid(format!(
                "value: at most {MAX_VALUE} bytes"
            )));
        }
        let tree = ns_tree(ns);
        let stamp = self.hlc.new_timestamp();
        let replicated = self.replicated(ns);
        let record = {
            let _writer = self.write_lock();
            let mut writes = Vec::new();
            let seq = if replicated {
                let next = self
                    .store
                    .get(META, SEQ_KEY)?
                    .and_then(|v| be_u64(&v))
                    .unwrap_or(0)
                    + 1;
                writes.push(Write::Put(
                    META.into(),
                    SEQ_KEY.to_vec(),
                    next.to_be_bytes().to_vec(),
                ));
                next
            } else {
                0
            };
            let record = Record {
                tombstone: value.is_none(),
                value: value.unwrap_or_default(),
                hlc: stamp.get_time().as_u64(),
                origin: self.own.clone(),
                seq,
            };
            if let Some(old) = self.stored(&tree, key)? {
                unindex(&mut writes, &old);
            }
            // A local namespace needs no tombstones: nobody can send the old value back.
            if replicated || !record.tombstone {
                writes.push(Write::Put(tree, key.into(), record.encode()));
            } else {
                writes.push(Write::Delete(tree, key.into()));
            }
            if replicated {
                reindex(&mut writes, ns, key, &record);
            }
            self.store.commit(writes)?;
            if replicated {
                self.own_seq.send_replace(seq);
            }
            record
        };
        // Acknowledged only once durable: sled itself syncs only every ~500 ms.
        self.flush().await?;
        if replicated {
            let _ = self.pushes.send(Entry {
                namespace: ns.to_owned(),
                key: key.to_owned(),
                record: record.clone(),
            });
        }
        Ok(record)
    }

    /// The record under `key` (tombstones included, so callers can tell "deleted" apart).
    pub fn get(&self, ns: &str, key: &str) -> Result<Option<Record>, MemoryError> {
        keys::check_namespace(ns)?;
        keys::check_key(key)?;
        match self.store.get(&ns_tree(ns), key.as_bytes())? {
            None => Ok(None),
            Some(bytes) => Record::decode(&bytes).map(Some),
        }
    }

    /// Live (non-deleted) entries of `ns` whose key starts with `prefix`, in key order.
    pub fn list(&self, ns: &str, prefix: &str, limit: usize) -> Result<Vec<Entry>, MemoryError> {
        keys::check_namespace(ns)?;
        let mut out = Vec::new();
        for item in self.store.scan_prefix(&ns_tree(ns), prefix.as_bytes()) {
            let (key, bytes) = item?;
            let record = Record::decode(&bytes)?;
            if record.tombstone {
                continue;
            }
            out.push(Entry {
                namespace: ns.to_owned(),
                key: String::from_utf8_lossy(&key).into_owned(),
                record,
            });
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Checks a record from another node before it is applied: `Ok(false)` when its namespace
    /// is local here, an error when it breaks a limit or is stamped too far ahead (logged).
    fn admit(&self, entry: &Entry) -> Result<bool, MemoryError> {
        keys::check_namespace(&entry.namespace)?;
        keys::check_key(&entry.key)?;
        if !self.replicated(&entry.namespace) {
            return Ok(false);
        }
        let stamp =
            uhlc::Timestamp::new(uhlc::NTP64(entry.record.hlc), hlc_id(&entry.record.origin));
        if self.hlc.update_with_timestamp(&stamp).is_err() {
            let now = uhlc::system_time_clock();
            let ahead = uhlc::NTP64(entry.record.hlc.saturating_sub(now.as_u64())).to_duration();
            let error = MemoryError::FromTheFuture {
                origin: entry.record.origin.short().to_owned(),
                ahead_ms: ahead.as_millis() as u64,
                max_ms: self.max_skew.as_millis() as u64,
            };
            tracing::warn!(namespace = %entry.namespace, key = %entry.key, error = %error, "refused a replicated record");
            self.ahead.lock_unpoisoned().insert(
                entry.record.origin.clone(),
                (ahead, std::time::Instant::now()),
            );
            return Err(error);
        }
        Ok(true)
    }

    /// Applies a record from another node: refused when stamped too far ahead, kept only when
    /// it wins over what is stored. Returns whether it was stored.
    pub fn apply(&self, entry: &Entry) -> Result<bool, MemoryError> {
        self.apply_all(std::slice::from_ref(entry))
            .pop()
            .unwrap_or(Ok(false))
    }

    /// [`Memory::apply`] for many records in one commit; the result for each, in order.
    pub fn apply_all(&self, entries: &[Entry]) -> Vec<Result<bool, MemoryError>> {
        let mut results: Vec<_> = entries.iter().map(|e| self.admit(e)).collect();
        let _writer = self.write_lock();
        let mut writes = Vec::new();
        // What this batch has already put at a place, for a place that comes twice.
        let mut pending: BTreeMap<(String, &str), Record> = BTreeMap::new();
        for (entry, result) in entries.iter().zip(results.iter_mut()) {
            if !matches!(result, Ok(true)) {
                continue;
            }
            let tree = ns_tree(&entry.namespace);
            let old = match pending.get(&(tree.clone(), entry.key.as_str())) {
                Some(old) => Some(old.clone()),
                None => match self.stored(&tree, &entry.key) {
                    Ok(old) => old,
                    Err(e) => {
                        *result = Err(e);
                        continue;
                    }
                },
            };
            let record = &entry.record;
            if let Some(old) = &old {
                if !record.wins_over(old) {
                    *result = Ok(false);
                    continue;
                }
                unindex(&mut writes, old);
            }
            writes.push(Write::Put(
                tree.clone(),
                entry.key.clone().into_bytes(),
                record.encode(),
            ));
            reindex(&mut writes, &entry.namespace, &entry.key, record);
            pending.insert((tree, entry.key.as_str()), record.clone());
        }
        if let Err(e) = self.store.commit(writes) {
            for result in results.iter_mut().filter(|r| matches!(r, Ok(true))) {
                *result = Err(e.clone().into());
            }
        }
        results
    }

    /// Records written by `origin` with a sequence number above `after`, oldest first.
    pub fn since(
        &self,
        origin: &NodeId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, MemoryError> {
        let start = index_key(origin, after.saturating_add(1));
        let end = index_key(origin, u64::MAX);
        let mut out = Vec::new();
        for item in self
            .store
            .range(INDEX, Bound::Included(start), Bound::Included(end))
        {
            let (_, place) = item?;
            let Some((ns, key)) = split_index_value(&place) else {
                continue;
            };
            if let Some(bytes) = self.store.get(&ns_tree(&ns), key.as_bytes())? {
                let record = Record::decode(&bytes)?;
                out.push(Entry {
                    namespace: ns,
                    key,
                    record,
                });
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Every origin this node holds records of, with the highest sequence number held.
    pub fn origins(&self) -> Result<BTreeMap<NodeId, u64>, MemoryError> {
        let mut out = BTreeMap::new();
        let mut cursor: Vec<u8> = Vec::new();
        // One seek per origin: jump past each origin's range instead of reading every entry.
        while let Some(item) = self
            .store
            .range(INDEX, Bound::Included(cursor.clone()), Bound::Unbounded)
            .next()
        {
            let (key, _) = item?;
            if key.len() != NodeId::HEX_LEN + 8 {
                break;
            }
            let origin_bytes = key[..NodeId::HEX_LEN].to_vec();
            let origin = std::str::from_utf8(&origin_bytes)
                .ok()
                .and_then(|s| NodeId::parse(s).ok());
            let mut next = origin_bytes.clone();
            next.extend_from_slice(&[0xff; 9]);
            if let Some(origin) = origin
                && let Some(Ok((last, _))) = self
                    .store
                    .range(INDEX, Bound::Unbounded, Bound::Excluded(next.clone()))
                    .next_back()
                && let Some((_, seq)) = split_index_key(&last)
            {
                out.insert(origin, seq);
            }
            cursor = next;
        }
        Ok(out)
    }

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
    fn set_watermark(&self, peer: &NodeId, origin: &NodeId, seq: u64) -> Result<(), MemoryError> {
        self.raise_meta(watermark_key(peer, origin), seq)
    }

    /// `(key suffix, u64)` of every meta entry under `prefix`.
    fn meta_under(&self, prefix: &str) -> Vec<(String, u64)> {
        self.store
            .scan_prefix(META, prefix.as_bytes())
            .filter_map(|item| item.ok())
            .filter_map(|(key, value)| {
                let rest = std::str::from_utf8(&key).ok()?.strip_prefix(prefix)?;
                Some((rest.to_owned(), be_u64(&value)?))
            })
            .collect()
    }

    /// Every watermark we hold for `peer`.
    pub fn watermarks(&self, peer: &NodeId) -> BTreeMap<NodeId, u64> {
        self.meta_under(&format!("wm/{}/", peer.as_str()))
            .into_iter()
            .filter_map(|(origin, seq)| Some((NodeId::parse(&origin).ok()?, seq)))
            .collect()
    }

    /// The highest sequence number of `origin` this node holds a record of.
    pub fn highest_from(&self, origin: &NodeId) -> u64 {
        self.store
            .range(
                INDEX,
                Bound::Included(index_key(origin, 0)),
                Bound::Included(index_key(origin, u64::MAX)),
            )
            .next_back()
            .and_then(|item| item.ok())
            .and_then(|(key, _)| split_index_key(&key))
            .map_or(0, |(_, seq)| seq)
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

    /// Flushes to disk, on the blocking pool (sled's `flush_async` deadlocks when called
    /// concurrently, spacejam/sled#1308).
    pub async fn flush(&self) -> Result<(), MemoryError> {
        Ok(crate::storage::flush(&self.store).await?)
    }

    fn meta_u64(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        self.store
            .get(META, key.as_ref())
            .ok()
            .flatten()
            .and_then(|v| be_u64(&v))
    }

    /// Raises a meta counter to `value` (never lowers it).
    fn raise_meta(&self, key: impl AsRef<[u8]>, value: u64) -> Result<(), MemoryError> {
        let key = key.as_ref();
        let _writer = self.write_lock();
        let old = self.store.get(META, key)?.and_then(|v| be_u64(&v));
        if old.is_none_or(|old| old < value) {
            self.store.commit(vec![Write::Put(
                META.into(),
                key.to_vec(),
                value.to_be_bytes().to_vec(),
            )])?;
        }
        Ok(())
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

    /// Records what `peer` says it holds (its frontier) and that we heard from it now.
    pub fn note_peer(
        &self,
        peer: &NodeId,
        frontier: &BTreeMap<NodeId, u64>,
    ) -> Result<(), MemoryError> {
        if peer == &self.own {
            return Ok(());
        }
        for (origin, seq) in frontier {
            self.raise_meta(frontier_key(peer, origin), *seq)?;
        }
        self.raise_meta(seen_key(peer), now_ms())
    }

    /// Takes in the nodes a peer has heard of (and when), so that a node we never met but
    /// that may still hold old values also holds back early tombstone collection.
    pub fn merge_known(&self, known: &BTreeMap<NodeId, u64>) -> Result<(), MemoryError> {
        let now = now_ms();
        for (node, at) in known {
            if node != &self.own {
                self.raise_meta(seen_key(node), (*at).min(now))?;
            }
        }
        Ok(())
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
    fn peer_frontier(&self, peer: &NodeId, origin: &NodeId) -> u64 {
        self.meta_u64(frontier_key(peer, origin)).unwrap_or(0)
    }

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

    fn touch_contact(&self) -> Result<(), MemoryError> {
        self.raise_meta(CONTACT_KEY, now_ms())
    }

    /// Applies a peer's push of its own writes. A write that follows the last one we hold from
    /// the sender advances our watermark for it, so the sender learns at once (from the
    /// returned frontier) that we hold it.
    pub fn accept_push(
        &self,
        sender: Option<&NodeId>,
        entries: &[Entry],
    ) -> (u32, Vec<String>, u64) {
        let mut applied = 0;
        let mut refused = Vec::new();
        for (entry, result) in entries.iter().zip(self.apply_all(entries)) {
            match result {
                Ok(stored) => {
                    applied += u32::from(stored);
                    if let Some(sender) = sender
                        && &entry.record.origin == sender
                        && entry.record.seq == self.watermark(sender, sender) + 1
                        && let Err(e) = self.set_watermark(sender, sender, entry.record.seq)
                    {
                        refused.push(format!("{}/{}: {e}", entry.namespace, entry.key));
                    }
                }
                Err(e) => refused.push(format!("{}/{}: {e}", entry.namespace, entry.key)),
            }
        }
        // A node whose only news came by pushes has never synced, so it has no contact time,
        // and would not know it was away too long: its first record starts the clock.
        if applied > 0
            && let Err(e) = self.start_contact_clock()
        {
            refused.push(format!("record contact: {e}"));
        }
        let frontier = sender.map_or(0, |s| self.watermark(s, s));
        (applied, refused, frontier)
    }

    /// Records "in touch now" unless a contact time is already recorded.
    fn start_contact_clock(&self) -> Result<(), MemoryError> {
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

    /// Removes the record at `tree`/`key` (and its index entries) if it is still `bytes`: a
    /// write may have raced in. Returns whether it went.
    fn remove_if_unchanged(
        &self,
        tree: &str,
        key: &[u8],
        bytes: &[u8],
        record: &Record,
    ) -> Result<bool, MemoryError> {
        let _writer = self.write_lock();
        if self.store.get(tree, key)?.is_none_or(|now| now != bytes) {
            return Ok(false);
        }
        let mut writes = vec![Write::Delete(tree.into(), key.to_vec())];
        unindex(&mut writes, record);
        self.store.commit(writes)?;
        Ok(true)
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

    /// Every replicated namespace that holds records.
    fn replicated_namespaces(&self) -> Result<Vec<String>, MemoryError> {
        Ok(self
            .store
            .trees()?
            .into_iter()
            .filter_map(|name| name.strip_prefix(NS_PREFIX).map(str::to_owned))
            .filter(|ns| self.replicated(ns))
            .collect())
    }

    /// After a full sync from a peer: drops every record the peer has seen (its frontier covers
    /// it) but no longer holds (not in [`RESYNC`]) — deleted while we were away, and the
    /// tombstone since collected. Records the peer never saw are kept; they reach it by the
    /// usual replication.
    fn drop_collected(&self, peer_frontier: &BTreeMap<NodeId, u64>) -> Result<usize, MemoryError> {
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
                let seen = peer_frontier.get(&record.origin).copied().unwrap_or(0);
                if record.seq == 0 || record.seq > seen {
                    continue;
                }
                dropped += usize::from(self.remove_if_unchanged(&tree, &key, &bytes, &record)?);
            }
        }
        Ok(dropped)
    }
}

const CONTACT_KEY: &[u8] = b"contact";

fn frontier_key(peer: &NodeId, origin: &NodeId) -> Vec<u8> {
    format!("fr/{}/{}", peer.as_str(), origin.as_str()).into_bytes()
}

fn seen_key(peer: &NodeId) -> Vec<u8> {
    format!("seen/{}", peer.as_str()).into_bytes()
}

fn split_index_key(key: &[u8]) -> Option<(NodeId, u64)> {
    if key.len() != NodeId::HEX_LEN + 8 {
        return None;
    }
    let origin = NodeId::parse(std::str::from_utf8(&key[..NodeId::HEX_LEN]).ok()?).ok()?;
    let seq = u64::from_be_bytes(key[NodeId::HEX_LEN..].try_into().ok()?);
    Some((origin, seq))
}

/// Removes `old`'s index (and tombstone) entries.
fn unindex(writes: &mut Vec<Write>, old: &Record) {
    if old.seq > 0 {
        writes.push(Write::Delete(INDEX.into(), index_key(&old.origin, old.seq)));
        if old.tombstone {
            writes.push(Write::Delete(TOMBS.into(), index_key(&old.origin, old.seq)));
        }
    }
}

/// Indexes `record`, stored under `ns`/`key`.
fn reindex(writes: &mut Vec<Write>, ns: &str, key: &str, record: &Record) {
    let at = index_key(&record.origin, record.seq);
    if record.tombstone {
        writes.push(Write::Put(TOMBS.into(), at.clone(), index_value(ns, key)));
    }
    writes.push(Write::Put(INDEX.into(), at, index_value(ns, key)));
}

fn index_key(origin: &NodeId, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(NodeId::HEX_LEN + 8);
    key.extend_from_slice(origin.as_str().as_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn index_value(ns: &str, key: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(ns.len() + 1 + key.len());
    value.extend_from_slice(ns.as_bytes());
    value.push(0);
    value.extend_from_slice(key.as_bytes());
    value
}

fn split_index_value(value: &[u8]) -> Option<(String, String)> {
    let split = value.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8(value[..split].to_vec()).ok()?,
        String::from_utf8(value[split + 1..].to_vec()).ok()?,
    ))
}

fn watermark_key(peer: &NodeId, origin: &NodeId) -> Vec<u8> {
    format!("wm/{}/{}", peer.as_str(), origin.as_str()).into_bytes()
}

/// What [`MemoryPeers::sync`] fails with when the peer is resyncing itself.
pub const RESYNCING: &str = "the peer is resyncing";

/// A `Sync` call.
#[derive(Debug, Clone, Default)]
pub struct SyncRequest {
    /// The caller (when known).
    pub node: Option<NodeId>,
    /// Per origin, the last sequence the caller has from the answering node.
    pub after: BTreeMap<NodeId, u64>,
    /// The caller's [`Memory::frontier`].
    pub frontier: BTreeMap<NodeId, u64>,
}

/// A batch a peer answered `Sync` with.
#[derive(Debug, Clone, Default)]
pub struct SyncBatch {
    /// Records, oldest first per origin.
    pub entries: Vec<Entry>,
    /// Whether the peer has more.
    pub more: bool,
    /// With the last batch: the highest sequence per origin the peer has seen (its own writes
    /// included), so overwritten writes still count as held.
    pub heads: BTreeMap<NodeId, u64>,
    /// With the last batch: the peer's [`Memory::frontier`].
    pub frontier: BTreeMap<NodeId, u64>,
    /// With the last batch: the nodes the peer heard of within the window ([`Memory::known`]).
    pub known: BTreeMap<NodeId, u64>,
}

/// How the replicator reaches peers (implemented over gRPC in `rpc::memory`).
pub trait MemoryPeers: Send + Sync + fmt::Debug {
    /// Asks the peer at `addr` for records after the given per-origin watermarks.
    fn sync(
        &self,
        addr: String,
        request: SyncRequest,
    ) -> BoxFuture<'static, Result<SyncBatch, String>>;
    /// Sends our new records to the peer at `addr`; answers the peer's frontier for our writes.
    fn push(&self, addr: String, entries: Vec<Entry>) -> BoxFuture<'static, Result<u64, String>>;
}

/// Answers a peer's `Sync`: for each origin we hold, the records after the peer's watermark.
/// Refused while this node is [`Memory::stale`]: its old records might bring back deletes.
pub fn answer_sync(memory: &Memory, request: &SyncRequest) -> Result<SyncBatch, MemoryError> {
    if memory.stale() {
        return Err(MemoryError::Resyncing);
    }
    if let Some(caller) = &request.node {
        memory.note_peer(caller, &request.frontier)?;
    }
    let after = &request.after;
    // Heads before the walk: every write up to a head is then visible to the walk, so the
    // caller may count writes up to the heads as held.
    let mut heads = memory.origins()?;
    let own = memory.own_seq();
    if own > 0 {
        heads.insert(memory.own_id().clone(), own);
    }
    let mut batch = SyncBatch::default();
    let mut bytes = 0;
    for (origin, _) in memory.origins()? {
        let from = after.get(&origin).copied().unwrap_or(0);
        let room = SYNC_BATCH - batch.entries.len();
        let entries = memory.since(&origin, from, room + 1)?;
        let complete = entries.len() <= room;
        for entry in entries.into_iter().take(room) {
            // Per origin the records go oldest first, so stopping anywhere keeps the
            // caller's watermark honest: it resumes right after the last record it got.
            if bytes + entry.record.value.len() > BATCH_BYTES && !batch.entries.is_empty() {
                batch.more = true;
                return Ok(batch);
            }
            bytes += entry.record.value.len() + entry.key.len();
            batch.entries.push(entry);
        }
        if !complete {
            batch.more = true;
            return Ok(batch);
        }
    }
    batch.heads = heads;
    batch.frontier = memory.frontier();
    batch.known = memory.known();
    Ok(batch)
}

/// Pulls everything `peer` has that we lack, batch by batch, and advances our watermarks.
pub async fn sync_from(
    memory: &Memory,
    peers: &dyn MemoryPeers,
    peer: &NodeId,
    addr: &str,
) -> Result<usize, String> {
    let mut applied = 0;
    loop {
        let after = memory.watermarks(peer);
        let request = SyncRequest {
            node: Some(memory.own_id().clone()),
            after: after.clone(),
            frontier: memory.frontier(),
        };
        let batch = peers.sync(addr.to_owned(), request).await?;
        let mut highest: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut refused: HashSet<NodeId> = HashSet::new();
        for (entry, result) in batch.entries.iter().zip(memory.apply_all(&batch.entries)) {
            match result {
                Ok(true) => applied += 1,
                Ok(false) => {}
                // Refused (logged by `apply`): keep the watermark below it so it is fetched
                // again once the clocks agree.
                Err(_) => {
                    refused.insert(entry.record.origin.clone());
                    continue;
                }
            }
            if refused.contains(&entry.record.origin) {
                continue;
            }
            let seen = highest.entry(entry.record.origin.clone()).or_default();
            *seen = (*seen).max(entry.record.seq);
        }
        for (origin, seq) in highest {
            if seq > after.get(&origin).copied().unwrap_or(0) {
                memory
                    .set_watermark(peer, &origin, seq)
                    .map_err(|e| e.to_string())?;
            }
        }
        memory.flush().await.map_err(|e| e.to_string())?;
        if !batch.more || batch.entries.is_empty() {
            for (origin, head) in &batch.heads {
                if !refused.contains(origin) && *head > memory.watermark(peer, origin) {
                    memory
                        .set_watermark(peer, origin, *head)
                        .map_err(|e| e.to_string())?;
                }
            }
            memory
                .note_peer(peer, &batch.frontier)
                .and_then(|()| memory.merge_known(&batch.known))
                .and_then(|()| memory.touch_contact())
                .map_err(|e| e.to_string())?;
            memory
                .synced_at
                .lock_unpoisoned()
                .insert(peer.clone(), std::time::Instant::now());
            return Ok(applied);
        }
    }
}

/// The full resync of a node that was out of touch longer than the tombstone window: pulls
/// everything `peer` holds, then drops each record the peer has seen but no longer holds (its
/// delete was collected meanwhile). Returns (records applied, records dropped).
pub async fn resync_from(
    memory: &Memory,
    peers: &dyn MemoryPeers,
    peer: &NodeId,
    addr: &str,
) -> Result<(usize, usize), String> {
    let fail = |e: MemoryError| e.to_string();
    memory.store.drop_tree(RESYNC).map_err(|e| e.to_string())?;
    let mut after: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut applied = 0;
    let batch = loop {
        let request = SyncRequest {
            node: Some(memory.own_id().clone()),
            after: after.clone(),
            frontier: memory.frontier(),
        };
        let batch = peers.sync(addr.to_owned(), request).await?;
        let results = memory.apply_all(&batch.entries);
        applied += results.iter().filter(|r| matches!(r, Ok(true))).count();
        let held = batch.entries.iter().map(|entry| {
            Write::Put(
                RESYNC.into(),
                index_value(&entry.namespace, &entry.key),
                Vec::new(),
            )
        });
        memory
            .store
            .commit(held.collect())
            .map_err(|e| e.to_string())?;
        for entry in &batch.entries {
            let seen = after.entry(entry.record.origin.clone()).or_default();
            *seen = (*seen).max(entry.record.seq);
        }
        if !batch.more || batch.entries.is_empty() {
            break batch;
        }
    };
    let dropped = memory.drop_collected(&batch.frontier).map_err(fail)?;
    for (origin, seq) in after.iter().chain(&batch.heads) {
        memory.set_watermark(peer, origin, *seq).map_err(fail)?;
    }
    memory
        .note_peer(peer, &batch.frontier)
        .and_then(|()| memory.merge_known(&batch.known))
        .and_then(|()| memory.touch_contact())
        .map_err(fail)?;
    memory.flush().await.map_err(fail)?;
    let _ = memory.store.drop_tree(RESYNC);
    Ok((applied, dropped))
}

/// Splits pending writes into pushes of at most [`SYNC_BATCH`] records and [`BATCH_BYTES`].
fn push_batches(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut batches: Vec<Vec<Entry>> = Vec::new();
    let mut bytes = 0;
    for entry in entries {
        let size = entry.record.value.len() + entry.key.len();
        let full = batches
            .last()
            .is_none_or(|b| b.len() >= SYNC_BATCH || bytes + size > BATCH_BYTES);
        if full {
            batches.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(batch) = batches.last_mut() {
            batch.push(entry);
        }
    }
    batches
}

/// Keeps every up peer in sync: pushes local writes at once, pulls from a peer when it comes
/// up and every sync interval, when tombstones are also collected. A node out of touch longer
/// than the tombstone window first resyncs fully from one peer.
pub async fn replicate(
    memory: Arc<Memory>,
    peers: Arc<PeerTable>,
    link: Arc<dyn MemoryPeers>,
    mut writes: mpsc::UnboundedReceiver<Entry>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut was_up: HashSet<NodeId> = HashSet::new();
    let mut last_full = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            Some(entry) = writes.recv() => {
                let mut pending = vec![entry];
                while let Ok(more) = writes.try_recv() {
                    pending.push(more);
                }
                for batch in push_batches(pending) {
                    for peer in peers.snapshot().into_iter().filter(|p| p.state == PeerState::Up) {
                        let push = link.push(peer.addr.clone(), batch.clone());
                        let memory = memory.clone();
                        tokio::spawn(async move {
                            match push.await {
                                // The peer's frontier for our writes: what lets us collect our
                                // tombstones early.
                                Ok(held) => {
                                    let own = memory.own_id().clone();
                                    let frontier = BTreeMap::from([(own, held)]);
                                    if let Err(e) = memory.note_peer(&peer.info.id, &frontier) {
                                        tracing::warn!(error = %e, "record a peer's frontier");
                                    }
                                }
                                Err(e) => tracing::debug!(peer = %peer.info.name, error = %e, "push memory (the next sync catches up)"),
                            }
                        });
                    }
                }
            }
            _ = tick.tick() => {
                let up: Vec<_> = peers.snapshot().into_iter().filter(|p| p.state == PeerState::Up).collect();
                let now_up: HashSet<NodeId> = up.iter().map(|p| p.info.id.clone()).collect();
                if memory.stale() {
                    // Nothing else until one peer has brought us back: our old records may be
                    // deletes we missed.
                    let mut all_away = !up.is_empty();
                    for peer in &up {
                        match resync_from(&memory, link.as_ref(), &peer.info.id, &peer.addr).await {
                            Ok((applied, dropped)) => {
                                tracing::warn!(
                                    peer = %peer.info.name, applied, dropped,
                                    "resynced memory after being out of touch longer than the tombstone window"
                                );
                                all_away = false;
                                break;
                            }
                            Err(e) => {
                                all_away &= e == RESYNCING;
                                tracing::warn!(peer = %peer.info.name, error = %e, "resync memory");
                            }
                        }
                    }
                    if all_away {
                        // The whole reachable fleet was away together: nobody collected deletes
                        // meanwhile, so everybody's records stand; go on as usual.
                        tracing::warn!("every reachable peer was out of touch too; resuming memory replication");
                        if let Err(e) = memory.touch_contact() {
                            tracing::warn!(error = %e, "record contact");
                        }
                    }
                    continue;
                }
                let full = last_full.elapsed() >= memory.sync_interval;
                if full {
                    last_full = tokio::time::Instant::now();
                    let ids: Vec<NodeId> = now_up.iter().cloned().collect();
                    if let Err(e) = memory.collect_tombstones(&ids) {
                        tracing::warn!(error = %e, "collect tombstones");
                    }
                }
                for peer in up {
                    // A peer that advertises writes we lack gets synced too (pushes can be lost),
                    // at most every couple of seconds.
                    let lagging = memory.lag(&peer.info.id, peer.info.memory_seq).0 > 0
                        && memory.since_sync(&peer.info.id) > Duration::from_secs(2);
                    if full || lagging || !was_up.contains(&peer.info.id) {
                        let (memory, link) = (memory.clone(), link.clone());
                        tokio::spawn(async move {
                            match sync_from(&memory, link.as_ref(), &peer.info.id, &peer.addr).await {
                                Ok(0) => {}
                                Ok(n) => tracing::info!(peer = %peer.info.name, records = n, "memory synced"),
                                Err(e) => tracing::debug!(peer = %peer.info.name, error = %e, "sync memory"),
                            }
                        });
                    }
                }
                was_up = now_up;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{id, record};

    #[tokio::test]
    async fn writes_are_indexed_by_origin_and_overwrites_leave_one_index_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(crate::storage::SledStore::new(
            sled::open(dir.path()).expect("db"),
        ));
        let own = id("me");
        let (memory, _writes) = Memory::open(db, own.clone(), MemoryOptions::default());
        memory
            .put("notes", "a", Some(b"1".to_vec()))
            .await
            .expect("put");
        memory
            .put("notes", "b", Some(b"2".to_vec()))
            .await
            .expect("put");
        memory
            .put("notes", "a", Some(b"3".to_vec()))
            .await
            .expect("put");
        let since = memory.since(&own, 0, 100).expect("since");
        let keys: Vec<_> = since
            .iter()
            .map(|e| (e.key.as_str(), e.record.seq))
            .collect();
        assert_eq!(keys, [("b", 2), ("a", 3)]);
        assert_eq!(memory.origins().expect("origins")[&own], 3);
        memory.put("notes", "b", None).await.expect("delete");
        assert_eq!(memory.list("notes", "", 10).expect("list").len(), 1);
        assert!(
            memory
                .get("notes", "b")
                .expect("get")
                .expect("tombstone")
                .tombstone
        );
    }

    #[test]
    fn pushes_are_split_by_count_and_by_bytes() {
        let entry = |size: usize| Entry {
            namespace: "n".into(),
            key: "k".into(),
            record: Record {
                value: vec![0; size],
                ..record(1, &id("o"), false)
            },
        };
        let many: Vec<Entry> = (0..SYNC_BATCH + 1).map(|_| entry(1)).collect();
        let sizes: Vec<usize> = push_batches(many).iter().map(Vec::len).collect();
        assert_eq!(sizes, [SYNC_BATCH, 1]);
        let big: Vec<Entry> = (0..10).map(|_| entry(MAX_VALUE)).collect();
        let batches = push_batches(big);
        assert!(batches.len() >= 2, "{} batches", batches.len());
        assert!(
            batches
                .iter()
                .all(|b| b.iter().map(|e| e.record.value.len()).sum::<usize>() <= BATCH_BYTES)
        );
    }

    #[tokio::test]
    async fn one_batch_applies_its_winners_in_one_commit_even_for_a_key_it_holds_twice() {
        let (_dir, memory) = open_memory(&id("me"), MemoryOptions::default());
        let (p, q) = (id("p"), id("q"));
        let now = uhlc::system_time_clock().as_u64();
        let entry = |key: &str, hlc: u64, origin: &NodeId, seq: u64| Entry {
            namespace: "notes".into(),
            key: key.into(),
            record: Record {
                seq,
                value: format!("{key}@{hlc}").into_bytes(),
                ..record(hlc, origin, false)
            },
        };
        memory.apply(&entry("held", now + 5, &q, 1)).expect("apply");
        let future = now + uhlc::NTP64::from(Duration::from_secs(60)).as_u64();
        let batch = [
            entry("k", now + 2, &p, 1),
            entry("k", now + 3, &q, 2),
            // Loses to the record two lines up, though it comes later in the batch.
            entry("k", now + 1, &p, 2),
            entry("held", now + 4, &p, 3),
            entry("far", future, &p, 4),
        ];
        let results: Vec<_> = memory
            .apply_all(&batch)
            .into_iter()
            .map(|r| r.map_err(|e| matches!(e, MemoryError::FromTheFuture { .. })))
            .collect();
        assert_eq!(
            results,
            [Ok(true), Ok(true), Ok(false), Ok(false), Err(true)]
        );
        let k = memory.get("notes", "k").expect("get").expect("k");
        assert_eq!((k.hlc, &k.origin), (now + 3, &q));
        // Only the winner is indexed: p's first write of `k` was overwritten in the batch.
        assert!(memory.since(&p, 0, 10).expect("since").is_empty());
        let from_q: Vec<_> = memory.since(&q, 0, 10).expect("since");
        assert_eq!(from_q.len(), 2);
        assert!(memory.get("notes", "far").expect("get").is_none());
    }

    #[tokio::test]
    async fn lag_is_what_a_peer_wrote_that_we_do_not_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(crate::storage::SledStore::new(
            sled::open(dir.path()).expect("db"),
        ));
        let (memory, _writes) = Memory::open(db, id("me"), MemoryOptions::default());
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

    #[tokio::test]
    async fn a_record_from_the_far_future_is_refused_and_its_writer_named_in_health() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(crate::storage::SledStore::new(
            sled::open(dir.path()).expect("db"),
        ));
        let (memory, _writes) = Memory::open(db, id("me"), MemoryOptions::default());
        assert_eq!(memory.clock_problem(), None);
        let future = uhlc::system_time_clock().as_u64()
            + uhlc::NTP64::from(Duration::from_secs(60)).as_u64();
        let entry = Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: record(future, &id("other"), false),
        };
        assert!(matches!(
            memory.apply(&entry),
            Err(MemoryError::FromTheFuture { .. })
        ));
        assert!(memory.get("notes", "k").expect("get").is_none());
        let problem = memory.clock_problem().expect("a clock reason");
        assert!(problem.contains(id("other").short()), "{problem}");
        assert!(
            problem.contains("memory.max_clock_skew_ms = 500"),
            "{problem}"
        );
    }

    fn open_memory(own: &NodeId, options: MemoryOptions) -> (tempfile::TempDir, Arc<Memory>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(crate::storage::SledStore::new(
            sled::open(dir.path()).expect("db"),
        ));
        let (memory, _writes) = Memory::open(db, own.clone(), options);
        (dir, memory)
    }

    /// Peers reached in-process: `addr` is the peer's id.
    #[derive(Debug, Default)]
    struct InProcess(std::sync::Mutex<BTreeMap<String, Arc<Memory>>>);

    impl MemoryPeers for InProcess {
        fn sync(
            &self,
            addr: String,
            request: SyncRequest,
        ) -> BoxFuture<'static, Result<SyncBatch, String>> {
            let peer = self.0.lock().expect("lock").get(&addr).cloned();
            Box::pin(async move {
                let peer = peer.ok_or("no such peer")?;
                match answer_sync(&peer, &request) {
                    Err(MemoryError::Resyncing) => Err(RESYNCING.to_owned()),
                    other => other.map_err(|e| e.to_string()),
                }
            })
        }

        fn push(
            &self,
            addr: String,
            entries: Vec<Entry>,
        ) -> BoxFuture<'static, Result<u64, String>> {
            let peer = self.0.lock().expect("lock").get(&addr).cloned();
            Box::pin(async move {
                let peer = peer.ok_or("no such peer")?;
                let sender = entries.first().map(|e| e.record.origin.clone());
                Ok(peer.accept_push(sender.as_ref(), &entries).2)
            })
        }
    }

    fn tombstone_of(memory: &Memory, key: &str) -> Option<bool> {
        memory.get("notes", key).expect("get").map(|r| r.tombstone)
    }

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
        // b pulls from a, then a hears of c through b: c has not reported anything yet.
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
        assert_eq!(memory.accept_push(Some(&sender), &[write]).0, 1);
        let started = memory
            .meta_u64(CONTACT_KEY)
            .expect("the first record starts the clock");
        assert!(!memory.stale());
        // Later pushes do not move it: only a completed sync does.
        memory.start_contact_clock().expect("again");
        assert_eq!(memory.meta_u64(CONTACT_KEY), Some(started));
        let long_ago = now_ms() - 2 * 3600 * 1000;
        memory
            .store
            .commit(vec![Write::Put(
                META.into(),
                CONTACT_KEY.to_vec(),
                long_ago.to_be_bytes().to_vec(),
            )])
            .expect("age");
        assert!(memory.stale(), "away longer than the window: resync first");
    }

    #[tokio::test]
    async fn a_push_advances_the_frontier_only_when_it_follows_what_is_held() {
        let (me, sender) = (id("me"), id("sender"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let now = uhlc::system_time_clock().as_u64();
        let write = |seq: u64, key: &str| Entry {
            namespace: "notes".into(),
            key: key.into(),
            record: Record {
                seq,
                ..record(now + seq, &sender, false)
            },
        };
        assert_eq!(memory.accept_push(Some(&sender), &[write(1, "a")]).2, 1);
        // 3 arrives before 2 (a lost push): the frontier waits for a sync to fill the gap.
        assert_eq!(memory.accept_push(Some(&sender), &[write(3, "c")]).2, 1);
        assert_eq!(memory.accept_push(Some(&sender), &[write(2, "b")]).2, 2);
        // Someone else's writes never move the sender's frontier.
        let (applied, refused, held) = memory.accept_push(Some(&me), &[write(4, "d")]);
        assert_eq!((applied, refused.len(), held), (1, 0, 0));
        assert_eq!(memory.frontier()[&sender], 2);
    }

    #[tokio::test]
    async fn a_node_away_longer_than_the_window_drops_what_was_deleted_meanwhile_and_keeps_its_news()
     {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(3600),
            ..MemoryOptions::default()
        };
        let (active, away) = (id("active"), id("away"));
        let (_da, ma) = open_memory(&active, options.clone());
        let (_db, mb) = open_memory(&away, options);
        let link = InProcess::default();
        link.0
            .lock()
            .expect("lock")
            .insert(active.to_string(), ma.clone());
        link.0
            .lock()
            .expect("lock")
            .insert(away.to_string(), mb.clone());
        for key in ["gone", "kept"] {
            ma.put("notes", key, Some(b"v".to_vec()))
                .await
                .expect("put");
        }
        sync_from(&mb, &link, &active, active.as_str())
            .await
            .expect("sync");
        assert_eq!(tombstone_of(&mb, "gone"), Some(false));
        // Meanwhile the active node deletes `gone` and collects the tombstone; the away node
        // writes `news` that nobody has seen.
        // The away node is heard of no more (its last contact is older than the window).
        ma.put("notes", "gone", None).await.expect("delete");
        assert_eq!(ma.collect_tombstones(&[]).expect("collect"), 0);
        let long_ago = now_ms() - 2 * 3600 * 1000;
        let age = |key: Vec<u8>| Write::Put(META.into(), key, long_ago.to_be_bytes().to_vec());
        ma.store.commit(vec![age(seen_key(&away))]).expect("age");
        assert_eq!(ma.collect_tombstones(&[]).expect("collect"), 1);
        mb.put("notes", "news", Some(b"n".to_vec()))
            .await
            .expect("put");
        mb.store
            .commit(vec![age(CONTACT_KEY.to_vec())])
            .expect("age contact");
        assert!(mb.stale());
        let refused = answer_sync(&mb, &SyncRequest::default());
        assert!(
            matches!(refused, Err(MemoryError::Resyncing)),
            "{refused:?}"
        );
        let (_, dropped) = resync_from(&mb, &link, &active, active.as_str())
            .await
            .expect("resync");
        assert_eq!(dropped, 1);
        assert!(!mb.stale());
        assert_eq!(tombstone_of(&mb, "gone"), None, "the delete is not undone");
        assert_eq!(tombstone_of(&mb, "kept"), Some(false));
        assert_eq!(tombstone_of(&mb, "news"), Some(false));
        // And the news reaches the active node the usual way.
        sync_from(&ma, &link, &away, away.as_str())
            .await
            .expect("sync");
        assert_eq!(tombstone_of(&ma, "news"), Some(false));
        assert_eq!(tombstone_of(&ma, "gone"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_puts_all_complete() {
        let (_dir, memory) = open_memory(&id("me"), MemoryOptions::default());
        let writers: Vec<_> = (0..32)
            .map(|w| {
                let memory = memory.clone();
                tokio::spawn(async move {
                    for i in 0..20 {
                        memory
                            .put("notes", &format!("w{w}-{i}"), Some(vec![0; 100]))
                            .await
                            .expect("put");
                    }
                })
            })
            .collect();
        // sled 0.34's concurrent flush_async froze exactly this; a deadline turns a hang into a
        // failure.
        tokio::time::timeout(Duration::from_secs(60), async {
            for writer in writers {
                writer.await.expect("writer");
            }
        })
        .await
        .expect("32 concurrent writers finished");
        assert_eq!(memory.list("notes", "", 10_000).expect("list").len(), 640);
    }
}
