//! The zero-config layout: where a node keeps its data by default, and the mesh CA a node
//! creates in `<data dir>/tls` on first start, with its own certificate and one for the local
//! `mesh-cli` (so `mesh-cli status` on the same machine just works).

use std::path::{Path, PathBuf};

use crate::{
    CertRole, TlsError,
    ca::{CA_CERT_FILE, CA_KEY_FILE, ca_init, issue},
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
///
/// A node that joined with a token holds the CA certificate without its key: it can issue
/// nothing, so it uses the certificate it joined with and makes no `mesh-cli` certificate.
pub fn bootstrap(data_dir: &Path, name: &str) -> Result<(TlsFiles, bool), TlsError> {
    let dir = tls_dir(data_dir);
    let files = files_of(&dir, name);
    let created = !files.ca.exists();
    if created {
        ca_init(&dir)?;
    }
    let has_key = ca_key(data_dir).exists();
    if !files.cert.exists() {
        if !has_key {
            return Err(TlsError::NoCaKey {
                dir,
                name: name.to_owned(),
            });
        }
        issue(&dir, name, &[], CertRole::Node)?;
    }
    if has_key && !cli_files(data_dir).cert.exists() {
        issue(&dir, CLI_CERT_NAME, &[], CertRole::Client)?;
    }
    Ok((files, created))
}

/// The zero-config CA key; a node whose data dir holds it is an issuer.
pub fn ca_key(data_dir: &Path) -> PathBuf {
    tls_dir(data_dir).join(CA_KEY_FILE)
}

/// The file in `<data_dir>/tls` naming the issuer a joined node got its certificate from.
const ISSUER_FILE: &str = "issuer.addr";

/// Remembers `issuer` (`host:port`) as the node's way back into the mesh after a join.
pub fn remember_issuer(data_dir: &Path, issuer: &str) -> Result<(), TlsError> {
    let path = tls_dir(data_dir).join(ISSUER_FILE);
    std::fs::write(&path, format!("{issuer}\n")).map_err(|e| TlsError::io("write", &path, e))
}

/// The issuer a joined node got its certificate from, which it dials at every start; `None`
/// when the node did not join with a token.
pub fn remembered_issuer(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(tls_dir(data_dir).join(ISSUER_FILE)).ok()?;
    Some(text.trim().to_owned()).filter(|addr| !addr.is_empty() && addr.len() <= 255)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_node_uses_its_certificate_and_refuses_another_name() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = tls_dir(data.path());
        // What a join leaves: the CA certificate without its key, and the node's files.
        let ca = tempfile::tempdir().expect("tempdir");
        ca_init(ca.path()).expect("ca");
        let (cert, key) = issue(ca.path(), "beta", &[], CertRole::Node).expect("issue");
        std::fs::create_dir_all(&dir).expect("dir");
        for (from, to) in [
            (ca.path().join(CA_CERT_FILE), dir.join(CA_CERT_FILE)),
            (cert, dir.join("beta.pem")),
            (key, dir.join("beta.key")),
        ] {
            std::fs::copy(from, to).expect("copy");
        }
        let (files, created) = bootstrap(data.path(), "beta").expect("joined files");
        assert!(!created);
        assert_eq!(files.cert, dir.join("beta.pem"));
        assert!(
            !cli_files(data.path()).cert.exists(),
            "no key to issue one with"
        );
        let err = bootstrap(data.path(), "gamma").expect_err("no certificate for gamma");
        assert!(matches!(err, TlsError::NoCaKey { .. }), "{err}");
        assert!(err.to_string().contains("--name"), "{err}");
    }

    #[test]
    fn the_issuer_is_remembered() {
        let data = tempfile::tempdir().expect("tempdir");
        assert_eq!(remembered_issuer(data.path()), None);
        std::fs::create_dir_all(tls_dir(data.path())).expect("dir");
        remember_issuer(data.path(), "10.0.0.7:7700").expect("remember");
        assert_eq!(
            remembered_issuer(data.path()).as_deref(),
            Some("10.0.0.7:7700")
        );
    }
}
