//! Keys any TLS stack reads (issue 26): every private key the mesh writes — by `mesh-cli ca init`
//! and `ca issue` (Ed25519 and `--key-type p256`), by a zero-config node in its data dir, by a
//! node that joined with a token, and by `mesh-cli join` — loads in Debian's OpenSSL 3
//! (`openssl pkey`) and in Python's `ssl` (`SSLContext.load_cert_chain`), so `curl --cert`,
//! grpcurl and Python clients can use the certificates the mesh issues. (grpcio, gRPC's own TLS,
//! is tested in `grpc.rs`.) Real `mesh-cli` and `mesh-node` processes on loopback, mDNS off.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use mesh_cert::CertRole;
use mesh_join::bootstrap;
use mesh_tests::{Harness, NodeOptions, bin, python3};

const DEADLINE: Duration = Duration::from_secs(15);

/// Loads `cert` with `key` the way Python's standard library does.
const PYTHON_LOAD: &str = r#"
import ssl, sys
ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(sys.argv[1], sys.argv[2])
"#;

/// Whether Debian's OpenSSL and Python's `ssl` read `key` (with its certificate `cert`): `Err`
/// names the stack that refused and what it said.
fn stock_stacks_read(cert: &Path, key: &Path) -> Result<(), String> {
    let openssl = Command::new("openssl")
        .args(["pkey", "-noout", "-in"])
        .arg(key)
        .output()
        .map_err(|e| format!("run openssl (deploy/test.sh installs it): {e}"))?;
    if !openssl.status.success() {
        return Err(format!(
            "openssl pkey: {}",
            String::from_utf8_lossy(&openssl.stderr).trim()
        ));
    }
    let python = Command::new(python3())
        .args(["-c", PYTHON_LOAD])
        .arg(cert)
        .arg(key)
        .output()
        .map_err(|e| format!("run python3: {e}"))?;
    if !python.status.success() {
        return Err(format!(
            "python ssl.load_cert_chain: {}",
            String::from_utf8_lossy(&python.stderr).trim()
        ));
    }
    Ok(())
}

/// Checks every `(what, cert, key)` and fails naming each one a stack refused.
fn assert_all_read(files: &[(String, PathBuf, PathBuf)]) {
    let refused: Vec<String> = files
        .iter()
        .filter_map(|(what, cert, key)| {
            stock_stacks_read(cert, key)
                .err()
                .map(|e| format!("{what} ({}): {e}", key.display()))
        })
        .collect();
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

fn mesh_cli(args: &[&str], home: &Path) -> std::process::Output {
    let output = Command::new(bin("mesh-cli"))
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env_remove("MESH_NODE")
        .env_remove("MESH_JOIN_TOKEN")
        .output()
        .expect("run mesh-cli");
    assert!(
        output.status.success(),
        "mesh-cli {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn keys_from_ca_init_and_ca_issue_load_in_openssl_and_python() {
    let home = tempfile::tempdir().expect("tempdir");
    let dir = home.path().join("ca");
    let d = dir.to_str().expect("utf-8 path");
    mesh_cli(&["ca", "init", "--dir", d], home.path());
    let issued = [
        ("node-ed", "node", "ed25519"),
        ("client-ed", "client", "ed25519"),
        ("node-p256", "node", "p256"),
        ("client-p256", "client", "p256"),
    ];
    let mut files = vec![("ca init".to_owned(), dir.join("ca.pem"), dir.join("ca.key"))];
    for (name, role, key_type) in issued {
        mesh_cli(
            &[
                "ca",
                "issue",
                "--dir",
                d,
                "--name",
                name,
                "--role",
                role,
                "--key-type",
                key_type,
            ],
            home.path(),
        );
        files.push((
            format!("ca issue --role {role} --key-type {key_type}"),
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        ));
    }
    // The default key type is Ed25519 (the one that used to be unreadable).
    mesh_cli(
        &[
            "ca", "issue", "--dir", d, "--name", "default", "--role", "client",
        ],
        home.path(),
    );
    let default_key = std::fs::read_to_string(dir.join("default.key")).expect("key");
    let default_key = rcgen::KeyPair::from_pem(&default_key).expect("a key");
    assert!(default_key.is_compatible(&rcgen::PKCS_ED25519), "Ed25519");
    files.push((
        "ca issue (default key type)".to_owned(),
        dir.join("default.pem"),
        dir.join("default.key"),
    ));
    assert_all_read(&files);
}

#[test]
fn keys_of_a_zero_config_node_a_joined_node_and_mesh_cli_join_load_in_openssl_and_python() {
    let h = Harness::new().expect("harness");
    // A zero-config node: its own CA, its certificate and the local mesh-cli's, in its data dir.
    let solo = h
        .spawn(NodeOptions::new("solo").zero_config_tls())
        .expect("zero-config node");
    let tls = bootstrap::tls_dir(&solo.data_dir);
    let mut files = vec![
        (
            "zero-config CA".to_owned(),
            tls.join("ca.pem"),
            tls.join("ca.key"),
        ),
        (
            "zero-config node".to_owned(),
            tls.join("solo.pem"),
            tls.join("solo.key"),
        ),
        (
            "zero-config mesh-cli".to_owned(),
            tls.join("mesh-cli.pem"),
            tls.join("mesh-cli.key"),
        ),
    ];

    // A node that joined with a token.
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let token = |role: &str| {
        let output = Command::new(bin("mesh-cli"))
            .args(["token", "create", "--uses", "2", "--role", role, "--dir"])
            .arg(h.ca_dir())
            .args(["--issuer", &alpha.addr])
            .output()
            .expect("run mesh-cli");
        assert!(output.status.success(), "token create");
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    };
    let beta = h
        .spawn(NodeOptions::new("beta").join(&token("node")))
        .expect("joiner");
    h.wait_all_up(&[&alpha, &beta], DEADLINE).expect("joined");
    let tls = bootstrap::tls_dir(&beta.data_dir);
    files.push((
        "mesh-node --join".to_owned(),
        tls.join("beta.pem"),
        tls.join("beta.key"),
    ));

    // mesh-cli join, with either key type.
    let client_token = token("client");
    let homes = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    for (key_type, home) in ["ed25519", "p256"].into_iter().zip(&homes) {
        mesh_cli(
            &[
                "join",
                &client_token,
                "--name",
                &format!("laptop-{key_type}"),
                "--key-type",
                key_type,
            ],
            home.path(),
        );
        let cli = bootstrap::user_cli_files(&home.path().join("config").join("agentmesh"));
        let key = std::fs::read_to_string(&cli.key).expect("key");
        let algorithm = match key_type {
            "p256" => &rcgen::PKCS_ECDSA_P256_SHA256,
            _ => &rcgen::PKCS_ED25519,
        };
        assert!(
            rcgen::KeyPair::from_pem(&key)
                .expect("a key")
                .is_compatible(algorithm),
            "{key_type}"
        );
        let tls = mesh_tls::MeshTls::load(&cli).expect("loads here too");
        assert_eq!(tls.identity().role, Some(CertRole::Client));
        files.push((
            format!("mesh-cli join --key-type {key_type}"),
            cli.cert.clone(),
            cli.key.clone(),
        ));
    }
    assert_all_read(&files);
}
