//! The validated configuration the node runs on: [`Config`] and its parts ([`Listen`],
//! [`Discovery`], [`TlsMode`], [`GpuDecl`], [`ModelConfig`] with its [`Backend`],
//! [`PersonaConfig`], [`TaskLimits`], [`HttpConfig`]). A value of these types has passed every
//! check, so code that holds one need not check again. Plain data: it must not parse, check or
//! look anything up (the raw file is `raw.rs`, the checks are under `validate/`).

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use mesh_domain::Tier;
use mesh_tls::TlsFiles;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any (for messages).
    pub source: Option<PathBuf>,
    /// Node name (mDNS instance name). A node with a certificate runs under its certificate's
    /// name (`server` checks them against each other at start).
    pub name: String,
    /// Whether `name` is the host name, not `node.name` or `--name`: then a certificate issued
    /// for another name wins without a word of the user's being overruled.
    pub name_from_host: bool,
    /// Where the gRPC server listens.
    pub listen: Listen,
    /// Where the node keeps its state.
    pub data_dir: PathBuf,
    /// `node.min_free_disk_mb`, in bytes.
    pub min_free_disk: u64,
    /// `node.drain_on_stop_s`: how long a stopping node drains before it leaves.
    pub drain_on_stop: Duration,
    /// Roles served: `node.roles` plus the keys of `[roles]`, sorted.
    pub roles: Vec<String>,
    /// `node.labels`.
    pub labels: BTreeMap<String, String>,
    /// `[discovery]`: how peers are found.
    pub discovery: Discovery,
    /// `[tls]`: how peers authenticate each other.
    pub tls: TlsMode,
    /// `tls.ca_key`: the mesh CA's private key, which makes this node an issuer (with
    /// [`TlsMode::Mtls`] only; a zero-config node's own CA key is found at start).
    pub ca_key: Option<PathBuf>,
    /// `resources.gpus`.
    pub gpus: Vec<GpuDecl>,
    /// `[[models]]`, or the zero-config embedded model.
    pub models: Vec<ModelConfig>,
    /// `[roles]`: role → model chain.
    pub role_chains: BTreeMap<String, Vec<String>>,
    /// `[[personas]]`.
    pub personas: Vec<PersonaConfig>,
    /// `security.remote_max_tier`.
    pub remote_max_tier: Tier,
    /// `security.client_max_tier`.
    pub client_max_tier: Tier,
    /// `security.mcp_max_tier`.
    pub mcp_max_tier: Tier,
    /// `[tasks]`: worker count, queue length and default task budgets.
    pub tasks: TaskLimits,
    /// `tools.roots`.
    pub tool_roots: Vec<PathBuf>,
    /// `memory.local_namespaces`.
    pub local_namespaces: Vec<String>,
    /// `memory.max_clock_skew_ms`.
    pub max_clock_skew: Duration,
    /// `memory.tombstone_window_s`.
    pub tombstone_window: Duration,
    /// `memory.sync_interval_s`.
    pub sync_interval: Duration,
    /// `memory.max_namespaces`.
    pub max_namespaces: usize,
    /// `memory.fanout`.
    pub memory_fanout: usize,
    /// `[http]`: the front door.
    pub http: HttpConfig,
    /// `[connections]`: timeouts and caps for connections not yet proven.
    pub connections: ConnectionLimits,
    /// `[approval]`: which tool calls wait for a person's approval.
    pub approval: ApprovalConfig,
    /// `[cron]`: how many schedules this node keeps.
    pub cron: CronLimits,
    /// `[[mcp]]`: the MCP servers whose tools this node offers.
    pub mcp: Vec<McpConfig>,
    /// What this was read from (the file, the flags, the runtime settings), so a runtime
    /// setting can be checked again against the same file.
    pub layers: crate::config::layers::Layers,
}

/// Validated `[approval]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalConfig {
    /// Calls of these tiers need approval.
    pub tiers: std::collections::BTreeSet<Tier>,
    /// Calls of these tools need approval.
    pub tools: std::collections::BTreeSet<String>,
    /// Calls of every tool of these MCP servers (`<server>__<tool>`) need approval.
    pub servers: std::collections::BTreeSet<String>,
    /// How long a call waits for a decision before it is denied.
    pub timeout: Duration,
    /// Calls that may wait at once on this node.
    pub max_pending: usize,
}

impl Default for ApprovalConfig {
    /// No call needs approval.
    fn default() -> Self {
        Self {
            tiers: Default::default(),
            tools: Default::default(),
            servers: Default::default(),
            timeout: Duration::from_secs(300),
            max_pending: 16,
        }
    }
}

/// A validated `[[mcp]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    /// The server's name: its tools are `<name>__<tool>`.
    pub name: String,
    /// How the node reaches it.
    pub transport: McpTransport,
    /// The tier its tools count as.
    pub tier: Tier,
    /// Only these tools (names on the server); `None`: all.
    pub tools: Option<Vec<String>>,
    /// Longest one call may take.
    pub timeout: Duration,
}

/// How the node reaches an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Environment variables set for it (besides the few passed on from the node's).
        env: BTreeMap<String, String>,
    },
    /// A streamable HTTP server.
    Http {
        /// Its URL.
        url: String,
    },
}

