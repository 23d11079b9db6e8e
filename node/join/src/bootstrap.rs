//! The zero-config layout: where a node keeps its data by default, the mesh CA a node creates
//! in `<data dir>/tls` on first start, with its own certificate and one for the local
//! `mesh-cli` (so `mesh-cli status` on the same machine just works), and the operator's own
//! place for `mesh-cli`'s files ([`user_config_dir`]) with the order `mesh-cli` looks for them
//! in ([`cli_file_places`]). It decides nothing about what a certificate may do.

use std::{
    fs,
    path::{Path, PathBuf},
};

use mesh_cert::{
    CertIdentity, CertRole, TlsError,
    ca::{CA_CERT_FILE, CA_KEY_FILE, IssueOptions, ca_init, issue, issue_at},
    pem::{pem_certs, read, write_new},
};
use mesh_tls::TlsFiles;

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

/// Where `mesh-cli` looks for its CA, certificate and key when neither flags nor `MESH_CA`,
/// `MESH_CERT` and `MESH_KEY` name them, first to last: the operator's config dir
/// ([`user_cli_files`], which `mesh-cli ca issue --role client --install` writes), then the
/// zero-config node's data dir of the same user ([`cli_files`]). The operator's own files come
/// first: they are the ones someone put there on purpose, for whichever mesh they chose.
pub fn cli_file_places() -> Vec<TlsFiles> {
    let config = user_config_dir().map(|dir| user_cli_files(&dir));
    let data = default_data_dir().map(|dir| cli_files(&dir));
    config.into_iter().chain(data).collect()
}

/// Issues a client certificate named `name` from the CA in `ca_dir` straight into the
/// operator's config dir `config_dir` as [`user_cli_files`] names them: the CA certificate,
/// `mesh-cli.pem` and `mesh-cli.key` (mode 0600, in a directory created with mode 0700).
/// Refuses to overwrite a certificate or key already there, or a `ca.pem` of another CA; checks
/// everything before it writes anything.
pub fn install_client(
    ca_dir: &Path,
    name: &str,
    config_dir: &Path,
    options: impl Into<IssueOptions>,
) -> Result<TlsFiles, TlsError> {
    let files = user_cli_files(config_dir);
    let ca_pem = read(&ca_dir.join(CA_CERT_FILE))?;
    for path in [&files.cert, &files.key] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    let keep_ca = match fs::read_to_string(&files.ca) {
        Ok(existing) if existing == ca_pem => true,
        Ok(_) => return Err(TlsError::Exists(files.ca.clone())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(TlsError::io("read", &files.ca, e)),
    };
    create_private_dir(config_dir)?;
    issue_at(
        ca_dir,
        name,
        &[],
        CertRole::Client,
        options.into(),
        &files.cert,
        &files.key,
    )?;
    if !keep_ca {
        write_new(&files.ca, ca_pem.as_bytes(), false)?;
    }
    Ok(files)
}

/// Creates `dir` (and its parents) readable by its owner only where it is new: it holds a
/// private key.
fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .map_err(|e| TlsError::io("create", dir, e))
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
    let cli = cli_files(data_dir);
    if has_key && cli.cert.exists() && is_legacy(&cli.cert)? {
        // Made before certificates had roles: as a legacy certificate it would be capped by
        // both tier settings. It is this machine's own and nothing else knows its id, so it
        // is set aside and issued again, as a client.
        for path in [&cli.cert, &cli.key] {
            let mut aside = path.as_os_str().to_owned();
            aside.push(".legacy");
            std::fs::rename(path, &aside).map_err(|e| TlsError::io("set aside", path, e))?;
        }
    }
    if has_key && !cli.cert.exists() {
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

/// The client certificates of the operator of the machine a node with `data_dir` runs on: the
/// one a zero-config node made for the local `mesh-cli` in its data dir ([`cli_files`]), and
/// the one in the config dir of the user the node runs as ([`user_cli_files`], which `mesh-cli
/// join` and `ca issue --install` write). Whoever holds their keys is that user (or root), who
/// owns the node's data dir and config anyway. A file that is missing, unreadable or not a
/// client certificate is skipped.
pub fn operator_certificates(data_dir: &Path) -> Vec<CertIdentity> {
    let config = user_config_dir().map(|dir| user_cli_files(&dir));
    std::iter::once(cli_files(data_dir))
        .chain(config)
        .filter_map(|files| {
            let pem = read(&files.cert).ok()?;
            let der = pem_certs(&files.cert, &pem).ok()?.swap_remove(0);
            CertIdentity::from_der(&der).ok()
        })
        .filter(|identity| identity.role == Some(CertRole::Client))
        .collect()
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
    use mesh_cert::ca::KeyType;
    use mesh_tls::MeshTls;

    use super::*;

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

    #[test]
    fn install_client_writes_a_usable_private_set_and_never_overwrites() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
        ca_init(&ours).expect("our CA");
        ca_init(&theirs).expect("their CA");
        let config = dir.path().join("config/agentmesh");

        let files = install_client(&ours, "operator", &config, KeyType::Ed25519).expect("install");
        assert_eq!(files, user_cli_files(&config));
        let tls = MeshTls::load(&files).expect("the installed files load together");
        assert_eq!(tls.identity().role, Some(CertRole::Client));
        assert_eq!(tls.identity().common_name.as_deref(), Some("operator"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |path: &Path| fs::metadata(path).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode(&files.key), 0o600, "the key is the owner's alone");
            assert_eq!(mode(&config), 0o700, "so is the directory");
        }

        // A second install would replace a working certificate: refused, nothing written.
        let err =
            install_client(&ours, "operator2", &config, KeyType::Ed25519).expect_err("refused");
        assert!(
            matches!(&err, TlsError::Exists(path) if *path == files.cert),
            "{err}"
        );

        // Without a certificate, the same CA's ca.pem is kept; another CA's is refused.
        fs::remove_file(&files.cert).expect("rm cert");
        fs::remove_file(&files.key).expect("rm key");
        let err =
            install_client(&theirs, "operator", &config, KeyType::Ed25519).expect_err("other CA");
        assert!(
            matches!(&err, TlsError::Exists(path) if *path == files.ca),
            "{err}"
        );
        assert!(
            !files.cert.exists() && !files.key.exists(),
            "nothing written"
        );
        install_client(&ours, "operator", &config, KeyType::Ed25519).expect("same CA again");
        MeshTls::load(&files).expect("loads");
    }

    #[test]
    fn install_client_without_a_ca_names_the_missing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = install_client(
            &dir.path().join("no-ca"),
            "operator",
            &dir.path().join("cfg"),
            KeyType::Ed25519,
        )
        .expect_err("no CA");
        assert!(err.to_string().contains("ca.pem"), "{err}");
        assert!(!dir.path().join("cfg").exists(), "nothing created");
    }

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
