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
    sync::Arc,
    time::Duration,
};

use sled::Transactional;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    identity::NodeId,
    llm::BoxFuture,
    peers::{PeerState, PeerTable},
};

/// Longest namespace name.
pub const MAX_NAMESPACE: usize = 64;
/// Longest key.
pub const MAX_KEY: usize = 512;
/// Largest value.
pub const MAX_VALUE: usize = 1024 * 1024;
/// Most records one `Sync` answer or `Push` carries; the rest follows in the next one.
pub const SYNC_BATCH: usize = 512;
/// Most value bytes one `Sync` answer or `Push` carries (well under the 16 MiB message limit).
pub const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// How often every up peer is synced even without news.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(30);

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The value (empty for tombstones).
    pub value: Vec<u8>,
    /// HLC timestamp (NTP64 bits).
    pub hlc: u64,
    /// The node that wrote it.
    pub origin: NodeId,
    /// The origin's write sequence number.
    pub seq: u64,
    /// A delete.
    pub tombstone: bool,
}

impl Record {
    /// Last-writer-wins: the greater (timestamp, origin id) wins, identically everywhere.
    pub fn wins_over(&self, other: &Record) -> bool {
        (self.hlc, &self.origin) > (other.hlc, &other.origin)
    }

    /// The storage encoding: version, flags, hlc, seq, origin (64 hex bytes), value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 1 + 8 + 8 + 64 + self.value.len());
        out.push(1);
        out.push(u8::from(self.tombstone));
        out.extend_from_slice(&self.hlc.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(self.origin.as_str().as_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    /// Decodes [`Record::encode`]'s output; anything else is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, MemoryError> {
        let bad = |why: &str| MemoryError::Corrupt(why.to_owned());
        if bytes.len() < 2 + 16 + NodeId::HEX_LEN {
            return Err(bad("record too short"));
        }
        if bytes[0] != 1 {
            return Err(bad("unknown record version"));
        }
        let tombstone = match bytes[1] {
            0 => false,
            1 => true,
            _ => return Err(bad("bad tombstone flag")),
        };
        let hlc = u64::from_be_bytes(bytes[2..10].try_into().map_err(|_| bad("hlc"))?);
        let seq = u64::from_be_bytes(bytes[10..18].try_into().map_err(|_| bad("seq"))?);
        let origin = std::str::from_utf8(&bytes[18..18 + NodeId::HEX_LEN])
            .map_err(|_| bad("origin is not text"))
            .and_then(|s| NodeId::parse(s).map_err(|e| bad(&e.to_string())))?;
        Ok(Self {
            value: bytes[18 + NodeId::HEX_LEN..].to_vec(),
            hlc,
            origin,
            seq,
            tombstone,
        })
    }
}

/// A record with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Namespace.
    pub namespace: String,
    /// Key.
    pub key: String,
    /// The record.
    pub record: Record,
}

/// Memory errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MemoryError {
    /// A name, key or value breaks a limit.
    #[error("{0}")]
    Invalid(String),
    /// A remote record is stamped too far in the future.
    #[error(
        "record from {origin} is stamped {ahead_ms} ms ahead of this node's clock (at most {max_ms} ms allowed); check the clocks"
    )]
    FromTheFuture {
        /// Writer.
        origin: String,
        /// How far ahead.
        ahead_ms: u64,
        /// The limit.
        max_ms: u64,
    },
    /// Stored bytes do not decode.
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    /// sled failed.
    #[error("storage: {0}")]
    Storage(String),
}

impl From<sled::Error> for MemoryError {
    fn from(e: sled::Error) -> Self {
        Self::Storage(e.to_string())
    }
}

/// Checks a namespace name.
pub fn check_namespace(ns: &str) -> Result<(), MemoryError> {
    let ok = !ns.is_empty()
        && ns.len() <= MAX_NAMESPACE
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(MemoryError::Invalid(format!(
            "namespace `{}`: use 1-{MAX_NAMESPACE} letters, digits, `-`, `_`, `.`",
            ns.chars().take(80).collect::<String>()
        )))
    }
}

/// Checks a key.
pub fn check_key(key: &str) -> Result<(), MemoryError> {
    if key.is_empty() || key.len() > MAX_KEY || key.contains('\0') {
        return Err(MemoryError::Invalid(format!(
            "key: must be 1-{MAX_KEY} bytes without NUL"
        )));
    }
    Ok(())
}

