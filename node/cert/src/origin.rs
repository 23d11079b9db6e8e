//! Who wrote a replicated record, and the proof: a node signs the records it writes with the key
//! of its own certificate ([`OriginSigner`]), and a node that receives a record, from its writer
//! or relayed by any other node, checks the signature against the certificate of the node the
//! record names as its origin ([`OriginVerifier`]). A relaying node holds no key that can sign
//! in another node's name, so it can pass records on but not forge or alter them.
//!
//! A certificate vouches for a record when it chains to the mesh CA, is a node certificate (not
//! a client's; a legacy one without a role counts as a node's), and the SHA-256 of its public
//! key is the origin's id (that is how a [`NodeId`] is defined), so a certificate can only ever
//! speak for its own key. It vouches for records written before it expires: an expired
//! certificate still verifies what its node wrote while it was valid. Keys are Ed25519 for
//! certificates issued since roles exist, ECDSA P-256 for older ones and for the self-made
//! certificate of an `--insecure` node; `ring` verifies both.
//!
//! This module checks signatures and certificates; it stores nothing and decides nothing about
//! what to do with a refused record (the memory counts and logs it).

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use mesh_domain::NodeId;
use rcgen::{CertificateParams, KeyPair, PublicKeyData, SigningKey};
use ring::signature::{ECDSA_P256_SHA256_ASN1, ED25519, UnparsedPublicKey, VerificationAlgorithm};
use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, UnixTime},
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use sha2::{Digest, Sha256};
use x509_parser::{
    oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519},
    prelude::{FromDer, X509Certificate},
};

use crate::{
    CertRole, TlsError,
    cert::CertIdentity,
    chain::{MeshChain, provider},
    pem::{read, write_new},
    revocation::RevokedSet,
};

/// Most origins whose verified keys an [`OriginVerifier`] keeps; past it the cache starts
/// over (every message carries the certificates of its origins, so nothing is lost but time).
pub const MAX_CACHED_ORIGINS: usize = 4096;

/// Largest certificate accepted to vouch for records (an Ed25519 node certificate is ~500
/// bytes, an ECDSA one ~600).
pub const MAX_CERTIFICATE_BYTES: usize = 4096;

/// Why a record's origin could not be verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// The certificate does not parse, or its key is of a kind records are not signed with.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The certificate does not chain to the mesh CA.
    #[error("certificate of {0} was not issued by this mesh's CA")]
    NotFromCa(String),
    /// A client certificate: clients do not write replicated records.
    #[error("certificate of {0} is a client certificate; only nodes write replicated records")]
    ClientCertificate(String),
    /// Neither the message nor this node holds a certificate of the origin.
    #[error("no certificate of origin {0} came with the record")]
    UnknownOrigin(String),
    /// The record was written after its origin's certificate expired.
    #[error("written by {0} after its certificate expired")]
    WrittenAfterExpiry(String),
    /// The signature is missing, or does not verify over the record's bytes.
    #[error("signature of {0} does not verify over the record (altered, or not written by it)")]
    BadSignature(String),
    /// Signing failed (a key the crypto library refused).
    #[error("signing failed: {0}")]
    Signing(String),
}

/// This node's signing key and the certificate that vouches for it.
pub struct OriginSigner {
    /// The node's private key (the key of its TLS certificate).
    key: KeyPair,
    /// The DER certificate passed along with our records so any node can verify them.
    certificate: Vec<u8>,
    /// Our id: the hash of the certificate's public key.
    id: NodeId,
}

impl std::fmt::Debug for OriginSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginSigner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl OriginSigner {
    /// The signer of a node whose certificate is `certificate` (DER) and key `key_pem`; the key
    /// must be the certificate's.
    pub fn new(key_pem: &str, certificate: Vec<u8>) -> Result<Self, OriginError> {
        let key =
            KeyPair::from_pem(key_pem).map_err(|e| OriginError::Certificate(e.to_string()))?;
        let identity = CertIdentity::from_der(&certificate)
            .map_err(|e| OriginError::Certificate(e.to_string()))?;
        if NodeId::from_spki_der(&key.subject_public_key_info()) != identity.id {
            return Err(OriginError::Certificate(
                "the key is not the certificate's".into(),
            ));
        }
        Ok(Self {
            key,
            certificate,
            id: identity.id,
        })
    }

