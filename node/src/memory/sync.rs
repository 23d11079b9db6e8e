//! Anti-entropy between memories: the `Sync` exchange (a [`SyncRequest`] answered with
//! [`SyncBatch`]es by [`answer_sync`], pulled by [`sync_from`], or in full by [`resync_from`]
//! after a node was away too long), pushes of new writes (batched here, taken in by
//! [`Memory::accept_push`]), and [`replicate`], the loop that keeps every up peer in sync.
//! Peers are reached through the [`MemoryPeers`] port: this file must not speak protobuf or open
//! connections (`rpc::memory` implements the port over gRPC).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use mesh_domain::{BoxFuture, NodeId, sync::MutexExt};
use rand::seq::{IndexedRandom, SliceRandom};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    error::{MemoryError, PeerCallError, SyncError},
    index::index_value,
    push::{Push, PushAnswer, PushCall, PushQueues},
    record::Entry,
    store::{Memory, RESYNC},
};
use crate::{
    peers::{PeerTable, UpPeer},
    storage::Write,
};

/// Most records one `Sync` answer or `Push` carries; the rest follows in the next one.
pub const SYNC_BATCH: usize = 512;
/// Most value bytes one `Sync` answer or `Push` carries (well under the 16 MiB message limit).
pub(super) const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How long one `Sync` call may take before the pull gives up (the next one starts over from
/// the watermarks): with one pull per peer at a time, a peer that never answers must not
/// stop pulls from it for good.
const SYNC_CALL_DEADLINE: Duration = Duration::from_secs(60);

/// One `Sync` call, bounded by [`SYNC_CALL_DEADLINE`].
async fn sync_call(
    peers: &dyn MemoryPeers,
    addr: &str,
    request: SyncRequest,
) -> Result<SyncBatch, PeerCallError> {
    tokio::time::timeout(SYNC_CALL_DEADLINE, peers.sync(addr.to_owned(), request))
        .await
        .map_err(|_| PeerCallError::NoAnswer {
            seconds: SYNC_CALL_DEADLINE.as_secs(),
        })?
}

/// Most `Sync` calls one pull makes (up to [`SYNC_BATCH`] records each); a longer catch-up
/// goes on at the next pull. A peer that answers "more" for ever holds one pull, not the
/// replicator, and is pulled again only after [`PULL_GAP`].
const PULL_BATCHES: usize = 64;
/// Most `Sync` calls of a full resync (two million records), which must see everything.
const RESYNC_BATCHES: usize = 4096;

/// A `Sync` call.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncRequest {
    /// The caller (when known).
    pub node: Option<NodeId>,
    /// Per origin, the last sequence the caller has from the answering node.
    pub after: BTreeMap<NodeId, u64>,
    /// The caller's [`Memory::frontier`].
    pub frontier: BTreeMap<NodeId, u64>,
}

/// A batch a peer answered `Sync` with.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncBatch {
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
    /// The certificates (DER) of the records' origins, one per origin
    /// ([`Memory::certificates_for`]).
    pub certificates: Vec<Vec<u8>>,
}

/// How the replicator reaches peers (implemented over gRPC in `rpc::memory`).
pub(crate) trait MemoryPeers: Send + Sync + fmt::Debug {
    /// Asks the peer at `addr` for records after the given per-origin watermarks.
    fn sync(
        &self,
        addr: String,
        request: SyncRequest,
    ) -> BoxFuture<'static, Result<SyncBatch, PeerCallError>>;
    /// Sends our new records, with our certificate, to the peer at `addr`; answers the peer's
    /// frontier for our writes, and which records it refused.
    fn push(
        &self,
        addr: String,
        entries: Vec<Entry>,
        certificates: Vec<Vec<u8>>,
    ) -> BoxFuture<'static, Result<PushAnswer, PeerCallError>>;
}

