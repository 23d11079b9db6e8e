//! The check itself: that llama.cpp (mesh-node's `embedded` feature, which alone pulls in this
//! crate) can be built here. llama-cpp-sys-2 builds it with cmake and a C++ compiler and
//! generates its bindings with bindgen, which loads libclang. Without one of them its build
//! script fails deep inside (a cmake or bindgen panic, minutes into a first build); this one
//! fails first, naming what is missing and the fix. It looks for libclang where clang-sys
//! (bindgen's loader) looks, and fails only when that search cannot succeed either; when unsure
//! it passes.
//!
//! Why a crate of its own, as a build-dependency of mesh-node: cargo orders nothing between this
//! check and llama-cpp-sys-2's build script (neither depends on the other), it starts the ready
//! job with the most jobs depending on it, and mesh-node's own build script has fewer of those
//! than llama-cpp-sys-2's (which mesh-node's library waits for through llama-cpp-2), so it never
//! ran first on a cold build. This build script is waited for by this crate, mesh-node's build
//! script and everything after it: one more than llama-cpp-sys-2's.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    // A passing check need not run again: a failed build script always reruns.
    println!("cargo:rerun-if-changed=build.rs");
    // clang-sys's search is only mirrored here for these hosts (build scripts run on the host).
    if !(cfg!(target_os = "linux") || cfg!(target_os = "freebsd") || cfg!(target_os = "macos")) {
        return;
    }
    // What is missing, with its Debian/Ubuntu package.
    let mut missing = Vec::new();
    if !set("CMAKE") && !on_path("cmake") {
        missing.push(("cmake", "cmake"));
    }
    if !cxx_compiler() {
        missing.push(("a C++ compiler", "g++"));
    }
    if !libclang() {
        missing.push(("libclang", "libclang-dev"));
    }
    if missing.is_empty() {
        return;
    }
    let what: Vec<_> = missing.iter().map(|(what, _)| *what).collect();
    let install = if cfg!(target_os = "macos") {
        "install the Xcode command line tools (`xcode-select --install`) and cmake".to_owned()
    } else {
        let packages: Vec<_> = missing.iter().map(|(_, package)| *package).collect();
        format!(
            "install (Debian/Ubuntu): `sudo apt-get install {}` (or run `deploy/test.sh \
             --setup-only` as root)",
            packages.join(" ")
        )
    };
    let elsewhere = if what.contains(&"libclang") {
        ", or set LIBCLANG_PATH to the directory of a libclang installed elsewhere"
    } else {
        ""
    };
    println!(
        "cargo::error=mesh-node's `embedded` feature (on by default) builds llama.cpp, which \
         needs cmake, a C++ compiler and libclang; not found here: {}. Fix: {install}{elsewhere}; \
         or build mesh-node without the embedded model backend: `cargo build -p mesh-node \
         --no-default-features` (docs/src/operations/building.md)",
        what.join(", ")
    );
}

/// An environment variable that is set and not empty.
fn set(name: &str) -> bool {
    env::var_os(name).is_some_and(|v| !v.is_empty())
}