    /// A signer with a self-made certificate for `key`: an `--insecure` node's (it has no CA),
    /// and tests'. Only an [`OriginVerifier::self_certified`] accepts its records.
    pub fn self_certified(key: KeyPair) -> Result<Self, OriginError> {
        let certificate = CertificateParams::new(Vec::<String>::new())
            .and_then(|params| params.self_signed(&key))
            .map_err(|e| OriginError::Signing(e.to_string()))?
            .der()
            .to_vec();
        let id = NodeId::from_spki_der(&key.subject_public_key_info());
        Ok(Self {
            key,
            certificate,
            id,
        })
    }

    /// A signer with a fresh Ed25519 key under a self-made certificate, for tests and
    /// benchmarks (see [`OriginSigner::self_certified`]).
    pub fn generate() -> Result<Self, OriginError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| OriginError::Signing(e.to_string()))?;
        Self::self_certified(key)
    }

    /// The node id the signatures speak for.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// The certificate (DER) that vouches for our signatures.
    pub fn certificate(&self) -> &[u8] {
        &self.certificate
    }

    /// Signs `message` (a record's canonical bytes).
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, OriginError> {
        self.key
            .sign(message)
            .map_err(|e| OriginError::Signing(e.to_string()))
    }
}

/// Loads (or creates, on first start) the key that gives an insecure node a stable id, with
/// which it signs its records (under a self-made certificate: an insecure node has no CA).
pub fn insecure_identity(data_dir: &Path) -> Result<OriginSigner, TlsError> {
    let path = data_dir.join("insecure-node.key");
    let key = if path.exists() {
        KeyPair::from_pem(&read(&path)?).map_err(|e| TlsError::Pem {
            path: path.clone(),
            reason: e.to_string(),
        })?
    } else {
        let key = KeyPair::generate()?;
        write_new(&path, key.serialize_pem().as_bytes(), true)?;
        key
    };
    OriginSigner::self_certified(key).map_err(|e| TlsError::Config(e.to_string()))
}

/// A verified key of one origin.
#[derive(Debug, Clone)]
struct OriginKey {
    /// SHA-256 of the certificate it came from: the same certificate is not checked twice.
    fingerprint: [u8; 32],
    /// Ed25519 or ECDSA P-256 with SHA-256 (ASN.1 signatures, as rcgen and rustls make them).
    algorithm: &'static dyn VerificationAlgorithm,
    /// The raw public key, as `ring` takes it.
    public_key: Vec<u8>,
    /// Unix seconds after which the certificate vouches for nothing (`None` when self-made).
    valid_until: Option<u64>,
}

/// Verifies records' signatures against their origins' certificates, remembering the keys of
/// certificates it has checked (at most [`MAX_CACHED_ORIGINS`]).
pub struct OriginVerifier {
    /// The mesh CA; `None` for an `--insecure` node, which checks only that a certificate's key
    /// is the origin's (nobody can sign in another node's name, but anybody can join).
    anchors: Option<MeshChain>,
    /// The mesh CA as it vouches for client certificates (which have no server-auth usage),
    /// for the statements operators sign (see [`crate::statement`]); `None` without a CA.
    clients: Option<Arc<dyn ClientCertVerifier>>,
    /// Verified keys by origin.
    keys: Mutex<HashMap<NodeId, OriginKey>>,
    /// The certificates the mesh CA revoked (shared with the node's TLS), whose later records
    /// the memory refuses.
    revoked: RevokedSet,
}

impl std::fmt::Debug for OriginVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginVerifier")
            .field("ca", &self.anchors.is_some())
            .finish_non_exhaustive()
    }
}