/// Answers a peer's `Sync`: for each origin we hold, the records after the peer's watermark.
/// Refused while this node is [`Memory::stale`]: its old records might bring back deletes.
pub(crate) fn answer_sync(
    memory: &Memory,
    request: &SyncRequest,
) -> Result<SyncBatch, MemoryError> {
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
    // Likewise the frontier: every write it covers is visible to the walk, so a resyncing
    // caller never takes a record that landed during the walk for one collected meanwhile.
    let frontier = memory.frontier();
    let mut batch = SyncBatch::default();
    let mut bytes = 0;
    for (origin, _) in memory.origins()? {
        let from = after.get(&origin).copied().unwrap_or(0);
        let room = SYNC_BATCH - batch.entries.len();
        let entries = memory.since(&origin, from, room + 1)?;
        let complete = entries.len() <= room;
        for entry in entries.into_iter().take(room) {
            // Never relay what cannot be proven: an unsigned record (stored before signatures)
            // would be refused by the caller. The upgrade takes them out of the index, so this
            // only guards against a store that was upgraded halfway.
            if entry.record.signature.is_empty() {
                continue;
            }
            // Per origin the records go oldest first, so stopping anywhere keeps the
            // caller's watermark honest: it resumes right after the last record it got.
            if bytes + entry.record.value.len() > BATCH_BYTES && !batch.entries.is_empty() {
                batch.more = true;
                batch.certificates = memory.certificates_for(&batch.entries);
                note_offered(memory, request, &batch)?;
                return Ok(batch);
            }
            bytes += entry.record.value.len() + entry.key.len();
            batch.entries.push(entry);
        }
        if !complete {
            batch.more = true;
            batch.certificates = memory.certificates_for(&batch.entries);
            note_offered(memory, request, &batch)?;
            return Ok(batch);
        }
    }
    batch.certificates = memory.certificates_for(&batch.entries);
    batch.heads = heads;
    batch.frontier = frontier;
    batch.known = memory.known();
    note_offered(memory, request, &batch)?;
    Ok(batch)
}

/// Records how far the caller was given this node's own writes: the last batch's head (every
/// own write up to it was visible to the walk), or the highest own record in a batch before.
fn note_offered(
    memory: &Memory,
    request: &SyncRequest,
    batch: &SyncBatch,
) -> Result<(), MemoryError> {
    let Some(caller) = &request.node else {
        return Ok(());
    };
    let own = memory.own_id();
    let sent = batch
        .entries
        .iter()
        .filter(|e| &e.record.origin == own)
        .map(|e| e.record.seq)
        .chain(batch.heads.get(own).copied())
        .max()
        .unwrap_or(0);
    memory.note_offered(caller, sent)
}

