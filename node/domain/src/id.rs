//! Node ids: what the peer table is keyed by and what every part of the mesh names a node with.

use std::fmt;

use sha2::{Digest, Sha256};

/// A node id: the hex SHA-256 of the node certificate's SubjectPublicKeyInfo (DER).
///
/// Keying on the public key rather than the whole certificate keeps the id stable when a
/// certificate is re-issued for the same key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

/// A node id on the wire that is not 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node id `{0}`: expected 64 lowercase hex characters")]
pub struct InvalidNodeId(pub String);

impl NodeId {
    /// Length of the hex form.
    pub const HEX_LEN: usize = 64;
    /// Length of the short form shown in tables.
    pub const SHORT_LEN: usize = 12;

    /// Parses a 64-character lowercase hex id, as sent on the wire.
    pub fn parse(s: &str) -> Result<Self, InvalidNodeId> {
        let valid = s.len() == Self::HEX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidNodeId(s.chars().take(80).collect()))
        }
    }

    /// The id of a public key given as SubjectPublicKeyInfo DER.
    pub fn from_spki_der(spki: &[u8]) -> Self {
        Self(hex::encode(Sha256::digest(spki)))
    }

    /// The full hex form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex characters, enough to tell nodes of one fleet apart in a table.
    pub fn short(&self) -> &str {
        &self.0[..Self::SHORT_LEN]
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A new id for a record only `writer` may write: a UUIDv7 (so ids sort by time) whose last 12
/// hex digits are the writer's short id, where a version-1 UUID keeps its node. A node applying
/// a replicated record whose key is such an id checks that the record's origin is the node the
/// id names ([`is_tagged_by`]): another node cannot write at the id, since its certificate
/// speaks for another id (finding a key pair whose id shares those 48 bits takes about 2^47
/// tries, and then a certificate of the mesh CA for it). Of the other 26 bits, 16 count the
/// process's ids (so its ids of one millisecond differ) and 10 are random.
pub fn tagged_uuid(writer: &NodeId) -> uuid::Uuid {
    use std::sync::atomic::{AtomicU16, Ordering};
    /// Tells apart this process's ids of one millisecond.
    static COUNTER: AtomicU16 = AtomicU16::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    // Ten random bits from a fresh UUIDv7's random tail, for ids of two runs of the node.
    let random = uuid::Uuid::now_v7().as_bytes()[14..].to_vec();
    // Bytes 6-15 of the UUID; the builder keeps the low nibble of the first and the low six
    // bits of the third (the rest is version and variant), and the last six are the tag.
    let mut tail = [0u8; 10];
    tail[0] = random.first().copied().unwrap_or(0);
    tail[1] = count[1];
    tail[2] = random.get(1).copied().unwrap_or(0);
    tail[3] = count[0];
    let short = hex::decode(writer.short()).unwrap_or_default();
    for (byte, tag) in tail[4..].iter_mut().zip(short) {
        *byte = tag;
    }
    uuid::Builder::from_unix_timestamp_millis(crate::time::now_ms(), &tail).into_uuid()
}

/// Whether `id` (a UUID, hyphenated or not, or any text ending in hex digits) ends with
/// `writer`'s short id: whether [`tagged_uuid`] could have made it for `writer`.
pub fn is_tagged_by(id: &str, writer: &NodeId) -> bool {
    id.len() > NodeId::SHORT_LEN && id.ends_with(writer.short())
}

/// The hex form, as on the wire.
impl serde::Serialize for NodeId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Only a valid hex id.
impl<'de> serde::Deserialize<'de> for NodeId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_parse_accepts_only_lowercase_hex_of_the_right_length() {
        let good = "a".repeat(64);
        assert!(NodeId::parse(&good).is_ok());
        assert!(NodeId::parse(&"A".repeat(64)).is_err());
        assert!(NodeId::parse(&"a".repeat(63)).is_err());
        assert!(NodeId::parse(&format!("{}g", "a".repeat(63))).is_err());
        assert!(NodeId::parse("").is_err());
    }

    #[test]
    fn a_tagged_uuid_names_its_writer_and_no_other_node() {
        let writer = NodeId::from_spki_der(b"writer");
        let other = NodeId::from_spki_der(b"other");
        let id = tagged_uuid(&writer);
        assert_eq!(id.get_version_num(), 7, "still a UUIDv7: {id}");
        let text = id.hyphenated().to_string();
        assert!(is_tagged_by(&text, &writer), "{text}");
        assert!(is_tagged_by(&id.simple().to_string(), &writer));
        assert!(!is_tagged_by(&text, &other));
        assert!(
            !is_tagged_by(writer.short(), &writer),
            "nothing but the tag"
        );
        let many: std::collections::HashSet<_> =
            (0..10_000).map(|_| tagged_uuid(&writer)).collect();
        assert_eq!(
            many.len(),
            10_000,
            "a node's ids differ, also within a millisecond"
        );
    }
}
