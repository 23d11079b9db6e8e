//! `mesh-cli` installs on its own: `cargo install --path mesh-cli` must not build the node's
//! heavy parts (llama.cpp needs cmake, a C++ compiler and libclang; sled, axum and async-openai
//! are the node's), so none of them may enter the CLI's dependency tree.

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

#[test]
fn the_cli_depends_on_none_of_the_nodes_heavy_parts() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "mesh-cli", "-e", "normal,build"])
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
        ["mesh-cert", "mesh-tls", "mesh-join", "mesh-proto"]
            .iter()
            .all(|ours| crates.contains(ours)),
        "not the CLI's tree:\n{tree}"
    );
    let found: Vec<&&str> = NODE_ONLY.iter().filter(|c| crates.contains(c)).collect();
    assert!(
        found.is_empty(),
        "mesh-cli depends on {found:?}; keep node-only code out of mesh-cert, mesh-tls, mesh-join, mesh-domain and mesh-proto"
    );
}
