//! The local store: the [`Memory`] itself, opened on a [`Store`], with local writes (`put`),
//! reads (`get`, `list`), the application of peers' records under last-writer-wins (`apply`),
//! and the trees and key layout that hold them: one tree per namespace, the `(origin, seq)`
//! index and its tombstones, and the meta counters the other files keep their bookkeeping in.
//! It must not talk to peers or decide when to sync (`sync`), judge stamps (`clock`) or collect
//! tombstones (`gc`); those add their own `impl Memory` blocks and use the fields and helpers
//! marked `pub(super)` here.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    ops::Bound,
    sync::Arc,
    time::Duration,
};

use mesh_cert::{OriginSigner, OriginVerifier};
use mesh_domain::{
    NodeId,
    keys::{self, MAX_VALUE},
    sync::MutexExt,
};
use tokio::sync::{mpsc, watch};

use super::{
    error::MemoryError,
    index::{INDEX, index_key, reindex, split_index_key, split_index_value, unindex},
    record::{Entry, Record},
};
use crate::{
    metrics::{labels, metrics},
    storage::{self, Store, Write},
};

/// How a node's memory behaves (`[memory]` in the config).
#[derive(Debug, Clone)]
pub struct MemoryOptions {
    /// Namespaces kept on this node only.
    pub local_namespaces: Vec<String>,
    /// How far ahead of our clock a record from a peer may be stamped.
    pub max_skew: Duration,
    /// How long a tombstone is kept at most; a node away longer resyncs.
    pub tombstone_window: Duration,
    /// How often `fanout` random up peers are synced even without news (and tombstones are
    /// collected).
    pub sync_interval: Duration,
    /// How many up peers a batch of writes is pushed to, and how many are pulled from each
    /// sync interval; the rest catch up by pulling.
    pub fanout: usize,
    /// Most namespaces the node keeps (the system namespaces do not count, and are never
    /// refused); a write that would create one more is refused.
    pub max_namespaces: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            local_namespaces: Vec::new(),
            max_skew: Duration::from_millis(500),
            tombstone_window: Duration::from_secs(7 * 24 * 3600),
            sync_interval: Duration::from_secs(30),
            fanout: 3,
            max_namespaces: 1000,
        }
    }
}

/// The node's memory: its records, the index over them and the bookkeeping of replication, all
/// in one [`Store`]. The fields are shared with the sibling files that add methods to it.
pub struct Memory {
    /// Where the records, the index and the meta counters live (trees named below).
    pub(super) store: Arc<dyn Store>,
    /// Serialises writers: each reads what it replaces, then commits.
    pub(super) writer: std::sync::Mutex<()>,
    /// This node's id: the origin of its own writes (the id of `signer`'s certificate).
    pub(super) own: NodeId,
    /// Signs this node's records (see `signatures`).
    pub(super) signer: Arc<OriginSigner>,
    /// Verifies peers' records against their origins' certificates (see `signatures`).
    pub(super) verifier: Arc<OriginVerifier>,
    /// When a refusal of records relayed by a peer in an origin's name was last logged: one
    /// line per (peer, origin) a minute, not one per record.
    pub(super) refusals_logged:
        std::sync::Mutex<HashMap<(Option<NodeId>, NodeId), std::time::Instant>>,
    /// Stamps local writes and moves up to the stamps of peers' records (see `clock`).
    pub(super) hlc: uhlc::HLC,
    /// How far ahead of our clock a peer's record may be stamped; named in refusals.
    pub(super) max_skew: Duration,
    /// Namespaces kept on this node only: no sequence numbers, no index, no tombstones.
    pub(super) local_namespaces: HashSet<String>,
    /// How long a tombstone is kept at most, and how long a node may be away before resyncing.
    pub(super) tombstone_window: Duration,
    /// How often `fanout` random up peers are synced; also how long a clock refusal stays
    /// reported.
    pub(super) sync_interval: Duration,
    /// How many up peers a batch is pushed to and how many are pulled from each interval.
    pub(super) fanout: usize,
    /// New local writes, for the replicator to push.
    pub(super) pushes: mpsc::UnboundedSender<Entry>,
    /// This node's latest write sequence number, published for whoever reports it.
    pub(super) own_seq: watch::Sender<u64>,
    /// When each peer was last synced successfully (for lag reporting).
    pub(super) synced_at: std::sync::Mutex<BTreeMap<NodeId, std::time::Instant>>,
    /// Writers whose records were last refused as stamped too far ahead: how far, and when.
    pub(super) ahead: std::sync::Mutex<BTreeMap<NodeId, (Duration, std::time::Instant)>>,
    /// The namespaces that hold records (system namespaces left out), kept here so a write
    /// need not list the store's trees; changed only under `writer`.
    namespaces: std::sync::Mutex<HashSet<String>>,
    /// The bound on `namespaces` (`memory.max_namespaces`).
    max_namespaces: usize,
    /// Counts commits that changed records (local writes and applied peers' records), so a
    /// reader can wait for a change instead of polling ([`Memory::changes`]).
    changes: watch::Sender<u64>,
    /// The same per namespace, for the namespaces someone follows ([`Memory::changes_in`]):
    /// only the node's own code subscribes, so the map holds a handful of entries.
    namespace_changes: std::sync::Mutex<HashMap<String, watch::Sender<u64>>>,
}

