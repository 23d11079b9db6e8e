//! Reading one crate target's files: what each file names, resolved to the files that back
//! those names ([`Tree`]), with `syn`.

use std::collections::{BTreeMap, BTreeSet};

use syn::{
    Attribute, Item, Meta, Token,
    buffer::{Cursor, TokenBuffer},
    punctuated::Punctuated,
    visit::{self, Visit},
};

/// The library's crate name, as `mesh-node`'s `main.rs` spells it.
pub const LIB_CRATE: &str = "mesh_node";

/// One file to read: where it is, which module it is, and its text.
#[derive(Debug)]
pub struct Input<'a> {
    /// As the messages name it, after the tree's `base`.
    pub path: &'a str,
    /// Its module path from the crate root (empty for the root file itself).
    pub module: Vec<String>,
    pub text: &'a str,
    /// `mesh-node`'s `main.rs`, read as the `main` module of the library's tree: its `crate::`
    /// is itself and is not followed, its `mesh_node::` paths name the library.
    pub in_binary: bool,
}

/// A checked source file.
#[derive(Debug)]
pub struct SourceFile {
    /// After the tree's `base`, e.g. `memory/sync.rs`.
    pub path: String,
    /// The top-level module it belongs to, e.g. `memory` (`main` for `mesh-node`'s `main.rs`,
    /// `crate` for a crate root that is kept).
    pub top: String,
}

/// The files of one crate target and which file names which.
#[derive(Debug)]
pub struct Tree {
    /// What the messages put before a file's path: `node/src/`, or nothing when the paths are
    /// relative to the workspace root already.
    pub base: String,
    pub files: Vec<SourceFile>,
    /// From file → to file → the first path in `from` that names `to` (as written).
    pub edges: BTreeMap<usize, BTreeMap<usize, String>>,
    /// From file → crate of the workspace it names (`mesh_cert`) → the first path that does.
    pub externs: BTreeMap<usize, BTreeMap<String, String>>,
}

impl Tree {
    /// A file as the messages name it: `node/src/memory.rs`.
    pub fn display(&self, file: usize) -> String {
        format!("{}{}", self.base, self.files[file].path)
    }
}

/// How to read a target's files into a [`Tree`].
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    /// Prefix of the paths in messages.
    pub base: &'a str,
    /// Whether the crate root is a file of the tree. `mesh-node`'s `lib.rs` only declares the
    /// modules, so it is left out; every other root is code like any file.
    pub keep_root: bool,
    /// The crates of the workspace a file may name (`mesh_cert`), to collect in `externs`.
    pub externs: &'a BTreeSet<String>,
}