fn on_path(program: &str) -> bool {
    env::var_os("PATH")
        .is_some_and(|path| env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// The C++ compiler the cc crate and cmake would pick: `CXX` (in any of cc's spellings), else
/// the usual names. A cross build names its compiler otherwise: not checked.
fn cxx_compiler() -> bool {
    let target = env::var("TARGET").unwrap_or_default();
    if target != env::var("HOST").unwrap_or_default() {
        return true;
    }
    let variables = [
        "CXX".to_owned(),
        "HOST_CXX".to_owned(),
        "TARGET_CXX".to_owned(),
        format!("CXX_{target}"),
        format!("CXX_{}", target.replace('-', "_")),
    ];
    variables.iter().any(|v| set(v)) || ["c++", "g++", "clang++"].iter().any(|p| on_path(p))
}

/// Whether clang-sys would find a libclang shared library (build/common.rs and build/dynamic.rs
/// of clang-sys 1.9, as bindgen loads it at run time): `LIBCLANG_PATH` alone when set, else
/// `llvm-config --prefix`, Xcode, `LD_LIBRARY_PATH`, `LIBRARY_PATH` and the usual directories.
/// Unlike clang-sys it does not check the files' ELF class: it may pass where clang-sys fails
/// later, never the other way round.
fn libclang() -> bool {
    let names: &[&str] = if cfg!(target_os = "macos") {
        &["libclang.dylib"]
    } else if cfg!(target_os = "linux") {
        &[
            "libclang.so",
            "libclang-*.so",
            "libclang.so.*",
            "libclang-*.so.*",
        ]
    } else {
        &["libclang.so", "libclang.so.*"]
    };
    let has = |dir: &Path| has_library(dir, names);

    if let Some(path) = env::var_os("LIBCLANG_PATH") {
        let path = PathBuf::from(path);
        return path.is_file() || has(&path);
    }
    let llvm_config = env::var("LLVM_CONFIG_PATH").unwrap_or_else(|_| "llvm-config".into());
    if let Some(prefix) = first_line(&llvm_config, &["--prefix"]) {
        let prefix = PathBuf::from(prefix);
        if ["bin", "lib", "lib64"].iter().any(|d| has(&prefix.join(d))) {
            return true;
        }
    }
    if cfg!(target_os = "macos")
        && let Some(xcode) = first_line("xcode-select", &["--print-path"])
        && has(&Path::new(&xcode).join("Toolchains/XcodeDefault.xctoolchain/usr/lib"))
    {
        return true;
    }
    for variable in ["LD_LIBRARY_PATH", "LIBRARY_PATH"] {
        if let Some(paths) = env::var_os(variable)
            && env::split_paths(&paths).any(|dir| has(&dir))
        {
            return true;
        }
    }
    let patterns: &[&str] = if cfg!(target_os = "macos") {
        &[
            "/usr/local/opt/llvm*/lib/llvm*/lib",
            "/Library/Developer/CommandLineTools/usr/lib",
            "/Applications/Xcode.app/Contents/Developer/Toolchains/XcodeDefault.xctoolchain/usr/lib",
            "/usr/local/opt/llvm*/lib",
        ]
    } else {
        &[
            "/usr/local/llvm*/lib*",
            "/usr/local/lib*/*/*",
            "/usr/local/lib*/*",
            "/usr/local/lib*",
            "/usr/lib*/*/*",
            "/usr/lib*/*",
            "/usr/lib*",
        ]
    };
    patterns
        .iter()
        .any(|p| expand(p).iter().any(|dir| has(dir)))
}

/// The first line a command prints, when it runs and succeeds.
fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    let stdout = String::from_utf8(output.stdout).ok()?;
    let line = stdout.lines().next()?.trim();
    (output.status.success() && !line.is_empty()).then(|| line.to_owned())
}

/// Whether `dir` holds a file whose name matches one of `names` (`*` wildcards), leaving out
/// `libclang-cpp` (a different library, which clang-sys skips too).
fn has_library(dir: &Path, names: &[&str]) -> bool {
    let Ok(entries) = dir.read_dir() else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        !name.contains("-cpp.") && names.iter().any(|n| matches(n, &name)) && entry.path().is_file()
    })
}

/// The directories an absolute pattern with `*` wildcards in its components matches.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/")];
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        dirs = dirs
            .iter()
            .flat_map(|dir| {
                if !part.contains('*') {
                    return vec![dir.join(part)];
                }
                dir.read_dir()
                    .into_iter()
                    .flatten()
                    .filter_map(Result::ok)
                    .filter(|e| matches(part, &e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect()
            })
            .filter(|dir| dir.is_dir())
            .collect();
    }
    dirs
}

/// Glob matching with `*` only, ignoring case (clang-sys matches directories that way).
fn matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((c, rest)) => n
                .split_first()
                .is_some_and(|(d, tail)| c.eq_ignore_ascii_case(d) && go(rest, tail)),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}
