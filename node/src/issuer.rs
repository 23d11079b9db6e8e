//! The issuer: redeems join tokens for certificates on a node that holds the mesh CA's key
//! (`tls.ca_key`, or a zero-config node's own CA).
//!
//! A token is checked without any list of tokens: its MAC is keyed by a key derived from the CA
//! key (see `mesh_join::token`), so nothing secret is stored here. What is stored is how often
//! each token id has been redeemed, in the local tree `join_redemptions` (never replicated: a
//! token names one issuer), until the token expires; so a token is good for its `uses` devices
//! and no more. The certificate gets the token's role and the name the joiner asks for; only the
//! public key comes from the CSR. A node certificate is not issued for a name this node or a live
//! member holds ([`PeerTable::holder_of`]): its holder's peers would refuse the newcomer anyway.
//! Every certificate it hands out is first recorded in the CA's dir (`mesh_cert::issued`), so
//! `mesh-cli ca certs` lists it and `ca revoke` finds it by name.
//!
//! Attempts are limited where they cost something, never before: a secret's MAC is checked
//! first (an HMAC, cheaper than keeping count), so callers without a genuine token cannot spend
//! the budget a real join needs. Genuine attempts are limited per caller address and over all
//! callers (each costs a signature and a disk write); refused forgeries are limited per address
//! too, apart from genuine ones, only so that a flood of them fills no log.
//!
//! It must not speak protobuf (that is `rpc::join`) or decide who may call it (every caller may:
//! the token is the credential).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use mesh_cert::{CertRole, TlsError, ca::CaSigner};
use mesh_domain::text::{LineBreaks, escape_controls};
use mesh_join::token::{MAX_CSR_BYTES, MAX_SECRET_BYTES, Secret, TokenError, TokenKey, unix_now};

use crate::{
    metrics::{labels, metrics},
    peers::{NameTaken, PeerTable},
    storage::{self, Store, StoreError, Write},
};

/// The local tree counting redemptions per token id.
const TREE: &str = "join_redemptions";
/// Most attempts with a genuine token (its MAC checks) per [`RATE_WINDOW`], over all callers:
/// each costs a signature and a disk write. A token's MAC cannot be guessed, so only holders of
/// a real (perhaps used-up or expired) token can spend it.
pub(crate) const MAX_ATTEMPTS: u32 = 30;
/// Most attempts with a genuine token per [`RATE_WINDOW`] from one caller address (an IPv6
/// caller's /64): one holder of a leaked token cannot spend [`MAX_ATTEMPTS`] alone.
pub(crate) const MAX_ATTEMPTS_PER_ADDRESS: u32 = 10;
/// Most refused forgeries (a secret that is malformed or whose MAC does not check) per
/// [`RATE_WINDOW`] from one caller address that are answered and logged as such; beyond, they
/// are refused as `Busy`, logged at debug only. They never count against a genuine token.
pub(crate) const MAX_FORGERIES_PER_ADDRESS: u32 = 30;
/// The window the limits count over.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Most caller addresses counted at once; when full, the one counted longest is forgotten
/// (which only ever lets that address try again sooner).
const MAX_ADDRESSES: usize = 4096;

/// Why a redemption was refused.
#[derive(Debug, thiserror::Error)]
pub enum RedeemError {
    /// The secret cannot be read.
    #[error("{0}")]
    Malformed(TokenError),
    /// The secret was not made with this CA's key.
    #[error("{0}")]
    Forged(TokenError),
    /// The token's time is up.
    #[error("this join token expired {ago} s ago; create a new one with `mesh-cli token create`")]
    Expired {
        /// Seconds since it expired.
        ago: u64,
    },
    /// Every use of the token has been redeemed.
    #[error(
        "this join token has already been used ({uses} of {uses} uses); create a new one with `mesh-cli token create`"
    )]
    UsedUp {
        /// How many uses it had.
        uses: u32,
    },
    /// The name or the CSR is not acceptable.
    #[error("{0}")]
    BadRequest(String),
    /// A node certificate for a name a live node holds.
    #[error(
        "cannot issue a node certificate for `{}`: {taken}. Join under another name (--name), or stop that node (and revoke its certificate with `mesh-cli ca revoke` if it is gone for good) first",
        taken.name
    )]
    NameInUse {
        /// Who holds the name.
        taken: NameTaken,
    },
    /// Too many attempts in the last minute, from this caller or over all.
    #[error("too many join attempts in the last minute; try again shortly")]
    Busy,
    /// The redemption count could not be kept.
    #[error("cannot record the redemption: {0}")]
    Store(#[from] StoreError),
    /// The CA's record of issued certificates could not be kept (`<CA dir>/issued`).
    #[error("the issuer cannot record the certificate it would issue: {0}")]
    Record(TlsError),
}

