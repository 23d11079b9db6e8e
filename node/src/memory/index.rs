//! The memory's index: every stored record by `(origin, seq)` ([`INDEX`]), its tombstones
//! ([`TOMBS`]), and the keys and places they hold, which sync, collection and signature
//! checks read as well as the store.

use mesh_domain::NodeId;

use super::record::Record;
use crate::storage::Write;

/// `(origin, seq)` → `ns\0key` of the one record that has it.
pub(super) const INDEX: &str = "mem_index";
/// The tombstones among [`INDEX`], for collection.
pub(super) const TOMBS: &str = "mem_tombs";

/// The `(origin, seq)` of an [`INDEX`] or [`TOMBS`] key.
pub(super) fn split_index_key(key: &[u8]) -> Option<(NodeId, u64)> {
    if key.len() != NodeId::HEX_LEN + 8 {
        return None;
    }
    let origin = NodeId::parse(std::str::from_utf8(&key[..NodeId::HEX_LEN]).ok()?).ok()?;
    let seq = u64::from_be_bytes(key[NodeId::HEX_LEN..].try_into().ok()?);
    Some((origin, seq))
}

/// Removes `old`'s index (and tombstone) entries.
pub(super) fn unindex(writes: &mut Vec<Write>, old: &Record) {
    if old.seq > 0 {
        writes.push(Write::Delete(INDEX.into(), index_key(&old.origin, old.seq)));
        if old.tombstone {
            writes.push(Write::Delete(TOMBS.into(), index_key(&old.origin, old.seq)));
        }
    }
}

/// Indexes `record`, stored under `ns`/`key`.
pub(super) fn reindex(writes: &mut Vec<Write>, ns: &str, key: &str, record: &Record) {
    let at = index_key(&record.origin, record.seq);
    if record.tombstone {
        writes.push(Write::Put(TOMBS.into(), at.clone(), index_value(ns, key)));
    }
    writes.push(Write::Put(INDEX.into(), at, index_value(ns, key)));
}

pub(super) fn index_key(origin: &NodeId, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(NodeId::HEX_LEN + 8);
    key.extend_from_slice(origin.as_str().as_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// A place (`ns\0key`), as the index and the resync tree (`mem_resync`) hold it.
pub(super) fn index_value(ns: &str, key: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(ns.len() + 1 + key.len());
    value.extend_from_slice(ns.as_bytes());
    value.push(0);
    value.extend_from_slice(key.as_bytes());
    value
}

/// The namespace and key of a place written by [`index_value`].
pub(super) fn split_index_value(value: &[u8]) -> Option<(String, String)> {
    let split = value.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8(value[..split].to_vec()).ok()?,
        String::from_utf8(value[split + 1..].to_vec()).ok()?,
    ))
}
