//! The mesh's own certificate authority: creating it (`mesh-cli ca init`), issuing node and
//! client certificates (`mesh-cli ca issue`), and the CA as a signer ([`CaSigner`]: of the
//! certificates join tokens are redeemed for, of revocations, and the key join tokens are
//! authenticated with).
//!
//! Whoever holds the CA key can add devices to the mesh, so it is written readable by its owner
//! only, and nothing here ever overwrites key material.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};

use sha2::{Digest, Sha256};

use crate::{
    CertRole, TlsError,
    cert::role_unit,
    pem::{pem_certs, read, write_new},
};

pub use crate::layout::{BACKDATED_S, CA_CERT_FILE, CA_KEY_FILE};

/// How long a new CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(3650 * 24 * 3600);
/// How long an issued node or client certificate is valid unless asked for less, and the most
/// it may be asked for.
pub const CERT_VALIDITY: Duration = Duration::from_secs(825 * 24 * 3600);

/// Creates a new mesh CA in `dir`: `ca.pem` (share it with every node) and `ca.key` (keep it
/// private). Refuses to overwrite an existing CA, since that would orphan every issued cert.
pub fn ca_init(dir: &Path) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    fs::create_dir_all(dir).map_err(|e| TlsError::io("create", dir, e))?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name("agentmesh CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_VALIDITY);
    let cert = params.self_signed(&key)?;

    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    Ok((cert_path, key_path))
}

/// The key algorithm of an issued certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyType {
    /// Ed25519: fast to sign and verify the memory's records with; the default.
    #[default]
    Ed25519,
    /// ECDSA P-256: for clients whose TLS offers no Ed25519 (grpcio, the C-core of gRPC, on
    /// which `grpcio-reflection` and other Python tools run).
    P256,
}

impl std::str::FromStr for KeyType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ed25519" => Ok(Self::Ed25519),
            "p256" => Ok(Self::P256),
            other => Err(format!("key type `{other}` is not ed25519 or p256")),
        }
    }
}

impl KeyType {
    /// A new key of this type, whose PEM (`serialize_pem`) every TLS stack reads.
    pub(crate) fn generate(self) -> Result<KeyPair, rcgen::Error> {
        match self {
            Self::Ed25519 => ed25519_pkcs8_v1(),
            Self::P256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        }
    }
}

/// The DER of an Ed25519 private key in PKCS#8 v1, the form of RFC 8410 section 7, up to the
/// 32-byte seed that follows it: `SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 },
/// OCTET STRING { OCTET STRING (32 bytes) } }`.
pub const ED25519_PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A new Ed25519 key serialized as PKCS#8 v1. ring (under rcgen) generates v2, with the public
/// key appended, which OpenSSL 3.0, Python's `ssl` and `cryptography`, and grpcio refuse to
/// read ("Could not read key"), so no curl, grpcurl or Python gRPC client could use a
/// certificate the mesh issued. ring reads both forms, so keys written as v2 before still load.
fn ed25519_pkcs8_v1() -> Result<KeyPair, rcgen::Error> {
    use ring::rand::SecureRandom;
    let mut der = Vec::with_capacity(ED25519_PKCS8_V1_PREFIX.len() + 32);
    der.extend_from_slice(&ED25519_PKCS8_V1_PREFIX);
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| rcgen::Error::RingUnspecified)?;
    der.extend_from_slice(&seed);
    KeyPair::from_pkcs8_der_and_sign_algo(&der.as_slice().into(), &rcgen::PKCS_ED25519)
}

/// How a certificate is issued: its key's algorithm and how long it is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssueOptions {
    /// The key's algorithm.
    pub key_type: KeyType,
    /// How long from now it is valid: 1 second to [`CERT_VALIDITY`] (the default). A short
    /// life suits a device lent for a day: nodes end its connections when it expires.
    pub validity: Duration,
}

impl Default for IssueOptions {
    fn default() -> Self {
        Self {
            key_type: KeyType::default(),
            validity: CERT_VALIDITY,
        }
    }
}

impl From<KeyType> for IssueOptions {
    fn from(key_type: KeyType) -> Self {
        Self {
            key_type,
            ..Self::default()
        }
    }
}