impl OriginVerifier {
    /// A verifier that accepts certificates chaining to `roots` (the mesh CA).
    pub fn new(roots: Arc<RootCertStore>, revoked: RevokedSet) -> Result<Self, TlsError> {
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self {
            anchors: Some(MeshChain::new(roots)?),
            clients: Some(clients),
            keys: Mutex::default(),
            revoked,
        })
    }

    /// The certificates revoked in this mesh.
    pub fn revoked(&self) -> &RevokedSet {
        &self.revoked
    }

    /// The mesh CA's check of client certificates; `None` without a CA.
    pub(crate) fn clients(&self) -> Option<&Arc<dyn ClientCertVerifier>> {
        self.clients.as_ref()
    }

    /// Whether certificates are checked against a mesh CA (false for an `--insecure` node,
    /// which has none, and takes callers' and writers' word for who they are).
    pub fn has_ca(&self) -> bool {
        self.anchors.is_some()
    }

    /// A verifier without a CA (`--insecure`): a certificate only has to carry the origin's key.
    pub fn self_certified() -> Self {
        Self {
            anchors: None,
            clients: None,
            keys: Mutex::default(),
            // No CA, so no revocation can be checked: the set stays empty.
            revoked: RevokedSet::new(&[]),
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, OriginKey>> {
        // A poisoned cache is still a valid cache: every entry was verified before insertion.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks `certificate` (DER) and remembers its key; returns the origin it speaks for.
    pub fn learn(&self, certificate: &[u8]) -> Result<NodeId, OriginError> {
        if certificate.len() > MAX_CERTIFICATE_BYTES {
            return Err(OriginError::Certificate(format!(
                "{} bytes, at most {MAX_CERTIFICATE_BYTES}",
                certificate.len()
            )));
        }
        let fingerprint: [u8; 32] = Sha256::digest(certificate).into();
        let identity = CertIdentity::from_der(certificate)
            .map_err(|e| OriginError::Certificate(e.to_string()))?;
        if self
            .keys()
            .get(&identity.id)
            .is_some_and(|known| known.fingerprint == fingerprint)
        {
            return Ok(identity.id);
        }
        let id = identity.id.short().to_owned();
        if identity.role == Some(CertRole::Client) {
            return Err(OriginError::ClientCertificate(id));
        }
        let valid_until = match &self.anchors {
            None => None,
            Some(anchors) => Some(checked_until(anchors, certificate, &identity, &id)?),
        };
        let (algorithm, public_key) = public_key(certificate)?;
        let key = OriginKey {
            fingerprint,
            algorithm,
            public_key,
            valid_until,
        };
        let mut keys = self.keys();
        // Of two certificates of one key (a renewal), the one valid longer speaks for it.
        if keys
            .get(&identity.id)
            .is_some_and(|known| known.valid_until > key.valid_until)
        {
            return Ok(identity.id);
        }
        if keys.len() >= MAX_CACHED_ORIGINS && !keys.contains_key(&identity.id) {
            keys.clear();
        }
        keys.insert(identity.id.clone(), key);
        Ok(identity.id)
    }

    /// Whether a verified key of `origin` is at hand.
    pub fn knows(&self, origin: &NodeId) -> bool {
        self.keys().contains_key(origin)
    }

    /// Checks that `origin` signed `message` (written at Unix second `written_at`) with
    /// `signature`; the origin's certificate must have been [`OriginVerifier::learn`]ed.
    pub fn verify(
        &self,
        origin: &NodeId,
        written_at: u64,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), OriginError> {
        let key = self
            .keys()
            .get(origin)
            .cloned()
            .ok_or_else(|| OriginError::UnknownOrigin(origin.short().to_owned()))?;
        if key.valid_until.is_some_and(|until| written_at > until) {
            return Err(OriginError::WrittenAfterExpiry(origin.short().to_owned()));
        }
        UnparsedPublicKey::new(key.algorithm, &key.public_key)
            .verify(message, signature)
            .map_err(|_| OriginError::BadSignature(origin.short().to_owned()))
    }
}

/// Checks the chain of `certificate` to the mesh CA; returns until when it vouches (its
/// `notAfter`). An expired certificate is checked as of its last valid second, so what its node
/// wrote before still verifies.
fn checked_until(
    anchors: &MeshChain,
    certificate: &[u8],
    identity: &CertIdentity,
    id: &str,
) -> Result<u64, OriginError> {
    let der = CertificateDer::from(certificate);
    let not_after = u64::try_from(identity.not_after).unwrap_or(0);
    let expired = |e: &rustls::Error| {
        matches!(
            e,
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. }
            )
        )
    };
    match anchors.check_at(&der, UnixTime::now()) {
        Ok(()) => Ok(not_after),
        Err(e) if expired(&e) => {
            let last = UnixTime::since_unix_epoch(Duration::from_secs(not_after.saturating_sub(1)));
            anchors
                .check_at(&der, last)
                .map(|()| not_after)
                .map_err(|_| OriginError::NotFromCa(id.to_owned()))
        }
        Err(_) => Err(OriginError::NotFromCa(id.to_owned())),
    }
}

/// Checks `signature` over `message` against the key of `certificate` (DER), whatever it
/// vouches for: the caller checks the certificate itself.
pub(crate) fn verify_raw(
    certificate: &[u8],
    message: &[u8],
    signature: &[u8],
) -> Result<(), OriginError> {
    let (algorithm, key) = public_key(certificate)?;
    UnparsedPublicKey::new(algorithm, &key)
        .verify(message, signature)
        .map_err(|_| OriginError::BadSignature("the certificate's key".into()))
}