/// The node's memory.
pub struct Memory {
    db: sled::Db,
    own: NodeId,
    hlc: uhlc::HLC,
    max_skew: Duration,
    index: sled::Tree,
    meta: sled::Tree,
    local_namespaces: HashSet<String>,
    /// New local writes, for the replicator to push.
    pushes: mpsc::UnboundedSender<Entry>,
    /// When each peer was last synced successfully (for lag reporting).
    synced_at: std::sync::Mutex<BTreeMap<NodeId, std::time::Instant>>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

const SEQ_KEY: &[u8] = b"seq";

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

impl Memory {
    /// Opens the memory trees in `db`. Returns the memory and the stream of local writes the
    /// replicator pushes.
    pub fn open(
        db: &sled::Db,
        own: NodeId,
        local_namespaces: impl IntoIterator<Item = String>,
        max_skew: Duration,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<Entry>), MemoryError> {
        let hlc = uhlc::HLCBuilder::new()
            .with_id(hlc_id(&own))
            .with_max_delta(max_skew)
            .build();
        let (pushes, rx) = mpsc::unbounded_channel();
        let memory = Self {
            db: db.clone(),
            index: db.open_tree("mem_index")?,
            meta: db.open_tree("mem_meta")?,
            own,
            hlc,
            max_skew,
            local_namespaces: local_namespaces.into_iter().collect(),
            pushes,
            synced_at: std::sync::Mutex::default(),
        };
        Ok((Arc::new(memory), rx))
    }

    /// This node's id.
    pub fn own_id(&self) -> &NodeId {
        &self.own
    }

    fn tree(&self, ns: &str) -> Result<sled::Tree, MemoryError> {
        Ok(self.db.open_tree(format!("mem/{ns}"))?)
    }

    /// The tree of `ns` if anything was ever written there; reads never create trees.
    fn existing_tree(&self, ns: &str) -> Result<Option<sled::Tree>, MemoryError> {
        let name = format!("mem/{ns}");
        if self
            .db
            .tree_names()
            .iter()
            .any(|n| n.as_ref() == name.as_bytes())
        {
            Ok(Some(self.db.open_tree(name)?))
        } else {
            Ok(None)
        }
    }

    fn replicated(&self, ns: &str) -> bool {
        !self.local_namespaces.contains(ns)
    }

    /// Writes a value (or a tombstone) and returns the record once it is durable.
    pub async fn put(
        &self,
        ns: &str,
        key: &str,
        value: Option<Vec<u8>>,
    ) -> Result<Record, MemoryError> {
        check_namespace(ns)?;
        check_key(key)?;
        if value.as_ref().is_some_and(|v| v.len() > MAX_VALUE) {
            return Err(MemoryError::Invalid(format!(
                "value: at most {MAX_VALUE} bytes"
            )));
        }
        let tree = self.tree(ns)?;
        let stamp = self.hlc.new_timestamp();
        let replicated = self.replicated(ns);
        let record_for = |seq: u64| Record {
            tombstone: value.is_none(),
            value: value.clone().unwrap_or_default(),
            hlc: stamp.get_time().as_u64(),
            origin: self.own.clone(),
            seq,
        };
        let record = (&tree, &self.index, &self.meta)
            .transaction(|(tree, index, meta)| {
                let seq = if replicated {
                    let next = meta
                        .get(SEQ_KEY)?
                        .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
                        .unwrap_or(0)
                        + 1;
                    meta.insert(SEQ_KEY, &next.to_be_bytes())?;
                    next
                } else {
                    0
                };
                let record = record_for(seq);
                if let Some(old) = tree.insert(key.as_bytes(), record.encode())?
                    && let Ok(old) = Record::decode(&old)
                    && old.seq > 0
                {
                    index.remove(index_key(&old.origin, old.seq))?;
                }
                if replicated {
                    index.insert(index_key(&record.origin, record.seq), index_value(ns, key))?;
                }
                Ok(record)
            })
            .map_err(|e: sled::transaction::TransactionError<()>| {
                MemoryError::Storage(format!("{e:?}"))
            })?;
        // Acknowledged only once durable: sled itself syncs only every ~500 ms.
        self.db.flush_async().await?;
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
        check_namespace(ns)?;
        check_key(key)?;
        let Some(tree) = self.existing_tree(ns)? else {
            return Ok(None);
        };
        match tree.get(key.as_bytes())? {
            None => Ok(None),
            Some(bytes) => Record::decode(&bytes).map(Some),
        }
    }

