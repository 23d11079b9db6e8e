//! The authenticated datagram every SWIM message travels in. A node seals each message with its
//! certificate, a stamp and a signature by its node key ([`Sealer`]); a receiver opens it
//! ([`Opener`]): the certificate must chain to the mesh CA and be a node's (the same check as
//! for a replicated record's origin, [`OriginVerifier::learn`]), must not be revoked, the
//! signature must verify over the whole datagram, and the stamp must be within
//! [`REPLAY_WINDOW`] of the receiver's clock and above every stamp this sender used before. So
//! a forged, unsigned, altered, replayed or other-mesh datagram is refused with a reason (the
//! caller counts it) before membership reads a byte of it.
//!
//! Each datagram carries its sender's certificate (~500 bytes), so a receiver needs no earlier
//! contact to check it, and a node met through gossip first can be checked at its first
//! datagram. This module only seals and opens; it decides nothing about membership.
//!
//! Layout (integers big-endian):
//! `"AMS1" | run u64 | stamp u64 (Unix µs) | cert_len u16 | cert | payload_len u16 | payload |
//! sig_len u8 | sig`; the signature covers everything before `sig_len`. `run` is drawn at
//! random when the node starts: stamps only grow within a run, so a restarted node (whose clock
//! may now be behind its last run's) is not taken for a replay of its last run.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_domain::{NodeId, sync::MutexExt};
use mesh_identity::{CertIdentity, OriginError, OriginSigner, OriginVerifier};

/// First bytes of every membership datagram (version 1 of this layout).
pub const MAGIC: &[u8; 4] = b"AMS1";
/// How far a datagram's stamp may be from the receiver's clock. Outside it a datagram is
/// stale: a replay of an old message, or a sender whose clock is off by more than this.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(30);
/// Largest datagram accepted (a certificate of at most 4 KiB plus a foca packet).
pub const MAX_DATAGRAM: usize = 8 * 1024;
/// Most runs of senders whose last stamp is remembered; past it the memory starts over, which
/// reopens nothing older than [`REPLAY_WINDOW`].
const MAX_SENDERS: usize = 4096;

/// Why a datagram was refused; [`Refusal::reason`] is its metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not this layout (truncated, wrong magic, lengths that do not add up).
    #[error("malformed membership datagram: {0}")]
    Malformed(&'static str),
    /// The certificate does not vouch for the sender (a client's, expired, unreadable).
    #[error("membership datagram: {0}")]
    Certificate(OriginError),
    /// A node of another mesh: its certificate is not from this mesh's CA.
    #[error("membership datagram from `{name}`, a node of another mesh")]
    Foreign {
        /// Its certificate's common name (or `a node`).
        name: String,
        /// Its certificate's fingerprint.
        fingerprint: String,
    },
    /// The sender's certificate is revoked.
    #[error("membership datagram from revoked node {0}")]
    Revoked(String),
    /// The signature does not verify (forged or altered).
    #[error("membership datagram from {0}: signature does not verify")]
    BadSignature(String),
    /// The stamp is outside the replay window.
    #[error("membership datagram from {0}: stamp {1} µs is outside the replay window")]
    Stale(String, u64),
    /// The stamp is not above the last one of this sender (a replay within the window).
    #[error("membership datagram from {0}: replayed (stamp not above the sender's last)")]
    Replayed(String),
}

impl Refusal {
    /// The `reason` label of `agentmesh_swim_dropped_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::Certificate(_) | Self::Foreign { .. } => "certificate",
            Self::Revoked(_) => "revoked",
            Self::BadSignature(_) => "bad_signature",
            Self::Stale(..) => "stale",
            Self::Replayed(_) => "replayed",
        }
    }
}

/// Why sealing failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The payload or certificate does not fit the layout.
    #[error("membership payload too large ({0} bytes)")]
    TooLarge(usize),
    /// The key refused to sign.
    #[error("sign membership datagram: {0}")]
    Signing(#[from] OriginError),
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Seals this node's datagrams. Stamps only grow, even within one microsecond or when the
/// clock steps back, so a receiver can refuse any stamp it has seen.
#[derive(Debug)]
pub struct Sealer {
    signer: Arc<OriginSigner>,
    /// This run's random number.
    run: u64,
    last: Mutex<u64>,
}

impl Sealer {
    /// Seals with `signer` (the node's key and certificate).
    pub fn new(signer: Arc<OriginSigner>) -> Self {
        Self {
            signer,
            run: rand::RngExt::random(&mut rand::make_rng::<rand::rngs::StdRng>()),
            last: Mutex::new(0),
        }
    }

    /// The node id datagrams are sealed as.
    pub fn id(&self) -> &NodeId {
        self.signer.id()
    }

    fn stamp(&self) -> u64 {
        let mut last = self.last.lock_unpoisoned();
        *last = now_us().max(*last + 1);
        *last
    }

    /// `payload` in a signed datagram.
    pub fn seal(&self, payload: &[u8]) -> Result<Vec<u8>, SealError> {
        self.seal_at(payload, self.stamp())
    }

    /// [`Sealer::seal`] with a chosen stamp (tests make stale datagrams with it).
    pub fn seal_at(&self, payload: &[u8], stamp: u64) -> Result<Vec<u8>, SealError> {
        let cert = self.signer.certificate();
        let cert_len = u16::try_from(cert.len()).map_err(|_| SealError::TooLarge(cert.len()))?;
        let payload_len =
            u16::try_from(payload.len()).map_err(|_| SealError::TooLarge(payload.len()))?;
        let mut out = Vec::with_capacity(4 + 8 + 2 + cert.len() + 2 + payload.len() + 1 + 72);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.run.to_be_bytes());
        out.extend_from_slice(&stamp.to_be_bytes());
        out.extend_from_slice(&cert_len.to_be_bytes());
        out.extend_from_slice(cert);
        out.extend_from_slice(&payload_len.to_be_bytes());
        out.extend_from_slice(payload);
        let signature = self.signer.sign(&out)?;
        let sig_len =
            u8::try_from(signature.len()).map_err(|_| SealError::TooLarge(signature.len()))?;
        out.push(sig_len);
        out.extend_from_slice(&signature);
        if out.len() > MAX_DATAGRAM {
            return Err(SealError::TooLarge(out.len()));
        }
        Ok(out)
    }
}

