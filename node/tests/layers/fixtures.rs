//! Tests of the checker itself, on small made-up trees and workspaces.

use std::collections::BTreeSet;

use crate::node::{check, read_node_tree};

/// A layer table for the fixtures: `a` at the bottom, then `b` and `c`, then `main`.
const FIXTURE_DOC: &str = "# Architecture\n\n## Layers\n\nIntro text.\n\n\
| layer | modules | may use |\n\
|---|---|---|\n\
| 1 | `a`, `mesh-proto` | nothing of ours |\n\
| 2 | `b`, `c` | layer 1 |\n\
| 3 | `main` | everything |\n\n\
## Next section\n";

fn problems_in(files: &[(&str, &str)]) -> Vec<String> {
    check(FIXTURE_DOC, files)
}

/// The file graph of `files`, as `from → to` pairs of paths.
fn edges_in(files: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    let tree = read_node_tree(files, &BTreeSet::new(), &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    let mut edges = Vec::new();
    for (from, targets) in &tree.edges {
        for to in targets.keys() {
            edges.push(format!(
                "{} → {}",
                tree.files[*from].path, tree.files[*to].path
            ));
        }
    }
    edges
}

pub fn assert_one_problem_mentions(problems: &[String], words: &[&str]) {
    assert!(
        problems
            .iter()
            .any(|problem| words.iter().all(|word| problem.contains(word))),
        "no problem mentions all of {words:?}:\n{}",
        problems.join("\n")
    );
}

const LIB: (&str, &str) = ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n");

#[test]
fn a_tree_that_keeps_to_the_table_passes() {
    let problems = problems_in(&[
        ("a.rs", "pub struct A;\n"),
        (
            "b/mod.rs",
            "pub mod x;\nuse crate::a::A;\npub fn b(_: A) -> x::X { x::X }\n",
        ),
        (
            "b/x.rs",
            "use crate::a::A;\npub struct X;\npub fn f(_: A) {}\n",
        ),
        (
            "c.rs",
            "use crate::{a, b::{self, x::X}};\npub fn c() -> X { b::b(a::A) }\n",
        ),
        LIB,
        (
            "main.rs",
            "use mesh_node::c;\nmod cli { pub fn run() {} }\nfn main() { c::c(); cli::run(); crate::cli::run(); }\n",
        ),
    ]);
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn a_circle_of_files_fails_naming_both_files() {
    let problems = problems_in(&[
        ("a.rs", ""),
        (
            "b.rs",
            "use crate::c::C;\npub struct B(pub Option<Box<C>>);\n",
        ),
        ("c.rs", "pub struct C(pub crate::b::B);\n"),
        LIB,
        ("main.rs", "fn main() {}\n"),
    ]);
    assert_one_problem_mentions(
        &problems,
        &[
            "circle of imports: node/src/b.rs → node/src/c.rs → node/src/b.rs",
            "node/src/b.rs names `use crate::c::C`",
            "node/src/c.rs names `crate::b::B`",
        ],
    );
    assert_one_problem_mentions(&problems, &["circle of modules: b → c → b"]);
    assert_eq!(problems.len(), 2, "{problems:#?}");
}

#[test]
fn a_circle_of_modules_fails_even_without_a_circle_of_files() {
    let problems = problems_in(&[
        ("a.rs", ""),
        ("b/mod.rs", "pub mod x;\npub mod y;\n"),
        ("b/x.rs", "pub fn x() { crate::c::c() }\n"),
        ("b/y.rs", "pub fn y() {}\n"),
        ("c.rs", "pub fn c() {}\npub fn d() { crate::b::y::y() }\n"),
        LIB,
        ("main.rs", "fn main() {}\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "circle of modules: b → c → b",
            "node/src/b/x.rs names `crate::c::c`",
            "node/src/c.rs names `crate::b::y::y`",
        ],
    );
}

#[test]
fn an_upward_import_fails() {
    let problems = problems_in(&[
        ("a.rs", "use crate::b::B;\npub fn a(_: B) {}\n"),
        ("b.rs", "pub struct B;\n"),
        ("c.rs", ""),
        LIB,
        ("main.rs", "fn main() {}\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "node/src/a.rs",
            "`a` (layer 1) uses `b` (layer 2)",
            "use crate::b::B",
            "trait (a port)",
        ],
    );
}

#[test]
fn nested_use_trees_inline_paths_and_macros_are_all_seen() {
    let edges = edges_in(&[
        ("a.rs", "use crate::{b::{self, x::{X, Y}}, c as see};\n"),
        ("b/mod.rs", "pub mod x;\n"),
        ("b/x.rs", "pub struct X;\npub struct Y;\n"),
        ("c.rs", "pub fn c() {}\n"),
        ("d.rs", "fn d() { let _ = crate::c::c(); }\n"),
        ("e.rs", "fn e() { println!(\"{:?}\", crate::c::c()); }\n"),
        ("f.rs", "use crate::b;\nfn f() -> b::x::X { b::x::X }\n"),
        (
            "g.rs",
            "fn g() -> impl Fn() { || crate::b::x::Y; crate::c::c }\n",
        ),
        ("h.rs", "macro_rules! h { () => { $crate::c::c() }; }\n"),
        LIB,
    ]);
    assert_eq!(
        edges,
        [
            "a.rs → b/mod.rs",
            "a.rs → b/x.rs",
            "a.rs → c.rs",
            "d.rs → c.rs",
            "e.rs → c.rs",
            "f.rs → b/mod.rs",
            "f.rs → b/x.rs",
            "g.rs → b/x.rs",
            "g.rs → c.rs",
            "h.rs → c.rs",
        ]
    );
}

#[test]
fn test_code_is_skipped() {
    let edges = edges_in(&[
        (
            "a.rs",
            "pub fn a() {}\n\
             #[cfg(test)]\nmod tests { use crate::b::B; }\n\
             mod inner {\n    #[cfg(test)]\n    mod deeper { fn f() { crate::c::c(); } }\n}\n\
             #[cfg(all(test, feature = \"x\"))]\nfn helper() -> crate::b::B { crate::b::B }\n\
             #[cfg(test)]\nmod more_tests;\n",
        ),
        ("a/more_tests.rs", "use crate::b::B;\n"),
        (
            "b.rs",
            "pub struct B;\n#[cfg(not(test))]\nfn real() { crate::a::a() }\n",
        ),
        ("c.rs", "pub fn c() {}\n"),
        LIB,
    ]);
    assert_eq!(edges, ["b.rs → a.rs"]);
}

#[test]
fn use_super_star_in_a_child_resolves_to_the_parent() {
    let edges = edges_in(&[
        ("b/mod.rs", "mod x;\npub const N: usize = 1;\n"),
        ("b/x.rs", "use super::*;\nfn f() -> usize { N }\n"),
        ("b/y/mod.rs", "mod z;\n"),
        ("b/y/z.rs", "fn f() -> usize { super::super::N }\n"),
        LIB,
    ]);
    assert_eq!(edges, ["b/x.rs → b/mod.rs", "b/y/z.rs → b/mod.rs"]);
}

#[test]
fn a_parent_naming_its_child_that_names_it_back_is_a_circle() {
    let problems = problems_in(&[
        ("a.rs", ""),
        ("b/mod.rs", "mod x;\npub const N: usize = x::M;\n"),
        (
            "b/x.rs",
            "use super::*;\npub const M: usize = 1;\nfn f() -> usize { N }\n",
        ),
        ("c.rs", ""),
        LIB,
        ("main.rs", "fn main() {}\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &["circle of imports: node/src/b/mod.rs → node/src/b/x.rs → node/src/b/mod.rs"],
    );
}

#[test]
fn inline_modules_and_self_references_stay_inside_their_file() {
    let edges = edges_in(&[
        (
            "c.rs",
            "mod engine { use super::*; pub fn run() -> C { C } }\n\
             pub struct C;\npub fn c() { engine::run(); self::engine::run(); crate::c::c(); }\n",
        ),
        ("d.rs", "mod inner { fn f() { super::super::c::c() } }\n"),
        LIB,
    ]);
    assert_eq!(edges, ["d.rs → c.rs"]);
}

#[test]
fn the_table_and_the_tree_must_name_the_same_modules() {
    let problems = problems_in(&[
        ("a.rs", ""),
        ("b.rs", ""),
        ("extra/mod.rs", ""),
        LIB,
        ("main.rs", "fn main() {}\n"),
    ]);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &["node/src/extra/mod.rs", "`extra` is not in the layer table"],
    );
    assert_one_problem_mentions(
        &problems,
        &["row `| 2 | `b`, `c` | layer 1 |`", "`c` is no module"],
    );
}

#[test]
fn a_missing_table_or_a_file_that_does_not_parse_fails() {
    let problems = check(
        "# Architecture\n\n## Modules\n",
        &[("a.rs", "fn ("), ("b.rs", ""), LIB],
    );
    // No table, so no flood of "`b` is not in the layer table".
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert_one_problem_mentions(&problems, &["no `## Layers` heading"]);
    assert_one_problem_mentions(&problems, &["node/src/a.rs: does not parse"]);
}

#[test]
fn main_names_the_library_as_mesh_node() {
    let edges = edges_in(&[
        ("c.rs", "pub fn c() {}\n"),
        ("server.rs", "pub fn run() {}\n"),
        (
            "main.rs",
            "use mesh_node::{c, server::run};\nmod cli { pub fn go() {} }\n\
             fn main() { c::c(); run(); cli::go(); crate::cli::go(); }\n",
        ),
        LIB,
    ]);
    assert_eq!(edges, ["main.rs → c.rs", "main.rs → server.rs"]);
}

/// Rule 4: a dialect folder of `http` naming another fails; both naming a file of `http` (and
/// their own files) passes.
#[test]
fn a_dialect_folder_naming_another_fails_and_their_shared_files_pass() {
    let doc = "## Layers\n\n| layer | modules | may use |\n|---|---|---|\n\
               | 1 | `a` | nothing of ours |\n| 2 | `http` | layer 1 |\n| 3 | `main` | everything |\n";
    let problems = check(
        doc,
        &[
            ("a.rs", "pub struct A;\n"),
            ("http/mod.rs", "mod shared;\nmod one;\nmod two;\n"),
            ("http/shared.rs", "pub struct S;\n"),
            (
                "http/one/mod.rs",
                "mod wire;\nuse super::shared::S;\npub fn f(_: S) { wire::w() }\n",
            ),
            ("http/one/wire.rs", "pub fn w() {}\n"),
            (
                "http/two/mod.rs",
                "use crate::{a::A, http::one::f};\npub fn g(_: A) { f(crate::http::shared::S) }\n",
            ),
            ("lib.rs", "pub mod a;\npub mod http;\n"),
            ("main.rs", "fn main() {}\n"),
        ],
    );
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_one_problem_mentions(
        &problems,
        &[
            "node/src/http/two/mod.rs",
            "the `two` folder of `http` names its `one` folder",
            "crate::http::one::f",
        ],
    );
}
