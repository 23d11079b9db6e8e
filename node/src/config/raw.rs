//! The config file as written: [`RawConfig`] and one `Raw*` struct per section, mirrored with
//! serde, plus [`Overrides`], the command-line flags that win over the file. Every key is
//! optional unless its doc says otherwise, and its doc gives the default; an unknown key is an
//! error that names the key and the file. It must not check values or fill in defaults that
//! depend on anything else (that is validation); it only says what the text holds.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::config::error::ConfigError;

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
    /// `[[models]]`. Default: none; a node with no models and no `[roles]` serves the
    /// zero-config embedded model when its file is in the data dir.
    pub models: Vec<RawModel>,
    /// `[roles]`: role → ordered model names, primary first. Default: none.
    pub roles: BTreeMap<String, Vec<String>>,
    /// `[[personas]]`. Default: none.
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
    /// `[connections]`
    pub connections: RawConnections,
    /// `[approval]`
    pub approval: RawApproval,
    /// `[cron]`
    pub cron: RawCron,
    /// `[[mcp]]`: MCP servers whose tools this node's agents, and the fleet's, may use.
    /// Default: none.
    pub mcp: Vec<RawMcp>,
}

impl RawConfig {
    /// Parses TOML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: format!(
                "{}\n(every key is listed in docs/src/operations/config.md)",
                e.to_string().trim_end()
            ),
        })
    }
}

/// `[node]`: who the node is, where it listens and where it keeps its state.
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
    /// At SIGTERM/SIGINT the node drains for at most this many seconds before it leaves
    /// (0-3600): no new work, queued tasks to other nodes, running ones given the time to
    /// finish. 0 leaves at once. Default 10.
    pub drain_on_stop_s: Option<u64>,
    /// Roles this node serves besides those in `[roles]`. Default: none.
    pub roles: Vec<String>,
    /// Free-form labels the router can require (`--label gpu=fast`). Default: none.
    pub labels: BTreeMap<String, String>,
}

/// `[discovery]`: how the node finds its peers.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDiscovery {
    /// Advertise and browse over mDNS. Default: true.
    pub mdns: bool,
    /// Restrict mDNS to these interfaces. Default: all.
    pub interfaces: Vec<String>,
    /// `host:port` of peers to dial at start (bootstrap; the rest is learned from them).
    /// Default: none.
    pub static_peers: Vec<String>,
    /// Dials started by mDNS adverts that may be pending (not up yet) at once; more adverts
    /// are dropped. Default: 64.
    pub max_advert_dials: usize,
    /// Failing advertised addresses remembered (and held back); the oldest is forgotten
    /// first. Default: 4096.
    pub max_failing_addrs: usize,
}

impl Default for RawDiscovery {
    fn default() -> Self {
        Self {
            mdns: true,
            interfaces: Vec::new(),
            static_peers: Vec::new(),
            max_advert_dials: 64,
            max_failing_addrs: 4096,
        }
    }
}

/// `[tls]`: how peers authenticate each other. With none of `ca`, `cert` and `key` (the
/// default), the node uses its own CA in `<data_dir>/tls`, created on first start.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTls {
    /// The mesh CA certificate (PEM). Default: none.
    pub ca: Option<PathBuf>,
    /// This node's certificate (PEM), issued by the CA. Default: none.
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM). Default: none.
    pub key: Option<PathBuf>,
    /// The mesh CA's private key (PEM); with it this node is an issuer: it redeems join tokens
    /// for certificates. Needs `ca`, `cert` and `key`. Default: none (a zero-config node is an
    /// issuer with the CA key in `<data_dir>/tls`).
    pub ca_key: Option<PathBuf>,
    /// Plain TCP without authentication. For local experiments only. Default: false.
    pub insecure: bool,
    /// Allow `insecure` on a non-loopback address. Default: false.
    pub insecure_allow_remote: bool,
}

/// `[resources]`: hardware the operator declares.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawResources {
    /// GPUs declared by the operator, shown in addition to those nvidia-smi reports.
    /// Default: none.
    pub gpus: Vec<RawGpu>,
}

/// One `[[resources.gpus]]` entry; both keys are required.
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
    /// The name roles refer to. Required.
    pub name: String,
    /// `openai` or `embedded`. Required.
    pub backend: String,
    /// For `openai` (required there): the server's base URL, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// For `openai` (required there): the model name the server knows.
    pub model: Option<String>,
    /// For `embedded` (required there): the GGUF file.
    pub path: Option<PathBuf>,
    /// For `openai`: the environment variable holding the API key. Default: none (the
    /// placeholder key `none` is sent).
    pub api_key_env: Option<String>,
    /// Context window in tokens. Default: 8192 (`openai`), 2048 (`embedded`).
    pub context_window: Option<usize>,
    /// Longest a single model call may take, seconds. Default: 120.
    pub timeout_s: Option<u64>,
    /// For `embedded`: threads for inference. Default: the number of CPU cores.
    pub threads: Option<usize>,
    /// For `openai`: where the server's chat template takes system messages: `"anywhere"` (as
    /// OpenAI's API does; ChatML, Llama 3 and Qwen templates) or `"first"` (every system message
    /// folded into one leading system turn, for templates that refuse a later one, such as
    /// Gemma's or older Mistral's). The embedded backend takes them anywhere. Default:
    /// `"anywhere"`.
    pub system_turns: Option<String>,
    /// Whether the model makes embeddings (`POST /v1/embeddings`): for `embedded`, the engine
    /// keeps a second, embedding context; for `openai`, the server's model answers
    /// `/embeddings` and the node passes calls through. Default: false (chat only).
    #[serde(default)]
    pub embeddings: bool,
}