impl RedeemError {
    /// The metric label of this refusal.
    fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) | Self::BadRequest(_) => "malformed",
            Self::NameInUse { .. } => "name_in_use",
            Self::Forged(_) => "forged",
            Self::Expired { .. } => "expired",
            Self::UsedUp { .. } => "used_up",
            Self::Busy => "busy",
            Self::Store(_) | Self::Record(_) => "store",
        }
    }
}

/// A certificate issued for a token.
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its role (the token's).
    pub role: CertRole,
}

/// Counts attempts in fixed windows.
#[derive(Debug, Clone, Copy)]
struct RateWindow {
    start: Instant,
    attempts: u32,
}

impl RateWindow {
    fn new(now: Instant) -> Self {
        Self {
            start: now,
            attempts: 0,
        }
    }

    /// Whether one more attempt at `now` fits in the window under `limit`.
    fn admit(&mut self, now: Instant, limit: u32) -> bool {
        if now.duration_since(self.start) >= RATE_WINDOW {
            *self = Self::new(now);
        }
        self.attempts = self.attempts.saturating_add(1);
        self.attempts <= limit
    }
}

/// What a caller sent, as the limits tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// A secret whose MAC checks.
    Genuine,
    /// A malformed secret, or one whose MAC does not check.
    Forged,
}

/// One caller address's windows, genuine and forged attempts apart.
#[derive(Debug, Clone, Copy)]
struct AddressWindows {
    genuine: RateWindow,
    forged: RateWindow,
}

/// The limits on redemption attempts (see the module docs).
#[derive(Debug)]
struct Limits {
    /// Genuine attempts over all callers.
    genuine: RateWindow,
    /// Per caller address (an IPv6 caller's /64); at most [`MAX_ADDRESSES`].
    by_address: HashMap<IpAddr, AddressWindows>,
}

impl Limits {
    fn new(now: Instant) -> Self {
        Self {
            genuine: RateWindow::new(now),
            by_address: HashMap::new(),
        }
    }

    /// Whether one more `attempt` from `from` (`None`: an address the transport did not say)
    /// fits at `now`. A genuine one is counted against the global budget only once its
    /// address admitted it, so one address over its limit spends nobody else's.
    fn admit(&mut self, from: Option<IpAddr>, attempt: Attempt, now: Instant) -> bool {
        let key = from.map_or(IpAddr::from([0, 0, 0, 0]), address_key);
        if !self.by_address.contains_key(&key) && self.by_address.len() >= MAX_ADDRESSES {
            self.by_address.retain(|_, w| {
                now.duration_since(w.genuine.start.max(w.forged.start)) < RATE_WINDOW
            });
            if self.by_address.len() >= MAX_ADDRESSES
                && let Some(oldest) = self
                    .by_address
                    .iter()
                    .min_by_key(|(_, w)| w.genuine.start.max(w.forged.start))
                    .map(|(ip, _)| *ip)
            {
                self.by_address.remove(&oldest);
            }
        }
        let windows = self.by_address.entry(key).or_insert(AddressWindows {
            genuine: RateWindow::new(now),
            forged: RateWindow::new(now),
        });
        match attempt {
            Attempt::Forged => windows.forged.admit(now, MAX_FORGERIES_PER_ADDRESS),
            Attempt::Genuine => {
                windows.genuine.admit(now, MAX_ATTEMPTS_PER_ADDRESS)
                    && self.genuine.admit(now, MAX_ATTEMPTS)
            }
        }
    }
}

/// The key an address is counted under: itself, or for IPv6 its /64 (one host usually holds a
/// whole /64, so counting its addresses apart would give it 2^64 budgets).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::from(octets)
            }
        },
    }
}

