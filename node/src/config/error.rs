//! What a config error says: [`ConfigError`] (the file could not be read, is not valid TOML, or
//! holds a wrong value), and `Origin`, which builds the wrong-value errors of one file so that
//! every message names it. It must not decide what is valid; the validation files do.

use std::path::{Path, PathBuf};

/// A configuration error: which key, in which file, what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys / wrong types.
    #[error("invalid config file {}: {message}", path.display())]
    Parse {
        path: PathBuf,
        /// toml's message, which names the key and shows the line.
        message: String,
    },
    /// A value is present but wrong.
    #[error("{origin}: `{key}` {problem}; {fix}")]
    Invalid {
        /// The file, or `configuration` when there is none (zero-config).
        origin: String,
        /// The full key, e.g. `node.listen`.
        key: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
    },
}

/// Where the values being checked came from: the file's path, or `configuration` when there is
/// no file. Every [`ConfigError::Invalid`] starts with it.
#[derive(Debug, Clone)]
pub(super) struct Origin(String);

impl Origin {
    /// The origin of the values read from `path`, or of the defaults and flags alone.
    pub(super) fn new(path: Option<&Path>) -> Self {
        Self(
            path.map(|p| p.display().to_string())
                .unwrap_or_else(|| "configuration".into()),
        )
    }

    /// The origin named `what` (a command, when the value came from one).
    pub(super) fn named(what: &str) -> Self {
        Self(what.to_owned())
    }

    /// The error for `key`: what is wrong with its value (`problem`) and how to fix it (`fix`).
    pub(super) fn invalid(&self, key: &str, problem: String, fix: &str) -> ConfigError {
        ConfigError::Invalid {
            origin: self.0.clone(),
            key: key.into(),
            problem,
            fix: fix.into(),
        }
    }
}
