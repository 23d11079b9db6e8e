//! Tests of the crate check, on made-up workspaces: the crate table, dependencies between
//! crates, modules using crates, circles in any crate's target, and reading a workspace from
//! disk as cargo and rustc find its files.

use std::{collections::BTreeSet, fs, path::Path};

use crate::{
    crates::check_crates,
    fixtures::assert_one_problem_mentions,
    node::{check, read_node_tree},
    workspace::{Member, SourceText, Target, Workspace, read_workspace},
};

/// Two crates of our own and `mesh-node`: `mesh-low` at the bottom, `mesh-high` above it.
const CRATE_DOC: &str = "# Architecture\n\n## Layers\n\nIntro text.\n\n\
| layer | crate | directory | what it is |\n\
|---|---|---|---|\n\
| 1 | `mesh-low` | `low/` | the bottom |\n\
| 2 | `mesh-high` | `high/` | above it |\n\
| 3 | `mesh-node` | `node/` | the node |\n\n\
| layer | modules | what they are |\n\
|---|---|---|\n\
| 1 | `a` | the bottom |\n\
| 2 | `b` | above it |\n\
| 3 | `main` | the daemon |\n\n\
## Next section\n";

/// A crate with a library of the given files (`path`, text), `path` relative to `dir/src`.
fn member(name: &str, dir: &str, deps: &[&str], lib: &[(&str, &str)]) -> Member {
    let files = lib
        .iter()
        .map(|(path, text)| {
            let module = crate::tree::module_path(path);
            SourceText {
                path: format!("{dir}/src/{path}"),
                module,
                text: text.to_string(),
                test_only: false,
            }
        })
        .collect();
    Member {
        name: name.into(),
        dir: dir.into(),
        deps: deps
            .iter()
            .map(|dep| (dep.to_string(), "dependencies".to_string()))
            .collect(),
        targets: vec![Target {
            kind: "lib",
            root: format!("{dir}/src/lib.rs"),
            files,
        }],
    }
}

/// A workspace that keeps to `CRATE_DOC`.
fn workspace() -> Workspace {
    Workspace {
        members: vec![
            member("mesh-low", "low", &[], &[("lib.rs", "pub fn low() {}\n")]),
            member("mesh-high", "high", &["mesh-low"], &[("lib.rs", "")]),
            member("mesh-node", "node", &["mesh-low", "mesh-high"], &[]),
        ],
        problems: Vec::new(),
    }
}

#[test]
fn a_workspace_that_keeps_to_the_crate_table_passes() {
    assert_eq!(check_crates(CRATE_DOC, &workspace()), Vec::<String>::new());
}

#[test]
fn every_crate_needs_its_row_in_its_directory_and_every_row_a_crate() {
    let mut workspace = workspace();
    workspace.members[0].dir = "elsewhere".into();
    workspace.members[1].name = "mesh-higher".into();
    let problems = check_crates(CRATE_DOC, &workspace);
    assert_one_problem_mentions(&problems, &["`mesh-low` is in `elsewhere/`, not `low/`"]);
    assert_one_problem_mentions(
        &problems,
        &["high/Cargo.toml", "`mesh-higher` is not in the crate table"],
    );
    assert_one_problem_mentions(&problems, &["`mesh-high` is no crate of the workspace"]);
    assert_eq!(problems.len(), 3, "{problems:#?}");

    let problems = check_crates("# Architecture\n\n## Layers\n\nNo table.\n", &workspace);
    assert_one_problem_mentions(&problems, &["no crate table under `## Layers`"]);
}

#[test]
fn a_crate_depending_on_a_higher_one_fails() {
    let mut workspace = workspace();
    workspace.members[0]
        .deps
        .push(("mesh-high".into(), "dev-dependencies".into()));
    // Crates outside the workspace are not ours to place.
    workspace.members[0]
        .deps
        .push(("tokio".into(), "dependencies".into()));
    let problems = check_crates(CRATE_DOC, &workspace);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "low/Cargo.toml",
            "`mesh-low` (layer 1) depends on `mesh-high` (layer 2)",
            "[dev-dependencies]",
        ],
    );
}

#[test]
fn a_crate_in_the_module_table_fails() {
    let doc = CRATE_DOC.replace("| 1 | `a` |", "| 1 | `a`, `mesh-low` |");
    let problems = check_crates(&doc, &workspace());
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(&problems, &["`mesh-low` is a crate", "module table"]);
}

#[test]
fn a_circle_in_any_crate_fails_the_root_included() {
    let mut workspace = workspace();
    workspace.members[1] = member(
        "mesh-high",
        "high",
        &[],
        &[
            (
                "lib.rs",
                "mod x;\nmod y;\npub struct Root;\npub fn f() { x::x() }\n",
            ),
            ("x.rs", "pub fn x() { let _ = crate::Root; }\n"),
            ("y.rs", "pub fn y() {}\n"),
        ],
    );
    let problems = check_crates(CRATE_DOC, &workspace);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "circle of imports in `mesh-high` (lib high/src/lib.rs): high/src/lib.rs → \
             high/src/x.rs → high/src/lib.rs",
            "high/src/lib.rs names `x::x`",
            "high/src/x.rs names `crate::Root`",
        ],
    );
    assert_one_problem_mentions(
        &problems,
        &["circle of modules in `mesh-high` (lib high/src/lib.rs): crate → x → crate"],
    );
}

