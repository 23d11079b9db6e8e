//! The mesh's own certificate authority: creating it (`mesh-cli ca init`), issuing node and
//! client certificates (`mesh-cli ca issue`), and the stable key of an `--insecure` node.
//!
//! Whoever holds the CA key can add devices to the mesh, so it is written readable by its owner
//! only, and nothing here ever overwrites key material.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::{
    CertRole, TlsError,
    cert::role_unit,
    origin::OriginSigner,
    pem::{read, write_new},
};

/// File names inside a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key; whoever holds it can add nodes to the mesh.
pub const CA_KEY_FILE: &str = "ca.key";

/// How long a new CA is valid.
const CA_VALIDITY_DAYS: i64 = 3650;
/// How long an issued node or client certificate is valid.
const CERT_VALIDITY_DAYS: i64 = 825;

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
    set_validity(&mut params, CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key)?;

    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    Ok((cert_path, key_path))
}

/// Issues `NAME.pem` / `NAME.key` in `dir`, signed by the CA in the same directory, for `role`
/// (the subject's OU). A node certificate is valid as server and client certificate, with SANs
/// `NAME`, `localhost`, `127.0.0.1`, `::1` and every extra `sans` entry (IP or DNS name); a
/// client certificate only as a client certificate. The key is Ed25519 (fast to sign and verify
/// the memory's records with).
pub fn issue(
    dir: &Path,
    name: &str,
    sans: &[String],
    role: CertRole,
) -> Result<(PathBuf, PathBuf), TlsError> {
    validate_cert_name(name)?;
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}.key"));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    let ca_pem = read(&dir.join(CA_CERT_FILE))?;
    let ca_key = KeyPair::from_pem(&read(&dir.join(CA_KEY_FILE))?).map_err(|e| TlsError::Pem {
        path: dir.join(CA_KEY_FILE),
        reason: e.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| TlsError::Pem {
        path: dir.join(CA_CERT_FILE),
        reason: e.to_string(),
    })?;

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
    set_validity(&mut params, CERT_VALIDITY_DAYS);
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let cert = params.signed_by(&key, &issuer)?;

    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    Ok((cert_path, key_path))
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

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "agentmesh");
    dn
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // Backdated an hour so a peer whose clock runs a little slow accepts it at once.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
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
    }
}