/// Redeems join tokens for certificates.
pub(crate) struct Issuer {
    ca: CaSigner,
    key: TokenKey,
    store: Arc<dyn Store>,
    /// Who holds which name (this node and its live peers).
    names: Arc<PeerTable>,
    /// One redemption at a time: reading a token's count and raising it are one step.
    redeeming: tokio::sync::Mutex<()>,
    /// How many attempts each caller, and all together, made lately.
    limits: std::sync::Mutex<Limits>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// An issuer signing with `ca`, counting redemptions in `store`, refusing node names that
    /// `names` says are held.
    pub(crate) fn new(ca: CaSigner, store: Arc<dyn Store>, names: Arc<PeerTable>) -> Self {
        let key = TokenKey::of(&ca);
        Self {
            ca,
            key,
            store,
            names,
            redeeming: tokio::sync::Mutex::new(()),
            limits: std::sync::Mutex::new(Limits::new(Instant::now())),
        }
    }

    /// The CA certificate, PEM.
    pub(crate) fn ca_pem(&self) -> &str {
        self.ca.ca_pem()
    }

    /// Redeems `secret` for a certificate named `name` for the key of `csr_pem`, now, for a
    /// caller at `from`.
    pub(crate) async fn redeem(
        &self,
        secret: &str,
        name: &str,
        csr_pem: &str,
        from: Option<IpAddr>,
    ) -> Result<Issued, RedeemError> {
        let result = self
            .redeem_at(secret, name, csr_pem, from, unix_now(), Instant::now())
            .await;
        // The name is the caller's, unchecked when the secret is refused: escaped, so a name
        // with a line break cannot write a line of its own into the log.
        let name = escape_controls(name, LineBreaks::Escape);
        let outcome = match &result {
            Ok(issued) => {
                tracing::info!(%name, role = %issued.role, ?from, "issued a certificate for a join token");
                "issued"
            }
            Err(RedeemError::Busy) => {
                tracing::debug!(%name, ?from, "refused a join token: too many attempts");
                "busy"
            }
            Err(e) => {
                let error = e.to_string();
                let error = escape_controls(&error, LineBreaks::Escape);
                tracing::warn!(%name, ?from, %error, "refused a join token");
                e.reason()
            }
        };
        metrics()
            .join_redemptions
            .get_or_create(&labels(&[("outcome", outcome)]))
            .inc();
        result
    }

    /// [`Issuer::redeem`] at Unix second `now` (and `instant`, for the limits).
    async fn redeem_at(
        &self,
        secret: &str,
        name: &str,
        csr_pem: &str,
        from: Option<IpAddr>,
        now: u64,
        instant: Instant,
    ) -> Result<Issued, RedeemError> {
        let admit = |attempt| match self.limits.lock() {
            Ok(mut limits) => limits.admit(from, attempt, instant),
            Err(poisoned) => poisoned.into_inner().admit(from, attempt, instant),
        };
        let secret = match self.genuine(secret) {
            Ok(secret) => secret,
            Err(_) if !admit(Attempt::Forged) => return Err(RedeemError::Busy),
            Err(e) => return Err(e),
        };
        if !admit(Attempt::Genuine) {
            return Err(RedeemError::Busy);
        }
        let claims = &secret.claims;
        if now > claims.expires {
            return Err(RedeemError::Expired {
                ago: now - claims.expires,
            });
        }
        if csr_pem.len() > MAX_CSR_BYTES {
            return Err(RedeemError::BadRequest(format!(
                "csr_pem: {} bytes, more than {MAX_CSR_BYTES}",
                csr_pem.len()
            )));
        }
        if claims.role == CertRole::Node
            && let Some(taken) = self.names.holder_of(name)
        {
            return Err(RedeemError::NameInUse { taken });
        }
        // Signed before the use is counted, so a bad name or CSR does not use the token up.
        let cert_pem = self
            .ca
            .sign_csr(csr_pem, name, claims.role)
            .map_err(|e| match e {
                TlsError::BadName(_) => RedeemError::BadRequest(format!("name: {e}")),
                e => RedeemError::BadRequest(format!("csr_pem: {e}")),
            })?;
        // Recorded before the use is counted, so no certificate leaves that `mesh-cli ca
        // certs` cannot list; forgotten again when the token turns out to be used up.
        let id = self.ca.record(&cert_pem).map_err(RedeemError::Record)?;
        if let Err(e) = self.count_use(&secret, now).await {
            if let Err(forget) = self.ca.forget(&id) {
                tracing::warn!(error = %forget, "drop the record of a certificate not handed out");
            }
            return Err(e);
        }
        Ok(Issued {
            cert_pem,
            role: claims.role,
        })
    }