/// A datagram that passed every check.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// Who sealed it (its certificate's key).
    pub sender: NodeId,
    /// The foca message inside.
    pub payload: &'a [u8],
}

/// Opens datagrams: checks certificate, revocation, signature and stamp.
#[derive(Debug)]
pub struct Opener {
    verifier: Arc<OriginVerifier>,
    /// The highest stamp accepted from each run of each sender.
    last: Mutex<HashMap<(NodeId, u64), u64>>,
}

/// Reads `n` bytes at `*at`, advancing it.
fn take<'a>(data: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Refusal> {
    let end = at
        .checked_add(n)
        .filter(|end| *end <= data.len())
        .ok_or(Refusal::Malformed("truncated"))?;
    let slice = &data[*at..end];
    *at = end;
    Ok(slice)
}

fn u64_at(data: &[u8], at: &mut usize) -> Result<u64, Refusal> {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(take(data, at, 8)?);
    Ok(u64::from_be_bytes(bytes))
}

fn u16_at(data: &[u8], at: &mut usize) -> Result<usize, Refusal> {
    let bytes = take(data, at, 2)?;
    Ok(usize::from(u16::from_be_bytes([bytes[0], bytes[1]])))
}

impl Opener {
    /// Opens with `verifier` (the mesh CA and its revocations; the memory uses the same one).
    pub fn new(verifier: Arc<OriginVerifier>) -> Self {
        Self {
            verifier,
            last: Mutex::default(),
        }
    }