#[test]
fn names_a_module_only_brings_in_lead_to_where_they_come_from() {
    let mut workspace = workspace();
    // The root re-exports `x::X` and another crate's `Thing`; `b/mod.rs` re-exports `b::y::Y`,
    // which `b/z.rs` takes through it: none of that is a circle.
    workspace.members[1] = member(
        "mesh-high",
        "high",
        &[],
        &[
            (
                "lib.rs",
                "mod b;\nmod x;\npub use mesh_low::Thing;\npub use x::X;\n",
            ),
            (
                "x.rs",
                "pub struct X;\npub fn f() -> crate::Thing { todo!() }\n",
            ),
            ("b/mod.rs", "mod y;\nmod z;\npub use y::Y;\n"),
            ("b/y.rs", "pub struct Y(pub crate::X);\n"),
            ("b/z.rs", "pub fn z() -> super::Y { todo!() }\n"),
        ],
    );
    assert_eq!(check_crates(CRATE_DOC, &workspace), Vec::<String>::new());
}

#[test]
fn a_module_using_a_crate_above_its_layer_fails() {
    let files = [
        ("a.rs", "use mesh_high::H;\npub fn a(_: H) {}\n"),
        ("b.rs", "pub fn b() { mesh_low::low(); mesh_high::h(); }\n"),
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("main.rs", "fn main() {}\n"),
    ];
    let problems = check(CRATE_DOC, &files);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "node/src/a.rs",
            "`a` (layer 1) uses the crate `mesh-high` (layer 2)",
            "use mesh_high::H",
        ],
    );
    // The first path naming each crate is kept.
    let tree = read_node_tree(
        &files,
        &BTreeSet::from(["mesh_low".into(), "mesh_high".into()]),
        &mut Vec::new(),
    );
    let b = tree
        .files
        .iter()
        .position(|file| file.path == "b.rs")
        .expect("b.rs");
    assert_eq!(
        tree.externs[&b].values().collect::<Vec<_>>(),
        ["mesh_high::h", "mesh_low::low"]
    );
}

/// Writes `files` (path relative to `dir`, text) under `dir`.
pub fn write(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        fs::write(path, text).expect("write");
    }
}

#[test]
fn a_workspace_is_read_as_cargo_and_rustc_find_its_files() {
    let root = tempfile::tempdir().expect("tempdir");
    write(
        root.path(),
        &[
            ("Cargo.toml", "[workspace]\nmembers = [\"one\"]\n"),
            (
                "one/Cargo.toml",
                "[package]\nname = \"mesh-one\"\n\n[dependencies]\nmesh-low = { path = \"x\" }\n\
                 renamed = { package = \"mesh-high\", path = \"y\" }\n\n\
                 [target.'cfg(unix)'.dev-dependencies]\nmesh-unix = { path = \"z\" }\n",
            ),
            ("one/src/lib.rs", "pub mod a;\nmod inline { mod deep; }\n"),
            ("one/src/a.rs", "mod b;\n"),
            ("one/src/a/b/mod.rs", "mod c;\n"),
            ("one/src/a/b/c.rs", ""),
            ("one/src/inline/deep.rs", ""),
            ("one/src/main.rs", "mod cli;\nfn main() {}\n"),
            ("one/src/cli.rs", ""),
            ("one/src/bin/tool.rs", "fn main() {}\n"),
            ("one/tests/t.rs", "mod common;\n"),
            ("one/tests/common/mod.rs", ""),
            ("one/tests/big/main.rs", "mod part;\n"),
            ("one/tests/big/part.rs", ""),
            ("one/build.rs", "fn main() {}\n"),
        ],
    );
    let workspace = read_workspace(root.path());
    assert_eq!(workspace.problems, Vec::<String>::new());
    let [one] = workspace.members.as_slice() else {
        panic!("one member: {:#?}", workspace.members)
    };
    assert_eq!((one.name.as_str(), one.dir.as_str()), ("mesh-one", "one"));
    let deps: Vec<(&str, &str)> = one
        .deps
        .iter()
        .map(|(name, section)| (name.as_str(), section.as_str()))
        .collect();
    assert_eq!(
        deps,
        [
            ("mesh-low", "dependencies"),
            ("mesh-high", "dependencies"),
            ("mesh-unix", "target.cfg(unix).dev-dependencies"),
        ]
    );
    let targets: Vec<String> = one
        .targets
        .iter()
        .map(|target| {
            let files: Vec<String> = target
                .files
                .iter()
                .map(|file| format!("{}={}", file.path, file.module.join("::")))
                .collect();
            format!("{} {}: {}", target.kind, target.root, files.join(", "))
        })
        .collect();
    assert_eq!(
        targets,
        [
            "lib one/src/lib.rs: one/src/a.rs=a, one/src/a/b/c.rs=a::b::c, \
             one/src/a/b/mod.rs=a::b, one/src/inline/deep.rs=inline::deep, one/src/lib.rs=",
            "bin one/src/main.rs: one/src/cli.rs=cli, one/src/main.rs=",
            "bin one/src/bin/tool.rs: one/src/bin/tool.rs=",
            "test one/tests/big/main.rs: one/tests/big/main.rs=, one/tests/big/part.rs=part",
            "test one/tests/t.rs: one/tests/common/mod.rs=common, one/tests/t.rs=",
            "build script one/build.rs: one/build.rs=",
        ]
    );
}

#[test]
fn a_mod_line_without_its_file_is_reported() {
    let root = tempfile::tempdir().expect("tempdir");
    write(
        root.path(),
        &[
            ("Cargo.toml", "[workspace]\nmembers = [\"one\"]\n"),
            ("one/Cargo.toml", "[package]\nname = \"mesh-one\"\n"),
            ("one/src/lib.rs", "mod gone;\n"),
        ],
    );
    let workspace = read_workspace(root.path());
    assert_eq!(
        workspace.problems,
        ["one/src/lib.rs: `mod gone;` has no file (one/src/gone.rs or one/src/gone/mod.rs)"]
    );
}