    /// Live (non-deleted) entries of `ns` whose key starts with `prefix`, in key order.
    pub fn list(&self, ns: &str, prefix: &str, limit: usize) -> Result<Vec<Entry>, MemoryError> {
        check_namespace(ns)?;
        let mut out = Vec::new();
        let Some(tree) = self.existing_tree(ns)? else {
            return Ok(out);
        };
        for item in tree.scan_prefix(prefix.as_bytes()) {
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

    /// Applies a record from another node: refused when stamped too far ahead, kept only when
    /// it wins over what is stored. Returns whether it was stored.
    pub fn apply(&self, entry: &Entry) -> Result<bool, MemoryError> {
        check_namespace(&entry.namespace)?;
        check_key(&entry.key)?;
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
            return Err(error);
        }
        let tree = self.tree(&entry.namespace)?;
        let record = &entry.record;
        (&tree, &self.index)
            .transaction(|(tree, index)| {
                if let Some(old) = tree.get(entry.key.as_bytes())?
                    && let Ok(old) = Record::decode(&old)
                {
                    if !record.wins_over(&old) {
                        return Ok(false);
                    }
                    if old.seq > 0 {
                        index.remove(index_key(&old.origin, old.seq))?;
                    }
                }
                tree.insert(entry.key.as_bytes(), record.encode())?;
                index.insert(
                    index_key(&record.origin, record.seq),
                    index_value(&entry.namespace, &entry.key),
                )?;
                Ok(true)
            })
            .map_err(|e: sled::transaction::TransactionError<()>| {
                MemoryError::Storage(format!("{e:?}"))
            })
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
        for item in self.index.range(start..=end) {
            let (_, place) = item?;
            let Some((ns, key)) = split_index_value(&place) else {
                continue;
            };
            if let Some(bytes) = self.tree(&ns)?.get(key.as_bytes())? {
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
        while let Some(item) = self.index.range(cursor.clone()..).next() {
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
                && let Some(Ok((last, _))) = self.index.range(..next.clone()).next_back()
                && last.len() == NodeId::HEX_LEN + 8
            {
                let seq =
                    u64::from_be_bytes(last[NodeId::HEX_LEN..].try_into().unwrap_or_default());
                out.insert(origin, seq);
            }
            cursor = next;
        }
        Ok(out)
    }

    /// This node's own latest write sequence number.
    pub fn own_seq(&self) -> u64 {
        self.meta
            .get(SEQ_KEY)
            .ok()
            .flatten()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0)
    }

    /// What we have pulled from `peer` about `origin`.
    pub fn watermark(&self, peer: &NodeId, origin: &NodeId) -> u64 {
        self.meta
            .get(watermark_key(peer, origin))
            .ok()
            .flatten()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0)
    }

    fn set_watermark(&self, peer: &NodeId, origin: &NodeId, seq: u64) -> Result<(), MemoryError> {
        self.meta
            .insert(watermark_key(peer, origin), &seq.to_be_bytes())?;
        Ok(())
    }

    /// Every watermark we hold for `peer`.
    pub fn watermarks(&self, peer: &NodeId) -> BTreeMap<NodeId, u64> {
        let prefix = format!("wm/{}/", peer.as_str());
        self.meta
            .scan_prefix(prefix.as_bytes())
            .filter_map(|item| item.ok())
            .filter_map(|(key, value)| {
                let origin = std::str::from_utf8(&key[prefix.len()..]).ok()?;
                let origin = NodeId::parse(origin).ok()?;
                let seq = u64::from_be_bytes(value.as_ref().try_into().ok()?);
                Some((origin, seq))
            })
            .collect()
    }

    /// The highest sequence number of `origin` this node holds a record of.
    pub fn highest_from(&self, origin: &NodeId) -> u64 {
        self.index
            .range(index_key(origin, 0)..=index_key(origin, u64::MAX))
            .next_back()
            .and_then(|item| item.ok())
            .and_then(|(key, _)| {
                key.get(NodeId::HEX_LEN..)?
                    .try_into()
                    .ok()
                    .map(u64::from_be_bytes)
            })
            .unwrap_or(0)
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
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .map(|at| at.elapsed().as_millis() as u64)
            .unwrap_or(0);
        (records, since)
    }

    /// Time since the last complete sync with `peer` (`MAX` when never).
    pub fn since_sync(&self, peer: &NodeId) -> Duration {
        self.synced_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .map_or(Duration::MAX, |at| at.elapsed())
    }

    /// Flushes to disk.
    pub async fn flush(&self) -> Result<(), MemoryError> {
        self.db.flush_async().await?;
        Ok(())
    }
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
}

/// How the replicator reaches peers (implemented over gRPC in `rpc::memory`).
pub trait MemoryPeers: Send + Sync + fmt::Debug {
    /// Asks the peer at `addr` for records after the given per-origin watermarks.
    fn sync(
        &self,
        addr: String,
        after: BTreeMap<NodeId, u64>,
    ) -> BoxFuture<'static, Result<SyncBatch, String>>;
    /// Sends new records to the peer at `addr`.
    fn push(&self, addr: String, entries: Vec<Entry>) -> BoxFuture<'static, Result<(), String>>;
}

/// Answers a peer's `Sync`: for each origin we hold, the records after the peer's watermark.
pub fn answer_sync(
    memory: &Memory,
    after: &BTreeMap<NodeId, u64>,
) -> Result<SyncBatch, MemoryError> {
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
    batch.heads = memory.origins()?;
    let own = memory.own_seq();
    if own > 0 {
        batch.heads.insert(memory.own_id().clone(), own);
    }
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
        let batch = peers.sync(addr.to_owned(), after.clone()).await?;
        let mut highest: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut refused: HashSet<NodeId> = HashSet::new();
        for entry in &batch.entries {
            match memory.apply(entry) {
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
                .synced_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(peer.clone(), std::time::Instant::now());
            return Ok(applied);
        }
    }
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
/// up and every [`SYNC_INTERVAL`].
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
                        let name = peer.info.name.clone();
                        tokio::spawn(async move {
                            if let Err(e) = push.await {
                                tracing::debug!(peer = %name, error = %e, "push memory (the next sync catches up)");
                            }
                        });
                    }
                }
            }
            _ = tick.tick() => {
                let full = last_full.elapsed() >= SYNC_INTERVAL;
                if full {
                    last_full = tokio::time::Instant::now();
                }
                let up: Vec<_> = peers.snapshot().into_iter().filter(|p| p.state == PeerState::Up).collect();
                let now_up: HashSet<NodeId> = up.iter().map(|p| p.info.id.clone()).collect();
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

    fn id(n: &str) -> NodeId {
        NodeId::from_spki_der(n.as_bytes())
    }

    fn record(hlc: u64, origin: &NodeId, tombstone: bool) -> Record {
        Record {
            value: if tombstone { vec![] } else { b"v".to_vec() },
            hlc,
            origin: origin.clone(),
            seq: 1,
            tombstone,
        }
    }

    #[test]
    fn the_later_timestamp_wins_and_ties_go_to_the_greater_node_id() {
        let (a, b) = (id("a"), id("b"));
        let (low, high) = if a < b { (a, b) } else { (b, a) };
        assert!(record(2, &low, false).wins_over(&record(1, &high, false)));
        assert!(record(5, &high, false).wins_over(&record(5, &low, false)));
        assert!(!record(5, &low, false).wins_over(&record(5, &high, false)));
        // A delete is a record like any other: a later tombstone wins, an earlier one loses.
        assert!(record(6, &low, true).wins_over(&record(5, &high, false)));
    }

    #[test]
    fn records_round_trip_and_garbage_is_an_error() {
        let r = Record {
            value: b"hello".to_vec(),
            hlc: 42,
            origin: id("x"),
            seq: 7,
            tombstone: false,
        };
        assert_eq!(Record::decode(&r.encode()).expect("decode"), r);
        for bad in [&b""[..], &b"\x02"[..], &[1u8; 20][..]] {
            assert!(Record::decode(bad).is_err());
        }
        let mut flag = r.encode();
        flag[1] = 9;
        assert!(Record::decode(&flag).is_err());
    }

    #[tokio::test]
    async fn writes_are_indexed_by_origin_and_overwrites_leave_one_index_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        let own = id("me");
        let (memory, _writes) =
            Memory::open(&db, own.clone(), Vec::new(), Duration::from_millis(500)).expect("open");
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
    async fn lag_is_what_a_peer_wrote_that_we_do_not_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        let (memory, _writes) =
            Memory::open(&db, id("me"), Vec::new(), Duration::from_millis(500)).expect("open");
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
    async fn a_record_from_the_far_future_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        let (memory, _writes) =
            Memory::open(&db, id("me"), Vec::new(), Duration::from_millis(500)).expect("open");
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
    }
}
