//! The layer check: which module of `node/src` may use which.
//!
//! The modules of `mesh-node` are stacked in layers. The table under the heading `## Layers` in
//! `docs/architecture.md` says which module sits on which layer (1 is the bottom). This test reads
//! that table and every `.rs` file under `node/src`, and fails when the code disagrees with it:
//!
//! 1. **Layering.** A module may use modules of its own layer and of the layers below, never one
//!    above. When a lower module needs something from a higher one, the lower module defines a
//!    trait (a port), the higher one implements it, and `server` wires the two together.
//! 2. **No circle of files.** No file may reach itself through the files it names.
//! 3. **No circle of modules.** The same for the top-level modules (`agent`, `rpc`, ...).
//! 4. **Separate dialects.** The folders of a module listed in [`SEPARATE_FOLDERS`] (`http`:
//!    `http/openai/`, `http/anthropic/`, ...) never name each other; what they share lives in
//!    the module's own files (`http/clients.rs`).
//!
//! It also fails when the table and the tree disagree: a top-level module missing from the table,
//! or a name in the table that is no module of `node/src`. Names with a `-` in the table are crate
//! names (`mesh-proto`) and are skipped.
//!
//! Why: the layers keep `rpc` and `http` (the adapters) at the edge, so the modules that decide
//! can be read and tested without the network, and a change at the bottom never has to know
//! about the top. Circles are how that quietly stops being true.
//!
//! "Names" means every path the code spells, read with `syn`: `use crate::…`, `use super::…` and
//! `use self::…` trees (groups included), paths in code (`crate::metrics::metrics()`), paths to a
//! child module (`hooks::Hooks`) or through an imported module (`router::rank`), and paths inside
//! macro calls. `main.rs` is the `main` module; its `mesh_node::…` paths name the library. A path
//! counts for the file that backs the deepest module in it (`crate::memory::Memory` is
//! `node/src/memory.rs`). Code under `#[cfg(test)]` is skipped, and so is `lib.rs`, which only
//! declares the modules. `mod x;` is a declaration, not a use.
//!
//! What it cannot see: a type used without being named (a method call on a field whose type is
//! named in another file), and a name that comes in through a glob from another file
//! (`use super::*;` then `models::f()`), which counts for the glob's module only. Both are rare
//! enough here; the compiler-checked alternative (one crate per layer) is much heavier.
//!
//! Run it alone with `cargo test -p mesh-node --test layers`. To try the check on another
//! checkout, set `LAYERS_ROOT` to its workspace root.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
};

use syn::{
    Attribute, Item, Meta, Token,
    buffer::{Cursor, TokenBuffer},
    punctuated::Punctuated,
    visit::{self, Visit},
};

/// Where the layer table lives, relative to the workspace root.
const TABLE_DOC: &str = "docs/architecture.md";
/// The heading the table sits under.
const TABLE_HEADING: &str = "## Layers";
/// The sources that are checked, relative to the workspace root.
const SRC_DIR: &str = "node/src";
/// The library's crate name, as `main.rs` spells it.
const LIB_CRATE: &str = "mesh_node";
/// Modules whose folders are separate API dialects, which never name each other (rule 4).
const SEPARATE_FOLDERS: &[&str] = &["http"];

// ---------------------------------------------------------------------------------------------
// The test CI runs
// ---------------------------------------------------------------------------------------------

#[test]
fn node_src_keeps_to_the_layer_table() {
    let root = workspace_root();
    let doc_path = root.join(TABLE_DOC);
    let doc = fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc_path.display()));
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
    assert!(problems.is_empty(), "{}", report(&problems));
}

