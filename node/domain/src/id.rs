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
}