/// Parses every file and resolves what it names to files. A left-out root and `#[cfg(test)]`
/// modules are read (for their `#[cfg(test)] mod x;` lines and their `use` lines) but are not
/// part of the tree.
pub fn read_tree(inputs: &[Input<'_>], reading: Reading<'_>, problems: &mut Vec<String>) -> Tree {
    let mut parsed = Vec::new();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    let mut imports: BTreeMap<Vec<String>, Imports> = BTreeMap::new();
    for input in inputs {
        match syn::parse_file(input.text) {
            Ok(file) => {
                let mut collector = Collector::new(input.in_binary, reading.externs);
                collector.read_file(input.module.clone(), &file);
                test_only.extend(collector.test_only_modules);
                if !input.in_binary {
                    imports.insert(input.module.clone(), collector.imports);
                }
                parsed.push((input, collector.found, collector.externs));
            }
            Err(e) => problems.push(format!(
                "{}{}: does not parse: {e}",
                reading.base, input.path
            )),
        }
    }

    let is_test_only = |module: &[String]| test_only.iter().any(|t| module.starts_with(t));
    let mut tree = Tree {
        base: reading.base.to_string(),
        files: Vec::new(),
        edges: BTreeMap::new(),
        externs: BTreeMap::new(),
    };
    let mut by_module: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    let mut references = Vec::new();
    for (input, found, externs) in parsed {
        let module = &input.module;
        let left_out = module.is_empty() && !reading.keep_root;
        if !input.in_binary && (left_out || is_test_only(module)) {
            continue; // a root that only declares, or test code
        }
        let top = match (input.in_binary, module.first()) {
            (true, _) => "main".to_string(),
            (false, Some(top)) => top.clone(),
            (false, None) => "crate".to_string(),
        };
        if !input.in_binary {
            by_module.insert(module.clone(), tree.files.len());
        }
        if !externs.is_empty() {
            tree.externs.insert(tree.files.len(), externs);
        }
        references.push(found);
        tree.files.push(SourceFile {
            path: input.path.to_string(),
            top,
        });
    }

    for (from, found) in references.into_iter().enumerate() {
        for reference in found {
            let Some(target) = through_imports(reference.target, &imports) else {
                continue; // a name another crate's
            };
            // The file that backs the deepest module on the path (the root, if it is kept).
            let to = (0..=target.len())
                .rev()
                .find_map(|length| by_module.get(&target[..length]));
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

/// What a file's `use` lines (outside functions) bring into its module: name → where it comes
/// from in the crate, or `None` when it comes from another crate.
type Imports = BTreeMap<String, Option<Vec<String>>>;

/// Where a path really leads: a name a module brings in with a `use` (`pub use
/// store::Memory` in `memory/mod.rs`, `pub use cert::CertIdentity` in a crate root) leads to
/// where it comes from, so a module that only re-exports is not in the way. `None` when the path
/// ends in another crate.
fn through_imports(
    mut target: Vec<String>,
    imports: &BTreeMap<Vec<String>, Imports>,
) -> Option<Vec<String>> {
    // A few steps at most: a re-export of a re-export.
    for _ in 0..8 {
        let Some(depth) = (0..target.len())
            .rev()
            .find(|depth| imports.contains_key(&target[..*depth]))
        else {
            break;
        };
        match imports[&target[..depth]].get(&target[depth]) {
            Some(Some(from)) if *from != target[..=depth] => {
                target = [from.as_slice(), &target[depth + 1..]].concat();
            }
            Some(None) => return None,
            _ => break,
        }
    }
    Some(target)
}

/// A file's module path: `memory/sync.rs` and `memory/sync/mod.rs` → `memory::sync`; `lib.rs`
/// → the crate root (empty).
pub fn module_path(path: &str) -> Vec<String> {
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

/// One path a file spells that leads into its own crate.
#[derive(Debug)]
struct Reference {
    /// Absolute, from the crate root: `crate::memory::Memory` → `["memory", "Memory"]`.
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
    /// Names brought in by `use` that lead into the crate: `router` → `["router"]`.
    imported: BTreeMap<String, Vec<String>>,
}

/// Walks one file's syntax tree and collects every path into its crate, and the first path
/// into each other crate of the workspace it names.
#[derive(Debug)]
struct Collector<'a> {
    /// `mesh-node`'s `main.rs` is its own crate: its `crate::` is itself, the library is
    /// `mesh_node::`.
    in_binary: bool,
    /// The workspace's crates, as code names them (`mesh_cert`).
    workspace: &'a BTreeSet<String>,
    scopes: Vec<Scope>,
    found: Vec<Reference>,
    /// Crate of the workspace → the first path that names it.
    externs: BTreeMap<String, String>,
    /// What the file's own `use` lines bring into its module.
    imports: Imports,
    /// Modules declared under `#[cfg(test)]` (`#[cfg(test)] mod tests;`), absolute.
    test_only_modules: Vec<Vec<String>>,
}

impl<'a> Collector<'a> {
    fn new(in_binary: bool, workspace: &'a BTreeSet<String>) -> Self {
        Collector {
            in_binary,
            workspace,
            scopes: Vec::new(),
            found: Vec::new(),
            externs: BTreeMap::new(),
            imports: Imports::new(),
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
                    if self.scopes.len() == 1
                        && let Some(name) = name.as_ref().filter(|name| *name != "_")
                    {
                        // The file's own module: what others reach through it.
                        let from = self.resolve(&written);
                        self.imports.insert(name.clone(), from);
                    }
                    self.learn_import(&written, name);
                }
            }
        }
        for item in items {
            self.visit_item(item);
        }
        self.scopes.pop();
    }

    /// Where a path leads, from the crate root; `None` when it leads out of the crate
    /// (another crate, a local name, `mesh-node`'s `main.rs` itself).
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
        } else if let Some(first) = path.first()
            && self.workspace.contains(first)
        {
            self.externs.entry(first.clone()).or_insert(written);
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

impl<'ast> Visit<'ast> for Collector<'_> {
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
pub fn is_test_only(attrs: &[Attribute]) -> bool {
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