    /// The secret in `text`, if it is well-formed and its MAC checks.
    fn genuine(&self, text: &str) -> Result<Secret, RedeemError> {
        if text.len() > MAX_SECRET_BYTES {
            return Err(RedeemError::Malformed(TokenError::Malformed(format!(
                "secret: {} bytes, more than {MAX_SECRET_BYTES}",
                text.len()
            ))));
        }
        let secret: Secret = text.parse().map_err(RedeemError::Malformed)?;
        self.key
            .check(self.ca.fingerprint(), &secret)
            .map_err(RedeemError::Forged)?;
        Ok(secret)
    }

    /// Counts one redemption of `secret`, refusing it when its uses are gone; forgets tokens
    /// that have expired, so the tree holds only live ones.
    async fn count_use(&self, secret: &Secret, now: u64) -> Result<(), RedeemError> {
        let _one_at_a_time = self.redeeming.lock().await;
        let claims = &secret.claims;
        let used = self
            .store
            .get(TREE, claims.id.as_bytes())?
            .and_then(|value| value.get(..4).map(|b| [b[0], b[1], b[2], b[3]]))
            .map_or(0, u32::from_be_bytes);
        if used >= claims.uses {
            return Err(RedeemError::UsedUp { uses: claims.uses });
        }
        let mut value = (used + 1).to_be_bytes().to_vec();
        value.extend_from_slice(&claims.expires.to_be_bytes());
        let mut writes = vec![Write::Put(
            TREE.into(),
            claims.id.as_bytes().to_vec(),
            value,
        )];
        for entry in self.store.scan_prefix(TREE, b"") {
            let (id, value) = entry?;
            let expires = value
                .get(4..12)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_be_bytes);
            if expires < now && id != claims.id.as_bytes() {
                writes.push(Write::Delete(TREE.into(), id));
            }
        }
        self.store.commit(writes)?;
        // Durable before the certificate leaves: a crash must not give a use back.
        storage::flush(&self.store).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_cert::ca::{CA_CERT_FILE, CA_KEY_FILE, KeyType, ca_init, new_key_and_csr};
    use mesh_join::token::create_token;

    use mesh_domain::NodeId;

    use crate::storage::SledStore;

    struct Fixture {
        _dir: tempfile::TempDir,
        issuer: Issuer,
        names: Arc<PeerTable>,
        store: Arc<dyn Store>,
        ca_dir: std::path::PathBuf,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_dir = dir.path().join("ca");
        ca_init(&ca_dir).expect("ca");
        let ca =
            CaSigner::load(&ca_dir.join(CA_CERT_FILE), &ca_dir.join(CA_KEY_FILE)).expect("load");
        let db = sled::Config::new().temporary(true).open().expect("sled");
        let store: Arc<dyn Store> = Arc::new(SledStore::new(db));
        let me = NodeId::from_spki_der(b"issuer");
        let names = Arc::new(PeerTable::for_node(me, "issuer".into()));
        Fixture {
            issuer: Issuer::new(ca, store.clone(), names.clone()),
            names,
            store,
            ca_dir,
            _dir: dir,
        }
    }

    fn token(f: &Fixture, role: CertRole, uses: u32) -> Secret {
        let ca = CaSigner::load(&f.ca_dir.join(CA_CERT_FILE), &f.ca_dir.join(CA_KEY_FILE))
            .expect("load");
        create_token(&ca, role, Duration::from_secs(600), uses, "h:1")
            .expect("token")
            .secret
    }

    fn csr(name: &str) -> String {
        new_key_and_csr(name, KeyType::Ed25519).expect("csr").1
    }