/// Validated `[connections]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// gRPC port: how long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// gRPC port: open connections, handshaking or established.
    pub grpc_max_connections: usize,
    /// gRPC port: TLS handshakes in progress (at most `grpc_max_connections`).
    pub grpc_max_handshakes: usize,
    /// Front door: how long a connection may take to send a request's headers, from when it
    /// opened or from its last response.
    pub header_timeout: Duration,
    /// Front door: open connections.
    pub http_max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            grpc_max_connections: 4096,
            grpc_max_handshakes: 2048,
            header_timeout: Duration::from_secs(10),
            http_max_connections: 2048,
        }
    }
}

/// Validated `[security]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Security {
    /// The highest tier run for anything not started by this node's operators.
    pub remote_max_tier: Tier,
    /// The highest tier run for an operator's client certificate.
    pub client_max_tier: Tier,
    /// The highest tier run or allowed for a caller of the front door's `/mcp` tools.
    pub mcp_max_tier: Tier,
}

/// Validated `[cron]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CronLimits {
    /// `cron.max_schedules`.
    pub max_schedules: usize,
    /// `cron.max_schedules_per_creator`.
    pub max_schedules_per_creator: usize,
    /// `cron.max_mb`, in bytes.
    pub max_bytes: usize,
    /// `cron.max_mb_per_creator`, in bytes.
    pub max_bytes_per_creator: usize,
}

/// Validated `[tasks]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Concurrent tasks.
    pub workers: usize,
    /// Waiting tasks before `RESOURCE_EXHAUSTED`.
    pub queue: usize,
    /// Model rounds of a task that does not set its own.
    pub max_rounds: u32,
    /// Token budget of a task that does not set its own.
    pub token_budget: u64,
    /// Deadline of a task that does not set its own.
    pub timeout: Duration,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            workers: 2,
            queue: 16,
            max_rounds: 10,
            token_budget: 200_000,
            timeout: Duration::from_secs(600),
        }
    }
}

/// Where to listen, and whether a taken default port may fall back to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// The address asked for.
    pub addr: SocketAddr,
    /// True when the port was not chosen explicitly: try up to
    /// [`LAST_FALLBACK_PORT`](crate::config::LAST_FALLBACK_PORT).
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
    /// `discovery.max_advert_dials`: pending dials started by mDNS adverts, at most.
    pub max_advert_dials: usize,
    /// `discovery.max_failing_addrs`: failing advertised addresses remembered, at most.
    pub max_failing_addrs: usize,
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
    /// The name shown for it, e.g. `RTX 4090`.
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
        timeout: Duration,
        /// Where the server's chat template takes system messages.
        system_turns: SystemTurns,
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
        timeout: Duration,
    },
}

/// `[[models]] system_turns`: where a model's chat template takes system messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SystemTurns {
    /// Wherever the conversation has them.
    #[default]
    Anywhere,
    /// Only first: every system message is folded into one leading system turn.
    First,
}

/// A validated `[[models]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// The name roles refer to.
    pub name: String,
    /// How it is reached.
    pub backend: Backend,
    /// Whether it makes embeddings (`embeddings = true`).
    pub embeddings: bool,
}

/// A validated `[[personas]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonaConfig {
    /// The name a task or a chat targets it by; unique on the node.
    pub name: String,
    /// Role whose chain it uses.
    pub role: String,
    /// The system prompt its tasks start with.
    pub system_prompt: String,
    /// Allowed tools; `None` = all. The names are not checked against the tools a node has
    /// here: the tool registry knows them.
    pub tools: Option<Vec<String>>,
    /// Highest tool tier its tasks may use.
    pub max_tier: Tier,
}

/// Validated `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Where to listen.
    pub listen: Listen,
    /// Accepted bearer keys, unlimited and not counted (empty, with `keys`: no
    /// authentication).
    pub api_keys: Vec<String>,
    /// `[[http.keys]]`: named keys with their policies.
    pub keys: Vec<HttpKey>,
    /// Hosts a front door without keys answers besides the loopback names, in normal form.
    pub allowed_hosts: Vec<mesh_domain::origin::HostPort>,
    /// Origins of web pages whose requests the front door takes, in normal form.
    pub allowed_origins: Vec<String>,
    /// `http.unknown_fields`.
    pub unknown_fields: UnknownFields,
    /// `http.model_aliases`, longest pattern first.
    pub model_aliases: Vec<ModelAlias>,
    /// `http.loopback_without_key`: callers on this machine need no key.
    pub loopback_without_key: bool,
}

/// `http.unknown_fields`: what the front door does with a request field the mesh does not
/// know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownFields {
    /// Accepted and not used (logged once per client at debug).
    #[default]
    Ignore,
    /// A 400 naming the field, in the API's own words.
    Refuse,
}

/// One `http.model_aliases` entry: model names a client sends, and the model or role of the
/// fleet they stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAlias {
    /// The name, or with [`ModelAlias::prefix`] the start of the names, it covers (without the
    /// `*`).
    pub pattern: String,
    /// Whether the entry was written with a trailing `*`.
    pub prefix: bool,
    /// A model name or `role:NAME`.
    pub target: String,
}

/// A validated `[[http.keys]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpKey {
    /// Its name (checked, unique on the node).
    pub name: String,
    /// Where its hash comes from.
    pub secret: KeySecret,
    /// What it may use, and how much.
    pub policy: mesh_domain::KeyPolicy,
}

/// How a configured key is known: by its hash, or by a file the node reads (and checks is the
/// owner's alone) when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySecret {
    /// `key_sha256`.
    Sha256([u8; 32]),
    /// `key_file`.
    File(std::path::PathBuf),
}