/// Issues `NAME.pem` / `NAME.key` in `dir`, signed by the CA in the same directory, for `role`
/// (the subject's OU; see `leaf_params` for names and usages; `sans` adds IPs or DNS names).
/// The key is Ed25519 (fast to sign and verify the memory's records with).
pub fn issue(
    dir: &Path,
    name: &str,
    sans: &[String],
    role: CertRole,
) -> Result<(PathBuf, PathBuf), TlsError> {
    issue_with(dir, name, sans, role, IssueOptions::default())
}

/// [`issue`] with a key of another type, or another validity.
pub fn issue_with(
    dir: &Path,
    name: &str,
    sans: &[String],
    role: CertRole,
    options: impl Into<IssueOptions>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}.key"));
    issue_at(dir, name, sans, role, options.into(), &cert_path, &key_path)?;
    Ok((cert_path, key_path))
}

/// [`issue`], writing the certificate and key to `cert_path` and `key_path` instead of the CA
/// directory (`mesh-cli ca issue --install` writes them into the operator's config dir).
pub fn issue_at(
    dir: &Path,
    name: &str,
    sans: &[String],
    role: CertRole,
    options: IssueOptions,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), TlsError> {
    validate_cert_name(name)?;
    if options.validity < Duration::from_secs(1) || options.validity > CERT_VALIDITY {
        return Err(TlsError::BadValidity(options.validity));
    }
    for path in [cert_path, key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.to_owned()));
        }
    }
    let ca = CaSigner::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE))?;
    let key = options.key_type.generate()?;
    let cert = leaf_params(name, sans, role, options.validity)?.signed_by(&key, &ca.issuer)?;

    // Recorded first: a certificate the CA cannot list again is not handed out.
    let id = ca.record(&cert.pem())?;
    let written = write_new(cert_path, cert.pem().as_bytes(), false)
        .and_then(|()| write_new(key_path, key.serialize_pem().as_bytes(), true));
    if written.is_err() {
        let _ = ca.forget(&id);
    }
    written
}

/// The mesh CA loaded for signing: its certificate and private key. A node configured with
/// `tls.ca_key` (an issuer) holds one to sign the certificates join tokens are redeemed for.
pub struct CaSigner {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM (what `Join.GetCa` answers).
    ca_pem: String,
    /// Hex SHA-256 of the CA certificate (DER): what a join token pins.
    fingerprint: String,
    /// The CA key, PKCS#8 DER: the input the join-token MAC key is derived from.
    key_der: Vec<u8>,
    /// The CA dir (the directory of its key), where what it issues is recorded
    /// ([`crate::issued`]).
    dir: PathBuf,
}

impl std::fmt::Debug for CaSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSigner")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl CaSigner {
    /// Reads the CA certificate and its key, checking that they belong together.
    pub fn load(ca_cert: &Path, ca_key: &Path) -> Result<Self, TlsError> {
        let ca_pem = read(ca_cert)?;
        let key = KeyPair::from_pem(&read(ca_key)?).map_err(|e| TlsError::Pem {
            path: ca_key.to_owned(),
            reason: e.to_string(),
        })?;
        // pem_certs refuses a file without a certificate, so there is a first one.
        let der = pem_certs(ca_cert, &ca_pem)?.swap_remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).map_err(|e| TlsError::Pem {
            path: ca_cert.to_owned(),
            reason: e.to_string(),
        })?;
        // A key that does not match the certificate would sign certificates nobody accepts.
        if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(TlsError::KeyMismatch {
                path: ca_key.to_owned(),
                reason: format!(
                    "it is not the key of the CA certificate {}",
                    ca_cert.display()
                ),
            });
        }
        let fingerprint = hex::encode(Sha256::digest(&der));
        let key_der = key.serialize_der();
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|e| TlsError::Pem {
            path: ca_cert.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            issuer,
            ca_pem,
            fingerprint,
            key_der,
            dir: ca_key
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_owned),
        })
    }

    /// Records `cert_pem`, which this CA signed, in its dir ([`crate::issued::record`]).
    pub fn record(&self, cert_pem: &str) -> Result<mesh_domain::NodeId, TlsError> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        crate::issued::record(&self.dir, cert_pem, now)
    }

    /// Drops the record of `id`: it was signed but never handed out.
    pub fn forget(&self, id: &mesh_domain::NodeId) -> Result<(), TlsError> {
        crate::issued::forget(&self.dir, id)
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Hex SHA-256 of the CA certificate (DER).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The CA key, PKCS#8 DER (revocations are signed with it).
    pub(crate) fn key_der(&self) -> &[u8] {
        &self.key_der
    }

    /// A key derived from the CA key (HKDF-SHA256, extracted with `salt`, which names what it is
    /// for): a secret only the CA's holders can make, such as the key join tokens are
    /// authenticated with, without the CA key itself leaving this type.
    pub fn derive_key(&self, salt: &[u8]) -> ring::hkdf::Prk {
        ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, salt).extract(&self.key_der)
    }

    /// Signs the public key of `csr_pem` as `name` in `role`. Only the key is taken from the
    /// request (after checking its signature, which proves the caller holds the key): subject,
    /// names and usages are ours, so a request cannot ask for more than `role` gives.
    pub fn sign_csr(&self, csr_pem: &str, name: &str, role: CertRole) -> Result<String, TlsError> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| TlsError::BadCsr(e.to_string()))?;
        let cert = leaf_params(name, &[], role, CERT_VALIDITY)?
            .signed_by(&csr.public_key, &self.issuer)?;
        Ok(cert.pem())
    }
}

