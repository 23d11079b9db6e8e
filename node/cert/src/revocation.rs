//! Revoked certificates: the entry the mesh CA signs to revoke one (`mesh-cli ca revoke`), how
//! any node checks it against its `tls.ca`, and the set of revoked certificates every part of a
//! node consults ([`RevokedSet`]): the TLS verifier when dialing, the certificate gate on every
//! request, the peer table and the memory.
//!
//! The entry is a protobuf `Revocation`, signed as the exact bytes that travel (with a
//! domain-separation prefix, so the CA's signature over anything else can never pass for a
//! revocation) by the CA's ECDSA P-256 key. The two messages are declared here as well as in
//! `proto/agentmesh/v1/node.proto`, so this crate needs no RPC stack; the unit tests read and
//! write them with `mesh-proto`'s types, so the two cannot drift apart unnoticed. Only the CA key can revoke; a node holding a
//! revocation can pass it on but not forge or alter one. This module decides nothing about what
//! a revoked certificate may still do; it says which ones are revoked and since when.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock, Weak},
};

use futures_channel::oneshot;
use mesh_domain::NodeId;
use prost::Message;
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair},
};
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::ca::CaSigner;

/// What the signed bytes start with: says what they are, so no other CA signature verifies.
const SIGNED_PREFIX: &[u8] = b"agentmesh revocation v1\0";
/// Most revocations a node keeps. A mesh revokes a handful of devices in its life; the cap
/// bounds what a CA-key holder gone mad (or a bug) can make every node hold.
pub const MAX_REVOCATIONS: usize = 10_000;
/// Largest encoded signed entry accepted.
pub const MAX_ENTRY_BYTES: usize = 2048;

/// One revoked certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The certificate's id (SHA-256 of its public key).
    pub id: NodeId,
    /// Its name (CN), for people.
    pub name: String,
    /// Unix ms: its holder's records stamped after this are ignored.
    pub revoked_at_ms: u64,
    /// Why, for people.
    pub reason: String,
}

/// Why a revocation entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevocationError {
    /// The bytes are not a signed revocation entry.
    #[error("not a revocation entry: {0}")]
    Malformed(String),
    /// The signature is not the mesh CA's over these bytes.
    #[error(
        "the revocation is not signed by this mesh's CA (signed by another CA, altered, or not signed); sign it with `mesh-cli ca revoke` where this mesh's ca.key is"
    )]
    BadSignature,
    /// This node has no CA to check against (`--insecure`).
    #[error("this node has no mesh CA (insecure mode), so it cannot check revocations")]
    NoCa,
    /// The CA key cannot sign (not ECDSA P-256).
    #[error("the CA key cannot sign revocations: {0}")]
    Signing(String),
    /// [`MAX_REVOCATIONS`] are already held.
    #[error("{MAX_REVOCATIONS} revocations are held already; no more are accepted")]
    Full,
}

impl Revocation {
    /// Signs the entry with the CA key.
    pub fn sign(&self, ca: &CaSigner) -> Result<SignedRevocation, RevocationError> {
        let entry = Entry {
            id: self.id.to_string(),
            name: self.name.clone(),
            revoked_at_ms: self.revoked_at_ms,
            reason: self.reason.clone(),
        }
        .encode_to_vec();
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, ca.key_der(), &rng)
            .map_err(|e| RevocationError::Signing(e.to_string()))?;
        let signature = key
            .sign(&rng, &signed_bytes(&entry))
            .map_err(|e| RevocationError::Signing(e.to_string()))?
            .as_ref()
            .to_vec();
        Ok(SignedRevocation { entry, signature })
    }
}

/// A signed entry as it travels and is stored: `agentmesh.v1.SignedRevocation`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SignedRevocation {
    /// The encoded entry (`agentmesh.v1.Revocation`), exactly the bytes signed.
    #[prost(bytes = "vec", tag = "1")]
    pub entry: Vec<u8>,
    /// The CA's signature over `agentmesh revocation v1\0` followed by `entry`.
    #[prost(bytes = "vec", tag = "2")]
    pub signature: Vec<u8>,
}

/// One revoked certificate as it is signed: `agentmesh.v1.Revocation`.
#[derive(Clone, PartialEq, prost::Message)]
struct Entry {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(uint64, tag = "3")]
    revoked_at_ms: u64,
    #[prost(string, tag = "4")]
    reason: String,
}

fn signed_bytes(entry: &[u8]) -> Vec<u8> {
    [SIGNED_PREFIX, entry].concat()
}