/// One `[[personas]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPersona {
    /// Unique persona name. Required.
    pub name: String,
    /// The role whose model chain the persona uses. Required.
    pub role: String,
    /// The system prompt. Default: empty.
    #[serde(default)]
    pub system_prompt: String,
    /// Tools the persona may use (default: every registered tool).
    pub tools: Option<Vec<String>>,
    /// Highest tool tier the persona may use (default: `read`).
    pub max_tier: Option<String>,
}

/// One `[[mcp]]` entry: an MCP server, started as a child process (`command`) or reached over
/// streamable HTTP (`url`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMcp {
    /// The server's name, the prefix of its tools' names (`<name>__<tool>`). Required.
    pub name: String,
    /// stdio: the program to start (looked up in `PATH`). This or `url`.
    pub command: Option<String>,
    /// stdio: its arguments. Default: none.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: environment variables it gets, besides `HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`
    /// and `USER` (nothing else of the node's environment is passed on). Default: none.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Streamable HTTP: the server's URL, e.g. `http://127.0.0.1:8000/mcp`. This or `command`.
    pub url: Option<String>,
    /// The tier its tools count as: `read`, `write` or `shell`. Default: `write`.
    pub tier: Option<String>,
    /// Only these of its tools (their names on the server). Default: all.
    pub tools: Option<Vec<String>>,
    /// Longest one call of its tools may take, seconds. Default: 60.
    pub timeout_s: Option<u64>,
}

/// `[tasks]`: how much work the node takes on, and the default budget of each task.
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

/// `[tools]`: where the file and shell tools may work.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTools {
    /// Directories `file_read` / `file_write` may touch; the first is `shell_exec`'s default
    /// working directory. Default: `<data_dir>/workspace`.
    pub roots: Vec<PathBuf>,
}

/// `[security]`: what other nodes may ask of this one.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawSecurity {
    /// The highest tier this node runs for anything not started by one of its operators
    /// (tasks from other nodes, node certificates): `read`, `write` or `shell`. Default: `read`.
    pub remote_max_tier: Option<String>,
    /// The highest tier this node runs for an operator's client certificate: `read`, `write` or
    /// `shell`. Default: `write`.
    pub client_max_tier: Option<String>,
    /// The highest tier this node runs or allows for a caller of the front door's `/mcp` tools
    /// (no certificate: an API key, or nothing on an open door): `read`, `write` or `shell`.
    /// Default: `read`.
    pub mcp_max_tier: Option<String>,
}

/// `[approval]`: which tool calls of tasks running here wait for a person's approval
/// (`mesh-cli approvals approve ID`). Default: none do.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawApproval {
    /// Calls of these tiers (`read`, `write`, `shell`; each listed tier, not the ones above
    /// it) need approval. Default: none.
    pub tiers: Vec<String>,
    /// Calls of these tools (by name, e.g. `shell_exec`, or an MCP tool's `<server>__<tool>`)
    /// need approval. Default: none.
    pub tools: Vec<String>,
    /// Calls of every tool of these MCP servers (their `[[mcp]] name`; the tools are named
    /// `<server>__<tool>`) need approval. Default: none.
    pub servers: Vec<String>,
    /// Seconds a call waits for a decision before it is denied (at most 540). Default: 300.
    pub timeout_s: Option<u64>,
    /// Calls that may wait for approval on this node at once; one more is denied at once.
    /// Default: 16.
    pub max_pending: Option<usize>,
}

/// `[cron]`: how many schedules, and how many bytes of them, this node keeps.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCron {
    /// Most schedules of all creators together. Default: 1000.
    pub max_schedules: Option<usize>,
    /// Most schedules of one creator (one certificate). Default: 100.
    pub max_schedules_per_creator: Option<usize>,
    /// Most MiB of stored schedules of all creators together. Default: 16.
    pub max_mb: Option<usize>,
    /// Most MiB of stored schedules of one creator. Default: 4.
    pub max_mb_per_creator: Option<usize>,
}

/// `[memory]`: what the shared memory keeps to itself and how it replicates.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawMemory {
    /// Namespaces kept on this node only (not replicated). Default: none.
    pub local_namespaces: Vec<String>,
    /// How far ahead of this node's clock a replicated record may be stamped. Default: 500.
    pub max_clock_skew_ms: Option<u64>,
    /// How long a tombstone is kept at most, in seconds. Default: 604800 (7 days).
    pub tombstone_window_s: Option<u64>,
    /// How often the node pulls from `fanout` random up peers even without news, in seconds.
    /// Default: 30.
    pub sync_interval_s: Option<u64>,
    /// How many up peers a write is pushed to, and how many are pulled from each sync
    /// interval (chosen at random each time; the rest catch up by pulling). Default: 3.
    pub fanout: Option<usize>,
    /// Most namespaces the node keeps (system namespaces aside). Default: 1000.
    pub max_namespaces: Option<usize>,
}

