//! `mesh-cli` installs on its own: `cargo install --path mesh-cli` must not build the node's
//! heavy parts (llama.cpp needs cmake, a C++ compiler and libclang; sled, axum and async-openai
//! are the node's), so none of them may enter the CLI's dependency tree. And the identity crate
//! at the bottom of it, `mesh-cert`, has no async runtime and no RPC stack: those belong to the
//! crates above it (`mesh-tls`, `mesh-join`), so none of them may enter its tree either.

use std::process::Command;

/// Crates the CLI must never depend on, directly or not.
const NODE_ONLY: &[&str] = &[
    "mesh-node",
    "sled",
    "axum",
    "async-openai",
    "llama-cpp-2",
    "llama-cpp-sys-2",
    "cmake",
    "bindgen",
    "clang-sys",
];

/// Crates `mesh-cert` must never depend on, directly or not.
const ABOVE_MESH_CERT: &[&str] = &[
    "tokio",
    "tokio-rustls",
    "tonic",
    "hyper",
    "tower",
    "mesh-proto",
    "mesh-tls",
    "mesh-join",
];

/// Every crate in `package`'s tree of normal and build dependencies, itself included.
fn dependency_tree(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", package, "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Which of `forbidden` are in `crates`.
fn found<'a>(crates: &[String], forbidden: &[&'a str]) -> Vec<&'a str> {
    forbidden
        .iter()
        .copied()
        .filter(|name| crates.iter().any(|c| c == name))
        .collect()
}

#[test]
fn the_cli_depends_on_none_of_the_nodes_heavy_parts() {
    let crates = dependency_tree("mesh-cli");
    assert!(
        found(
            &crates,
            &["mesh-cert", "mesh-tls", "mesh-join", "mesh-proto"]
        )
        .len()
            == 4,
        "not the CLI's tree:\n{crates:?}"
    );
    let found = found(&crates, NODE_ONLY);
    assert!(
        found.is_empty(),
        "mesh-cli depends on {found:?}; keep node-only code out of mesh-cert, mesh-tls, mesh-join, mesh-domain and mesh-proto"
    );
}

#[test]
fn mesh_cert_depends_on_no_runtime_and_no_rpc() {
    let crates = dependency_tree("mesh-cert");
    assert!(
        found(&crates, &["mesh-cert", "rustls"]).len() == 2,
        "not mesh-cert's tree:\n{crates:?}"
    );
    let found = found(&crates, ABOVE_MESH_CERT);
    assert!(
        found.is_empty(),
        "mesh-cert depends on {found:?}; move the code that needs them to mesh-tls or mesh-join"
    );
}