impl Memory {
    /// Applies a peer's push of its own writes, each verified against the certificates that
    /// came with it. A write that follows the last one we hold from the sender advances our
    /// watermark for it, so the sender learns at once (from the returned frontier) that we hold
    /// it.
    pub fn accept_push(
        &self,
        sender: Option<&NodeId>,
        entries: &[Entry],
        certificates: &[Vec<u8>],
    ) -> (u32, Vec<String>, u64) {
        let mut applied = 0;
        let mut refused = Vec::new();
        for (entry, result) in entries
            .iter()
            .zip(self.apply_from(sender, entries, certificates))
        {
            // A record a writer rule refused still follows the sender's last write: held.
            let received = match &result {
                Ok(stored) => Ok(*stored),
                Err(e) if e.counts_as_received() => {
                    refused.push(format!("{}/{}: {e}", entry.namespace, entry.key));
                    Ok(false)
                }
                Err(e) => Err(e),
            };
            match received {
                Ok(stored) => {
                    applied += u32::from(stored);
                    if let Some(sender) = sender
                        && &entry.record.origin == sender
                        && self.watermark(sender, sender).checked_add(1) == Some(entry.record.seq)
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
}

/// Pulls everything `peer` has that we lack, batch by batch, and advances our watermarks.
pub(crate) async fn sync_from(
    memory: &Memory,
    peers: &dyn MemoryPeers,
    peer: &NodeId,
    addr: &str,
) -> Result<usize, SyncError> {
    pull_origins(memory, peers, peer, addr, &[]).await
}

/// [`sync_from`], asking `peer` again for every record of `origins` it holds, whatever this
/// node's watermarks for it say. A peer may have taken an origin's records out of order (one
/// pushed straight to it before those written just before it, as a durable task's confirmed
/// step is) after this node's watermark for that peer passed them: the one who resumes the task
/// must have them all. Watermarks never go back.
pub(crate) async fn pull_origins(
    memory: &Memory,
    peers: &dyn MemoryPeers,
    peer: &NodeId,
    addr: &str,
    origins: &[NodeId],
) -> Result<usize, SyncError> {
    let mut applied = 0;
    // What this pull asks for next: past every record received, refused ones included, so a
    // peer that keeps sending a refused record cannot hold the pull in a loop. The stored
    // watermarks stay below a refused record (see below).
    let mut after = memory.watermarks(peer);
    for origin in origins {
        after.insert(origin.clone(), 0);
    }
    // Origins with a refused record in this pull: their stored watermark stays below it.
    let mut refused: HashSet<NodeId> = HashSet::new();
    for _ in 0..PULL_BATCHES {
        let request = SyncRequest {
            node: Some(memory.own_id().clone()),
            after: after.clone(),
            frontier: memory.frontier(),
        };
        let batch = sync_call(peers, addr, request).await?;
        let before = after.clone();
        let mut highest: BTreeMap<NodeId, u64> = BTreeMap::new();
        let results = memory.apply_from(Some(peer), &batch.entries, &batch.certificates);
        for (entry, result) in batch.entries.iter().zip(results) {
            let next = after.entry(entry.record.origin.clone()).or_default();
            *next = (*next).max(entry.record.seq);
            match result {
                Ok(true) => applied += 1,
                Ok(false) => {}
                // Refused by a writer rule: its origin wrote it, and no copy will pass.
                Err(e) if e.counts_as_received() => {}
                // Refused (logged where it was refused: a stamp too far ahead, or a signature
                // that does not verify): keep the watermark below it, so the record is fetched
                // again at the next sync (once the clocks agree), and a genuine copy relayed
                // by this peer later is not skipped. Others relay the genuine record meanwhile.
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
            if seq > memory.watermark(peer, &origin) {
                memory.set_watermark(peer, &origin, seq)?;
            }
        }
        memory.flush().await?;
        if !batch.more || batch.entries.is_empty() {
            for (origin, head) in &batch.heads {
                if !refused.contains(origin) && *head > memory.watermark(peer, origin) {
                    memory.set_watermark(peer, origin, *head)?;
                }
            }
            memory
                .note_peer(peer, &batch.frontier)
                .and_then(|()| memory.merge_known(&batch.known))
                .and_then(|()| memory.touch_contact())?;
            memory
                .synced_at
                .lock_unpoisoned()
                .insert(peer.clone(), std::time::Instant::now());
            return Ok(applied);
        }
        if after == before {
            return Err(SyncError::Stuck);
        }
    }
    // A long catch-up goes on at the next pull, from the watermarks stored so far.
    Ok(applied)
}

/// The full resync of a node that was out of touch longer than the tombstone window: pulls
/// everything `peer` holds, then drops each record the peer has seen but no longer holds (its
/// delete was collected meanwhile). Returns (records applied, records dropped).
pub(super) async fn resync_from(
    memory: &Memory,
    peers: &dyn MemoryPeers,
    peer: &NodeId,
    addr: &str,
) -> Result<(usize, usize), SyncError> {
    memory.store.drop_tree(RESYNC).map_err(MemoryError::from)?;
    let mut after: BTreeMap<NodeId, u64> = BTreeMap::new();
    // As in `sync_from`: no watermark is stored past a refused record.
    let mut refused: HashSet<NodeId> = HashSet::new();
    let mut applied = 0;
    let mut batches = 0;
    let batch = loop {
        batches += 1;
        if batches > RESYNC_BATCHES {
            return Err(SyncError::TooLong {
                batches: RESYNC_BATCHES,
            });
        }
        let request = SyncRequest {
            node: Some(memory.own_id().clone()),
            after: after.clone(),
            frontier: memory.frontier(),
        };
        let batch = sync_call(peers, addr, request).await?;
        let results = memory.apply_from(Some(peer), &batch.entries, &batch.certificates);
        applied += results.iter().filter(|r| matches!(r, Ok(true))).count();
        for (entry, result) in batch.entries.iter().zip(&results) {
            if result.as_ref().is_err_and(|e| !e.counts_as_received()) {
                refused.insert(entry.record.origin.clone());
            }
        }
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
            .map_err(MemoryError::from)?;
        let before = after.clone();
        for entry in &batch.entries {
            let seen = after.entry(entry.record.origin.clone()).or_default();
            *seen = (*seen).max(entry.record.seq);
        }
        if !batch.more || batch.entries.is_empty() {
            break batch;
        }
        if after == before {
            return Err(SyncError::Stuck);
        }
    };
    let dropped = memory.drop_collected(peer, &batch.frontier)?;
    for (origin, seq) in after.iter().chain(&batch.heads) {
        if !refused.contains(origin) {
            memory.set_watermark(peer, origin, *seq)?;
        }
    }
    memory
        .note_peer(peer, &batch.frontier)
        .and_then(|()| memory.merge_known(&batch.known))
        .and_then(|()| memory.touch_contact())?;
    memory.flush().await?;
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

/// How often a node that lacks writes some peer advertises pulls from one more random peer.
const LAG_PULL_EVERY: Duration = Duration::from_secs(1);

/// Pulls from `peer` in a task of its own; the claim `pull` ends with it.
fn spawn_pull(memory: &Arc<Memory>, link: &Arc<dyn MemoryPeers>, pull: Pull, peer: UpPeer) {
    let (memory, link) = (memory.clone(), link.clone());
    tokio::spawn(async move {
        let _pull = pull;
        match sync_from(&memory, link.as_ref(), &peer.id, &peer.addr).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(peer = %peer.name, records = n, "memory synced"),
            Err(e) => tracing::debug!(peer = %peer.name, error = %e, "sync memory"),
        }
    });
}

/// How soon after a pull from a peer ended the next one from it may start: a peer that
/// advertises writes it never sends (a `memory_seq` of `u64::MAX`), or whose pulls keep
/// failing, counts as lagging at every tick, and would otherwise be pulled every 500 ms.
const PULL_GAP: Duration = Duration::from_secs(2);

/// The peers a pull is running from, and when the last pull from each ended. The replicator
/// starts no second pull from a peer while one runs: a node that has never finished a sync with
/// a peer counts as lagging at every tick, so a pull slower than the tick (a large catch-up,
/// records being verified on a busy machine) was started again every 500 ms, each fetching and
/// checking the same records. Nor does it start one within [`PULL_GAP`] of the last.
#[derive(Debug, Clone, Default)]
struct Pulls(Arc<std::sync::Mutex<PullTimes>>);

/// What [`Pulls`] keeps.
#[derive(Debug, Default)]
struct PullTimes {
    /// Peers a pull from is running.
    running: HashSet<NodeId>,
    /// When the last pull from each peer ended.
    ended: HashMap<NodeId, tokio::time::Instant>,
}

/// A running pull from one peer; the peer is free for the next pull when it drops.
#[derive(Debug)]
struct Pull {
    pulls: Pulls,
    peer: NodeId,
}

impl Pulls {
    /// Claims `peer` for a pull, unless one from it is running or ended within [`PULL_GAP`].
    fn start(&self, peer: &NodeId) -> Option<Pull> {
        let mut times = self.0.lock_unpoisoned();
        let recent = times
            .ended
            .get(peer)
            .is_some_and(|at| at.elapsed() < PULL_GAP);
        (!recent && times.running.insert(peer.clone())).then(|| Pull {
            pulls: self.clone(),
            peer: peer.clone(),
        })
    }

    /// Forgets the end times of peers that are no longer up.
    fn retain(&self, up: &HashSet<NodeId>) {
        self.0
            .lock_unpoisoned()
            .ended
            .retain(|id, _| up.contains(id));
    }
}

impl Drop for Pull {
    fn drop(&mut self) {
        let mut times = self.pulls.0.lock_unpoisoned();
        times.running.remove(&self.peer);
        times
            .ended
            .insert(self.peer.clone(), tokio::time::Instant::now());
    }
}

/// Keeps the memory in sync with the up peers at a cost that does not grow with the fleet: a
/// batch of local writes is pushed at once to `fanout` random up peers; every sync interval
/// (when tombstones are also collected) `fanout` random up peers are pulled from; a peer is
/// pulled from when it comes up or a push to it failed; and while a peer advertises writes
/// this node lacks (its `memory_seq`), one random up peer is pulled from every
/// [`LAG_PULL_EVERY`], so the writes spread from whoever holds them like gossip and the
/// writer answers about as many pulls as any other node. One pull per peer at a time. A node
/// out of touch longer than the tombstone window first resyncs fully from one peer.
pub(crate) async fn replicate(
    memory: Arc<Memory>,
    peers: Arc<PeerTable>,
    link: Arc<dyn MemoryPeers>,
    writes: &mut mpsc::UnboundedReceiver<Entry>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut was_up: HashSet<NodeId> = HashSet::new();
    let mut last_full = tokio::time::Instant::now();
    let mut last_lag_pull: Option<tokio::time::Instant> = None;
    // Per peer, the `memory_seq` of it we were last seen to hold all of.
    let mut caught_up: HashMap<NodeId, u64> = HashMap::new();
    let mut rng = rand::make_rng::<rand::rngs::StdRng>();
    let pulls = Pulls::default();
    let push_call: PushCall = {
        let link = link.clone();
        Arc::new(move |addr, entries, certificates| link.push(addr, entries, certificates))
    };
    let mut pushes = PushQueues::new(memory.clone(), push_call, cancel.clone());
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            Some(entry) = writes.recv() => {
                let mut pending = vec![entry];
                while let Ok(more) = writes.try_recv() {
                    pending.push(more);
                }
                let up = peers.up_peers();
                for batch in push_batches(pending) {
                    let push = Arc::new(Push {
                        certificates: memory.certificates_for(&batch),
                        entries: batch,
                    });
                    for peer in up.sample(&mut rng, memory.fanout) {
                        pushes.offer(&peer.id, &peer.name, &peer.addr, &push);
                    }
                }
            }
            _ = tick.tick() => {
                let up = peers.up_peers();
                let now_up: HashSet<NodeId> = up.iter().map(|p| p.id.clone()).collect();
                if memory.stale() {
                    // Nothing else until one peer has brought us back: our old records may be
                    // deletes we missed.
                    let mut all_away = !up.is_empty();
                    for peer in &up {
                        // One sync per peer at a time, resyncs included, at most every
                        // `PULL_GAP`: a pull started before this node went stale may still run.
                        let Some(_pull) = pulls.start(&peer.id) else {
                            all_away = false;
                            continue;
                        };
                        match resync_from(&memory, link.as_ref(), &peer.id, &peer.addr).await {
                            Ok((applied, dropped)) => {
                                tracing::warn!(
                                    peer = %peer.name, applied, dropped,
                                    "resynced memory after being out of touch longer than the tombstone window"
                                );
                                all_away = false;
                                break;
                            }
                            Err(e) => {
                                all_away &= matches!(e, SyncError::Peer(PeerCallError::Resyncing));
                                tracing::warn!(peer = %peer.name, error = %e, "resync memory");
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
                pushes.retain(&now_up);
                pulls.retain(&now_up);
                let behind = pushes.take_behind();
                // Newly up peers, and peers a push could not reach; every interval, `fanout`
                // random ones.
                let mut due: Vec<&UpPeer> = up
                    .iter()
                    .filter(|p| behind.contains(&p.id) || !was_up.contains(&p.id))
                    .collect();
                if full {
                    due.extend(up.sample(&mut rng, memory.fanout));
                }
                for peer in due {
                    if let Some(pull) = pulls.start(&peer.id) {
                        spawn_pull(&memory, &link, pull, peer.clone());
                    }
                }
                // Writes a peer advertises that we lack (pushes go to a few peers; pushes can
                // be lost): one random up peer free for a pull, the writer among them.
                caught_up.retain(|id, _| now_up.contains(id));
                let lagging = up.iter().any(|p| {
                    // Once we hold a peer's writes up to a sequence, we always will: no need
                    // to look in the store again until its sequence rises.
                    if caught_up.get(&p.id).is_some_and(|seq| *seq >= p.memory_seq) {
                        return false;
                    }
                    let behind = memory.lag(&p.id, p.memory_seq).0 > 0;
                    if !behind {
                        caught_up.insert(p.id.clone(), p.memory_seq);
                    }
                    behind
                });
                if lagging && last_lag_pull.is_none_or(|at| at.elapsed() >= LAG_PULL_EVERY) {
                    let mut order: Vec<&UpPeer> = up.iter().collect();
                    order.shuffle(&mut rng);
                    if let Some((peer, pull)) = order
                        .into_iter()
                        .find_map(|p| pulls.start(&p.id).map(|pull| (p, pull)))
                    {
                        last_lag_pull = Some(tokio::time::Instant::now());
                        spawn_pull(&memory, &link, pull, peer.clone());
                    }
                }
                was_up = now_up;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::{keys::MAX_VALUE, time::now_ms};

    use super::*;
    use crate::memory::{
        frontier::{CONTACT_KEY, seen_key},
        record::Record,
        store::{META, MemoryOptions},
        test_support::{
            CannedPeer, InProcess, age_contact, certificate, id, open_memory, record, signed,
            tombstone_of,
        },
    };

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

    /// How a [`Fake`] peer answers `Sync`.
    #[derive(Debug, Default, Clone, Copy)]
    enum Answer {
        /// After 3 s, with nothing.
        #[default]
        Slow,
        /// At once, with an error.
        Fail,
        /// At once: the peer is resyncing too.
        Resyncing,
        /// After 100 ms, with "more" and one record of a new made-up origin, for ever.
        Endless,
    }

    /// How many calls of one kind a [`Fake`] peer got, and how many ran at once at most.
    #[derive(Debug, Default)]
    struct Calls {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        total: std::sync::atomic::AtomicUsize,
    }

    impl Calls {
        /// Counts a call for as long as the returned guard lives.
        fn enter(self: &Arc<Self>) -> impl Drop {
            use std::sync::atomic::Ordering::SeqCst;
            self.total.fetch_add(1, SeqCst);
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            struct Leave(Arc<Calls>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.running.fetch_sub(1, SeqCst);
                }
            }
            Leave(self.clone())
        }

        fn most(&self) -> usize {
            self.most.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn total(&self) -> usize {
            self.total.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// A peer that answers `Sync` as told and takes a minute to answer each push, counting
    /// the calls; pulls started are the `Sync` calls that ask from the start.
    #[derive(Debug, Default)]
    struct Fake {
        answer: Answer,
        syncs: Arc<Calls>,
        pushes: Arc<Calls>,
        pulls: std::sync::atomic::AtomicUsize,
        next_seq: std::sync::atomic::AtomicU64,
    }

    impl MemoryPeers for Arc<Fake> {
        fn sync(
            &self,
            _: String,
            request: SyncRequest,
        ) -> BoxFuture<'static, Result<SyncBatch, PeerCallError>> {
            use std::sync::atomic::Ordering::SeqCst;
            let this = self.clone();
            Box::pin(async move {
                let _call = this.syncs.enter();
                if request.after.is_empty() {
                    this.pulls.fetch_add(1, SeqCst);
                }
                match this.answer {
                    Answer::Slow => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        Ok(SyncBatch::default())
                    }
                    Answer::Fail => Err(PeerCallError::Refused("refused".into())),
                    Answer::Resyncing => Err(PeerCallError::Resyncing),
                    Answer::Endless => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let seq = this.next_seq.fetch_add(1, SeqCst) + 1;
                        let origin = NodeId::parse(&format!("{seq:064x}")).expect("an id");
                        Ok(SyncBatch {
                            entries: vec![Entry {
                                namespace: "notes".into(),
                                key: format!("k{seq}"),
                                record: Record {
                                    seq,
                                    ..record(now_ms(), &origin, false)
                                },
                            }],
                            more: true,
                            ..SyncBatch::default()
                        })
                    }
                }
            })
        }

        fn push(
            &self,
            _: String,
            _: Vec<Entry>,
            _: Vec<Vec<u8>>,
        ) -> BoxFuture<'static, Result<PushAnswer, PeerCallError>> {
            let this = self.clone();
            Box::pin(async move {
                let _call = this.pushes.enter();
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(PushAnswer::default())
            })
        }
    }

    /// Lets paused time run (10 ms a step, at most 10 s) until `fake` saw `n` pulls start.
    async fn pulls_started(fake: &Fake, n: usize) {
        let started = || fake.pulls.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..1_000 {
            if started() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(started(), n, "pulls started");
    }

    /// Runs the replicator of a fresh node `me` for `run` (paused time) with one up peer that
    /// advertises `memory_seq` and answers as `fake` does, after `writes` local writes.
    async fn replicate_against(
        me: &str,
        fake: &Arc<Fake>,
        memory_seq: u64,
        writes: usize,
        run: Duration,
    ) {
        let (_dir, memory) = open_memory(&id(me), MemoryOptions::default());
        replicate_memory(&memory, fake, memory_seq, writes, run).await;
    }

    /// [`replicate_against`] with a memory of the test's own.
    async fn replicate_memory(
        memory: &Arc<Memory>,
        fake: &Arc<Fake>,
        memory_seq: u64,
        writes: usize,
        run: Duration,
    ) {
        let me = memory.own_id().to_string();
        let peer = id(&format!("{me}-peer"));
        let mut info = crate::capabilities::test_support::test_capabilities().snapshot();
        info.id = peer.clone();
        info.name = "peer".into();
        info.memory_seq = memory_seq;
        let table = Arc::new(PeerTable::default());
        table
            .beat(info, "peer:7700", crate::discovery::PeerSource::Static)
            .expect("the name is free");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let (replicated, stop) = (memory.clone(), cancel.clone());
        let link = Arc::new(fake.clone());
        let replicator = tokio::spawn(async move {
            replicate(replicated, table, link, &mut rx, stop).await;
        });
        // The replicator sees the peer up (and starts its first pull) before the writes.
        pulls_started(fake, 1).await;
        for i in 0..writes {
            let record = Record {
                seq: i as u64 + 1,
                ..record(now_ms(), memory.own_id(), false)
            };
            let entry = Entry {
                namespace: "notes".into(),
                key: format!("w{i}"),
                record,
            };
            tx.send(entry).expect("replicator listening");
            // One batch each: the replicator takes what is queued at once as one.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(run).await;
        cancel.cancel();
        replicator.await.expect("replicator");
    }

    /// Issue 17: a batch of writes goes to `fanout` random up peers, not to every one, so the
    /// writer's work per write does not grow with the fleet (the rest pull it).
    #[tokio::test(start_paused = true)]
    async fn a_write_is_pushed_to_fanout_peers_not_to_every_up_peer() {
        let options = MemoryOptions {
            fanout: 3,
            ..MemoryOptions::default()
        };
        let (_dir, memory) = open_memory(&id("writer"), options);
        let table = Arc::new(PeerTable::default());
        for n in 0..10 {
            let mut info = crate::capabilities::test_support::test_capabilities().snapshot();
            info.id = id(&format!("peer{n}"));
            info.name = format!("peer{n}");
            table
                .beat(
                    info,
                    &format!("peer{n}:7700"),
                    crate::discovery::PeerSource::Static,
                )
                .expect("the name is free");
        }
        let fake = Arc::new(Fake::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let (replicated, stop, link) = (memory.clone(), cancel.clone(), Arc::new(fake.clone()));
        let replicator = tokio::spawn(async move {
            replicate(replicated, table, link, &mut rx, stop).await;
        });
        // Every peer is new, so each is pulled from once; then the write.
        pulls_started(&fake, 10).await;
        let record = Record {
            seq: 1,
            ..record(now_ms(), memory.own_id(), false)
        };
        tx.send(Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record,
        })
        .expect("replicator listening");
        // Each push takes a minute here: after a second, the pushes under way are all there
        // were.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(fake.pushes.total(), 3, "pushed to `fanout` peers");
        cancel.cancel();
        replicator.await.expect("replicator");
    }

    /// Regression: a peer this node never finished a sync with counts as lagging at every
    /// 500 ms tick, so a pull slower than that was started again and again, each fetching (and
    /// verifying) the same records; on a busy machine, converging after a partition took 5-11 s
    /// instead of 2.
    #[tokio::test(start_paused = true)]
    async fn no_second_pull_from_a_peer_starts_while_one_runs() {
        let fake = Arc::new(Fake::default());
        // Ten ticks: the first pull is still running for the first six of them.
        replicate_against("slow", &fake, 100, 0, Duration::from_millis(4400)).await;
        assert_eq!(fake.syncs.most(), 1, "pulls at once");
        // Once it ended the peer was synced, so nothing was due any more.
        assert_eq!(fake.syncs.total(), 1);
    }

    /// Regression: a peer advertising writes it never sends (`memory_seq = u64::MAX`) whose
    /// pulls fail counted as lagging at every 500 ms tick and was pulled at every one.
    #[tokio::test(start_paused = true)]
    async fn a_peer_advertising_endless_writes_whose_pulls_fail_is_pulled_at_most_every_gap() {
        let fake = Arc::new(Fake {
            answer: Answer::Fail,
            ..Fake::default()
        });
        replicate_against("gap", &fake, u64::MAX, 0, Duration::from_secs(20)).await;
        let (most, total) = (fake.syncs.most(), fake.syncs.total());
        assert_eq!(most, 1);
        // 20.6 s at one pull per 2 s.
        assert!((10..=11).contains(&total), "{total} pulls");
    }

    /// A node back from a long absence resyncs from a peer at most every 2 s, as it pulls: a
    /// peer that refuses every resync is not asked again at every tick.
    #[tokio::test(start_paused = true)]
    async fn a_stale_node_resyncs_from_a_failing_peer_at_most_every_gap() {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(3600),
            ..MemoryOptions::default()
        };
        let (_dir, memory) = open_memory(&id("stale"), options);
        age_contact(&memory);
        assert!(memory.stale());
        let fake = Arc::new(Fake {
            answer: Answer::Fail,
            ..Fake::default()
        });
        replicate_memory(&memory, &fake, 0, 0, Duration::from_secs(20)).await;
        let total = fake.syncs.total();
        assert!((10..=11).contains(&total), "{total} resyncs");
        assert!(memory.stale(), "no peer brought it back");
    }

    /// When every reachable peer answers that it is resyncing too, the fleet was away together
    /// and nobody collected deletes: the stale node goes on as usual; any other failure (the
    /// test above) keeps it stale.
    #[tokio::test(start_paused = true)]
    async fn a_stale_node_whose_every_peer_is_resyncing_too_resumes() {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(3600),
            ..MemoryOptions::default()
        };
        let (_dir, memory) = open_memory(&id("stale"), options);
        age_contact(&memory);
        assert!(memory.stale());
        let fake = Arc::new(Fake {
            answer: Answer::Resyncing,
            ..Fake::default()
        });
        replicate_memory(&memory, &fake, 0, 0, Duration::from_secs(5)).await;
        assert!(fake.syncs.total() >= 1, "the peer was asked");
        assert!(!memory.stale(), "the whole fleet was away together");
    }

    /// Regression: a pull went on as long as the peer answered "more", so a peer whose answers
    /// never end held it for ever, growing its per-origin map with every made-up origin.
    #[tokio::test(start_paused = true)]
    async fn a_sync_answer_that_never_ends_ends_the_pull_after_a_bounded_number_of_batches() {
        let fake = Arc::new(Fake {
            answer: Answer::Endless,
            ..Fake::default()
        });
        replicate_against("endless", &fake, u64::MAX, 0, Duration::from_secs(30)).await;
        assert_eq!(fake.syncs.most(), 1, "one call at a time");
        // Each pull: 64 calls of 100 ms, then 2 s before the next.
        let pulls = fake.pulls.load(std::sync::atomic::Ordering::SeqCst);
        assert!((3..=4).contains(&pulls), "{pulls} pulls");
    }

    /// Regression: every batch of writes spawned one push per up peer, so a peer that never
    /// answers gathered a task (and a copy of the batch) per write.
    #[tokio::test(start_paused = true)]
    async fn pushes_to_a_peer_that_never_answers_wait_in_one_bounded_queue_and_mark_it_behind() {
        let fake = Arc::new(Fake::default());
        replicate_against("stuck", &fake, 0, 200, Duration::from_secs(15)).await;
        assert_eq!(fake.pushes.most(), 1, "one push in flight");
        // The first push timed out after 10 s; the next one is on its way.
        assert_eq!(fake.pushes.total(), 2);
        // The first pull when it came up, and one when its queue overflowed.
        assert_eq!(fake.pulls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// Regression: a push that followed a watermark of `u64::MAX` (the peer's heads claimed it)
    /// overflowed `watermark + 1`: a panic in a debug build.
    #[tokio::test]
    async fn a_push_after_an_absurd_watermark_is_applied_without_overflow() {
        let (me, sender) = (id("wm-me"), id("wm-sender"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let liar = CannedPeer::new(SyncBatch {
            heads: BTreeMap::from([(sender.clone(), u64::MAX)]),
            ..SyncBatch::default()
        });
        sync_from(&memory, &liar, &sender, "liar")
            .await
            .expect("sync");
        assert_eq!(memory.watermark(&sender, &sender), u64::MAX);
        let write = signed(Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: record(uhlc::system_time_clock().as_u64(), &sender, false),
        });
        let (applied, refused, _) =
            memory.accept_push(Some(&sender), &[write], &certificate(&sender));
        assert_eq!((applied, refused.len()), (1, 0));
    }

    #[tokio::test]
    async fn a_push_advances_the_frontier_only_when_it_follows_what_is_held() {
        let (me, sender) = (id("me"), id("sender"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let now = uhlc::system_time_clock().as_u64();
        let write = |seq: u64, key: &str| {
            signed(Entry {
                namespace: "notes".into(),
                key: key.into(),
                record: Record {
                    seq,
                    ..record(now + seq, &sender, false)
                },
            })
        };
        let certs = certificate(&sender);
        let push = |from: &NodeId, entry: Entry| memory.accept_push(Some(from), &[entry], &certs);
        assert_eq!(push(&sender, write(1, "a")).2, 1);
        // 3 arrives before 2 (a lost push): the frontier waits for a sync to fill the gap.
        assert_eq!(push(&sender, write(3, "c")).2, 1);
        assert_eq!(push(&sender, write(2, "b")).2, 2);
        // Someone else's writes never move the sender's frontier.
        let (applied, refused, held) = push(&me, write(4, "d"));
        assert_eq!((applied, refused.len(), held), (1, 0, 0));
        assert_eq!(memory.frontier()[&sender], 2);
    }

    /// Regression: a resync dropped every record the peer's frontier covered and the peer did
    /// not hold, its own writes included, so a peer claiming to hold all of this node's writes
    /// (`u64::MAX`) while holding none made a node back from a long absence delete what it had
    /// written meanwhile, which no one had ever seen.
    #[tokio::test]
    async fn a_resync_drops_none_of_this_nodes_writes_the_peer_was_never_given() {
        let options = MemoryOptions {
            tombstone_window: Duration::from_secs(3600),
            ..MemoryOptions::default()
        };
        let (me, peer) = (id("resync-me"), id("resync-liar"));
        let (_dir, memory) = open_memory(&me, options);
        memory
            .put("notes", "given", Some(b"v".to_vec()))
            .await
            .expect("put");
        // The peer pulls it (and so may have seen it deleted and collected since).
        let answer = answer_sync(
            &memory,
            &SyncRequest {
                node: Some(peer.clone()),
                ..SyncRequest::default()
            },
        )
        .expect("answer");
        assert_eq!(answer.entries.len(), 1);
        memory
            .put("notes", "news", Some(b"n".to_vec()))
            .await
            .expect("put");
        age_contact(&memory);
        assert!(memory.stale());
        let liar = CannedPeer::new(SyncBatch {
            frontier: BTreeMap::from([(me.clone(), u64::MAX)]),
            ..SyncBatch::default()
        });
        let (_, dropped) = resync_from(&memory, &liar, &peer, "liar")
            .await
            .expect("resync");
        assert_eq!(tombstone_of(&memory, "news"), Some(false), "never given");
        assert_eq!(
            tombstone_of(&memory, "given"),
            None,
            "given, and gone there"
        );
        assert_eq!(dropped, 1);
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
}
