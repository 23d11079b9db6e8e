//! The directories file and shell tools may use (`tools.roots`): a path is resolved and
//! canonicalised before use, so `..` and symlinks cannot leave them.

use std::path::{Component, Path, PathBuf};

use super::framework::ToolError;

/// Directories file tools may use.
#[derive(Debug)]
pub(crate) struct Roots {
    roots: Vec<PathBuf>,
}

impl Roots {
    pub(crate) fn new(roots: Vec<PathBuf>) -> Self {
        for root in &roots {
            if let Err(e) = std::fs::create_dir_all(root) {
                tracing::warn!(root = %root.display(), error = %e, "cannot create tool root");
            }
        }
        Self { roots }
    }

    pub(crate) fn default_dir(&self) -> Result<PathBuf, ToolError> {
        self.roots
            .first()
            .cloned()
            .ok_or_else(|| ToolError::Path("no tool roots configured".to_owned()))
    }

    /// Resolves `path` (relative to the first root, or absolute) to a location inside a root.
    /// The longest existing ancestor is canonicalised, so symlinks and `..` are followed before
    /// the check; the rest must be plain names.
    pub(crate) fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        if path.is_empty() {
            return Err(ToolError::Path("`path` is empty".into()));
        }
        let requested = Path::new(path);
        let joined = if requested.is_absolute() {
            requested.to_path_buf()
        } else {
            self.default_dir()?.join(requested)
        };
        let mut existing = joined.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            let name = existing.file_name().ok_or_else(|| {
                ToolError::Path(format!("`{path}` has no existing parent directory"))
            })?;
            rest.push(name.to_owned());
            existing = existing.parent().ok_or_else(|| {
                ToolError::Path(format!("`{path}` has no existing parent directory"))
            })?;
        }
        let mut resolved = existing
            .canonicalize()
            .map_err(|e| ToolError::Path(format!("cannot resolve `{path}`: {e}")))?;
        for name in rest.into_iter().rev() {
            if Path::new(&name)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                return Err(ToolError::Path(format!("`{path}` is not a plain path")));
            }
            resolved.push(name);
        }
        let inside = self.roots.iter().any(|root| {
            root.canonicalize()
                .map(|root| resolved.starts_with(root))
                .unwrap_or(false)
        });
        if inside {
            Ok(resolved)
        } else {
            Err(ToolError::Path(format!(
                "`{path}` is outside the directories this node allows ({})",
                self.roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use super::Roots;

    /// Roots in a fresh temporary directory (`<tmp>/ws`).
    pub(crate) fn roots() -> (tempfile::TempDir, Arc<Roots>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Arc::new(Roots::new(vec![dir.path().join("ws")]));
        (dir, roots)
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::roots;

    #[test]
    fn paths_outside_the_roots_are_refused() {
        let (dir, roots) = roots();
        assert!(roots.resolve("notes/a.txt").is_ok());
        assert!(roots.resolve("../escape.txt").is_err());
        assert!(roots.resolve("a/../../escape.txt").is_err());
        assert!(roots.resolve("/etc/passwd").is_err());
        std::os::unix::fs::symlink("/etc", dir.path().join("ws/etc-link")).expect("symlink");
        assert!(
            roots.resolve("etc-link/passwd").is_err(),
            "symlinks are followed before the check"
        );
    }
}
