//! What an operator signs with the key of their own client certificate, so that every node can
//! check that the person acted, and not a node in their name: a decision on an approval
//! ([`ApprovalStatement`]) and a front-door key added at run time
//! ([`KeyStatement`](crate::api_key::KeyStatement), with the key's other types).
//!
//! A statement is JSON; the exact bytes that were signed travel and are stored with the
//! signature and the signer's certificate ([`Signed`]), and a reader parses those bytes and
//! compares what they say with what it acts on: nothing is re-encoded before it is checked. The
//! signature is over a prefix naming the kind of statement and its layout, then the bytes
//! ([`Signed::signed_bytes`]), so a signature over one kind never verifies as another.
//!
//! Signing and verifying (certificates, chains, revocations) are `mesh-cert`'s; this module
//! only says what is signed.

use serde::{Deserialize, Serialize};

use crate::Tier;

/// Largest statement accepted (its JSON bytes).
pub const MAX_STATEMENT: usize = 8 * 1024;

/// Which statement a signature is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    /// An [`ApprovalStatement`].
    ApprovalDecision,
    /// A [`KeyStatement`](crate::api_key::KeyStatement).
    KeyAdd,
}

impl StatementKind {
    /// The bytes signed before the statement: its kind and layout version, and a NUL.
    pub fn prefix(self) -> &'static [u8] {
        match self {
            Self::ApprovalDecision => b"agentmesh approval decision v1\0",
            Self::KeyAdd => b"agentmesh front-door key v1\0",
        }
    }

    /// What a person calls it, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::ApprovalDecision => "approval decision",
            Self::KeyAdd => "front-door key",
        }
    }
}

/// A statement as it travels and is stored: its exact bytes, the signer's signature over
/// [`Signed::signed_bytes`], and the signer's certificate (DER). Serialised with each part in
/// hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// The statement's JSON bytes, as signed.
    #[serde(with = "hex_bytes")]
    pub statement: Vec<u8>,
    /// The signature (Ed25519, or ECDSA P-256 with SHA-256 in ASN.1).
    #[serde(with = "hex_bytes")]
    pub signature: Vec<u8>,
    /// The signer's certificate (DER), issued by the mesh CA.
    #[serde(with = "hex_bytes")]
    pub certificate: Vec<u8>,
}

impl Signed {
    /// The bytes the signature is over: the kind's prefix, then the statement.
    pub fn signed_bytes(&self, kind: StatementKind) -> Vec<u8> {
        signed_bytes(kind, &self.statement)
    }

    /// The statement parsed as `T` (the caller then compares it with what it acts on).
    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, String> {
        if self.statement.len() > MAX_STATEMENT {
            return Err(format!(
                "statement: {} bytes, at most {MAX_STATEMENT}",
                self.statement.len()
            ));
        }
        serde_json::from_slice(&self.statement).map_err(|e| format!("statement: {e}"))
    }
}

/// The bytes a signature over `statement` of `kind` is made over.
pub fn signed_bytes(kind: StatementKind, statement: &[u8]) -> Vec<u8> {
    let prefix = kind.prefix();
    let mut bytes = Vec::with_capacity(prefix.len() + statement.len());
    bytes.extend_from_slice(prefix);
    bytes.extend_from_slice(statement);
    bytes
}

/// A person's decision on one gated tool call, and the call as they were shown it: the node
/// running the call acts on it only when every field matches its own request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalStatement {
    /// The approval's id.
    pub approval_id: String,
    /// The task that made the call.
    pub task_id: String,
    /// The node the call waits on (its full id).
    pub node_id: String,
    /// The tool called.
    pub tool: String,
    /// The tier the call counts as.
    pub tier: Tier,
    /// SHA-256 (hex) of the call's full arguments.
    pub arguments_sha256: String,
    /// When the approval expires (Unix ms).
    pub expires_ms: u64,
    /// Whether the call may run.
    pub approve: bool,
    /// Why (what the model is told of a denial).
    pub reason: String,
}

/// Bytes as a hex string in JSON.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_parts_travel_as_hex_and_each_kind_signs_its_own_bytes() {
        let signed = Signed {
            statement: br#"{"a":1}"#.to_vec(),
            signature: vec![0xab, 0xcd],
            certificate: vec![1],
        };
        let json = serde_json::to_value(&signed).expect("json");
        assert_eq!(json["signature"], "abcd");
        let back: Signed = serde_json::from_value(json).expect("back");
        assert_eq!(back, signed);
        let approval = signed.signed_bytes(StatementKind::ApprovalDecision);
        let key = signed.signed_bytes(StatementKind::KeyAdd);
        assert_ne!(approval, key);
        assert!(approval.ends_with(br#"{"a":1}"#));
        let big = Signed {
            statement: vec![b' '; MAX_STATEMENT + 1],
            ..signed
        };
        assert!(big.parse::<serde_json::Value>().is_err());
    }
}
