//! Node configuration: the TOML file, command-line overrides, defaults, and validation.
//!
//! Read in two steps: [`RawConfig`] mirrors the file (serde, unknown keys rejected), then
//! [`RawConfig::validate`] turns it into [`Config`], the types the node uses. Every error names
//! the key and the file and says how to fix it. This module reads no certificates and opens no
//! sockets; it only decides what the operator asked for. It does not check the tool names a
//! persona lists: the tool registry knows them, config does not.
//!
//! Layout; a file uses only the files listed above it, and none uses this one, which only
//! re-exports them and loads a file with [`Config::load`]:
//! - `error.rs`: [`ConfigError`], and the origin (file) every error names;
//! - `defaults.rs`: ports, the default name and thread count, the zero-config embedded model;
//! - `types.rs`: [`Config`] and its parts, the validated types the rest of the node uses;
//! - `raw.rs`: [`RawConfig`] and one `Raw*` struct per section, every default documented, and
//!   [`Overrides`] (the flags);
//! - `validate/`: [`RawConfig::validate`], one function per section, grouped in files;
//! - `runtime.rs`: the runtime settings (`mesh-cli config set`) kept in the data dir and laid
//!   over the file, which keys they are, and what each is in a [`Config`].

mod defaults;
mod error;
mod layers;
mod raw;
mod runtime;
mod types;
mod validate;

use std::path::Path;

pub use defaults::{
    DEFAULT_CONTEXT_WINDOW, DEFAULT_HTTP_PORT, DEFAULT_MODEL_FILE, DEFAULT_MODEL_NAME,
    DEFAULT_PORT, DEFAULT_ROLE, FETCH_HINT, LAST_FALLBACK_PORT, MAX_NAME_LEN, MAX_THREADS,
    default_model_path, default_name, default_threads,
};
pub use error::ConfigError;
pub use layers::{Layers, RuntimeSettings};
pub use raw::{
    Overrides, RawApproval, RawConfig, RawConnections, RawCron, RawDiscovery, RawGpu, RawHttp,
    RawHttpKey, RawMcp, RawMemory, RawModel, RawNode, RawPersona, RawResources, RawSecurity,
    RawTasks, RawTls, RawTools,
};
pub use runtime::{MAX_VALUE_BYTES, SETTABLE, SETTINGS_FILE, Settable, Shown, Source};
pub use types::{
    ApprovalConfig, Backend, Config, ConnectionLimits, CronLimits, Discovery, GpuDecl, HttpConfig,
    HttpKey, KeySecret, Listen, McpConfig, McpTransport, ModelAlias, ModelConfig, PersonaConfig,
    SystemTurns, TaskLimits, TlsMode, UnknownFields,
};
pub use validate::is_valid_name as is_valid_node_name;

impl Config {
    /// Loads `path` (or nothing, for zero-config), applies `overrides`, lays the runtime
    /// settings of the data dir over them (`<data_dir>/settings.toml`), and validates.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        runtime::load(path, overrides)
    }
}
