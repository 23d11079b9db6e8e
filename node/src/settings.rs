//! The runtime settings of a running node (`mesh-cli config set`): it owns the node's current
//! configuration as they change it, checks a change with the config file's own validation
//! (`Config::with_runtime`), keeps it in the data dir (`settings.toml`), and applies it at once to
//! the parts that hold those values: admission (the client and `/mcp` tier caps), the
//! capabilities (the remote tier cap and declared GPUs, which the fleet learns from them), the
//! scheduler (which schedules it may own), the approval gate (its policy) and the front-door keys
//! (the loopback exemption). Every runtime setting applies without a restart.
//!
//! It decides nothing about who may change settings (admission does; `rpc::settings` asks it) and
//! speaks no protobuf.

use std::{path::PathBuf, sync::Arc, sync::Mutex};

use mesh_domain::sync::MutexExt;

use crate::{
    admission::Admission,
    api_keys::Keys,
    approvals::Approvals,
    capabilities::Capabilities,
    config::{Config, ConfigError, Shown, Source},
    cron::Scheduler,
};

/// Why a setting was not changed.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Not a runtime setting, or not a valid value (the message names the key).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The settings file could not be written; nothing changed.
    #[error("cannot keep the runtime settings in {}: {source}; nothing was changed", path.display())]
    Save {
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The parts a runtime setting changes.
#[derive(Debug)]
pub(crate) struct Targets {
    /// The client and `/mcp` tier caps.
    pub admission: Arc<Admission>,
    /// The advertised remote tier cap and declared GPUs.
    pub caps: Arc<Capabilities>,
    /// Which schedules this node may own.
    pub scheduler: Arc<Scheduler>,
    /// Which tool calls wait for approval.
    pub approvals: Approvals,
    /// The front door's loopback exemption.
    pub keys: Arc<Keys>,
}

/// The node's runtime settings.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The configuration in effect; changed one setting at a time.
    current: Mutex<Config>,
    targets: Targets,
}

impl Settings {
    /// The settings of a node started with `config` (runtime settings already laid over it),
    /// applied to `targets` from now on. Says in the log which runtime settings win over the
    /// config file.
    pub(crate) fn new(config: Config, targets: Targets) -> Self {
        for shown in config.runtime_settings() {
            if let (Source::Runtime, Some(file)) = (shown.source, &shown.file) {
                tracing::warn!(
                    key = shown.key,
                    runtime = %shown.value,
                    file = %file,
                    "a runtime setting (`mesh-cli config set`) wins over the config file's value; `mesh-cli config unset {}` goes back to the file's",
                    shown.key
                );
            }
        }
        Self {
            current: Mutex::new(config),
            targets,
        }
    }

    /// Every runtime setting as it is now.
    pub(crate) fn show(&self) -> Vec<Shown> {
        self.current.lock_unpoisoned().runtime_settings()
    }

    /// Sets `key` to the value `text` stands for.
    pub(crate) fn set(&self, key: &str, text: &str) -> Result<Shown, SettingsError> {
        self.change(key, |current| current.layers.runtime.with(key, text))
    }

    /// Removes the runtime setting of `key`: the file's value, or the default, applies again.
    pub(crate) fn unset(&self, key: &str) -> Result<Shown, SettingsError> {
        self.change(key, |current| current.layers.runtime.without(key))
    }

    /// Checks, keeps and applies one change; on any error nothing changes.
    fn change(
        &self,
        key: &str,
        change: impl FnOnce(&Config) -> Result<crate::config::RuntimeSettings, ConfigError>,
    ) -> Result<Shown, SettingsError> {
        let mut current = self.current.lock_unpoisoned();
        let next = current.with_runtime(change(&current)?)?;
        let runtime = &next.layers.runtime;
        runtime.save().map_err(|source| SettingsError::Save {
            path: runtime.path().to_owned(),
            source,
        })?;
        self.apply(&next);
        *current = next;
        let shown = current
            .runtime_settings()
            .into_iter()
            .find(|shown| shown.key == key)
            .expect("`with` and `without` refuse a key that is not a runtime setting");
        tracing::info!(key, value = %shown.value, source = shown.source.as_str(), "runtime setting changed");
        Ok(shown)
    }

    /// Hands `config`'s runtime-settable values to the parts that hold them.
    fn apply(&self, config: &Config) {
        let t = &self.targets;
        t.admission
            .set_tiers(config.client_max_tier, config.mcp_max_tier);
        t.caps.set_runtime(config.remote_max_tier, &config.gpus);
        t.scheduler.set_remote_max_tier(config.remote_max_tier);
        t.approvals.set_policy(config.approval.clone());
        t.keys
            .set_loopback_without_key(config.http.loopback_without_key);
    }
}