/// `[http]`: the OpenAI-compatible front door.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawHttp {
    /// Address to listen on. Default: `127.0.0.1:7780` (the next free port up to 7790).
    pub listen: Option<String>,
    /// Bearer keys; when set, `/v1/*` requests need one. Default: none (no authentication,
    /// which a front door beyond loopback must accept with `allow_unauthenticated`).
    pub api_keys: Vec<String>,
    /// `[[http.keys]]`: named keys with allowed models and roles, budgets and rate limits, and
    /// their usage counted fleet-wide. Default: none.
    pub keys: Vec<RawHttpKey>,
    /// Lets a front door listen beyond loopback without `api_keys`, open to anyone who can
    /// reach it. Default: false (such a node refuses to start).
    pub allow_unauthenticated: bool,
    /// Host names (`name` or `name:port`) a front door without keys answers besides
    /// `localhost`, `127.0.0.1` and `[::1]`: the names a container's or a proxy's clients reach
    /// it by. Default: none.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) of web pages whose requests the front door takes; a
    /// request with any other `Origin` is refused. Default: none.
    pub allowed_origins: Vec<String>,
    /// What the front door does with a request field the mesh does not know: `"ignore"`
    /// (accepted and not used, logged once per client at debug) or `"refuse"` (a 400 naming
    /// it, in the API's own words). Default: `"ignore"`.
    pub unknown_fields: Option<String>,
    /// Model names clients send, mapped to a model or role of the fleet, e.g.
    /// `"claude-*" = "role:coder"`; a name ending in `*` covers every name that starts with the
    /// rest, and the longest match wins. Used only for names no model or role of the fleet
    /// has. Default: none.
    pub model_aliases: BTreeMap<String, String>,
    /// Lets requests from this machine (a loopback peer address) in without a key, also once
    /// the node or the fleet has keys. Default: false (every caller needs a key once there
    /// are keys).
    pub loopback_without_key: bool,
}

/// One `[[http.keys]]` entry: the key itself is not in the file, only its SHA-256 or the path
/// of a file (mode 0600) that holds it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawHttpKey {
    /// The key's name, unique on the node: usage and limits are counted per name. Required.
    pub name: String,
    /// The key's SHA-256, 64 hex digits (`printf %s "$KEY" | sha256sum`). This or `key_file`.
    pub key_sha256: Option<String>,
    /// A file holding the key (one line, owner-only: mode 0600). This or `key_sha256`.
    pub key_file: Option<PathBuf>,
    /// Models the key may ask for. Default (with `roles` empty too): every model and role.
    pub models: Vec<String>,
    /// Roles the key may ask for (`role:NAME`). Default (with `models` empty too): all.
    pub roles: Vec<String>,
    /// Prompt plus completion tokens per UTC day, fleet-wide. Default: no limit.
    pub max_tokens_per_day: Option<u64>,
    /// Prompt plus completion tokens per UTC month, fleet-wide. Default: no limit.
    pub max_tokens_per_month: Option<u64>,
    /// Requests per calendar minute, fleet-wide. Default: no limit.
    pub requests_per_minute: Option<u64>,
    /// Prompt plus completion tokens per calendar minute, fleet-wide. Default: no limit.
    pub tokens_per_minute: Option<u64>,
    /// The `mcp` scope: the key may use `/mcp` (tasks, the fleet, the shared memory). Default:
    /// false (models only).
    pub mcp: bool,
}

/// `[connections]`: how long a connection may take to prove itself, and how many each listener
/// holds at once.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConnections {
    /// gRPC port: seconds a TLS handshake may take before the connection is closed. Default: 10.
    pub handshake_timeout_s: Option<u64>,
    /// gRPC port: open connections, handshaking or established. Default: 4096.
    pub grpc_max_connections: Option<usize>,
    /// gRPC port: TLS handshakes in progress. Default: 2048.
    pub grpc_max_handshakes: Option<usize>,
    /// Front door: seconds a connection may take to send a request's headers, counted from when
    /// it opened or from its last response (so it is also how long an idle keep-alive
    /// connection stays). Default: 10.
    pub header_timeout_s: Option<u64>,
    /// Front door: open connections. Default: 2048.
    pub http_max_connections: Option<usize>,
}

/// Command-line flags that override the file. Each is unset (or false) unless given.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        RawConfig::parse(text, Path::new("node.toml"))
            .expect_err("config must be rejected")
            .to_string()
    }

    #[test]
    fn unknown_keys_are_named_with_the_file() {
        let message = err("[node]\nnmae = \"x\"\n");
        assert!(message.contains("nmae"), "{message}");
        assert!(message.contains("node.toml"), "{message}");
        let message = err("[dicsovery]\nmdns = true\n");
        assert!(message.contains("dicsovery"), "{message}");
    }
}
