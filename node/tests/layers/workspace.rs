//! Reading the workspace from disk: its crates (the root `Cargo.toml`'s members), what each
//! depends on, and each crate's targets (library, binaries, tests, benches, examples, build
//! script) with the files their `mod` lines reach, as cargo and rustc find them.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use syn::Item;

use crate::tree::is_test_only;

/// The crates of the workspace, and what could not be read.
#[derive(Debug, Default)]
pub struct Workspace {
    pub members: Vec<Member>,
    /// Manifests or sources that could not be read or followed, as problems.
    pub problems: Vec<String>,
}

/// One crate of the workspace.
#[derive(Debug)]
pub struct Member {
    /// Its package name (`mesh-cert`).
    pub name: String,
    /// Its directory, relative to the workspace root, `/`-separated (`node/cert`).
    pub dir: String,
    /// The crates it depends on (a renamed one by its package name), each with the section of
    /// its manifest that says so (`dependencies`, `dev-dependencies`, ...).
    pub deps: Vec<(String, String)>,
    pub targets: Vec<Target>,
}

/// One target of a crate: a crate root and the files it reaches.
#[derive(Debug)]
pub struct Target {
    /// `lib`, `bin`, `test`, `bench`, `example` or `build script`.
    pub kind: &'static str,
    /// The root file, relative to the workspace root (`mesh-cli/src/main.rs`).
    pub root: String,
    pub files: Vec<SourceText>,
}

/// A file of a target.
#[derive(Debug)]
pub struct SourceText {
    /// Relative to the workspace root.
    pub path: String,
    /// Its module path from the target's root (empty for the root).
    pub module: Vec<String>,
    pub text: String,
    /// Whether only tests build it: it is reached through a `#[cfg(test)] mod x;` (here or in
    /// a module above it).
    pub test_only: bool,
}

/// Reads the workspace at `root`. Panics when the root manifest cannot be read: then there is
/// nothing to check.
pub fn read_workspace(root: &Path) -> Workspace {
    let manifest = root.join("Cargo.toml");
    let text = fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", manifest.display()));
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", manifest.display()));
    let members = table
        .get("workspace")
        .and_then(|workspace| workspace.get("members"))
        .and_then(toml::Value::as_array)
        .unwrap_or_else(|| panic!("{} has no [workspace] members", manifest.display()));
    let mut workspace = Workspace::default();
    for dir in members {
        match dir.as_str() {
            Some(dir) if !dir.contains('*') => {
                if let Some(member) = read_member(root, dir, &mut workspace.problems) {
                    workspace.members.push(member);
                }
            }
            _ => workspace.problems.push(format!(
                "Cargo.toml: workspace member `{dir}` is not a plain directory; the layer check \
                 reads plain directories only (list each crate)"
            )),
        }
    }
    workspace
}

fn read_member(root: &Path, dir: &str, problems: &mut Vec<String>) -> Option<Member> {
    let dir = dir.trim_end_matches('/');
    let manifest_path = format!("{dir}/Cargo.toml");
    let manifest: toml::Table = match fs::read_to_string(root.join(&manifest_path)) {
        Ok(text) => match text.parse() {
            Ok(table) => table,
            Err(e) => {
                problems.push(format!("{manifest_path}: does not parse: {e}"));
                return None;
            }
        },
        Err(e) => {
            problems.push(format!("{manifest_path}: cannot read it: {e}"));
            return None;
        }
    };
    let package = manifest.get("package");
    let Some(name) = package
        .and_then(|package| package.get("name"))
        .and_then(toml::Value::as_str)
    else {
        problems.push(format!("{manifest_path}: no [package] name"));
        return None;
    };
    let mut member = Member {
        name: name.to_string(),
        dir: dir.to_string(),
        deps: dependencies(&manifest),
        targets: Vec::new(),
    };
    for (kind, path) in target_roots(&root.join(dir), &manifest) {
        let root_file = format!("{dir}/{path}");
        let files = walk(root, &root_file, problems);
        member.targets.push(Target {
            kind,
            root: root_file,
            files,
        });
    }
    Some(member)
}

/// Every dependency in `[dependencies]`, `[dev-dependencies]`, `[build-dependencies]` and their
/// `[target.…]` forms, by package name.
fn dependencies(manifest: &toml::Table) -> Vec<(String, String)> {
    const SECTIONS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];
    let mut tables: Vec<(String, &toml::Table)> = Vec::new();
    for section in SECTIONS {
        if let Some(table) = manifest.get(section).and_then(toml::Value::as_table) {
            tables.push((section.to_string(), table));
        }
    }
    let targets = manifest.get("target").and_then(toml::Value::as_table);
    for (cfg, target) in targets.into_iter().flatten() {
        for section in SECTIONS {
            if let Some(table) = target.get(section).and_then(toml::Value::as_table) {
                tables.push((format!("target.{cfg}.{section}"), table));
            }
        }
    }
    let mut deps = Vec::new();
    for (section, table) in tables {
        for (key, value) in table {
            let package = value
                .get("package")
                .and_then(toml::Value::as_str)
                .unwrap_or(key);
            deps.push((package.to_string(), section.clone()));
        }
    }
    deps
}