/// A new key of `key_type` and a certificate signing request for it, PEM: what a joining device
/// sends (the key never leaves it).
pub fn new_key_and_csr(name: &str, key_type: KeyType) -> Result<(KeyPair, String), TlsError> {
    validate_cert_name(name)?;
    let key = key_type.generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(name);
    let csr = params.serialize_request(&key)?;
    Ok((key, csr.pem()?))
}

/// What the CA certifies for `name` in `role`: the subject (CN = name, OU = the role), the
/// names and the usages. A node certificate is valid as server and client certificate, with SANs
/// `NAME`, `localhost`, `127.0.0.1`, `::1` and every extra `sans` entry; a client certificate
/// only as a client certificate. It is valid for `validity` from now.
fn leaf_params(
    name: &str,
    sans: &[String],
    role: CertRole,
    validity: Duration,
) -> Result<CertificateParams, TlsError> {
    validate_cert_name(name)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(name);
    params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, role_unit(role));
    let mut all_sans: Vec<String> = vec![name.into(), "localhost".into(), "127.0.0.1".into()];
    all_sans.push("::1".into());
    all_sans.extend(sans.iter().cloned());
    all_sans.dedup();
    for san in &all_sans {
        let san = match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) if is_dns_name(san) => SanType::DnsName(
                san.clone()
                    .try_into()
                    .map_err(|_| TlsError::BadSan(san.clone()))?,
            ),
            Err(_) => return Err(TlsError::BadSan(san.clone())),
        };
        params.subject_alt_names.push(san);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match role {
        CertRole::Node => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        CertRole::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    set_validity(&mut params, validity);
    Ok(params)
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "agentmesh");
    dn
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::seconds(BACKDATED_S);
    params.not_after = now + validity;
}

fn validate_cert_name(name: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(TlsError::BadName(name.to_owned()))
    }
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'*')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_init_and_issue_refuse_to_overwrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("first init");
        assert!(matches!(ca_init(dir.path()), Err(TlsError::Exists(_))));
        issue(dir.path(), "alpha", &[], CertRole::Node).expect("first issue");
        assert!(matches!(
            issue(dir.path(), "alpha", &[], CertRole::Node),
            Err(TlsError::Exists(_))
        ));
    }

    #[test]
    fn bad_names_and_sans_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        assert!(matches!(
            issue(dir.path(), "../evil", &[], CertRole::Node),
            Err(TlsError::BadName(_))
        ));
        assert!(matches!(
            issue(dir.path(), "ok", &["bad san!".into()], CertRole::Node),
            Err(TlsError::BadSan(_))
        ));
        for validity in [Duration::ZERO, CERT_VALIDITY + Duration::from_secs(1)] {
            let options = IssueOptions {
                validity,
                ..IssueOptions::default()
            };
            let err = issue_with(dir.path(), "ok", &[], CertRole::Client, options)
                .expect_err("validity out of bounds");
            assert!(matches!(err, TlsError::BadValidity(_)), "{err}");
            assert!(err.to_string().contains("--ttl"), "{err}");
            assert!(!dir.path().join("ok.pem").exists(), "nothing written");
        }
    }
}
