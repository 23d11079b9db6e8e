//! The issuer: redeems join tokens for certificates on a node that holds the mesh CA's key
//! (`tls.ca_key`, or a zero-config node's own CA).
//!
//! A token is checked without any list of tokens: its MAC is keyed by a key derived from the CA
//! key (see `mesh_identity::join`), so nothing secret is stored here. What is stored is how often
//! each token id has been redeemed, in the local tree `join_redemptions` (never replicated: a
//! token names one issuer), until the token expires; so a token is good for its `uses` devices
//! and no more. The certificate gets the token's role and the name the joiner asks for; only the
//! public key comes from the CSR. Every certificate it hands out is first recorded in the CA's
//! dir (`mesh_identity::issued`), so `mesh-cli ca certs` lists it and `ca revoke` finds it by name.
//!
//! It must not speak protobuf (that is `rpc::join`) or decide who may call it (every caller may:
//! the token is the credential).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use mesh_identity::{
    CertRole, TlsError,
    ca::CaSigner,
    join::{MAX_CSR_BYTES, MAX_SECRET_BYTES, Secret, TokenError, TokenKey, unix_now},
};

use crate::{
    metrics::{labels, metrics},
    storage::{self, Store, StoreError, Write},
};

/// The local tree counting redemptions per token id.
const TREE: &str = "join_redemptions";
/// Most redemption attempts per [`RATE_WINDOW`], over all callers: a token's MAC cannot be
/// guessed, so this only keeps a flood from costing signatures and disk writes.
pub const MAX_ATTEMPTS: u32 = 30;
/// The window [`MAX_ATTEMPTS`] counts over.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

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
    /// Too many attempts in the last minute.
    #[error(
        "too many join attempts in the last minute (at most {MAX_ATTEMPTS}); try again shortly"
    )]
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
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its role (the token's).
    pub role: CertRole,
}

/// Counts attempts in fixed windows.
#[derive(Debug)]
struct RateWindow {
    start: Instant,
    attempts: u32,
}

impl RateWindow {
    /// Whether one more attempt at `now` fits in the window.
    fn admit(&mut self, now: Instant) -> bool {
        if now.duration_since(self.start) >= RATE_WINDOW {
            self.start = now;
            self.attempts = 0;
        }
        self.attempts += 1;
        self.attempts <= MAX_ATTEMPTS
    }
}

/// Redeems join tokens for certificates.
pub struct Issuer {
    ca: CaSigner,
    key: TokenKey,
    store: Arc<dyn Store>,
    /// One redemption at a time: reading a token's count and raising it are one step.
    redeeming: tokio::sync::Mutex<()>,
    rate: std::sync::Mutex<RateWindow>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// An issuer signing with `ca`, counting redemptions in `store`.
    pub fn new(ca: CaSigner, store: Arc<dyn Store>) -> Self {
        let key = ca.token_key();
        Self {
            ca,
            key,
            store,
            redeeming: tokio::sync::Mutex::new(()),
            rate: std::sync::Mutex::new(RateWindow {
                start: Instant::now(),
                attempts: 0,
            }),
        }
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        self.ca.ca_pem()
    }

    /// Redeems `secret` for a certificate named `name` for the key of `csr_pem`, now.
    pub async fn redeem(
        &self,
        secret: &str,
        name: &str,
        csr_pem: &str,
    ) -> Result<Issued, RedeemError> {
        let result = self.redeem_at(secret, name, csr_pem, unix_now()).await;
        let outcome = match &result {
            Ok(issued) => {
                tracing::info!(%name, role = %issued.role, "issued a certificate for a join token");
                "issued"
            }
            Err(e) => {
                tracing::warn!(%name, error = %e, "refused a join token");
                e.reason()
            }
        };
        metrics()
            .join_redemptions
            .get_or_create(&labels(&[("outcome", outcome)]))
            .inc();
        result
    }

    /// [`Issuer::redeem`] at Unix second `now`.
    async fn redeem_at(
        &self,
        secret: &str,
        name: &str,
        csr_pem: &str,
        now: u64,
    ) -> Result<Issued, RedeemError> {
        let admitted = match self.rate.lock() {
            Ok(mut rate) => rate.admit(Instant::now()),
            Err(poisoned) => poisoned.into_inner().admit(Instant::now()),
        };
        if !admitted {
            return Err(RedeemError::Busy);
        }
        if secret.len() > MAX_SECRET_BYTES {
            return Err(RedeemError::Malformed(TokenError::Malformed(format!(
                "secret: {} bytes, more than {MAX_SECRET_BYTES}",
                secret.len()
            ))));
        }
        let secret: Secret = secret.parse().map_err(RedeemError::Malformed)?;
        self.key
            .check(self.ca.fingerprint(), &secret)
            .map_err(RedeemError::Forged)?;
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
    use mesh_identity::{
        ca::{CA_CERT_FILE, CA_KEY_FILE, ca_init, new_key_and_csr},
        join::create_token,
    };

    use crate::storage::SledStore;

    struct Fixture {
        _dir: tempfile::TempDir,
        issuer: Issuer,
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
        Fixture {
            issuer: Issuer::new(ca, store.clone()),
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
        new_key_and_csr(name).expect("csr").1
    }

    #[tokio::test]
    async fn a_token_is_good_for_its_uses_and_no_more() {
        let f = fixture();
        let secret = token(&f, CertRole::Node, 2).to_string();
        let now = unix_now();
        for name in ["one", "two"] {
            f.issuer
                .redeem_at(&secret, name, &csr(name), now)
                .await
                .expect("within its uses");
        }
        let err = f
            .issuer
            .redeem_at(&secret, "three", &csr("three"), now)
            .await
            .expect_err("used up");
        assert!(matches!(err, RedeemError::UsedUp { uses: 2 }), "{err}");
        assert!(err.to_string().contains("already been used"), "{err}");
        // The CA recorded what it handed out, and not the refused third.
        let names: Vec<String> = mesh_identity::issued::list(&f.ca_dir)
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
            .issuer
            .redeem_at(&secret.to_string(), "a", &csr("a"), late)
            .await
            .expect_err("expired");
        assert!(err.to_string().contains("expired 5 s ago"), "{err}");
        let other = fixture();
        let foreign = token(&other, CertRole::Node, 1).to_string();
        let err = f
            .issuer
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
                .issuer
                .redeem_at(&secret, name, &csr_pem, now)
                .await
                .expect_err("bad request");
            assert!(matches!(err, RedeemError::BadRequest(_)), "{err}");
        }
        let issued = f
            .issuer
            .redeem_at(&secret, "ok", &csr("ok"), now)
            .await
            .expect("still unused");
        assert_eq!(issued.role, CertRole::Client, "the token's role");
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

    #[test]
    fn attempts_are_capped_per_window() {
        let start = Instant::now();
        let mut rate = RateWindow { start, attempts: 0 };
        for _ in 0..MAX_ATTEMPTS {
            assert!(rate.admit(start));
        }
        assert!(!rate.admit(start + Duration::from_secs(59)));
        assert!(rate.admit(start + RATE_WINDOW), "a new window");
    }
}