/// The signature algorithm and raw public key of a certificate's key.
fn public_key(
    certificate: &[u8],
) -> Result<(&'static dyn VerificationAlgorithm, Vec<u8>), OriginError> {
    let (_, cert) = X509Certificate::from_der(certificate)
        .map_err(|e| OriginError::Certificate(e.to_string()))?;
    let spki = cert.public_key();
    let raw = spki.subject_public_key.data.to_vec();
    let algorithm = &spki.algorithm;
    if algorithm.algorithm == OID_SIG_ED25519 {
        return Ok((&ED25519, raw));
    }
    let curve = algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
    if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY && curve == Some(OID_EC_P256) {
        return Ok((&ECDSA_P256_SHA256_ASN1, raw));
    }
    Err(OriginError::Certificate(format!(
        "key type {} is not Ed25519 or ECDSA P-256",
        algorithm.algorithm
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ca::ca_init,
        test_support::{member, verifier_of},
    };

    #[test]
    fn a_node_signs_and_any_member_verifies_but_not_over_other_bytes_or_in_another_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        let (_, alpha) = member(dir.path(), "alpha", CertRole::Node);
        let (_, beta) = member(dir.path(), "beta", CertRole::Node);
        let verifier = verifier_of(dir.path());
        let signature = alpha.sign(b"record").expect("sign");
        assert_eq!(
            verifier.verify(alpha.id(), 0, b"record", &signature),
            Err(OriginError::UnknownOrigin(alpha.id().short().to_owned())),
            "no certificate learned yet"
        );
        assert_eq!(verifier.learn(alpha.certificate()), Ok(alpha.id().clone()));
        assert_eq!(verifier.learn(beta.certificate()), Ok(beta.id().clone()));
        assert_eq!(
            verifier.verify(alpha.id(), 0, b"record", &signature),
            Ok(())
        );
        assert!(matches!(
            verifier.verify(alpha.id(), 0, b"recore", &signature),
            Err(OriginError::BadSignature(_))
        ));
        // beta signs in alpha's name: beta's key is not alpha's.
        let forged = beta.sign(b"record").expect("sign");
        assert!(matches!(
            verifier.verify(alpha.id(), 0, b"record", &forged),
            Err(OriginError::BadSignature(_))
        ));
        assert!(matches!(
            verifier.verify(alpha.id(), 0, b"record", &[]),
            Err(OriginError::BadSignature(_))
        ));
        // Written after the certificate's end: not vouched for.
        assert!(matches!(
            verifier.verify(alpha.id(), u64::MAX, b"record", &signature),
            Err(OriginError::WrittenAfterExpiry(_))
        ));
    }

    #[test]
    fn client_certificates_foreign_certificates_and_self_made_ones_vouch_for_nothing() {
        let ours = tempfile::tempdir().expect("tempdir");
        let theirs = tempfile::tempdir().expect("tempdir");
        ca_init(ours.path()).expect("ca");
        ca_init(theirs.path()).expect("ca");
        let verifier = verifier_of(ours.path());
        let (_, client) = member(ours.path(), "operator", CertRole::Client);
        assert!(matches!(
            verifier.learn(client.certificate()),
            Err(OriginError::ClientCertificate(_))
        ));
        let (_, foreign) = member(theirs.path(), "mallory", CertRole::Node);
        assert!(matches!(
            verifier.learn(foreign.certificate()),
            Err(OriginError::NotFromCa(_))
        ));
        let made = OriginSigner::self_certified(KeyPair::generate().expect("key")).expect("self");
        assert!(matches!(
            verifier.learn(made.certificate()),
            Err(OriginError::NotFromCa(_))
        ));
        assert!(matches!(
            verifier.learn(b"not a certificate"),
            Err(OriginError::Certificate(_))
        ));
        assert!(!verifier.knows(foreign.id()) && !verifier.knows(made.id()));
    }

    #[test]
    fn without_a_ca_a_self_made_certificate_speaks_for_its_own_key_only() {
        let verifier = OriginVerifier::self_certified();
        // ECDSA P-256 (an insecure node's key) and Ed25519 both verify.
        for key in [
            KeyPair::generate().expect("p256"),
            KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519"),
        ] {
            let signer = OriginSigner::self_certified(key).expect("signer");
            let other =
                OriginSigner::self_certified(KeyPair::generate().expect("key")).expect("signer");
            assert_eq!(
                verifier.learn(signer.certificate()),
                Ok(signer.id().clone())
            );
            let signature = signer.sign(b"m").expect("sign");
            assert_eq!(verifier.verify(signer.id(), 0, b"m", &signature), Ok(()));
            let forged = other.sign(b"m").expect("sign");
            assert!(verifier.verify(signer.id(), 0, b"m", &forged).is_err());
        }
    }
}
