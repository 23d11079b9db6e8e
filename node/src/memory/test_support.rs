//! Helpers the memory's unit tests share: node ids, records and memories on a temporary store,
//! and peers reached in-process. Test code only; nothing outside the tests may use it.

use mesh_domain::NodeId;

use super::record::Record;

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