/// One page of a listing ([`Memory::page`]).
#[derive(Debug, Default)]
pub struct Page {
    /// The entries, in key order.
    pub entries: Vec<Entry>,
    /// When the page was cut (by its count or its byte budget) and more entries remain: the
    /// last key in it, to continue after.
    pub next_after: Option<String>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

const SEQ_KEY: &[u8] = b"seq";
/// Counters: own sequence, watermarks, peers' frontiers, when peers were seen.
pub(super) const META: &str = "mem_meta";
/// During a full resync: the places the peer holds.
pub(super) const RESYNC: &str = "mem_resync";
/// Namespace trees are named `mem/<namespace>`.
const NS_PREFIX: &str = "mem/";

pub(super) fn ns_tree(ns: &str) -> String {
    format!("{NS_PREFIX}{ns}")
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    bytes.try_into().ok().map(u64::from_be_bytes)
}

impl Memory {
    /// Opens the memory kept in `store`, for the node whose records `signer` signs; `verifier`
    /// checks everything peers send. A store written before records were signed is upgraded
    /// first ([`Memory::sign_stored`]). Returns the memory and the stream of local writes the
    /// replicator pushes.
    pub fn open(
        store: Arc<dyn Store>,
        signer: Arc<OriginSigner>,
        verifier: Arc<OriginVerifier>,
        options: MemoryOptions,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Entry>) {
        let own = signer.id().clone();
        // Our own records come back from peers and are verified like any other.
        if let Err(e) = verifier.learn(signer.certificate()) {
            tracing::warn!(error = %e, "this node's own certificate does not vouch for its records; peers will refuse them");
        }
        let hlc = Self::new_clock(&own, options.max_skew);
        let (pushes, rx) = mpsc::unbounded_channel();
        let stored_seq = store
            .get(META, SEQ_KEY)
            .ok()
            .flatten()
            .and_then(|v| be_u64(&v))
            .unwrap_or(0);
        let namespaces = match store.trees() {
            Ok(trees) => trees
                .iter()
                .filter_map(|name| name.strip_prefix(NS_PREFIX))
                .filter(|ns| !keys::SYSTEM_NAMESPACES.contains(ns))
                .map(str::to_owned)
                .collect(),
            Err(e) => {
                // Counted from nothing, the bound still holds for new namespaces from here on.
                tracing::warn!(error = %e, "list the memory's namespaces");
                HashSet::new()
            }
        };
        let memory = Self {
            store,
            writer: std::sync::Mutex::default(),
            own,
            signer,
            verifier,
            refusals_logged: std::sync::Mutex::default(),
            hlc,
            max_skew: options.max_skew,
            local_namespaces: options.local_namespaces.into_iter().collect(),
            tombstone_window: options.tombstone_window,
            sync_interval: options.sync_interval,
            fanout: options.fanout.max(1),
            pushes,
            own_seq: watch::Sender::new(stored_seq),
            synced_at: std::sync::Mutex::default(),
            ahead: std::sync::Mutex::default(),
            namespaces: std::sync::Mutex::new(namespaces),
            max_namespaces: options.max_namespaces,
            changes: watch::Sender::new(0),
            namespace_changes: std::sync::Mutex::default(),
        };
        match memory.sign_stored() {
            Ok((0, 0)) => {}
            Ok((signed, unsigned)) => tracing::warn!(
                signed,
                unsigned,
                "memory upgraded to signed records: own records signed; other nodes' unsigned records kept and served here but not relayed until their writers' signed copies arrive"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "upgrade memory to signed records (retried at the next start)")
            }
        }
        let revocations = memory.load_revocations();
        if revocations > 0 {
            tracing::info!(revocations, "revoked certificates loaded");
        }
        (Arc::new(memory), rx)
    }