/// The workspace root: `LAYERS_ROOT` if set, else the parent of this crate (`node/..`).
fn workspace_root() -> PathBuf {
    match std::env::var_os("LAYERS_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// Every `.rs` file under `dir`, as (path relative to `dir` with `/` separators, text), sorted.
fn read_sources(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = fs::read_dir(&current)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", current.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", current.display()))
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                let relative = path
                    .strip_prefix(dir)
                    .expect("every path found under dir starts with dir")
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

/// The failure message: every problem, numbered, and where to look.
fn report(problems: &[String]) -> String {
    let mut text = format!(
        "{SRC_DIR} does not keep to the layer table ({TABLE_HEADING} in {TABLE_DOC}): {} problem(s)\n\n",
        problems.len()
    );
    for (number, problem) in problems.iter().enumerate() {
        text += &format!("{}. {}\n\n", number + 1, problem.replace('\n', "\n   "));
    }
    text += "The rules and how to mend them are at the top of node/tests/layers.rs.";
    text
}

// ---------------------------------------------------------------------------------------------
// The checker: layer table + sources in, problems out
// ---------------------------------------------------------------------------------------------

/// Checks `files` (paths relative to `node/src`, with their text) against the layer table in
/// `doc` (the text of `docs/architecture.md`). Returns every problem found, empty when all is
/// well.
fn check(doc: &str, files: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    let layers = parse_layer_table(doc, &mut problems);
    let tree = read_tree(files, &mut problems);
    if let Some(layers) = &layers {
        table_matches_tree(layers, &tree, &mut problems);
        no_upward_use(layers, &tree, &mut problems);
    }
    no_circle_of_files(&tree, &mut problems);
    no_circle_of_modules(&tree, &mut problems);
    no_folder_names_a_sibling(&tree, &mut problems);
    problems
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

/// Rule 2: no file reaches itself through the files it names.
fn no_circle_of_files(tree: &Tree, problems: &mut Vec<String>) {
    let graph: Graph<usize> = tree
        .edges
        .iter()
        .map(|(from, targets)| (*from, targets.keys().copied().collect()))
        .collect();
    for knot in knots(&graph) {
        let circle = circle_through(&graph, &knot);
        let names: Vec<String> = circle.iter().map(|file| tree.display(*file)).collect();
        let mut text = format!("circle of imports: {}", names.join(" → "));
        for pair in circle.windows(2) {
            let via = &tree.edges[&pair[0]][&pair[1]];
            text += &format!("\n  {} names `{via}`", tree.display(pair[0]));
        }
        if knot.len() > circle.len() - 1 {
            let all: Vec<String> = knot.iter().map(|file| tree.display(*file)).collect();
            text += &format!(
                "\n  (part of a knot of {} files that all reach each other: {})",
                all.len(),
                all.join(", ")
            );
        }
        problems.push(text);
    }
}

/// Rule 3: no top-level module reaches itself through the modules it names.
fn no_circle_of_modules(tree: &Tree, problems: &mut Vec<String>) {
    // module → module → (the file, the path) that first names it, for the message.
    let mut edges: BTreeMap<&str, BTreeMap<&str, (usize, &str)>> = BTreeMap::new();
    for (from, targets) in &tree.edges {
        for (to, via) in targets {
            let (a, b) = (&tree.files[*from].top, &tree.files[*to].top);
            if a != b {
                let first = edges.entry(a).or_default().entry(b);
                first.or_insert((*from, via));
            }
        }
    }
    let graph: Graph<&str> = edges
        .iter()
        .map(|(from, targets)| (*from, targets.keys().copied().collect()))
        .collect();
    for knot in knots(&graph) {
        let circle = circle_through(&graph, &knot);
        let mut text = format!("circle of modules: {}", circle.join(" → "));
        for pair in circle.windows(2) {
            let (file, via) = edges[pair[0]][pair[1]];
            text += &format!("\n  {} names `{via}`", tree.display(file));
        }
        if knot.len() > circle.len() - 1 {
            text += &format!(
                "\n  (part of a knot of {} modules that all reach each other: {})",
                knot.len(),
                knot.join(", ")
            );
        }
        problems.push(text);
    }
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

// ---------------------------------------------------------------------------------------------
// The layer table
// ---------------------------------------------------------------------------------------------

/// Where a module sits: its layer and the table row that says so.
#[derive(Debug)]
struct Placement {
    layer: u32,
    row: String,
}

/// Module name → where it sits.
type Layers = BTreeMap<String, Placement>;

/// Reads the first markdown table after the `## Layers` heading. `None` (and a problem) when
/// there is no such table.
///
/// A row is `| 2 | `discovery`, `peers` | free text |`: the layer number, then the names in
/// backticks. The header row and the `|---|` row under it are skipped.
fn parse_layer_table(doc: &str, problems: &mut Vec<String>) -> Option<Layers> {
    let Some(heading) = doc
        .lines()
        .position(|line| line.trim_end() == TABLE_HEADING)
    else {
        problems.push(format!(
            "{TABLE_DOC} has no `{TABLE_HEADING}` heading; the layer table goes under it"
        ));
        return None;
    };
    let table: Vec<&str> = doc
        .lines()
        .skip(heading + 1)
        .take_while(|line| !line.starts_with("# ") && !line.starts_with("## "))
        .skip_while(|line| !line.trim_start().starts_with('|'))
        .take_while(|line| line.trim_start().starts_with('|'))
        .collect();
    let Some(separator) = table.iter().position(|row| {
        row.chars()
            .all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
    }) else {
        problems.push(format!(
            "{TABLE_DOC}: no table (a header row, a `|---|` row, then one row per layer) under \
             `{TABLE_HEADING}`"
        ));
        return None;
    };

    let mut layers = Layers::new();
    for row in &table[separator + 1..] {
        let row = row.trim();
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let (Some(number), Some(names)) = (cells.first(), cells.get(1)) else {
            problems.push(format!(
                "{TABLE_DOC}, row `{row}`: expected `| layer | modules |`"
            ));
            continue;
        };
        let Ok(layer) = number.trim_matches('*').parse::<u32>() else {
            problems.push(format!(
                "{TABLE_DOC}, row `{row}`: the first cell is not a layer number"
            ));
            continue;
        };
        // Names are the odd pieces between backticks: "`a`, `b`" splits to ["", "a", ", ", "b", ""].
        for name in names.split('`').skip(1).step_by(2) {
            if name.contains('-') {
                continue; // a crate, not a module of node/src
            }
            if let Some(earlier) = layers.get(name) {
                problems.push(format!(
                    "{TABLE_DOC}, row `{row}`: `{name}` is already on layer {}; list it once",
                    earlier.layer
                ));
                continue;
            }
            let placement = Placement {
                layer,
                row: row.to_string(),
            };
            layers.insert(name.to_string(), placement);
        }
    }
    if table.len() == separator + 1 {
        problems.push(format!(
            "{TABLE_DOC}: the table under `{TABLE_HEADING}` has no rows"
        ));
    }
    Some(layers)
}

// ---------------------------------------------------------------------------------------------
// The sources and what each file names
// ---------------------------------------------------------------------------------------------

/// A checked source file.
#[derive(Debug)]
struct SourceFile {
    /// Relative to `node/src`, e.g. `memory/sync.rs`.
    path: String,
    /// The top-level module it belongs to, e.g. `memory` (`main` for `main.rs`).
    top: String,
}

/// The files of `node/src` and which file names which.
#[derive(Debug)]
struct Tree {
    files: Vec<SourceFile>,
    /// From file → to file → the first path in `from` that names `to` (as written).
    edges: BTreeMap<usize, BTreeMap<usize, String>>,
}

impl Tree {
    /// A file as the messages name it: `node/src/memory.rs`.
    fn display(&self, file: usize) -> String {
        format!("{SRC_DIR}/{}", self.files[file].path)
    }
}

/// Parses every file and resolves what it names to files. `lib.rs` and `#[cfg(test)]` modules
/// are read (for their `#[cfg(test)] mod x;` lines) but are not part of the tree.
fn read_tree(files: &[(&str, &str)], problems: &mut Vec<String>) -> Tree {
    let mut parsed = Vec::new();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for (path, text) in files {
        let module = module_path(path);
        let in_binary = *path == "main.rs";
        match syn::parse_file(text) {
            Ok(file) => {
                let mut collector = Collector::new(in_binary);
                collector.read_file(module.clone(), &file);
                test_only.extend(collector.test_only_modules);
                parsed.push((*path, module, in_binary, collector.found));
            }
            Err(e) => problems.push(format!("{SRC_DIR}/{path}: does not parse: {e}")),
        }
    }

    let is_test_only = |module: &[String]| test_only.iter().any(|t| module.starts_with(t));
    let mut tree = Tree {
        files: Vec::new(),
        edges: BTreeMap::new(),
    };
    let mut by_module: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    let mut references = Vec::new();
    for (path, module, in_binary, found) in parsed {
        if !in_binary && (module.is_empty() || is_test_only(&module)) {
            continue; // lib.rs, or test code
        }
        let top = match (in_binary, module.first()) {
            (false, Some(top)) => top.clone(),
            _ => "main".to_string(),
        };
        if !in_binary {
            by_module.insert(module, tree.files.len());
        }
        references.push(found);
        tree.files.push(SourceFile {
            path: path.to_string(),
            top,
        });
    }

    for (from, found) in references.into_iter().enumerate() {
        for reference in found {
            // The file that backs the deepest module on the path.
            let to = (1..=reference.target.len())
                .rev()
                .find_map(|length| by_module.get(&reference.target[..length]));
            if let Some(&to) = to.filter(|to| **to != from) {
                tree.edges
                    .entry(from)
                    .or_default()
                    .entry(to)
                    .or_insert(reference.written);
            }
        }
    }
    tree
}

/// A file's module path: `memory/sync.rs` and `memory/sync/mod.rs` → `memory::sync`; `lib.rs`
/// → the crate root (empty).
fn module_path(path: &str) -> Vec<String> {
    if path == "lib.rs" {
        return Vec::new();
    }
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts
}

/// `path::name`.
fn child_of(path: &[String], name: &str) -> Vec<String> {
    let mut child = path.to_vec();
    child.push(name.to_string());
    child
}

/// One path a file spells that leads into the library.
#[derive(Debug)]
struct Reference {
    /// Absolute, from the library root: `crate::memory::Memory` → `["memory", "Memory"]`.
    target: Vec<String>,
    /// As written, for the message: `use crate::memory::Memory`.
    written: String,
}

/// A module being read: inline `mod x { … }` blocks get one of their own.
#[derive(Debug, Default)]
struct Scope {
    /// Absolute module path.
    path: Vec<String>,
    /// `mod x;` and `mod x { … }` declared here: `x::y` means `<path>::x::y`.
    children: BTreeSet<String>,
    /// Names brought in by `use` that lead into the library: `router` → `["router"]`.
    imported: BTreeMap<String, Vec<String>>,
}

/// Walks one file's syntax tree and collects every path into the library.
#[derive(Debug)]
struct Collector {
    /// `main.rs` is its own crate: its `crate::` is itself, the library is `mesh_node::`.
    in_binary: bool,
    scopes: Vec<Scope>,
    found: Vec<Reference>,
    /// Modules declared under `#[cfg(test)]` (`#[cfg(test)] mod tests;`), absolute.
    test_only_modules: Vec<Vec<String>>,
}

impl Collector {
    fn new(in_binary: bool) -> Self {
        Collector {
            in_binary,
            scopes: Vec::new(),
            found: Vec::new(),
            test_only_modules: Vec::new(),
        }
    }

    fn read_file(&mut self, module: Vec<String>, file: &syn::File) {
        if is_test_only(&file.attrs) {
            self.test_only_modules.push(module); // `#![cfg(test)]`
            return;
        }
        self.read_module(module, &file.items);
    }

    fn read_module(&mut self, path: Vec<String>, items: &[Item]) {
        let mut scope = Scope {
            path,
            ..Scope::default()
        };
        for item in items {
            if let Item::Mod(module) = item
                && !is_test_only(&module.attrs)
            {
                scope.children.insert(module.ident.to_string());
            }
        }
        self.scopes.push(scope);
        // Learn the module's imports first: code may use a name above its `use` line.
        for item in items {
            if let Item::Use(import) = item
                && !is_test_only(&import.attrs)
            {
                for (written, name) in use_leaves(&import.tree) {
                    self.learn_import(&written, name);
                }
            }
        }
        for item in items {
            self.visit_item(item);
        }
        self.scopes.pop();
    }

    /// Where a path leads, from the library root; `None` when it leads out of the library
    /// (another crate, a local name, `main.rs` itself).
    fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
        let scope = self.scopes.last()?;
        let (first, rest) = path.split_first()?;
        let mut base = match first.as_str() {
            "crate" | "self" | "super" if self.in_binary => return None,
            "crate" => return Some(rest.to_vec()),
            "self" | "super" => scope.path.clone(),
            name if self.in_binary && name == LIB_CRATE => return Some(rest.to_vec()),
            name if scope.children.contains(name) && !self.in_binary => {
                return Some([scope.path.as_slice(), path].concat());
            }
            name => {
                let imported = scope.imported.get(name)?;
                return Some([imported.as_slice(), rest].concat());
            }
        };
        let mut rest = path;
        while let Some((first, tail)) = rest.split_first() {
            match first.as_str() {
                "self" => {}
                "super" => {
                    base.pop()?;
                }
                _ => break,
            }
            rest = tail;
        }
        base.extend_from_slice(rest);
        Some(base)
    }

    fn record(&mut self, path: &[String], written: String) {
        if let Some(target) = self.resolve(path) {
            self.found.push(Reference { target, written });
        }
    }

    /// Remembers what `use` brings in, so `router::rank` after `use crate::router;` resolves.
    /// `use super::*` from an inline module also brings in the parent's names.
    fn learn_import(&mut self, written: &[String], name: Option<String>) {
        let Some(target) = self.resolve(written) else {
            return;
        };
        let mut learned: Vec<(String, Vec<String>)> = Vec::new();
        match name {
            Some(name) if name != "_" => learned.push((name, target)),
            Some(_) => {}
            None => {
                if let Some(parent) = self.scopes.iter().find(|scope| scope.path == target) {
                    learned.extend(parent.imported.clone());
                    for child in &parent.children {
                        learned.push((child.clone(), child_of(&target, child)));
                    }
                }
            }
        }
        if let Some(scope) = self.scopes.last_mut() {
            for (name, target) in learned {
                scope.imported.entry(name).or_insert(target);
            }
        }
    }
}

/// Flattens a use tree into its leaves: (the full path, the name it binds; `None` for a glob).
/// `use a::{b::{self, C}, d::*}` → `(a::b, b)`, `(a::b::C, C)`, `(a::d, None)`.
fn use_leaves(tree: &syn::UseTree) -> Vec<(Vec<String>, Option<String>)> {
    fn walk(
        tree: &syn::UseTree,
        prefix: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                walk(&path.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(name) => leaf(prefix, &name.ident, name.ident.to_string(), out),
            syn::UseTree::Rename(rename) => {
                leaf(prefix, &rename.ident, rename.rename.to_string(), out);
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    walk(tree, prefix, out);
                }
            }
        }
    }
    fn leaf(
        prefix: &[String],
        ident: &syn::Ident,
        binds: String,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        if ident == "self" {
            // `use a::b::{self}` binds `b` (or its rename) to `a::b`.
            let binds = if binds == "self" {
                prefix.last().cloned()
            } else {
                Some(binds)
            };
            out.push((prefix.to_vec(), binds));
        } else {
            out.push((child_of(prefix, &ident.to_string()), Some(binds)));
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast Item) {
        if is_test_only(item_attrs(item)) {
            if let Item::Mod(module) = item
                && let Some(scope) = self.scopes.last()
            {
                let path = child_of(&scope.path, &module.ident.to_string());
                self.test_only_modules.push(path);
            }
            return;
        }
        match item {
            Item::Mod(module) => {
                // `mod x;` only declares; `mod x { … }` is read as a scope of its own.
                if let (Some((_, items)), Some(scope)) = (&module.content, self.scopes.last()) {
                    let path = child_of(&scope.path, &module.ident.to_string());
                    self.read_module(path, items);
                }
            }
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_item_use(&mut self, import: &'ast syn::ItemUse) {
        if import.leading_colon.is_some() {
            return; // `use ::other_crate::…`
        }
        for (written, name) in use_leaves(&import.tree) {
            let text = format!("use {}", written.join("::"));
            self.record(&written, text);
            // Imports inside function bodies were not seen by `read_module`.
            self.learn_import(&written, name);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path
                .segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect();
            let written = segments.join("::");
            self.record(&segments, written);
        }
        visit::visit_path(self, path); // generic arguments hold paths too
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        let buffer = TokenBuffer::new2(mac.tokens.clone());
        let mut paths = Vec::new();
        paths_in_tokens(buffer.begin(), &mut paths);
        for path in paths {
            let written = format!("{} (in a macro)", path.join("::"));
            self.record(&path, written);
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(in crate::x)` says who may look, it uses nothing.
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(item) => &item.attrs,
            syn::ImplItem::Fn(item) => &item.attrs,
            syn::ImplItem::Type(item) => &item.attrs,
            syn::ImplItem::Macro(item) => &item.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs = match item {
            syn::TraitItem::Const(item) => &item.attrs,
            syn::TraitItem::Fn(item) => &item.attrs,
            syn::TraitItem::Type(item) => &item.attrs,
            syn::TraitItem::Macro(item) => &item.attrs,
            _ => return visit::visit_trait_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        let skip = match stmt {
            syn::Stmt::Local(local) => is_test_only(&local.attrs),
            syn::Stmt::Macro(mac) => is_test_only(&mac.attrs),
            _ => false, // items go through visit_item
        };
        if !skip {
            visit::visit_stmt(self, stmt);
        }
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        if !is_test_only(&arm.attrs) {
            visit::visit_arm(self, arm);
        }
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        if !is_test_only(&field.attrs) {
            visit::visit_field(self, field);
        }
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        if !is_test_only(&variant.attrs) {
            visit::visit_variant(self, variant);
        }
    }
}

/// Collects `a::b::c` runs from a macro's tokens (`$crate` counts as `crate`), since syn does
/// not parse what is inside a macro call. A run after `::` belongs to a longer or absolute path.
fn paths_in_tokens(mut cursor: Cursor<'_>, out: &mut Vec<Vec<String>>) {
    let mut after_colons = false;
    while !cursor.eof() {
        if let Some((inside, _, _, next)) = cursor.any_group() {
            paths_in_tokens(inside, out);
            (cursor, after_colons) = (next, false);
        } else if let Some(next) = double_colon(cursor) {
            (cursor, after_colons) = (next, true);
        } else if let Some((path, next)) = path_at(cursor) {
            if !after_colons && path.len() > 1 {
                out.push(path);
            }
            (cursor, after_colons) = (next, false);
        } else if let Some((_, next)) = cursor.token_tree() {
            (cursor, after_colons) = (next, false);
        } else {
            break;
        }
    }
}

/// `a::b::c` (or `$crate::b`) at the cursor, and the cursor after it.
fn path_at(cursor: Cursor<'_>) -> Option<(Vec<String>, Cursor<'_>)> {
    let dollar_crate = cursor
        .punct()
        .filter(|(punct, _)| punct.as_char() == '$')
        .and_then(|(_, next)| next.ident())
        .filter(|(ident, _)| ident == "crate");
    let (first, mut cursor) = match dollar_crate {
        Some((_, next)) => ("crate".to_string(), next),
        None => cursor
            .ident()
            .map(|(ident, next)| (ident.to_string(), next))?,
    };
    let mut path = vec![first];
    while let Some((ident, next)) = double_colon(cursor).and_then(Cursor::ident) {
        path.push(ident.to_string());
        cursor = next;
    }
    Some((path, cursor))
}

fn double_colon(cursor: Cursor<'_>) -> Option<Cursor<'_>> {
    let (first, next) = cursor.punct()?;
    let (second, next) = next.punct()?;
    (first.as_char() == ':' && second.as_char() == ':').then_some(next)
}

/// Whether the attributes hold `#[cfg(test)]` (or `#[cfg(all(test, …))]`).
fn is_test_only(attrs: &[Attribute]) -> bool {
    fn test_only(predicate: &Meta) -> bool {
        match predicate {
            Meta::Path(path) => path.is_ident("test"),
            Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                .is_ok_and(|all| all.iter().any(test_only)),
            _ => false,
        }
    }
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg") && attr.parse_args::<Meta>().is_ok_and(|p| test_only(&p))
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(item) => &item.attrs,
        Item::Enum(item) => &item.attrs,
        Item::ExternCrate(item) => &item.attrs,
        Item::Fn(item) => &item.attrs,
        Item::ForeignMod(item) => &item.attrs,
        Item::Impl(item) => &item.attrs,
        Item::Macro(item) => &item.attrs,
        Item::Mod(item) => &item.attrs,
        Item::Static(item) => &item.attrs,
        Item::Struct(item) => &item.attrs,
        Item::Trait(item) => &item.attrs,
        Item::TraitAlias(item) => &item.attrs,
        Item::Type(item) => &item.attrs,
        Item::Union(item) => &item.attrs,
        Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

// ---------------------------------------------------------------------------------------------
// Circles
// ---------------------------------------------------------------------------------------------

/// A directed graph: node → the nodes it names.
type Graph<N> = BTreeMap<N, BTreeSet<N>>;

/// The knots of a graph: its strongly connected components with more than one node (every node
/// in one reaches every other), found with Kosaraju's algorithm: order the nodes by when a
/// depth-first search finishes them, then search the reversed graph in the opposite order; each
/// search there collects one component.
fn knots<N: Ord + Clone>(graph: &Graph<N>) -> Vec<Vec<N>> {
    fn finish<N: Ord + Clone>(
        graph: &Graph<N>,
        node: &N,
        seen: &mut BTreeSet<N>,
        order: &mut Vec<N>,
    ) {
        if seen.insert(node.clone()) {
            for next in graph.get(node).into_iter().flatten() {
                finish(graph, next, seen, order);
            }
            order.push(node.clone());
        }
    }
    let nodes: BTreeSet<N> = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to))
        .cloned()
        .collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for node in &nodes {
        finish(graph, node, &mut seen, &mut order);
    }

    let mut reversed: Graph<N> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut knots = Vec::new();
    for node in order.iter().rev() {
        let mut component = Vec::new();
        finish(&reversed, node, &mut assigned, &mut component);
        if component.len() > 1 {
            component.sort();
            knots.push(component);
        }
    }
    knots.sort();
    knots
}

/// One concrete circle inside a knot: the shortest way from its first node back to itself,
/// as `[a, b, …, a]` (breadth-first search).
fn circle_through<N: Ord + Clone>(graph: &Graph<N>, knot: &[N]) -> Vec<N> {
    let start = &knot[0];
    let mut came_from: BTreeMap<N, N> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                // Walk back from `node` to `start` (the one node with no predecessor here).
                let mut circle = vec![node.clone()];
                while let Some(previous) = came_from.get(circle.last().expect("never empty")) {
                    circle.push(previous.clone());
                }
                circle.reverse(); // start, …, node
                circle.push(start.clone());
                return circle;
            }
            if knot.contains(next) && !came_from.contains_key(next) {
                came_from.insert(next.clone(), node.clone());
                queue.push_back(next.clone());
            }
        }
    }
    unreachable!("every node of a knot lies on a circle")
}

// ---------------------------------------------------------------------------------------------
// Tests of the checker itself, on small made-up trees
// ---------------------------------------------------------------------------------------------

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
    let tree = read_tree(files, &mut problems);
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

fn assert_one_problem_mentions(problems: &[String], words: &[&str]) {
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
