//! Helpers the memory's unit tests share: node ids, records, memories on a temporary store, and
//! peers reached in-process. Test code only; nothing outside the tests may use it.

use std::{collections::BTreeMap, sync::Arc};

use mesh_domain::{BoxFuture, NodeId};

use super::{
    error::MemoryError,
    record::{Entry, Record},
    store::{Memory, MemoryOptions},
    sync::{MemoryPeers, RESYNCING, SyncBatch, SyncRequest, answer_sync},
};
use crate::storage::{SledStore, Store};

/// A node id derived from a short name.
pub(super) fn id(n: &str) -> NodeId {
    NodeId::from_spki_der(n.as_bytes())
}

/// A record by `origin` stamped `hlc`, with sequence 1 and value `v` (none for a tombstone).
pub(super) fn record(hlc: u64, origin: &NodeId, tombstone: bool) -> Record {
    Record {
        value: if tombstone { vec![] } else { b"v".to_vec() },
        hlc,
        origin: origin.clone(),
        seq: 1,
        tombstone,
    }
}

/// A memory for node `own` on a fresh sled store in a temporary directory (kept alive by the
/// returned guard).
pub(super) fn open_memory(
    own: &NodeId,
    options: MemoryOptions,
) -> (tempfile::TempDir, Arc<Memory>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
    let (memory, _writes) = Memory::open(db, own.clone(), options);
    (dir, memory)
}

/// Peers reached in-process: `addr` is the peer's id.
#[derive(Debug, Default)]
pub(super) struct InProcess(pub(super) std::sync::Mutex<BTreeMap<String, Arc<Memory>>>);

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

    fn push(&self, addr: String, entries: Vec<Entry>) -> BoxFuture<'static, Result<u64, String>> {
        let peer = self.0.lock().expect("lock").get(&addr).cloned();
        Box::pin(async move {
            let peer = peer.ok_or("no such peer")?;
            let sender = entries.first().map(|e| e.record.origin.clone());
            Ok(peer.accept_push(sender.as_ref(), &entries).2)
        })
    }
}

/// Whether `key` of namespace `notes` is a tombstone (`None` when nothing is stored there).
pub(super) fn tombstone_of(memory: &Memory, key: &str) -> Option<bool> {
    memory.get("notes", key).expect("get").map(|r| r.tombstone)
}
