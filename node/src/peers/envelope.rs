//! The authenticated datagram every SWIM message travels in. A node seals each message with its
//! certificate, a stamp and a signature by its node key ([`Sealer`]); a receiver opens it
//! ([`Opener`]) in two steps, so that what is cheap to refuse is refused before any
//! cryptography:
//!
//! 1. [`Opener::screen`] checks what costs no cryptography: the magic and the lengths, the
//!    stamp within [`REPLAY_WINDOW`] of the receiver's clock, and, when the certificate is one
//!    already verified, that it is not revoked and that the stamp is above every stamp of this
//!    sender's run (the replay mark). A stale, replayed or malformed datagram costs a few
//!    comparisons and one lookup.
//! 2. [`Opener::verify`] does the rest: the certificate must chain to the mesh CA and be a
//!    node's (the same check as for a replicated record's origin, [`OriginVerifier::learn`]),
//!    must not be revoked, the signature must verify over the whole datagram, and only then
//!    does the stamp raise the sender's replay mark.
//!
//! So a forged, unsigned, altered, replayed or other-mesh datagram is refused with a reason (the
//! caller counts it) before membership reads a byte of it. Each datagram carries its sender's
//! certificate (~500 bytes), so a receiver needs no earlier contact to check it, and a node met
//! through gossip first can be checked at its first datagram. This module only seals and opens;
//! it decides nothing about membership, nor when a check runs (membership does).
//!
//! Layout (integers big-endian):
//! `"AMS1" | run u64 | stamp u64 (Unix µs) | cert_len u16 | cert | payload_len u16 | payload |
//! sig_len u8 | sig`; the signature covers everything before `sig_len`. `run` is drawn at
//! random when the node starts: stamps only grow within a run, so a restarted node (whose clock
//! may now be behind its last run's) is not taken for a replay of its last run.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_cert::{CertIdentity, OriginError, OriginSigner, OriginVerifier};
use mesh_domain::{NodeId, sync::MutexExt};

/// First bytes of every membership datagram (version 1 of this layout).
pub(crate) const MAGIC: &[u8; 4] = b"AMS1";
/// How far a datagram's stamp may be from the receiver's clock. Outside it a datagram is
/// stale: a replay of an old message, or a sender whose clock is off by more than this.
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(30);
/// Largest datagram accepted (a certificate of at most 4 KiB plus a foca packet).
pub(crate) const MAX_DATAGRAM: usize = 8 * 1024;
/// Most certificates whose senders' replay marks are remembered; past it the certificate whose
/// newest stamp is oldest is forgotten first (a sender silent for longer than
/// [`REPLAY_WINDOW`] needs no mark: its old datagrams are stale).
pub(crate) const MAX_SENDERS: usize = 4096;
/// Most runs remembered per certificate; past it the run whose stamp is oldest is forgotten.
/// A node draws a new run at every start, so one certificate holds several runs only across
/// restarts; and a holder of one certificate who makes up runs churns only its own marks.
pub(crate) const RUNS_PER_SENDER: usize = 4;

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
    /// The stamp is outside the replay window (checked before anything says who sent it).
    #[error("membership datagram stamped {0} µs, outside the replay window")]
    Stale(u64),
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
            Self::Stale(_) => "stale",
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

/// A datagram's parts, as its layout says (nothing checked but the lengths).
struct Parts<'a> {
    run: u64,
    stamp: u64,
    cert: &'a [u8],
    payload: &'a [u8],
    /// Everything the signature covers.
    signed: &'a [u8],
    signature: &'a [u8],
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

impl<'a> Parts<'a> {
    /// Splits `datagram` by its layout: magic, lengths, no trailing bytes.
    fn of(datagram: &'a [u8]) -> Result<Self, Refusal> {
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
        Ok(Self {
            run,
            stamp,
            cert,
            payload,
            signed,
            signature,
        })
    }

