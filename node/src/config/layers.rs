//! What a configuration was read from ([`Layers`]): the file, the flags, and the runtime
//! settings laid over them ([`RuntimeSettings`]), kept in the [`Config`](super::Config) so a
//! runtime change is checked again against the same file and flags. Reading, changing and
//! applying runtime settings is `runtime`'s; this file only holds them, so that the validated
//! configuration (`types`) can carry them without naming the code that applies them.

use std::path::PathBuf;

use toml::Table;

use crate::config::raw::Overrides;

/// What the configuration was read from, kept so a runtime change is checked again against
/// the same file and flags.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    /// The config file, as a table (empty without one).
    pub file: Table,
    /// The command-line flags.
    pub overrides: Overrides,
    /// The runtime settings laid over the file.
    pub runtime: RuntimeSettings,
}

/// The runtime settings of a data dir (`<data_dir>/settings.toml`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeSettings {
    pub(in crate::config) path: PathBuf,
    pub(in crate::config) table: Table,
}