/// The root file of every target of the crate in `dir` (relative to `dir`), as cargo finds
/// them: the ones the manifest names and the ones found by convention.
fn target_roots(dir: &Path, manifest: &toml::Table) -> Vec<(&'static str, String)> {
    let mut roots: Vec<(&'static str, String)> = Vec::new();
    let mut add = |kind: &'static str, path: String| {
        if dir.join(&path).is_file() && !roots.iter().any(|(_, known)| *known == path) {
            roots.push((kind, path));
        }
    };
    let named = |section: &str| -> Vec<String> {
        let entries = match manifest.get(section) {
            Some(toml::Value::Array(entries)) => entries.clone(),
            Some(entry @ toml::Value::Table(_)) => vec![entry.clone()],
            _ => Vec::new(),
        };
        entries
            .iter()
            .filter_map(|entry| entry.get("path").and_then(toml::Value::as_str))
            .map(str::to_string)
            .collect()
    };
    for path in named("lib") {
        add("lib", path);
    }
    add("lib", "src/lib.rs".into());
    for (kind, section, conventional) in [
        ("bin", "bin", "src/bin"),
        ("test", "test", "tests"),
        ("bench", "bench", "benches"),
        ("example", "example", "examples"),
    ] {
        for path in named(section) {
            add(kind, path);
        }
        if kind == "bin" {
            add("bin", "src/main.rs".into());
        }
        for path in conventional_roots(&dir.join(conventional)) {
            add(kind, format!("{conventional}/{path}"));
        }
    }
    let build = manifest
        .get("package")
        .and_then(|package| package.get("build"))
        .and_then(toml::Value::as_str)
        .unwrap_or("build.rs");
    add("build script", build.to_string());
    roots
}

/// `x.rs` and `x/main.rs` in `dir`, sorted (the targets cargo finds there).
fn conventional_roots(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() && path.join("main.rs").is_file() {
            found.push(format!("{name}/main.rs"));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(name);
        }
    }
    found.sort();
    found
}

/// The files a target's root reaches through `mod x;` lines, the root first, as rustc finds
/// them: `x.rs` or `x/mod.rs` in the directory of the declaring module (for a crate root or a
/// `mod.rs`, its own directory; for `a.rs`, `a/`), or where `#[path]` says.
fn walk(root: &Path, root_file: &str, problems: &mut Vec<String>) -> Vec<SourceText> {
    let mut files = Vec::new();
    let mut seen = BTreeSet::new();
    let parent = |path: &str| path.rsplit_once('/').map_or("", |(dir, _)| dir).to_string();
    let mut pending = vec![(
        root_file.to_string(),
        Vec::<String>::new(),
        parent(root_file),
        false,
    )];
    while let Some((path, module, children_dir, test_only)) = pending.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let text = match fs::read_to_string(root.join(&path)) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{path}: cannot read it: {e}"));
                continue;
            }
        };
        if let Ok(file) = syn::parse_file(&text) {
            let mut declared = Vec::new();
            declarations(
                &file.items,
                &children_dir,
                &module,
                test_only,
                &mut declared,
            );
            for child in declared {
                let name = &child.name;
                let dir = &child.dir;
                let candidates = match &child.path_attribute {
                    Some(explicit) => vec![format!("{}/{explicit}", parent(&path))],
                    None => vec![format!("{dir}/{name}.rs"), format!("{dir}/{name}/mod.rs")],
                };
                match candidates.iter().find(|file| root.join(file).is_file()) {
                    Some(file) => pending.push((
                        file.clone(),
                        child.module,
                        format!("{dir}/{name}"),
                        child.test_only,
                    )),
                    None => problems.push(format!(
                        "{path}: `mod {name};` has no file ({})",
                        candidates.join(" or ")
                    )),
                }
            }
        } // a file that does not parse is reported when its target is read
        files.push(SourceText {
            path,
            module,
            text,
            test_only,
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// A `mod x;` line.
struct Declared {
    name: String,
    /// The directory its file is looked for in.
    dir: String,
    /// Its module path.
    module: Vec<String>,
    /// Its `#[path = "…"]`, if any.
    path_attribute: Option<String>,
    /// Whether it is declared under `#[cfg(test)]` (itself or a module around it).
    test_only: bool,
}

/// The `mod x;` lines in `items` (inside inline modules too); `test_only` when `items` are
/// built only for tests.
fn declarations(
    items: &[Item],
    dir: &str,
    module: &[String],
    test_only: bool,
    out: &mut Vec<Declared>,
) {
    for item in items {
        let Item::Mod(declared) = item else { continue };
        let name = declared.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        let test_only = test_only || is_test_only(&declared.attrs);
        match &declared.content {
            Some((_, inner)) => {
                declarations(inner, &format!("{dir}/{name}"), &child, test_only, out);
            }
            None => {
                let path_attribute = declared.attrs.iter().find_map(|attr| {
                    let syn::Meta::NameValue(value) = &attr.meta else {
                        return None;
                    };
                    let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(path),
                        ..
                    }) = &value.value
                    else {
                        return None;
                    };
                    value.path.is_ident("path").then(|| path.value())
                });
                out.push(Declared {
                    name,
                    dir: dir.to_string(),
                    module: child,
                    path_attribute,
                    test_only,
                });
            }
        }
    }
}

/// The workspace root: `LAYERS_ROOT` if set, else the parent of this crate (`node/..`).
pub fn workspace_root() -> PathBuf {
    match std::env::var_os("LAYERS_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// Every `.rs` file under `dir`, as (path relative to `dir` with `/` separators, text), sorted.
pub fn read_sources(dir: &Path) -> Vec<(String, String)> {
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
