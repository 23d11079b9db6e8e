//! The check of the workspace's crates against the crate table: every crate placed on a layer
//! (in the directory the table says), none depending on a crate above its own, and no circle
//! of files or modules inside any target of any crate.

use std::collections::BTreeSet;

use crate::{
    circles::{no_circle_of_files, no_circle_of_modules},
    node::{NODE_CRATE, SRC_DIR},
    table::{Crates, TABLE_DOC, TABLE_HEADING, crates_in_module_table, parse_crate_table},
    tree::{Input, Reading, read_tree},
    workspace::{Member, Target, Workspace},
};

/// Checks `workspace` against the crate table in `doc` (the text of
/// `docs/src/architecture/layers.md`). `mesh-node`'s library and daemon are left to the module
/// table's check.
pub fn check_crates(doc: &str, workspace: &Workspace) -> Vec<String> {
    let mut problems = workspace.problems.clone();
    match parse_crate_table(doc, &mut problems) {
        Some(crates) => {
            table_matches_members(&crates, workspace, &mut problems);
            no_upward_dependency(&crates, workspace, &mut problems);
        }
        None => problems.push(format!(
            "{TABLE_DOC}: no crate table under `{TABLE_HEADING}` (a header `| layer | crate | \
             directory | … |`, a `|---|` row, then one row per crate of the workspace)"
        )),
    }
    for (name, row) in crates_in_module_table(doc) {
        problems.push(format!(
            "{TABLE_DOC}, {TABLE_HEADING}, module table, row `{row}`: `{name}` is a crate; its \
             layer is the crate table's, so drop it here"
        ));
    }
    for member in &workspace.members {
        for target in &member.targets {
            if !is_node_module_tree(member, target) {
                no_circle_in(member, target, &mut problems);
            }
        }
    }
    problems
}

/// `mesh-node`'s library and its `main.rs`: the module table's check reads them.
fn is_node_module_tree(member: &Member, target: &Target) -> bool {
    member.name == NODE_CRATE && target.root.starts_with(&format!("{SRC_DIR}/"))
}

/// The table names every crate of the workspace, in its directory, and no other.
fn table_matches_members(crates: &Crates, workspace: &Workspace, problems: &mut Vec<String>) {
    for member in &workspace.members {
        match crates.get(&member.name) {
            None => problems.push(format!(
                "{}/Cargo.toml: the crate `{}` is not in the crate table; add a row `| layer | \
                 `{}` | `{}/` | what it is |` under {TABLE_HEADING} in {TABLE_DOC}",
                member.dir, member.name, member.name, member.dir
            )),
            Some(row) if row.dir != member.dir => problems.push(format!(
                "{TABLE_DOC}, crate table, row `{}`: `{}` is in `{}/`, not `{}/`",
                row.row, member.name, member.dir, row.dir
            )),
            Some(_) => {}
        }
    }
    for (name, row) in crates {
        if !workspace.members.iter().any(|member| member.name == *name) {
            problems.push(format!(
                "{TABLE_DOC}, crate table, row `{}`: `{name}` is no crate of the workspace (the \
                 members of Cargo.toml); fix or drop the row",
                row.row
            ));
        }
    }
}

/// A crate depends on crates of its own layer and the layers below only.
fn no_upward_dependency(crates: &Crates, workspace: &Workspace, problems: &mut Vec<String>) {
    let ours: BTreeSet<&str> = workspace.members.iter().map(|m| m.name.as_str()).collect();
    for member in &workspace.members {
        let Some(own) = crates.get(&member.name) else {
            continue; // reported by table_matches_members
        };
        for (dep, section) in &member.deps {
            let Some(other) = crates.get(dep).filter(|_| ours.contains(dep.as_str())) else {
                continue;
            };
            if other.layer > own.layer {
                problems.push(format!(
                    "{}/Cargo.toml: `{}` (layer {}) depends on `{dep}` (layer {}), a higher \
                     layer, in [{section}].\nA crate may depend on crates of its own layer and \
                     the ones below only: move what it needs down, or the crate up",
                    member.dir, member.name, own.layer, other.layer
                ));
            }
        }
    }
}

/// No circle of files, nor of top-level modules, in one target.
fn no_circle_in(member: &Member, target: &Target, problems: &mut Vec<String>) {
    let inputs: Vec<Input<'_>> = target
        .files
        .iter()
        .map(|file| Input {
            path: &file.path,
            module: file.module.clone(),
            text: &file.text,
            in_binary: false,
        })
        .collect();
    let reading = Reading {
        base: "",
        keep_root: true,
        externs: &BTreeSet::new(),
    };
    let tree = read_tree(&inputs, reading, problems);
    let place = format!(" in `{}` ({} {})", member.name, target.kind, target.root);
    no_circle_of_files(&tree, &place, problems);
    no_circle_of_modules(&tree, &place, problems);
}
