//! `mesh-cli` as scripts see it: exit codes and the certificate commands.

use std::process::{Command, Output, Stdio};

fn mesh_cli(args: &[&str], home: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesh-cli"))
        .args(args)
        .env_remove("MESH_NODE")
        .env_remove("MESH_CA")
        .env_remove("MESH_CERT")
        .env_remove("MESH_KEY")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .stdin(Stdio::null())
        .output()
        .expect("run mesh-cli")
}

#[test]
fn ca_init_and_issue_write_usable_files_and_never_overwrite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    let ca = ca.to_str().expect("utf-8");
    let init = mesh_cli(&["ca", "init", "--dir", ca], dir.path());
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let issue = mesh_cli(
        &[
            "ca",
            "issue",
            "--role",
            "node",
            "--dir",
            ca,
            "--name",
            "gpu-box",
            "--san",
            "10.0.0.7",
            "--san",
            "gpu-box.lan",
        ],
        dir.path(),
    );
    assert!(
        issue.status.success(),
        "{}",
        String::from_utf8_lossy(&issue.stderr)
    );
    for file in ["ca.pem", "ca.key", "gpu-box.pem", "gpu-box.key"] {
        assert!(std::path::Path::new(ca).join(file).exists(), "{file}");
    }
    let files = mesh_tls::TlsFiles {
        ca: format!("{ca}/ca.pem").into(),
        cert: format!("{ca}/gpu-box.pem").into(),
        key: format!("{ca}/gpu-box.key").into(),
    };
    let tls = mesh_tls::MeshTls::load(&files).expect("issued files load");
    assert_eq!(tls.identity().common_name.as_deref(), Some("gpu-box"));

    let again = mesh_cli(&["ca", "init", "--dir", ca], dir.path());
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("refusing to overwrite"));
}

#[test]
fn bad_usage_exits_2_and_failed_operations_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(mesh_cli(&["frobnicate"], dir.path()).status.code(), Some(2));
    assert_eq!(
        mesh_cli(&["status", "--bogus"], dir.path()).status.code(),
        Some(2)
    );
    assert_eq!(
        mesh_cli(&["--ca", "x.pem", "status"], dir.path())
            .status
            .code(),
        Some(2),
        "--ca without --cert/--key is a usage error"
    );

    let no_certs = mesh_cli(&["status"], dir.path());
    assert_eq!(no_certs.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&no_certs.stderr);
    // Every place looked in, in order, and both ways to fix it.
    let config_place = dir.path().join("config/agentmesh/mesh-cli.pem");
    let data_place = dir.path().join("data/agentmesh/tls/mesh-cli.pem");
    let (config_at, data_at) = (
        stderr.find(&*config_place.to_string_lossy()),
        stderr.find(&*data_place.to_string_lossy()),
    );
    assert!(
        config_at.is_some() && data_at.is_some() && config_at < data_at,
        "{stderr}"
    );
    assert!(
        stderr.contains("--role client --name <you> --install"),
        "{stderr}"
    );
    assert!(stderr.contains("--ca, --cert and --key"), "{stderr}");

    // Nothing listens on port 1: a clear "cannot reach" error, exit 1.
    let unreachable = mesh_cli(
        &["--insecure", "--node", "127.0.0.1:1", "status"],
        dir.path(),
    );
    assert_eq!(unreachable.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("cannot reach a node at 127.0.0.1:1"),
        "{stderr}"
    );
}

#[test]
fn ca_issue_install_writes_the_operators_files_privately_and_never_overwrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    let ca = ca.to_str().expect("utf-8");
    assert!(
        mesh_cli(&["ca", "init", "--dir", ca], dir.path())
            .status
            .success()
    );
    let install = [
        "ca",
        "issue",
        "--dir",
        ca,
        "--role",
        "client",
        "--name",
        "alice",
        "--install",
    ];
    let output = mesh_cli(&install, dir.path());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = dir.path().join("config/agentmesh");
    let files = mesh_join::bootstrap::user_cli_files(&config);
    let tls = mesh_tls::MeshTls::load(&files).expect("installed files load");
    assert_eq!(tls.identity().common_name.as_deref(), Some("alice"));
    assert_eq!(tls.identity().role, Some(mesh_cert::CertRole::Client));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files.key)
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(
        !std::path::Path::new(ca).join("alice.key").exists(),
        "the key is written once, into the config dir"
    );

    let again = mesh_cli(&install, dir.path());
    assert_eq!(again.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("refusing to overwrite"), "{stderr}");
    assert!(stderr.contains("mesh-cli.pem"), "{stderr}");

    // A node's certificate has no place there: bad usage.
    let node = mesh_cli(
        &[
            "ca",
            "issue",
            "--dir",
            ca,
            "--role",
            "node",
            "--name",
            "n",
            "--install",
        ],
        dir.path(),
    );
    assert_eq!(node.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&node.stderr).contains("--role client"));
}

#[test]
fn token_create_finds_the_local_ca_and_node_and_bounds_what_it_makes() {
    let home = tempfile::tempdir().expect("tempdir");
    // A zero-config node's layout in the default data dir.
    let data = home.path().join("data").join("agentmesh");
    mesh_cert::ca::ca_init(&data.join("tls")).expect("ca");
    std::fs::write(data.join("node.addr"), "127.0.0.1:7755\n").expect("addr");

    let made = mesh_cli(&["token", "create", "--json", "--uses", "3"], home.path());
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let made: serde_json::Value = serde_json::from_slice(&made.stdout).expect("json");
    assert_eq!(made["issuer"], "127.0.0.1:7755");
    assert_eq!(made["role"], "node");
    assert_eq!(made["uses"], 3);
    let token: mesh_join::token::JoinToken = made["token"]
        .as_str()
        .expect("token")
        .parse()
        .expect("a token");
    assert_eq!(
        token.ca_fingerprint,
        mesh_join::client::fingerprint_of(&data.join("tls").join("ca.pem")).expect("fp")
    );

    for (args, says) in [
        (&["token", "create", "--ttl", "8d"][..], "--ttl"),
        (&["token", "create", "--uses", "0"][..], "--uses"),
        (&["token", "create", "--issuer", "no-port"][..], "--issuer"),
    ] {
        let out = mesh_cli(args, home.path());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // Without a node address to go by, it asks for --issuer.
    std::fs::remove_file(data.join("node.addr")).expect("rm");
    let out = mesh_cli(&["token", "create"], home.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--issuer HOST:PORT"));
}

/// A reader that goes away (`mesh-cli … | head -n 1`) ends mesh-cli quietly with 0, as ripgrep
/// does; it used to panic on the next line ("failed printing to stdout: Broken pipe") and exit
/// 101, which failed the demo's `set -o pipefail` now and then.
#[test]
fn a_closed_stdout_ends_mesh_cli_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_mesh-cli"))
        .args(["ca", "init", "--dir"])
        .arg(dir.path().join("ca"))
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run mesh-cli");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(dir.path().join("ca/ca.pem").exists(), "the work was done");
}
