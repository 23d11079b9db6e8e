//! `mesh-cert` is the identity crate without a runtime or a network: certificates, the CA,
//! revocations and signatures. The TLS stack of connections (tokio, tonic, hyper) and the wire
//! contract (mesh-proto, which brings tonic) belong to the crates above it (`mesh-tls`,
//! `mesh-join`), so none of them may enter its dependency tree: code that needs them goes there.

use std::process::Command;

/// Crates `mesh-cert` must never depend on, directly or not.
const ABOVE: &[&str] = &[
    "tokio",
    "tokio-rustls",
    "tonic",
    "hyper",
    "tower",
    "mesh-proto",
    "mesh-tls",
    "mesh-join",
];

#[test]
fn mesh_cert_depends_on_no_runtime_and_no_rpc() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "mesh-cert", "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"mesh-cert") && crates.contains(&"rustls"),
        "not mesh-cert's tree:\n{tree}"
    );
    let found: Vec<&&str> = ABOVE.iter().filter(|c| crates.contains(c)).collect();
    assert!(
        found.is_empty(),
        "mesh-cert depends on {found:?}; move the code that needs them to mesh-tls or mesh-join"
    );
}
