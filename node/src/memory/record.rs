//! The record: a value or a delete with its HLC stamp, writer, write sequence and the writer's
//! signature; the pure last-writer-wins rule that decides between two records of one place; the
//! bytes a record is stored as; and the bytes its writer signs ([`Entry::signed_bytes`]). Pure
//! data in, data out: it must not touch the store, the clock, keys or the network.

use mesh_domain::NodeId;
use sha2::{Digest, Sha256};

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
    /// The origin's signature over [`Entry::signed_bytes`]; empty for a record stored before
    /// records were signed (served locally, never relayed).
    pub signature: Vec<u8>,
}

/// The storage encoding's version: 2 carries the signature; 1 (before signatures) still decodes.
const VERSION: u8 = 2;
/// Largest signature stored (Ed25519: 64 bytes; ECDSA P-256 in ASN.1: at most 72).
pub(crate) const MAX_SIGNATURE: usize = 255;
/// What a record's signed bytes start with: says what they are and in which layout, so a
/// signature over a record can never be taken for one over anything else.
const SIGNED_PREFIX: &[u8] = b"agentmesh memory record v1\0";

impl Record {
    /// Last-writer-wins: the greater (timestamp, origin id) wins, identically everywhere.
    pub fn wins_over(&self, other: &Record) -> bool {
        (self.hlc, &self.origin) > (other.hlc, &other.origin)
    }

    /// Whether this record replaces `other` at its place: it wins, or it is the signed copy of
    /// the same write (same stamp and origin) that is stored unsigned from before signatures.
    pub fn supersedes(&self, other: &Record) -> bool {
        self.wins_over(other)
            || (other.signature.is_empty()
                && !self.signature.is_empty()
                && (self.hlc, &self.origin) == (other.hlc, &other.origin))
    }

    /// The storage encoding: version, flags, hlc, seq, origin (64 hex bytes), signature length
    /// (one byte) and signature, value.
    pub fn encode(&self) -> Vec<u8> {
        let signature = &self.signature[..self.signature.len().min(MAX_SIGNATURE)];
        let mut out =
            Vec::with_capacity(1 + 1 + 8 + 8 + 64 + 1 + signature.len() + self.value.len());
        out.push(VERSION);
        out.push(u8::from(self.tombstone));
        out.extend_from_slice(&self.hlc.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(self.origin.as_str().as_bytes());
        out.push(u8::try_from(signature.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(signature);
        out.extend_from_slice(&self.value);
        out
    }

    /// Decodes [`Record::encode`]'s output, and version 1 (stored before records were signed:
    /// no signature); anything else is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, MemoryError> {
        let bad = |why: &str| MemoryError::Corrupt(why.to_owned());
        if bytes.len() < 2 + 16 + NodeId::HEX_LEN {
            return Err(bad("record too short"));
        }
        let version = bytes[0];
        if version != 1 && version != VERSION {
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
        let mut rest = &bytes[18 + NodeId::HEX_LEN..];
        let mut signature = Vec::new();
        if version == VERSION {
            let (&len, after) = rest.split_first().ok_or_else(|| bad("signature length"))?;
            let len = usize::from(len);
            if after.len() < len {
                return Err(bad("signature cut short"));
            }
            signature = after[..len].to_vec();
            rest = &after[len..];
        }
        Ok(Self {
            value: rest.to_vec(),
            hlc,
            origin,
            seq,
            tombstone,
            signature,
        })
    }

    /// The Unix second the HLC stamp says the record was written at (its high 32 bits).
    pub fn written_at(&self) -> u64 {
        self.hlc >> 32
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

impl Entry {
    /// What the entry weighs in an answer, for byte budgets: its namespace, key, value and
    /// signature (the fixed-size fields are left out: they are small next to a value).
    pub fn size(&self) -> usize {
        self.namespace.len()
            + self.key.len()
            + self.record.value.len()
            + self.record.signature.len()
    }

    /// The bytes the origin signs: a prefix naming them, then the namespace and the key (each
    /// with its length), the SHA-256 of the value, the HLC stamp, the origin, the sequence and
    /// the tombstone flag. Everything that decides what the record says and where it lands is
    /// in it; the signature is not.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let r = &self.record;
        let mut out = Vec::with_capacity(
            SIGNED_PREFIX.len() + 8 + self.namespace.len() + self.key.len() + 32 + 81,
        );
        out.extend_from_slice(SIGNED_PREFIX);
        for part in [self.namespace.as_bytes(), self.key.as_bytes()] {
            // Lengths are bounded far below u32 (keys::MAX_KEY); saturating keeps this total.
            out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&Sha256::digest(&r.value));
        out.extend_from_slice(&r.hlc.to_be_bytes());
        out.extend_from_slice(r.origin.as_str().as_bytes());
        out.extend_from_slice(&r.seq.to_be_bytes());
        out.push(u8::from(r.tombstone));
        out
    }
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
            signature: vec![7; 64],
        };
        assert_eq!(Record::decode(&r.encode()).expect("decode"), r);
        for bad in [&b""[..], &b"\x03"[..], &[1u8; 20][..]] {
            assert!(Record::decode(bad).is_err());
        }
        let mut flag = r.encode();
        flag[1] = 9;
        assert!(Record::decode(&flag).is_err());
        // A signature length past the end is corruption, not a panic.
        let mut cut = r.encode();
        cut.truncate(2 + 16 + NodeId::HEX_LEN + 10);
        assert!(Record::decode(&cut).is_err());
    }

    /// Records stored before signatures existed (version 1) still decode, unsigned.
    #[test]
    fn version_1_records_still_decode_without_a_signature() {
        let origin = id("x");
        let mut v1 = vec![1, 0];
        v1.extend_from_slice(&42u64.to_be_bytes());
        v1.extend_from_slice(&7u64.to_be_bytes());
        v1.extend_from_slice(origin.as_str().as_bytes());
        v1.extend_from_slice(b"hello");
        let r = Record::decode(&v1).expect("decode v1");
        assert_eq!((r.value.as_slice(), r.hlc, r.seq), (&b"hello"[..], 42, 7));
        assert!(r.signature.is_empty() && !r.tombstone);
        assert_eq!(r.origin, origin);
    }

    #[test]
    fn the_signed_bytes_cover_every_field_but_the_signature() {
        let entry = Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: Record {
                signature: vec![1; 64],
                ..record(42, &id("x"), false)
            },
        };
        let base = entry.signed_bytes();
        let mut changes: Vec<Entry> = Vec::new();
        let mut change = |f: &dyn Fn(&mut Entry)| {
            let mut e = entry.clone();
            f(&mut e);
            changes.push(e);
        };
        change(&|e| e.namespace = "notez".into());
        change(&|e| e.key = "K".into());
        // The boundary between namespace and key is part of the bytes too.
        change(&|e| {
            e.namespace = "note".into();
            e.key = "sk".into();
        });
        change(&|e| e.record.value = b"w".to_vec());
        change(&|e| e.record.hlc += 1);
        change(&|e| e.record.origin = id("y"));
        change(&|e| e.record.seq += 1);
        change(&|e| e.record.tombstone = true);
        for changed in &changes {
            assert_ne!(changed.signed_bytes(), base, "{changed:?}");
        }
        let mut resigned = entry.clone();
        resigned.record.signature = vec![2; 64];
        assert_eq!(resigned.signed_bytes(), base);
    }
}
