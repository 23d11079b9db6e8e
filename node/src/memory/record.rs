//! The record: a value or a delete with its HLC stamp, writer and write sequence; the pure
//! last-writer-wins rule that decides between two records of one place; and the bytes a record
//! is stored as. Pure data in, data out: it must not touch the store, the clock or the network.

use mesh_domain::NodeId;

use super::error::MemoryError;

/// One stored record: a value or a delete, stamped for last-writer-wins.
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
    /// Whether this record is a delete (a tombstone), kept so the delete wins over older values.
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
    /// The namespace the record lives in.
    pub namespace: String,
    /// The key within the namespace.
    pub key: String,
    /// The record stored there.
    pub record: Record,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{id, record};

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
}
