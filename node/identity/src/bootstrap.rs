//! The zero-config layout: where a node keeps its data by default, and the mesh CA a node
//! creates in `<data dir>/tls` on first start, with its own certificate and one for the local
//! `mesh-cli` (so `mesh-cli status` on the same machine just works).

use std::path::{Path, PathBuf};

use crate::{
    CertRole, TlsError,
    ca::{CA_CERT_FILE, ca_init, issue},
    cert::CertIdentity,
    pem::{pem_certs, read},
    tls::TlsFiles,
};

/// The certificate a bootstrapped node issues for the local `mesh-cli`.
pub const CLI_CERT_NAME: &str = "mesh-cli";

/// The platform's data dir + `agentmesh` (e.g. `~/.local/share/agentmesh`); `None` where the
/// platform has none.
pub fn default_data_dir() -> Option<PathBuf> {
    dirs::data_dir().map(|dir| dir.join("agentmesh"))
}

/// The operator's own place for `mesh-cli`'s files: the platform's config dir + `agentmesh`
/// (e.g. `~/.config/agentmesh`), holding `ca.pem`, `mesh-cli.pem` and `mesh-cli.key` as
/// [`user_cli_files`] names them; `None` where the platform has none.
pub fn user_config_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|dir| dir.join("agentmesh"))
}

/// The files of `mesh-cli` in the operator's config dir (see [`user_config_dir`]).
pub fn user_cli_files(config_dir: &Path) -> TlsFiles {
    files_of(config_dir, CLI_CERT_NAME)
}

/// The directory of a node's zero-config CA.
pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

/// The files of `name` in a CA directory.
pub fn files_of(dir: &Path, name: &str) -> TlsFiles {
    TlsFiles {
        ca: dir.join(CA_CERT_FILE),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    }
}

/// The files of the local `mesh-cli` in a zero-config node's data dir.
pub fn cli_files(data_dir: &Path) -> TlsFiles {
    files_of(&tls_dir(data_dir), CLI_CERT_NAME)
}

/// The files of node `name` in its zero-config CA under `data_dir`, creating on first use the
/// CA, the node's certificate and the local `mesh-cli`'s certificate. The flag says whether the
/// CA was created just now (the node tells its operator how to add devices).
pub fn bootstrap(data_dir: &Path, name: &str) -> Result<(TlsFiles, bool), TlsError> {
    let dir = tls_dir(data_dir);
    let files = files_of(&dir, name);
    let created = !files.ca.exists();
    if created {
        ca_init(&dir)?;
    }
    if !files.cert.exists() {
        issue(&dir, name, &[], CertRole::Node)?;
    }
    let cli = cli_files(data_dir);
    if cli.cert.exists() && is_legacy(&cli.cert)? {
        // Made before certificates had roles: as a legacy certificate it would be capped by
        // both tier settings. It is this machine's own and nothing else knows its id, so it
        // is set aside and issued again, as a client.
        for path in [&cli.cert, &cli.key] {
            let mut aside = path.as_os_str().to_owned();
            aside.push(".legacy");
            std::fs::rename(path, &aside).map_err(|e| TlsError::io("set aside", path, e))?;
        }
    }
    if !cli.cert.exists() {
        issue(&dir, CLI_CERT_NAME, &[], CertRole::Client)?;
    }
    Ok((files, created))
}

/// Whether the certificate at `path` carries no role (issued before roles existed).
fn is_legacy(path: &Path) -> Result<bool, TlsError> {
    let certs = pem_certs(path, &read(path)?)?;
    let identity = CertIdentity::from_der(&certs[0]).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(identity.role.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CA_KEY_FILE;

    /// Regression: after the upgrade to certificate roles, a zero-config node kept the local
    /// `mesh-cli` certificate it had made before, which has no role, so the operator on the
    /// same machine was capped by both tier settings.
    #[test]
    fn a_local_cli_certificate_without_a_role_is_issued_again_as_a_client() {
        let dir = tempfile::tempdir().expect("tempdir");
        bootstrap(dir.path(), "alpha").expect("first start");
        let cli = cli_files(dir.path());
        // Replace it with one made the way it was before roles: no OU, both usages.
        let tls = tls_dir(dir.path());
        let ca_key = rcgen::KeyPair::from_pem(&read(&tls.join(CA_KEY_FILE)).expect("ca key"))
            .expect("ca key pem");
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&read(&cli.ca).expect("ca"), ca_key).expect("issuer");
        let mut params =
            rcgen::CertificateParams::new(vec![CLI_CERT_NAME.to_owned()]).expect("params");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().expect("key");
        let old = params.signed_by(&key, &issuer).expect("sign").pem();
        std::fs::write(&cli.cert, &old).expect("write cert");
        std::fs::write(&cli.key, key.serialize_pem()).expect("write key");
        assert!(is_legacy(&cli.cert).expect("read"));

        let (_, created) = bootstrap(dir.path(), "alpha").expect("second start");
        assert!(!created, "the CA is kept");
        assert!(!is_legacy(&cli.cert).expect("read"), "issued again");
        let aside = tls.join(format!("{CLI_CERT_NAME}.pem.legacy"));
        assert_eq!(
            read(&aside).expect("set aside"),
            old,
            "the old one is kept aside"
        );
        // A certificate with a role is left alone.
        let current = read(&cli.cert).expect("current");
        bootstrap(dir.path(), "alpha").expect("third start");
        assert_eq!(read(&cli.cert).expect("still"), current);
    }
}
