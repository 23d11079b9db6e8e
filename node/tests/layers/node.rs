//! The check of `mesh-node`'s modules against the module table: every top-level module of
//! `node/src` placed on a layer, none using a module or a crate above its own, no circle of
//! files or modules, and no dialect folder of `http` naming another.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    circles::{no_circle_of_files, no_circle_of_modules},
    table::{Crates, Layers, TABLE_DOC, TABLE_HEADING, parse_crate_table, parse_layer_table},
    tree::{Input, Reading, Tree, module_path, read_tree},
};

/// The sources the module table places, relative to the workspace root.
pub const SRC_DIR: &str = "node/src";
/// The crate they make up, whose library and daemon the module table covers.
pub const NODE_CRATE: &str = "mesh-node";
/// Modules whose folders are separate API dialects, which never name each other (rule 4).
const SEPARATE_FOLDERS: &[&str] = &["http"];

/// Checks `files` (paths relative to `node/src`, with their text) against the layer table in
/// `doc` (the text of `docs/src/architecture/layers.md`). Returns every problem found, empty
/// when all is well.
pub fn check(doc: &str, files: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    let layers = parse_layer_table(doc, &mut problems);
    // The crate table's problems are the crate check's to report.
    let crates = parse_crate_table(doc, &mut Vec::new()).unwrap_or_default();
    let workspace: BTreeSet<String> = crates
        .keys()
        .filter(|name| *name != NODE_CRATE)
        .map(|name| name.replace('-', "_"))
        .collect();
    let tree = read_node_tree(files, &workspace, &mut problems);
    if let Some(layers) = &layers {
        table_matches_tree(layers, &tree, &mut problems);
        no_upward_use(layers, &tree, &mut problems);
        no_upward_crate(layers, &crates, &tree, &mut problems);
    }
    no_circle_of_files(&tree, "", &mut problems);
    no_circle_of_modules(&tree, "", &mut problems);
    no_folder_names_a_sibling(&tree, &mut problems);
    problems
}

/// Rule 4: in a module of [`SEPARATE_FOLDERS`], no folder names another. One problem per file
/// and folder it should not name, with the first path that names it.
fn no_folder_names_a_sibling(tree: &Tree, problems: &mut Vec<String>) {
    for (from, targets) in &tree.edges {
        let Some((module, own)) = separate_folder_of(&tree.files[*from].path) else {
            continue;
        };
        let mut reported = BTreeSet::new();
        for (to, via) in targets {
            let Some((_, other)) = separate_folder_of(&tree.files[*to].path)
                .filter(|(other_module, other)| *other_module == module && *other != own)
            else {
                continue;
            };
            if reported.insert(other) {
                problems.push(format!(
                    "{SRC_DIR}/{}: the `{own}` folder of `{module}` names its `{other}` folder \
                     through `{via}`.\nThe folders of `{module}` are separate dialects and never \
                     name each other: move what both need to a file of `{module}` \
                     ({SRC_DIR}/{module}/*.rs), which each may name",
                    tree.files[*from].path
                ));
            }
        }
    }
}

/// The module of [`SEPARATE_FOLDERS`] and the folder in it that a file lies in:
/// `http/openai/wire.rs` → `("http", "openai")`; `None` for a file of no such folder
/// (`http/clients.rs`, `memory/sync.rs`).
fn separate_folder_of(path: &str) -> Option<(&str, &str)> {
    let mut parts = path.split('/');
    let (module, folder) = (parts.next()?, parts.next()?);
    parts.next()?;
    SEPARATE_FOLDERS
        .contains(&module)
        .then_some((module, folder))
}

/// `node/src` as a [`Tree`]: paths relative to it, `lib.rs` (which only declares the modules)
/// left out, `main.rs` read as the module `main` that names the library as `mesh_node`.
pub fn read_node_tree(
    files: &[(&str, &str)],
    workspace: &BTreeSet<String>,
    problems: &mut Vec<String>,
) -> Tree {
    let inputs: Vec<Input<'_>> = files
        .iter()
        .map(|(path, text)| Input {
            path,
            module: module_path(path),
            text,
            in_binary: *path == "main.rs",
        })
        .collect();
    let base = format!("{SRC_DIR}/");
    let reading = Reading {
        base: &base,
        keep_root: false,
        externs: workspace,
    };
    read_tree(&inputs, reading, problems)
}

/// The table and the tree name the same top-level modules.
fn table_matches_tree(layers: &Layers, tree: &Tree, problems: &mut Vec<String>) {
    let tops: BTreeMap<&str, &str> = tree
        .files
        .iter()
        .map(|file| (file.top.as_str(), file.path.as_str()))
        .collect();
    for (module, placement) in layers {
        if !tops.contains_key(module.as_str()) {
            problems.push(format!(
                "{TABLE_DOC}, {TABLE_HEADING}, row `{}`: `{module}` is no module of {SRC_DIR} \
                 (there is no {SRC_DIR}/{module}.rs or {SRC_DIR}/{module}/); fix or drop the name",
                placement.row
            ));
        }
    }
    for (module, path) in tops {
        if !layers.contains_key(module) {
            problems.push(format!(
                "{SRC_DIR}/{path}: its module `{module}` is not in the layer table; add it to a \
                 row of {TABLE_HEADING} in {TABLE_DOC}"
            ));
        }
    }
}

/// Rule 1: a file uses modules of its own layer and the layers below only. One problem per
/// file and module it should not use, with the first path that names it.
fn no_upward_use(layers: &Layers, tree: &Tree, problems: &mut Vec<String>) {
    for (from, targets) in &tree.edges {
        let file = &tree.files[*from];
        let mut reported = BTreeSet::new();
        for (to, via) in targets {
            let used = &tree.files[*to].top;
            let (Some(own), Some(other)) = (layers.get(&file.top), layers.get(used)) else {
                continue; // reported by table_matches_tree
            };
            if other.layer > own.layer && reported.insert(used) {
                problems.push(format!(
                    "{SRC_DIR}/{}: `{}` (layer {}) uses `{used}` (layer {}), a higher layer, \
                     through `{via}`.\nA module may use its own layer and the ones below only: \
                     let layer {} define a trait (a port) that `{used}` implements, and let \
                     `server` wire them",
                    file.path, file.top, own.layer, other.layer, own.layer
                ));
            }
        }
    }
}

/// Rule 1 for crates: a file uses crates of its module's layer and the layers below only (the
/// crate table's layers).
fn no_upward_crate(layers: &Layers, crates: &Crates, tree: &Tree, problems: &mut Vec<String>) {
    for (from, named) in &tree.externs {
        let file = &tree.files[*from];
        let Some(own) = layers.get(&file.top) else {
            continue; // reported by table_matches_tree
        };
        for (ident, via) in named {
            let name = ident.replace('_', "-");
            let Some(other) = crates.get(&name) else {
                continue;
            };
            if other.layer > own.layer {
                problems.push(format!(
                    "{SRC_DIR}/{}: `{}` (layer {}) uses the crate `{name}` (layer {}), a higher \
                     layer, through `{via}`.\nA module may use crates of its own layer and the \
                     ones below only: move what it needs down, or the module up",
                    file.path, file.top, own.layer, other.layer
                ));
            }
        }
    }
}
