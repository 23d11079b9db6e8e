//! The layer check: which crate of the workspace may depend on which, and which module of
//! `node/src` may use which.
//!
//! The crates of the workspace and the modules of `mesh-node` are stacked in layers, on one
//! scale (0 is the bottom). Under the heading `## Layers` in `docs/src/architecture/layers.md`,
//! the crate table gives each crate its row (layer and directory), and the module table places
//! the top-level modules of `node/src`. This test reads both tables, every crate's manifest and
//! the files of every target of every crate (library, binaries, tests, benches, build script), and
//! fails when the code disagrees with them:
//!
//! 1. **Layering.** A crate may depend on crates of its own layer and of the layers below, never
//!    one above (`[dependencies]`, `[dev-dependencies]` and `[build-dependencies]` alike). A
//!    module of `node/src` may use modules and crates of its own layer and of the layers below.
//!    When a lower module needs something from a higher one, the lower module defines a trait (a
//!    port), the higher one implements it, and `server` wires the two together.
//! 2. **No circle of files.** In no target of any crate may a file reach itself through the files
//!    it names.
//! 3. **No circle of modules.** The same for the top-level modules of each target (`agent`,
//!    `rpc`, ...; a crate root with code of its own is the module `crate`).
//! 4. **Separate dialects.** The folders of `http`, one per API dialect (`http/openai/`,
//!    `http/anthropic/`, ...), never name each other; what they share lives in `http`'s own
//!    files (`http/clients.rs`).
//! 5. **No long file.** No product file of any crate (libraries, binaries, build scripts; not
//!    tests, not `#[cfg(test)]` code, not the test crate `mesh-tests`) has more than 800 lines
//!    of code (`size.rs` says what counts). A longer one holds several concerns: split it
//!    along them.
//!
//! It also fails when the tables and the tree disagree: a crate of the workspace without its row
//! (or in another directory), a row for no crate, a crate in the module table (its layer is the
//! crate table's), a top-level module of `node/src` missing from the module table, or a name
//! there that is no module of `node/src`.
//!
//! Why: the layers keep `rpc` and `http` (the adapters) at the edge and the identity crates
//! under the node, so the parts that decide can be read and tested without the network, and a
//! change at the bottom never has to know about the top. Circles are how that quietly stops
//! being true; cargo refuses a circle of crates, but not one of files inside a crate.
//!
//! "Names" means every path the code spells, read with `syn`: `use crate::…`, `use super::…` and
//! `use self::…` trees (groups included), paths in code (`crate::metrics::metrics()`), paths to a
//! child module (`hooks::Hooks`) or through an imported module (`router::rank`), and paths inside
//! macro calls. `node/src/main.rs` is the `main` module; its `mesh_node::…` paths name the
//! library. A path counts for the file that backs the deepest module in it
//! (`crate::memory::Memory` is `node/src/memory.rs`); `crate::Name` brought in by a `use` in the
//! crate root counts for where the name comes from. Code under `#[cfg(test)]` is skipped, and so
//! is `node/src/lib.rs`, which only declares the modules; every other crate root is read like any
//! file. `mod x;` is a declaration, not a use.
//!
//! What it cannot see: a type used without being named (a method call on a field whose type is
//! named in another file), and a name that comes in through a glob from another file
//! (`use super::*;` then `models::f()`), which counts for the glob's module only. Both are rare
//! enough here; the compiler-checked alternative (one crate per layer) is much heavier.
//!
//! Run it alone with `cargo test -p mesh-node --test layers`. To try the check on another
//! checkout, set `LAYERS_ROOT` to its workspace root.

mod circles;
mod crate_fixtures;
mod crates;
mod fixtures;
mod node;
mod size;
mod size_fixtures;
mod table;
mod tree;
mod workspace;

use std::fs;

use crate::{
    crates::check_crates,
    node::{SRC_DIR, check},
    table::{TABLE_DOC, TABLE_HEADING},
    workspace::{read_sources, read_workspace, workspace_root},
};

#[test]
fn node_src_keeps_to_the_layer_table() {
    let root = workspace_root();
    let doc = read_doc(&root);
    let sources = read_sources(&root.join(SRC_DIR));
    assert!(
        sources.iter().any(|(path, _)| path == "lib.rs"),
        "no {SRC_DIR}/lib.rs under {}: is the workspace root right?",
        root.display()
    );
    let files: Vec<(&str, &str)> = sources
        .iter()
        .map(|(path, text)| (path.as_str(), text.as_str()))
        .collect();

    let problems = check(&doc, &files);
    assert!(problems.is_empty(), "{}", report(SRC_DIR, &problems));
}

#[test]
fn every_crate_keeps_to_the_layer_table() {
    let root = workspace_root();
    let doc = read_doc(&root);
    let workspace = read_node_workspace(&root);
    let problems = check_crates(&doc, &workspace);
    assert!(
        problems.is_empty(),
        "{}",
        report("the workspace's crates", &problems)
    );
}

#[test]
fn no_product_file_is_over_800_lines_of_code() {
    let root = workspace_root();
    let workspace = read_node_workspace(&root);
    let problems = size::check_sizes(&workspace);
    let mut text = format!(
        "product files over {} lines of code (rule 5): {}\n\n",
        size::MAX_LINES_OF_CODE,
        problems.len()
    );
    for (number, problem) in problems.iter().enumerate() {
        text += &format!("{}. {}\n\n", number + 1, problem.replace('\n', "\n   "));
    }
    text += "The rules are at the top of node/tests/layers/main.rs.";
    assert!(problems.is_empty(), "{text}");
}

/// The workspace at `root`, which must hold `mesh-node` (else the root is wrong).
fn read_node_workspace(root: &std::path::Path) -> workspace::Workspace {
    let workspace = read_workspace(root);
    assert!(
        workspace
            .members
            .iter()
            .any(|member| member.name == "mesh-node"),
        "no mesh-node among the members of {}/Cargo.toml: is the workspace root right?",
        root.display()
    );
    workspace
}

fn read_doc(root: &std::path::Path) -> String {
    let path = root.join(TABLE_DOC);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The failure message: every problem, numbered, and where to look.
fn report(what: &str, problems: &[String]) -> String {
    let mut text = format!(
        "{what}: not as the layer tables say ({TABLE_HEADING} in {TABLE_DOC}): {} problem(s)\n\n",
        problems.len()
    );
    for (number, problem) in problems.iter().enumerate() {
        text += &format!("{}. {}\n\n", number + 1, problem.replace('\n', "\n   "));
    }
    text += "The rules and how to mend them are at the top of node/tests/layers/main.rs.";
    text
}