/// Raw P-256 public keys of the CA certificates that may sign revocations.
fn ca_keys(cas: &[CertificateDer<'static>]) -> Vec<Vec<u8>> {
    cas.iter()
        .filter_map(|der| X509Certificate::from_der(der).ok())
        .map(|(_, cert)| cert.public_key().subject_public_key.data.to_vec())
        .collect()
}

/// The certificates revoked in this mesh, shared by every part of a node that accepts or
/// believes a certificate. Cloning shares the set.
#[derive(Debug, Clone)]
pub struct RevokedSet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The CA public keys revocations are checked against (none in insecure mode).
    ca_keys: Vec<Vec<u8>>,
    revoked: RwLock<HashMap<NodeId, Revocation>>,
    /// Bumped on every new revocation, so long-lived streams and the peer table act at once.
    changed: Mutex<Changes>,
}

/// How many revocations were added, and who waits for the next one.
#[derive(Debug, Default)]
struct Changes {
    count: u64,
    /// One per waiting [`RevocationWatch::changed`]; a waiter that gave up (its future dropped)
    /// is pruned when the next one registers, so the list holds at most the live waiters.
    waiters: Vec<oneshot::Sender<()>>,
}

impl Inner {
    fn changes(&self) -> std::sync::MutexGuard<'_, Changes> {
        // A poisoned count is still a count: it only ever grows.
        self.changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl RevokedSet {
    /// An empty set whose revocations must be signed by one of `cas`.
    pub fn new(cas: &[CertificateDer<'static>]) -> Self {
        Self {
            inner: Arc::new(Inner {
                ca_keys: ca_keys(cas),
                revoked: RwLock::default(),
                changed: Mutex::default(),
            }),
        }
    }

    /// Checks a signed entry (the `SignedRevocation` bytes) against the CA; does not add it.
    pub fn verify(&self, signed: &[u8]) -> Result<Revocation, RevocationError> {
        if self.inner.ca_keys.is_empty() {
            return Err(RevocationError::NoCa);
        }
        if signed.len() > MAX_ENTRY_BYTES {
            return Err(RevocationError::Malformed(format!(
                "{} bytes, at most {MAX_ENTRY_BYTES}",
                signed.len()
            )));
        }
        let signed = SignedRevocation::decode(signed)
            .map_err(|e| RevocationError::Malformed(e.to_string()))?;
        let message = signed_bytes(&signed.entry);
        let good = self.inner.ca_keys.iter().any(|key| {
            ring::signature::UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, key)
                .verify(&message, &signed.signature)
                .is_ok()
        });
        if !good {
            return Err(RevocationError::BadSignature);
        }
        let entry = Entry::decode(signed.entry.as_slice())
            .map_err(|e| RevocationError::Malformed(e.to_string()))?;
        let id =
            NodeId::parse(&entry.id).map_err(|e| RevocationError::Malformed(format!("id: {e}")))?;
        Ok(Revocation {
            id,
            name: entry.name,
            revoked_at_ms: entry.revoked_at_ms,
            reason: entry.reason,
        })
    }

    /// Adds a verified revocation; `Ok(true)` when it is new. Of two revocations of one
    /// certificate, the earlier time holds.
    pub fn insert(&self, revocation: Revocation) -> Result<bool, RevocationError> {
        let mut revoked = self
            .inner
            .revoked
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = revoked.get_mut(&revocation.id) {
            if revocation.revoked_at_ms < known.revoked_at_ms {
                known.revoked_at_ms = revocation.revoked_at_ms;
            }
            return Ok(false);
        }
        if revoked.len() >= MAX_REVOCATIONS {
            return Err(RevocationError::Full);
        }
        revoked.insert(revocation.id.clone(), revocation);
        drop(revoked);
        let mut changes = self.inner.changes();
        changes.count += 1;
        for waiter in changes.waiters.drain(..) {
            let _ = waiter.send(()); // Err: that waiter gave up already.
        }
        Ok(true)
    }

    /// When `id` was revoked (Unix ms), if it was.
    pub fn revoked_at(&self, id: &NodeId) -> Option<u64> {
        self.read().get(id).map(|r| r.revoked_at_ms)
    }

    /// Whether `id` is revoked.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.read().contains_key(id)
    }

    /// Every revocation, by name.
    pub fn list(&self) -> Vec<Revocation> {
        let mut all: Vec<Revocation> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        all
    }

