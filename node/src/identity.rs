//! Who a node is: its id, derived from its certificate's public key, and the fingerprint of the
//! certificate itself.
//!
//! The id is what the peer table is keyed by and what every other module uses to name a node.
//! This module only derives identities; it does not load files or decide trust (that is `tls`).

use std::fmt;

use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

/// A node id: the hex SHA-256 of the node certificate's SubjectPublicKeyInfo (DER).
///
/// Keying on the public key rather than the whole certificate keeps the id stable when a
/// certificate is re-issued for the same key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    /// Length of the hex form.
    pub const HEX_LEN: usize = 64;
    /// Length of the short form shown in tables.
    pub const SHORT_LEN: usize = 12;

    /// Parses a 64-character lowercase hex id, as sent on the wire.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        let valid = s.len() == Self::HEX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdentityError::BadId(s.chars().take(80).collect()))
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

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.short())
    }
}

/// What a certificate says about the node presenting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The node id (hash of the public key).
    pub id: NodeId,
    /// Hex SHA-256 of the whole certificate (DER): the mDNS TXT `fp`.
    pub fingerprint: String,
    /// The certificate's common name, which `mesh-cli ca issue` sets to the node name.
    pub common_name: Option<String>,
    /// Unix seconds after which the certificate is no longer valid.
    pub not_after: i64,
}

impl CertIdentity {
    /// Derives the identity from a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, IdentityError> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        Ok(Self {
            id: NodeId::from_spki_der(cert.public_key().raw),
            fingerprint: hex::encode(Sha256::digest(der)),
            common_name,
            not_after: cert.validity().not_after.timestamp(),
        })
    }
}

/// Errors deriving an identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A node id on the wire is not 64 lowercase hex characters.
    #[error("invalid node id `{0}`: expected 64 lowercase hex characters")]
    BadId(String),
    /// A certificate could not be parsed.
    #[error("cannot parse certificate: {0}")]
    BadCertificate(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

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
    fn identity_is_the_hash_of_the_public_key_not_of_the_certificate() {
        let key = rcgen::KeyPair::generate().expect("generate key");
        let one = rcgen::CertificateParams::new(vec!["a".into()])
            .expect("params")
            .self_signed(&key)
            .expect("sign");
        let two = rcgen::CertificateParams::new(vec!["b".into()])
            .expect("params")
            .self_signed(&key)
            .expect("sign");
        let one = CertIdentity::from_der(one.der()).expect("parse");
        let two = CertIdentity::from_der(two.der()).expect("parse");
        assert_eq!(one.id, two.id, "same key, same id");
        assert_ne!(one.fingerprint, two.fingerprint, "different certificates");
        assert_eq!(
            one.id,
            NodeId::from_spki_der(&key.subject_public_key_info())
        );
    }
}