    /// Refuses a stamp outside the replay window around `now` (Unix µs).
    fn check_window(&self, now: u64) -> Result<(), Refusal> {
        let window = u64::try_from(REPLAY_WINDOW.as_micros()).unwrap_or(u64::MAX);
        if now.abs_diff(self.stamp) > window {
            return Err(Refusal::Stale(self.stamp));
        }
        Ok(())
    }
}

/// The replay marks of one certificate's sender: the highest stamp accepted from each of its
/// runs (at most [`RUNS_PER_SENDER`]).
#[derive(Debug)]
struct Marks {
    /// The node id the certificate speaks for (verified when the certificate was first met).
    id: NodeId,
    /// `(run, highest stamp)`.
    runs: Vec<(u64, u64)>,
}

impl Marks {
    /// The highest stamp accepted from `run`, if any.
    fn of(&self, run: u64) -> Option<u64> {
        self.runs.iter().find(|(r, _)| *r == run).map(|(_, s)| *s)
    }

    /// The newest stamp accepted from any run (what eviction orders by).
    fn newest(&self) -> u64 {
        self.runs.iter().map(|(_, s)| *s).max().unwrap_or(0)
    }

    /// Raises `run`'s mark to `stamp`, forgetting the oldest run when there is no room.
    fn raise(&mut self, run: u64, stamp: u64) {
        if let Some(mark) = self.runs.iter_mut().find(|(r, _)| *r == run) {
            mark.1 = stamp;
            return;
        }
        if self.runs.len() >= RUNS_PER_SENDER
            && let Some(oldest) = (0..self.runs.len()).min_by_key(|i| self.runs[*i].1)
        {
            self.runs.swap_remove(oldest);
        }
        self.runs.push((run, stamp));
    }
}

/// Opens datagrams: [`Opener::screen`] without cryptography, then [`Opener::verify`].
#[derive(Debug)]
pub struct Opener {
    verifier: Arc<OriginVerifier>,
    /// Replay marks by certificate (DER), for certificates that verified: looked up without
    /// hashing or parsing the certificate the way verifying it would.
    marks: Mutex<HashMap<Box<[u8]>, Marks>>,
    /// Datagrams [`Opener::verify`] checked with cryptography (certificate and signature).
    checks: AtomicU64,
}

impl Opener {
    /// Opens with `verifier` (the mesh CA and its revocations; the memory uses the same one).
    pub fn new(verifier: Arc<OriginVerifier>) -> Self {
        Self {
            verifier,
            marks: Mutex::default(),
            checks: AtomicU64::new(0),
        }
    }

    /// Checks `datagram` and opens it: [`Opener::screen`] then [`Opener::verify`].
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Result<Opened<'a>, Refusal> {
        self.screen(datagram)?;
        self.verify(datagram)
    }

    /// The checks that cost no cryptography: layout, stamp window, and for a certificate
    /// verified before, revocation and the replay mark. Returns the sender when its
    /// certificate is known (its datagrams may come from a member), `None` for a certificate
    /// met for the first time (or forgotten). A datagram that passes still needs
    /// [`Opener::verify`].
    pub fn screen(&self, datagram: &[u8]) -> Result<Option<NodeId>, Refusal> {
        let parts = Parts::of(datagram)?;
        parts.check_window(now_us())?;
        let marks = self.marks.lock_unpoisoned();
        let Some(known) = marks.get(parts.cert) else {
            return Ok(None);
        };
        if self.verifier.revoked().contains(&known.id) {
            return Err(Refusal::Revoked(known.id.short().to_owned()));
        }
        if known.of(parts.run).is_some_and(|seen| parts.stamp <= seen) {
            return Err(Refusal::Replayed(known.id.short().to_owned()));
        }
        Ok(Some(known.id.clone()))
    }

    /// The checks that cost cryptography, for a datagram [`Opener::screen`] let through: the
    /// certificate (chain, role, revocation), the signature, and then the replay mark, which
    /// only a verified stamp raises (so a forger cannot push a sender's mark ahead).
    pub fn verify<'a>(&self, datagram: &'a [u8]) -> Result<Opened<'a>, Refusal> {
        let parts = Parts::of(datagram)?;
        self.checks.fetch_add(1, Ordering::Relaxed);
        let cert = parts.cert;
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
            .verify(
                &sender,
                parts.stamp / 1_000_000,
                parts.signed,
                parts.signature,
            )
            .map_err(|e| match e {
                OriginError::BadSignature(_) => Refusal::BadSignature(short.clone()),
                other => Refusal::Certificate(other),
            })?;
        // Screened before it waited for this check; the wait is bounded, but not by this code.
        parts.check_window(now_us())?;
        let mut marks = self.marks.lock_unpoisoned();
        if let Some(known) = marks.get_mut(parts.cert) {
            // Two copies of one datagram may both pass the screen before either is verified.
            if known.of(parts.run).is_some_and(|seen| parts.stamp <= seen) {
                return Err(Refusal::Replayed(short));
            }
            known.raise(parts.run, parts.stamp);
        } else {
            if marks.len() >= MAX_SENDERS {
                forget_oldest(&mut marks);
            }
            marks.insert(
                parts.cert.into(),
                Marks {
                    id: sender.clone(),
                    runs: vec![(parts.run, parts.stamp)],
                },
            );
        }
        Ok(Opened {
            sender,
            payload: parts.payload,
        })
    }

    /// How many datagrams [`Opener::verify`] has checked with cryptography.
    pub fn signature_checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }
}