    /// This node's id.
    pub fn own_id(&self) -> &NodeId {
        &self.own
    }

    /// Follows changes: the receiver sees a new value after every commit that changed records
    /// (a local write, or peers' records applied), whatever their namespace. A reader waiting
    /// for a key re-reads it on each change instead of polling.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Follows the changes of one namespace, as [`Memory::changes`] follows all: a reader that
    /// keeps a namespace decoded re-reads it on a change there, not on every write.
    pub fn changes_in(&self, ns: &str) -> watch::Receiver<u64> {
        self.namespace_changes
            .lock_unpoisoned()
            .entry(ns.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Tells followers that a commit changed records of `namespaces`.
    pub(super) fn changed<'a>(&self, namespaces: impl IntoIterator<Item = &'a str>) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        let followed = self.namespace_changes.lock_unpoisoned();
        for ns in namespaces {
            if let Some(changes) = followed.get(ns) {
                changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    pub(super) fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writer.lock_unpoisoned()
    }

    /// Refuses `ns` when it would be a new namespace past the bound, counting `more` new ones
    /// already pending in the caller's batch. Called under `writer`.
    fn check_namespace_room(&self, ns: &str, more: &HashSet<String>) -> Result<(), MemoryError> {
        let known = self.namespaces.lock_unpoisoned();
        if keys::SYSTEM_NAMESPACES.contains(&ns)
            || known.contains(ns)
            || more.contains(ns)
            || known.len() + more.len() < self.max_namespaces
        {
            return Ok(());
        }
        Err(MemoryError::TooManyNamespaces {
            namespace: ns.to_owned(),
            limit: self.max_namespaces,
        })
    }

    /// Records namespaces that now hold records (after their commit). Called under `writer`.
    fn note_namespaces(&self, created: HashSet<String>) {
        if !created.is_empty() {
            self.namespaces.lock_unpoisoned().extend(
                created
                    .into_iter()
                    .filter(|ns| !keys::SYSTEM_NAMESPACES.contains(&ns.as_str())),
            );
        }
    }

    /// Counts `count` replicated records refused because their namespace would be one too
    /// many, and says so in the log at most once a minute (a peer may send many).
    fn refuse_for_namespaces(&self, count: u64) {
        static LOGGED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
        metrics()
            .memory_records_refused
            .get_or_create(&labels(&[("reason", "namespaces")]))
            .inc_by(count);
        let mut logged = LOGGED.lock_unpoisoned();
        if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            *logged = Some(std::time::Instant::now());
            tracing::warn!(
                records = count,
                limit = self.max_namespaces,
                "refused replicated records in new namespaces: this node holds the most namespaces it keeps (memory.max_namespaces); raise it to take them"
            );
        }
    }

    pub(super) fn replicated(&self, ns: &str) -> bool {
        !self.local_namespaces.contains(ns)
    }

    /// The record stored at `key` of namespace tree `tree`; a corrupt one counts as absent.
    pub(super) fn stored(&self, tree: &str, key: &str) -> Result<Option<Record>, MemoryError> {
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
        let replicated = self.replicated(ns);
        let record = {
            let _writer = self.write_lock();
            self.check_namespace_room(ns, &HashSet::new())?;
            // Stamped under the writer lock, after what it replaces is read: a stamp taken
            // before could lose to a peer's record applied in between, and this node would
            // store its older write over the newer one while every other node kept the newer
            // one — the two would disagree on the key for good.
            let old = self.stored(&tree, key)?;
            let hlc = self.stamp_after(old.as_ref())?;
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
            let mut record = Record {
                tombstone: value.is_none(),
                value: value.unwrap_or_default(),
                hlc,
                origin: self.own.clone(),
                seq,
                signature: Vec::new(),
            };
            if replicated {
                record.signature = self.sign(ns, key, &record)?;
            }
            if let Some(old) = &old {
                unindex(&mut writes, old);
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
            self.note_namespaces(HashSet::from([ns.to_owned()]));
            if replicated {
                self.own_seq.send_replace(seq);
            }
            record
        };
        self.changed([ns]);
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

    /// Live (non-deleted) entries of `ns` whose key starts with `prefix`, in key order, at most
    /// `limit` of them. For the node's own bounded reads; answers to callers use [`Memory::page`].
    pub fn list(&self, ns: &str, prefix: &str, limit: usize) -> Result<Vec<Entry>, MemoryError> {
        Ok(self.page(ns, prefix, "", limit, usize::MAX)?.entries)
    }

    /// One page of [`Memory::list`]: live entries of `ns` whose key starts with `prefix` and
    /// sorts after `after` (none: from the start), in key order, until `limit` entries or
    /// `max_bytes` of keys and values ([`Entry::size`]); the first entry is always taken, so a
    /// page never comes back empty while entries remain. When entries remain past the page,
    /// [`Page::next_after`] says where to continue.
    pub fn page(
        &self,
        ns: &str,
        prefix: &str,
        after: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, MemoryError> {
        keys::check_namespace(ns)?;
        let tree = ns_tree(ns);
        let items = if after.as_bytes() < prefix.as_bytes() {
            self.store.scan_prefix(&tree, prefix.as_bytes())
        } else {
            self.store.range(
                &tree,
                Bound::Excluded(after.as_bytes().to_vec()),
                Bound::Unbounded,
            )
        };
        let mut page = Page::default();
        let mut bytes = 0usize;
        for item in items {
            let (key, value) = item?;
            if !key.starts_with(prefix.as_bytes()) {
                break;
            }
            let record = Record::decode(&value)?;
            if record.tombstone {
                continue;
            }
            let entry = Entry {
                namespace: ns.to_owned(),
                key: String::from_utf8_lossy(&key).into_owned(),
                record,
            };
            bytes = bytes.saturating_add(entry.size());
            if !page.entries.is_empty() && (page.entries.len() >= limit || bytes > max_bytes) {
                page.next_after = page.entries.last().map(|e| e.key.clone());
                break;
            }
            page.entries.push(entry);
        }
        Ok(page)
    }

    /// Checks a record from another node before it is applied: `Ok(false)` when its namespace
    /// is local here, an error when it breaks a limit or is stamped too far ahead (logged).
    fn admit(&self, entry: &Entry) -> Result<bool, MemoryError> {
        keys::check_namespace(&entry.namespace)?;
        keys::check_key(&entry.key)?;
        if !self.replicated(&entry.namespace) {
            return Ok(false);
        }
        self.check_stamp(entry)?;
        Ok(true)
    }

    /// Applies a record whose signature was checked (or a test's): refused when stamped too far
    /// ahead, kept only when it wins over what is stored. Returns whether it was stored.
    #[cfg(test)]
    pub(super) fn apply(&self, entry: &Entry) -> Result<bool, MemoryError> {
        self.apply_all(std::slice::from_ref(entry))
            .pop()
            .unwrap_or(Ok(false))
    }

    /// [`Memory::apply`] for many records in one commit; the result for each, in order. Only
    /// for records whose signatures were checked: peers' records come in through
    /// [`Memory::apply_from`].
    pub(super) fn apply_all(&self, entries: &[Entry]) -> Vec<Result<bool, MemoryError>> {
        let mut results: Vec<_> = entries.iter().map(|e| self.admit(e)).collect();
        let _writer = self.write_lock();
        let mut writes = Vec::new();
        // What this batch has already put at a place, for a place that comes twice.
        let mut pending: BTreeMap<(String, &str), Record> = BTreeMap::new();
        // Namespaces this batch creates, and how many records were refused for want of room.
        let (mut created, mut no_room) = (HashSet::new(), 0u64);
        for (entry, result) in entries.iter().zip(results.iter_mut()) {
            if !matches!(result, Ok(true)) {
                continue;
            }
            if let Err(e) = self.check_namespace_room(&entry.namespace, &created) {
                no_room += 1;
                *result = Err(e);
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
                if !record.supersedes(old) {
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
            if !self.namespaces.lock_unpoisoned().contains(&entry.namespace) {
                created.insert(entry.namespace.clone());
            }
        }
        let any = !writes.is_empty();
        match self.store.commit(writes) {
            Ok(()) => {
                self.note_namespaces(created);
                if any {
                    let written: HashSet<&str> = pending
                        .keys()
                        .filter_map(|(tree, _)| tree.strip_prefix(NS_PREFIX))
                        .collect();
                    self.changed(written);
                }
            }
            Err(e) => {
                for result in results.iter_mut().filter(|r| matches!(r, Ok(true))) {
                    *result = Err(e.clone().into());
                }
            }
        }
        if no_room > 0 {
            self.refuse_for_namespaces(no_room);
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

    /// Flushes to disk, on the blocking pool (sled's `flush_async` deadlocks when called
    /// concurrently, spacejam/sled#1308).
    pub async fn flush(&self) -> Result<(), MemoryError> {
        Ok(storage::flush(&self.store).await?)
    }

    /// The meta counter under `key`, if any.
    pub(super) fn meta_u64(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        self.store
            .get(META, key.as_ref())
            .ok()
            .flatten()
            .and_then(|v| be_u64(&v))
    }

    /// `(key suffix, u64)` of every meta entry under `prefix`.
    pub(super) fn meta_under(&self, prefix: &str) -> Vec<(String, u64)> {
        self.store
            .scan_prefix(META, prefix.as_bytes())
            .filter_map(|item| item.ok())
            .filter_map(|(key, value)| {
                let rest = std::str::from_utf8(&key).ok()?.strip_prefix(prefix)?;
                Some((rest.to_owned(), be_u64(&value)?))
            })
            .collect()
    }

    /// Raises a meta counter to `value` (never lowers it).
    pub(super) fn raise_meta(&self, key: impl AsRef<[u8]>, value: u64) -> Result<(), MemoryError> {
        self.raise_metas(vec![(key.as_ref().to_vec(), value)])
    }

    /// Raises each meta counter to its value (never lowers one), in one commit.
    pub(super) fn raise_metas(&self, raised: Vec<(Vec<u8>, u64)>) -> Result<(), MemoryError> {
        let _writer = self.write_lock();
        let mut writes = Vec::new();
        for (key, value) in raised {
            let old = self.store.get(META, &key)?.and_then(|v| be_u64(&v));
            if old.is_none_or(|old| old < value) {
                writes.push(Write::Put(META.into(), key, value.to_be_bytes().to_vec()));
            }
        }
        if !writes.is_empty() {
            self.store.commit(writes)?;
        }
        Ok(())
    }

    /// Removes the record at `tree`/`key` (and its index entries) if it is still `bytes`: a
    /// write may have raced in. Returns whether it went.
    pub(super) fn remove_if_unchanged(
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
        // A collected tombstone changes nothing a reader sees; a dropped record does.
        if !record.tombstone {
            self.changed(tree.strip_prefix(NS_PREFIX));
        }
        Ok(true)
    }

    /// Every namespace that holds records (live or deleted) and callers may read (the private
    /// system namespaces left out), sorted, with what it is.
    pub fn namespaces(&self) -> Result<Vec<(String, NamespaceKind)>, MemoryError> {
        let mut list: Vec<(String, NamespaceKind)> = self
            .store
            .trees()?
            .into_iter()
            .filter_map(|name| name.strip_prefix(NS_PREFIX).map(str::to_owned))
            .filter(|ns| super::error::readable_by_callers(ns).is_ok())
            .map(|ns| {
                let kind = if keys::SYSTEM_NAMESPACES.contains(&ns.as_str()) {
                    NamespaceKind::System
                } else if self.replicated(&ns) {
                    NamespaceKind::Shared
                } else {
                    NamespaceKind::Local
                };
                (ns, kind)
            })
            .collect();
        list.sort();
        Ok(list)
    }

    /// Every replicated namespace that holds records.
    pub(super) fn replicated_namespaces(&self) -> Result<Vec<String>, MemoryError> {
        Ok(self
            .store
            .trees()?
            .into_iter()
            .filter_map(|name| name.strip_prefix(NS_PREFIX).map(str::to_owned))
            .filter(|ns| self.replicated(ns))
            .collect())
    }
}

/// What a namespace is ([`Memory::namespaces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NamespaceKind {
    /// Replicated to every node.
    Shared,
    /// In `memory.local_namespaces`: it stays on this node.
    Local,
    /// Written only by the node's own services (cron, sessions, approvals, …).
    System,
}

impl NamespaceKind {
    /// `shared`, `local` or `system`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Local => "local",
            Self::System => "system",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        memory::test_support::{id, open_memory, record, signer, verifier},
        storage::SledStore,
    };

    #[tokio::test]
    async fn writes_are_indexed_by_origin_and_overwrites_leave_one_index_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
        let own = id("me");
        let (memory, _writes) =
            Memory::open(db, signer(&own), verifier(), MemoryOptions::default());
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

    /// A reader following one namespace (the scheduler follows `cron`) is woken by its own
    /// writes and peers' records there, and not by writes elsewhere.
    #[tokio::test]
    async fn a_follower_of_a_namespace_wakes_for_changes_there_only() {
        let (_dir, memory) = open_memory(&id("me"), MemoryOptions::default());
        let mut cron = memory.changes_in("cron");
        let mut notes = memory.changes_in("notes");
        memory
            .put("notes", "k", Some(b"v".to_vec()))
            .await
            .expect("put");
        assert!(notes.has_changed().expect("open"));
        assert!(!cron.has_changed().expect("open"), "a write elsewhere");
        notes.mark_unchanged();
        let now = uhlc::system_time_clock().as_u64();
        let peer = Entry {
            namespace: "cron".into(),
            key: "nightly".into(),
            record: Record {
                seq: 1,
                value: b"{}".to_vec(),
                ..record(now, &id("p"), false)
            },
        };
        assert!(memory.apply(&peer).expect("apply"));
        assert!(cron.has_changed().expect("open"));
        assert!(!notes.has_changed().expect("open"));
        cron.mark_unchanged();
        // A record that loses to the one held changes nothing.
        let older = Entry {
            record: Record {
                seq: 2,
                ..record(now - 1, &id("p"), false)
            },
            ..peer.clone()
        };
        assert!(!memory.apply(&older).expect("apply"));
        assert!(!cron.has_changed().expect("open"));
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

    /// Point 7b of issue 16: a node's namespaces are bounded. Local writes and replicated
    /// records that would create one past the bound are refused (the latter counted), while
    /// existing namespaces, the system namespaces and everything stored stay as they were,
    /// also after a restart.
    #[tokio::test]
    async fn writes_that_would_create_a_namespace_past_the_bound_are_refused() {
        let own = id("me");
        let options = MemoryOptions {
            max_namespaces: 3,
            ..MemoryOptions::default()
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let open = || {
            let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
            Memory::open(db, signer(&own), verifier(), options.clone()).0
        };
        let memory = open();
        for ns in ["a", "b", "c"] {
            memory.put(ns, "k", Some(b"1".to_vec())).await.expect("put");
        }
        let refused = memory
            .put("d", "k", Some(b"1".to_vec()))
            .await
            .expect_err("a fourth namespace is refused");
        assert!(
            matches!(refused, MemoryError::TooManyNamespaces { limit: 3, .. }),
            "{refused:?}"
        );
        let message = refused.to_string();
        assert!(
            message.contains("memory.max_namespaces") && message.contains("`d`"),
            "{message}"
        );
        // Existing namespaces stay writable, deletes included; the node's own are never refused.
        memory
            .put("a", "k2", Some(b"2".to_vec()))
            .await
            .expect("put");
        memory.put("b", "k", None).await.expect("delete");
        memory
            .put(keys::CRON_SCHEDULES, "s", Some(b"{}".to_vec()))
            .await
            .expect("a system namespace");

        let refusals = || {
            metrics()
                .memory_records_refused
                .get_or_create(&labels(&[("reason", "namespaces")]))
                .get()
        };
        let before = refusals();
        let now = uhlc::system_time_clock().as_u64();
        let peer = id("peer");
        let from_peer = |ns: &str, seq: u64| Entry {
            namespace: ns.into(),
            key: "r".into(),
            record: Record {
                seq,
                ..record(now, &peer, false)
            },
        };
        let results: Vec<_> = memory
            .apply_all(&[from_peer("e", 1), from_peer("c", 2), from_peer("f", 3)])
            .into_iter()
            .map(|r| r.map_err(|e| matches!(e, MemoryError::TooManyNamespaces { .. })))
            .collect();
        assert_eq!(results, [Err(true), Ok(true), Err(true)]);
        assert_eq!(refusals() - before, 2, "refused records are counted");
        assert!(memory.get("e", "r").expect("get").is_none());
        drop(memory);

        let memory = open();
        for ns in ["a", "b", "c"] {
            assert!(memory.get(ns, "k").expect("get").is_some(), "{ns} kept");
        }
        assert!(memory.get("c", "r").expect("get").is_some());
        assert!(
            memory.put("g", "k", Some(b"1".to_vec())).await.is_err(),
            "the count survives a restart"
        );
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