    /// The caller address of the tests that do not vary it.
    const CALLER: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));

    impl Fixture {
        /// [`Issuer::redeem_at`] from [`CALLER`], now.
        async fn redeem_at(
            &self,
            secret: &str,
            name: &str,
            csr_pem: &str,
            now: u64,
        ) -> Result<Issued, RedeemError> {
            self.issuer
                .redeem_at(secret, name, csr_pem, CALLER, now, Instant::now())
                .await
        }
    }

    #[tokio::test]
    async fn a_token_is_good_for_its_uses_and_no_more() {
        let f = fixture();
        let secret = token(&f, CertRole::Node, 2).to_string();
        let now = unix_now();
        for name in ["one", "two"] {
            f.redeem_at(&secret, name, &csr(name), now)
                .await
                .expect("within its uses");
        }
        let err = f
            .redeem_at(&secret, "three", &csr("three"), now)
            .await
            .expect_err("used up");
        assert!(matches!(err, RedeemError::UsedUp { uses: 2 }), "{err}");
        assert!(err.to_string().contains("already been used"), "{err}");
        // The CA recorded what it handed out, and not the refused third.
        let names: Vec<String> = mesh_cert::issued::list(&f.ca_dir)
            .expect("records")
            .into_iter()
            .map(|cert| cert.name)
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"one".to_owned()) && names.contains(&"two".to_owned()));
    }

    #[tokio::test]
    async fn an_expired_or_foreign_token_is_refused_and_counts_nothing() {
        let f = fixture();
        let secret = token(&f, CertRole::Node, 1);
        let late = secret.claims.expires + 5;
        let err = f
            .redeem_at(&secret.to_string(), "a", &csr("a"), late)
            .await
            .expect_err("expired");
        assert!(err.to_string().contains("expired 5 s ago"), "{err}");
        let other = fixture();
        let foreign = token(&other, CertRole::Node, 1).to_string();
        let err = f
            .redeem_at(&foreign, "a", &csr("a"), unix_now())
            .await
            .expect_err("foreign");
        assert!(matches!(err, RedeemError::Forged(_)), "{err}");
        assert_eq!(f.store.scan_prefix(TREE, b"").count(), 0);
    }

    #[tokio::test]
    async fn a_bad_name_or_csr_does_not_use_the_token_up() {
        let f = fixture();
        let secret = token(&f, CertRole::Client, 1).to_string();
        let now = unix_now();
        for (name, csr_pem) in [
            ("../evil", csr("ok")),
            ("ok", "not a csr".to_owned()),
            ("ok", "x".repeat(MAX_CSR_BYTES + 1)),
        ] {
            let err = f
                .redeem_at(&secret, name, &csr_pem, now)
                .await
                .expect_err("bad request");
            assert!(matches!(err, RedeemError::BadRequest(_)), "{err}");
        }
        let issued = f
            .redeem_at(&secret, "ok", &csr("ok"), now)
            .await
            .expect("still unused");
        assert_eq!(issued.role, CertRole::Client, "the token's role");
    }

    /// Issue 26: a node certificate is not issued for a name this node or a live member
    /// holds, and the refusal does not use the token up; a client may share a node's name.
    #[tokio::test]
    async fn a_node_name_in_use_is_refused_and_the_token_kept() {
        let f = fixture();
        let mut member = crate::capabilities::test_support::test_capabilities().snapshot();
        member.name = "beta".into();
        member.id = NodeId::from_spki_der(b"beta");
        f.names
            .beat(
                member.clone(),
                "beta:7700",
                crate::discovery::PeerSource::Static,
            )
            .expect("free");
        let secret = token(&f, CertRole::Node, 1).to_string();
        let now = unix_now();
        for name in ["beta", "issuer"] {
            let err = f
                .redeem_at(&secret, name, &csr(name), now)
                .await
                .expect_err("in use");
            assert!(matches!(err, RedeemError::NameInUse { .. }), "{err}");
            let message = err.to_string();
            assert!(
                message.contains(&format!("`{name}`")) && message.contains("--name"),
                "{message}"
            );
        }
        let client = token(&f, CertRole::Client, 1).to_string();
        f.redeem_at(&client, "beta", &csr("beta"), now)
            .await
            .expect("a client is no member: the name is not in its way");
        // Once beta is down its name is free again (a reinstalled device joins as itself).
        f.names
            .mark(&member.id, mesh_domain::PeerState::Down, "SWIM");
        f.redeem_at(&secret, "beta", &csr("beta"), now)
            .await
            .expect("the token was not used up, and beta is down");
    }

    #[tokio::test]
    async fn expired_tokens_are_forgotten() {
        let f = fixture();
        let first = token(&f, CertRole::Node, 1);
        let second = token(&f, CertRole::Node, 1);
        f.issuer.count_use(&first, unix_now()).await.expect("first");
        // Counted once the first has expired: the first's count is dropped.
        f.issuer
            .count_use(&second, first.claims.expires + 1)
            .await
            .expect("second");
        let ids: Vec<_> = f
            .store
            .scan_prefix(TREE, b"")
            .filter_map(Result::ok)
            .map(|(id, _)| String::from_utf8_lossy(&id).into_owned())
            .collect();
        assert_eq!(ids, vec![second.claims.id.clone()]);
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().expect("an address"))
    }

    #[test]
    fn genuine_attempts_are_limited_per_address_and_over_all() {
        let start = Instant::now();
        let mut limits = Limits::new(start);
        let (a, b, c, d) = (
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            ip("10.0.0.3"),
            ip("10.0.0.4"),
        );
        for _ in 0..MAX_ATTEMPTS_PER_ADDRESS {
            assert!(limits.admit(a, Attempt::Genuine, start));
        }
        assert!(!limits.admit(a, Attempt::Genuine, start), "a's limit");
        for from in [b, c] {
            for _ in 0..MAX_ATTEMPTS_PER_ADDRESS {
                assert!(limits.admit(from, Attempt::Genuine, start), "{from:?}");
            }
        }
        // a's refused attempt spent nothing of the budget over all: a, b and c spent it.
        assert!(
            !limits.admit(d, Attempt::Genuine, start),
            "the budget over all"
        );
        let later = start + RATE_WINDOW;
        assert!(limits.admit(a, Attempt::Genuine, later), "a new window");
        assert!(limits.admit(d, Attempt::Genuine, later), "a new window");
    }

    /// Regression (issue 26): the one budget of 30 attempts a minute was spent before the MAC
    /// was checked, so 35 calls with a made-up secret locked a real join out for a minute.
    #[test]
    fn forgeries_never_spend_what_a_genuine_attempt_needs() {
        let start = Instant::now();
        let mut limits = Limits::new(start);
        let a = ip("10.0.0.1");
        let admitted = (0..100)
            .filter(|_| limits.admit(a, Attempt::Forged, start))
            .count();
        assert_eq!(admitted, MAX_FORGERIES_PER_ADDRESS as usize, "answered");
        assert!(
            limits.admit(a, Attempt::Genuine, start),
            "from the same address"
        );
        assert!(limits.admit(ip("10.0.0.2"), Attempt::Genuine, start));
    }

    #[test]
    fn an_ipv6_caller_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        let start = Instant::now();
        let mut limits = Limits::new(start);
        for host in 0..MAX_ATTEMPTS_PER_ADDRESS {
            assert!(limits.admit(ip(&format!("2001:db8::{host:x}")), Attempt::Genuine, start));
        }
        assert!(
            !limits.admit(ip("2001:db8::ffff:1"), Attempt::Genuine, start),
            "same /64"
        );
        assert!(
            limits.admit(ip("2001:db8:0:1::1"), Attempt::Genuine, start),
            "another /64"
        );
        assert_eq!(
            address_key("::ffff:10.0.0.1".parse().expect("ip")),
            "10.0.0.1".parse::<IpAddr>().expect("ip")
        );
    }

    #[test]
    fn the_addresses_counted_are_bounded() {
        let start = Instant::now();
        let mut limits = Limits::new(start);
        for n in 0..(MAX_ADDRESSES as u32 + 100) {
            limits.admit(Some(IpAddr::from(n.to_be_bytes())), Attempt::Forged, start);
        }
        assert_eq!(limits.by_address.len(), MAX_ADDRESSES);
        // Stale windows are dropped first.
        let later = start + RATE_WINDOW;
        limits.admit(ip("10.9.9.9"), Attempt::Forged, later);
        assert_eq!(limits.by_address.len(), 1);
    }

    /// Regression (issue 26), through the issuer: forged and malformed secrets from one address
    /// (past the point where they are only answered `Busy`) leave a real token from that
    /// address, and the count of its uses, untouched.
    #[tokio::test]
    async fn a_flood_of_forged_secrets_does_not_lock_out_a_real_join() {
        let f = fixture();
        let other = fixture();
        let forged = token(&other, CertRole::Node, 1).to_string();
        let now = unix_now();
        let mut busy = 0;
        for n in 0..35 {
            let secret = if n % 2 == 0 {
                forged.as_str()
            } else {
                "nonsense"
            };
            match f.redeem_at(secret, "x", &csr("x"), now).await {
                Err(RedeemError::Busy) => busy += 1,
                Err(RedeemError::Forged(_) | RedeemError::Malformed(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(busy, 35 - MAX_FORGERIES_PER_ADDRESS);
        assert_eq!(f.store.scan_prefix(TREE, b"").count(), 0);
        let secret = token(&f, CertRole::Node, 1).to_string();
        f.redeem_at(&secret, "real", &csr("real"), now)
            .await
            .expect("the real join");
    }
}