    /// Follows the set from now on: its [`RevocationWatch::changed`] returns whenever a
    /// revocation is added.
    pub fn subscribe(&self) -> RevocationWatch {
        RevocationWatch {
            set: Arc::downgrade(&self.inner),
            seen: self.inner.changes().count,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeId, Revocation>> {
        self.inner
            .revoked
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Follows a [`RevokedSet`] as a `tokio::sync::watch` receiver follows its sender, without tying
/// this crate to a runtime: [`RevocationWatch::changed`] returns once a revocation was added
/// since it last returned (or since [`RevokedSet::subscribe`]).
#[derive(Debug)]
pub struct RevocationWatch {
    /// Weak, so a watch does not keep its node's set alive.
    set: Weak<Inner>,
    /// The count of additions last seen.
    seen: u64,
}

/// The set a [`RevocationWatch`] follows is gone (its node is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the revoked set is gone")]
pub struct SetClosed;

impl RevocationWatch {
    /// Whether a revocation was added since this watch last looked.
    pub fn has_changed(&self) -> Result<bool, SetClosed> {
        let inner = self.set.upgrade().ok_or(SetClosed)?;
        let count = inner.changes().count;
        Ok(count != self.seen)
    }

    /// Counts what was added so far as seen.
    pub fn mark_unchanged(&mut self) {
        if let Some(inner) = self.set.upgrade() {
            self.seen = inner.changes().count;
        }
    }

    /// Waits until a revocation is added (returns at once if one was since this watch last
    /// looked); `Err` once the set is gone. Dropping the future gives up the wait and loses
    /// nothing: the next call still sees the addition.
    pub async fn changed(&mut self) -> Result<(), SetClosed> {
        loop {
            let woken = {
                let inner = self.set.upgrade().ok_or(SetClosed)?;
                let mut changes = inner.changes();
                if changes.count != self.seen {
                    self.seen = changes.count;
                    return Ok(());
                }
                changes.waiters.retain(|waiter| !waiter.is_canceled());
                let (waiter, woken) = oneshot::channel();
                changes.waiters.push(waiter);
                woken
            };
            // Err: the set was dropped with its waiters, which the next turn reports.
            let _ = woken.await;
        }
    }
}

/// The certificate id `name_or_id` stands for: a 64-hex-digit id as is, else the id of
/// `CA_DIR/NAME.pem`.
pub fn certificate_id(
    ca_dir: &std::path::Path,
    name_or_id: &str,
) -> Result<NodeId, crate::TlsError> {
    if let Ok(id) = NodeId::parse(name_or_id) {
        return Ok(id);
    }
    let path = ca_dir.join(format!("{name_or_id}.pem"));
    let pem = crate::pem::read(&path)?;
    let der = crate::pem::pem_certs(&path, &pem)?;
    crate::CertIdentity::from_der(&der[0])
        .map(|identity| identity.id)
        .map_err(|e| crate::TlsError::Pem {
            path,
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use std::{
        future::Future,
        pin::pin,
        sync::atomic::{AtomicUsize, Ordering},
        task::{Context, Poll, Wake, Waker},
    };

    use mesh_proto::v1 as pb;

    use super::*;
    use crate::{
        CertRole,
        ca::{CA_CERT_FILE, CA_KEY_FILE, ca_init, issue},
        pem::{pem_certs, read},
    };

    fn ca(dir: &std::path::Path) -> (CaSigner, RevokedSet) {
        ca_init(dir).expect("ca init");
        let signer = CaSigner::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE)).expect("ca");
        let path = dir.join(CA_CERT_FILE);
        let certs = pem_certs(&path, &read(&path).expect("read")).expect("pem");
        (signer, RevokedSet::new(&certs))
    }

    fn entry() -> Revocation {
        Revocation {
            id: NodeId::from_spki_der(b"mallory"),
            name: "mallory".into(),
            revoked_at_ms: 1_700_000_000_000,
            reason: "lost".into(),
        }
    }

    #[test]
    fn an_entry_signed_by_the_ca_verifies_and_nothing_else_does() {
        let ours = tempfile::tempdir().expect("tempdir");
        let theirs = tempfile::tempdir().expect("tempdir");
        let (signer, set) = ca(ours.path());
        let (other_signer, _) = ca(theirs.path());

        let signed = entry().sign(&signer).expect("sign").encode_to_vec();
        assert_eq!(set.verify(&signed).expect("verifies"), entry());

        // Another CA's signature.
        let foreign = entry().sign(&other_signer).expect("sign").encode_to_vec();
        assert_eq!(set.verify(&foreign), Err(RevocationError::BadSignature));

        // Altered: a later time under the original signature.
        let mut altered = pb::SignedRevocation::decode(signed.as_slice()).expect("decode");
        let mut inner = pb::Revocation::decode(altered.entry.as_slice()).expect("decode");
        inner.revoked_at_ms += 1;
        altered.entry = inner.encode_to_vec();
        assert_eq!(
            set.verify(&altered.encode_to_vec()),
            Err(RevocationError::BadSignature)
        );

        // Garbage, and a node without a CA.
        assert!(matches!(
            set.verify(b"\xff\xff"),
            Err(RevocationError::Malformed(_))
        ));
        assert_eq!(
            RevokedSet::new(&[]).verify(&signed),
            Err(RevocationError::NoCa)
        );
    }

    #[test]
    fn the_set_keeps_the_earliest_time_and_is_bounded() {
        let set = RevokedSet::new(&[]);
        let mut changed = set.subscribe();
        assert_eq!(set.insert(entry()), Ok(true));
        assert!(changed.has_changed().expect("open"));
        changed.mark_unchanged();
        let earlier = Revocation {
            revoked_at_ms: 5,
            ..entry()
        };
        assert_eq!(set.insert(earlier), Ok(false));
        assert!(!changed.has_changed().expect("open"));
        assert_eq!(set.revoked_at(&entry().id), Some(5));
        for i in 1..MAX_REVOCATIONS {
            let r = Revocation {
                id: NodeId::from_spki_der(&i.to_be_bytes()),
                ..entry()
            };
            assert_eq!(set.insert(r), Ok(true));
        }
        let one_more = Revocation {
            id: NodeId::from_spki_der(b"one more"),
            ..entry()
        };
        assert_eq!(set.insert(one_more), Err(RevocationError::Full));
    }

    #[test]
    fn a_node_certificate_id_is_what_a_name_resolves_to() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, _) = ca(dir.path());
        let (cert, _) = issue(dir.path(), "beta", &[], CertRole::Node).expect("issue");
        let der = pem_certs(&cert, &read(&cert).expect("read")).expect("pem");
        let id = crate::CertIdentity::from_der(&der[0]).expect("identity").id;
        assert_eq!(certificate_id(dir.path(), "beta").expect("by name"), id);
        assert_eq!(certificate_id(dir.path(), id.as_str()).expect("by id"), id);
        assert!(certificate_id(dir.path(), "nobody").is_err());
    }

    /// The messages declared here are `agentmesh.v1`'s: an entry encoded by `mesh-proto` carries
    /// the signature made over this crate's encoding, and each side decodes the other's.
    #[test]
    fn the_signed_entry_is_the_wire_contracts_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (signer, set) = ca(dir.path());
        let ours = entry().sign(&signer).expect("sign");
        let wire = pb::SignedRevocation::decode(ours.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(
            (&wire.entry, &wire.signature),
            (&ours.entry, &ours.signature)
        );
        let fields = pb::Revocation::decode(wire.entry.as_slice()).expect("decode");
        assert_eq!(
            (
                fields.id.as_str(),
                fields.name.as_str(),
                fields.revoked_at_ms
            ),
            (entry().id.as_str(), "mallory", entry().revoked_at_ms)
        );
        // Encoded again by mesh-proto: the same bytes, so the signature still holds.
        let again = pb::SignedRevocation {
            entry: fields.encode_to_vec(),
            signature: wire.signature,
        };
        assert_eq!(set.verify(&again.encode_to_vec()), Ok(entry()));
    }

    /// Counts the wake-ups of a task, to see that an addition wakes a waiting watch.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_watch_wakes_on_an_addition_and_ends_with_its_set() {
        let set = RevokedSet::new(&[]);
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut watch = set.subscribe();
        {
            let mut changed = pin!(watch.changed());
            assert!(
                changed.as_mut().poll(&mut cx).is_pending(),
                "nothing added yet"
            );
            assert_eq!(set.insert(entry()), Ok(true));
            assert_eq!(
                wakes.0.load(Ordering::SeqCst),
                1,
                "the addition wakes the waiter"
            );
            assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        }
        // Seen: the next wait waits again, and ends when the set is dropped.
        let mut changed = pin!(watch.changed());
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        drop(set);
        assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(Err(SetClosed)));
    }

    #[test]
    fn waits_given_up_leave_nothing_behind() {
        let set = RevokedSet::new(&[]);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..1000 {
            let mut watch = set.subscribe();
            let mut changed = pin!(watch.changed());
            assert!(changed.as_mut().poll(&mut cx).is_pending());
        }
        let mut watch = set.subscribe();
        let mut changed = pin!(watch.changed());
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        assert_eq!(set.inner.changes().waiters.len(), 1, "only the live waiter");
    }
}