/// Forgets the certificate whose newest stamp is oldest (a scan, run only when a certificate
/// not yet known verifies while [`MAX_SENDERS`] are remembered: each costs a signature check
/// first, and only certificates of the mesh CA get that far).
fn forget_oldest(marks: &mut HashMap<Box<[u8]>, Marks>) {
    let oldest = marks
        .iter()
        .min_by_key(|(_, m)| m.newest())
        .map(|(cert, _)| cert.clone());
    if let Some(cert) = oldest {
        marks.remove(&cert);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_cert::CertRole;
    use mesh_tls::{MeshTls, TlsFiles};

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

    /// A datagram with `sealed`'s certificate, run and `stamp`, and a signature of random
    /// bytes: what anyone who saw one datagram of a node can make.
    fn forged_copy(sealed: &[u8], stamp: u64) -> Vec<u8> {
        let mut forged = sealed.to_vec();
        forged[12..20].copy_from_slice(&stamp.to_be_bytes());
        let sig_len = usize::from(forged[forged.len() - 65]);
        assert_eq!(sig_len, 64, "an Ed25519 signature");
        let at = forged.len() - 64;
        forged[at..].copy_from_slice(&[0x5a; 64]);
        forged
    }

    /// Issue 26: what is cheap to refuse is refused before any cryptography. A stale datagram
    /// (of an hour ago, with a real node's certificate and a made-up signature), a replay, and
    /// malformed ones cost no signature check; a fresh forged copy costs one, and is refused.
    #[test]
    fn stale_replayed_and_malformed_datagrams_cost_no_signature_check() {
        let (sealer, opener) = self_certified();
        let first = sealer.seal(b"ping").expect("seal");
        assert_eq!(opener.screen(&first), Ok(None), "a certificate not met yet");
        opener.verify(&first).expect("opens");
        let checks = opener.signature_checks();
        assert_eq!(checks, 1);

        let hour_ago = now_us() - 3_600_000_000;
        for (what, datagram, reason) in [
            ("stale", forged_copy(&first, hour_ago), "stale"),
            (
                "from the future",
                forged_copy(&first, now_us() + 3_600_000_000),
                "stale",
            ),
            ("replayed", first.clone(), "replayed"),
            (
                "below the mark",
                forged_copy(&first, now_us() - 1_000_000),
                "replayed",
            ),
            ("wrong magic", [b"XXXX", &first[4..]].concat(), "malformed"),
            ("truncated", first[..first.len() - 1].to_vec(), "malformed"),
        ] {
            let refused = opener.open(&datagram).expect_err(what);
            assert_eq!(refused.reason(), reason, "{what}: {refused}");
        }
        assert_eq!(
            opener.signature_checks(),
            checks,
            "no signature check for what the screen refuses"
        );

        let fresh = forged_copy(&first, now_us());
        assert_eq!(opener.screen(&fresh), Ok(Some(sealer.id().clone())));
        let refused = opener.verify(&fresh).expect_err("a made-up signature");
        assert_eq!(refused.reason(), "bad_signature");
        assert_eq!(opener.signature_checks(), checks + 1);
        // The forgery raised no mark: the sender's next datagram opens.
        assert!(opener.open(&sealer.seal(b"ack").expect("seal")).is_ok());
    }

    /// Issue 26: two copies of one datagram that both pass the screen before either is
    /// verified (it runs apart from the check) open once.
    #[test]
    fn two_copies_screened_before_either_is_verified_open_once() {
        let (sealer, opener) = self_certified();
        opener
            .open(&sealer.seal(b"hello").expect("seal"))
            .expect("known");
        let datagram = sealer.seal(b"ping").expect("seal");
        assert!(opener.screen(&datagram).is_ok());
        assert!(opener.screen(&datagram).is_ok());
        assert!(opener.verify(&datagram).is_ok());
        assert_eq!(
            opener.verify(&datagram).expect_err("twice").reason(),
            "replayed"
        );
    }

    /// Issue 26: past [`MAX_SENDERS`] the sender silent longest is forgotten, not every mark
    /// at once, so a live sender's datagrams stay refused as replays.
    #[test]
    fn past_the_cap_the_oldest_sender_is_forgotten_not_every_mark() {
        let (alpha, opener) = self_certified();
        let (beta, _) = self_certified();
        let seen = alpha.seal(b"ping").expect("seal");
        opener.open(&seen).expect("alpha");
        {
            let mut marks = opener.marks.lock_unpoisoned();
            let hour_ago = now_us() - 3_600_000_000;
            for n in 0..MAX_SENDERS - 1 {
                marks.insert(
                    format!("certificate {n}").into_bytes().into(),
                    Marks {
                        id: NodeId::from_spki_der(&n.to_be_bytes()),
                        runs: vec![(1, hour_ago + n as u64)],
                    },
                );
            }
            assert_eq!(marks.len(), MAX_SENDERS);
        }
        opener
            .open(&beta.seal(b"ping").expect("seal"))
            .expect("beta");
        let marks = opener.marks.lock_unpoisoned();
        assert_eq!(marks.len(), MAX_SENDERS);
        assert!(
            !marks.contains_key(&b"certificate 0"[..]),
            "the oldest is forgotten"
        );
        assert!(marks.contains_key(&b"certificate 1"[..]));
        drop(marks);
        assert_eq!(
            opener.open(&seen).expect_err("still a replay").reason(),
            "replayed"
        );
    }

    /// Issue 26: made-up runs of one certificate replace only that certificate's oldest run.
    #[test]
    fn a_certificate_keeps_its_newest_runs() {
        let mut marks = Marks {
            id: NodeId::from_spki_der(b"alpha"),
            runs: Vec::new(),
        };
        for run in 0..RUNS_PER_SENDER as u64 {
            marks.raise(run, 100 + run);
        }
        marks.raise(0, 200);
        marks.raise(99, 300);
        assert_eq!(marks.runs.len(), RUNS_PER_SENDER);
        assert_eq!(marks.of(1), None, "the oldest run is forgotten");
        assert_eq!((marks.of(0), marks.of(99)), (Some(200), Some(300)));
        assert_eq!(marks.newest(), 300);
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
        mesh_cert::ca::ca_init(&dir).expect("ca");
        TestCa { dir }
    }

    impl TestCa {
        fn tls(&self, name: &str, role: CertRole) -> MeshTls {
            let (cert, key) = mesh_cert::ca::issue(&self.dir, name, &[], role).expect("issue");
            MeshTls::load(&TlsFiles {
                ca: self.dir.join(mesh_cert::ca::CA_CERT_FILE),
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