    /// Checks `datagram`; the payload and its sender, or why it is refused.
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Result<Opened<'a>, Refusal> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(Refusal::Malformed("larger than 8 KiB"));
        }
        let mut at = 0;
        if take(datagram, &mut at, 4)? != MAGIC {
            return Err(Refusal::Malformed("not a membership datagram (magic)"));
        }
        let run = u64_at(datagram, &mut at)?;
        let stamp = u64_at(datagram, &mut at)?;
        let cert_len = u16_at(datagram, &mut at)?;
        let cert = take(datagram, &mut at, cert_len)?;
        let payload_len = u16_at(datagram, &mut at)?;
        let payload = take(datagram, &mut at, payload_len)?;
        let signed = &datagram[..at];
        let sig_len = usize::from(take(datagram, &mut at, 1)?[0]);
        let signature = take(datagram, &mut at, sig_len)?;
        if at != datagram.len() {
            return Err(Refusal::Malformed("trailing bytes"));
        }

        let sender = self.verifier.learn(cert).map_err(|e| match e {
            OriginError::NotFromCa(_) => match CertIdentity::from_der(cert) {
                Ok(presented) => Refusal::Foreign {
                    name: presented.common_name.unwrap_or_else(|| "a node".into()),
                    fingerprint: presented.fingerprint,
                },
                Err(_) => Refusal::Certificate(e),
            },
            other => Refusal::Certificate(other),
        })?;
        let short = sender.short().to_owned();
        if self.verifier.revoked().contains(&sender) {
            return Err(Refusal::Revoked(short));
        }
        self.verifier
            .verify(&sender, stamp / 1_000_000, signed, signature)
            .map_err(|e| match e {
                OriginError::BadSignature(_) => Refusal::BadSignature(short.clone()),
                other => Refusal::Certificate(other),
            })?;
        // Only a signed stamp moves the sender's mark, so a forger cannot push it ahead.
        let window = u64::try_from(REPLAY_WINDOW.as_micros()).unwrap_or(u64::MAX);
        if now_us().abs_diff(stamp) > window {
            return Err(Refusal::Stale(short, stamp));
        }
        let mut last = self.last.lock_unpoisoned();
        let key = (sender, run);
        if last.get(&key).is_some_and(|seen| stamp <= *seen) {
            return Err(Refusal::Replayed(short));
        }
        if last.len() >= MAX_SENDERS && !last.contains_key(&key) {
            last.clear();
        }
        last.insert(key.clone(), stamp);
        let sender = key.0;
        Ok(Opened { sender, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_identity::{CertRole, MeshTls, TlsFiles};

    fn self_certified() -> (Sealer, Opener) {
        let signer = Arc::new(OriginSigner::generate().expect("key"));
        (
            Sealer::new(signer),
            Opener::new(Arc::new(OriginVerifier::self_certified())),
        )
    }

    #[test]
    fn a_sealed_datagram_opens_once_and_names_its_sender() {
        let (sealer, opener) = self_certified();
        let datagram = sealer.seal(b"ping").expect("seal");
        let opened = opener.open(&datagram).expect("open");
        assert_eq!(opened.sender, *sealer.id());
        assert_eq!(opened.payload, b"ping");
        assert_eq!(
            opener.open(&datagram).map(|_| ()),
            Err(Refusal::Replayed(sealer.id().short().to_owned()))
        );
        // The next datagram of the same sender opens: stamps only grow.
        assert!(opener.open(&sealer.seal(b"ack").expect("seal")).is_ok());
        // A restarted sender (a new run) whose clock is now behind is no replay.
        let restarted = Sealer {
            run: sealer.run.wrapping_add(1),
            ..Sealer::new(sealer.signer.clone())
        };
        let behind = now_us() - 1_000_000;
        assert!(
            opener
                .open(&restarted.seal_at(b"ping", behind).expect("seal"))
                .is_ok()
        );
    }

    #[test]
    fn an_altered_datagram_is_refused() {
        let (sealer, opener) = self_certified();
        let mut datagram = sealer.seal(b"member alive").expect("seal");
        let at = datagram.len() - 80;
        datagram[at] ^= 1;
        let refused = opener.open(&datagram).expect_err("altered");
        assert_eq!(refused.reason(), "bad_signature", "{refused}");
    }

    #[test]
    fn a_stale_datagram_is_refused() {
        let (sealer, opener) = self_certified();
        let old = now_us() - 2 * u64::try_from(REPLAY_WINDOW.as_micros()).expect("fits");
        let datagram = sealer.seal_at(b"ping", old).expect("seal");
        assert_eq!(opener.open(&datagram).expect_err("stale").reason(), "stale");
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let (sealer, opener) = self_certified();
        let datagram = sealer.seal(b"ping").expect("seal");
        for len in 0..datagram.len() {
            let refused = opener.open(&datagram[..len]).expect_err("truncated");
            assert!(
                matches!(refused, Refusal::Malformed(_) | Refusal::Certificate(_)),
                "{len}: {refused}"
            );
        }
        let mut longer = datagram.clone();
        longer.push(0);
        assert_eq!(
            opener.open(&longer).expect_err("trailing").reason(),
            "malformed"
        );
    }

    /// Issue 17: a datagram signed by a key the mesh CA never certified (another mesh's node,
    /// or a self-made certificate) changes nothing.
    #[test]
    fn a_key_outside_the_mesh_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = mesh_ca(dir.path(), "mesh");
        let other = mesh_ca(dir.path(), "other");
        let opener = Opener::new(Arc::new(ca.verifier()));
        let member = Sealer::new(Arc::new(ca.node_signer("alpha", CertRole::Node)));
        assert!(opener.open(&member.seal(b"x").expect("seal")).is_ok());
        let foreign = Sealer::new(Arc::new(other.node_signer("mallory", CertRole::Node)));
        let refused = opener
            .open(&foreign.seal(b"x").expect("seal"))
            .expect_err("foreign");
        assert_eq!(refused.reason(), "certificate", "{refused}");
        let stranger = Sealer::new(Arc::new(OriginSigner::generate().expect("key")));
        let refused = opener
            .open(&stranger.seal(b"x").expect("seal"))
            .expect_err("self-made");
        assert_eq!(refused.reason(), "certificate", "{refused}");
        let client = Sealer::new(Arc::new(ca.node_signer("cli", CertRole::Client)));
        let refused = opener
            .open(&client.seal(b"x").expect("seal"))
            .expect_err("client");
        assert_eq!(refused.reason(), "certificate", "{refused}");
    }

    /// A mesh CA in `dir/name` that issues node and client certificates.
    struct TestCa {
        dir: std::path::PathBuf,
    }

    fn mesh_ca(dir: &std::path::Path, name: &str) -> TestCa {
        let dir = dir.join(name);
        mesh_identity::ca::ca_init(&dir).expect("ca");
        TestCa { dir }
    }

    impl TestCa {
        fn tls(&self, name: &str, role: CertRole) -> MeshTls {
            let (cert, key) = mesh_identity::ca::issue(&self.dir, name, &[], role).expect("issue");
            MeshTls::load(&TlsFiles {
                ca: self.dir.join(mesh_identity::ca::CA_CERT_FILE),
                cert,
                key,
            })
            .expect("load")
        }

        fn verifier(&self) -> OriginVerifier {
            self.tls("verifier", CertRole::Node)
                .origin_verifier()
                .expect("verifier")
        }

        fn node_signer(&self, name: &str, role: CertRole) -> OriginSigner {
            self.tls(name, role).origin_signer().expect("signer")
        }
    }
}
