//! What a node says about itself ([`NodeInfo`]: who it is, what it serves, what it has, how
//! busy and how healthy it is), and how alive a peer looks ([`PeerState`]).

use std::{collections::BTreeMap, sync::Arc};

use crate::{id::NodeId, mcp::McpToolInfo, tier::Tier};

/// Everything one node says about itself (the domain form of `agentmesh.v1.NodeInfo`).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Node id.
    pub id: NodeId,
    /// Software version.
    pub version: String,
    /// Protocol major.
    pub protocol: u32,
    /// `host:port` addresses it listens on.
    pub addrs: Vec<String>,
    /// Roles it serves.
    pub roles: Vec<String>,
    /// Free-form labels (`site = "home"`) tasks can require.
    pub labels: BTreeMap<String, String>,
    /// Personas (name, role).
    pub personas: Vec<PersonaInfo>,
    /// Its models, each with its measured speed.
    pub models: Vec<ModelInfo>,
    /// Role → model chain.
    pub role_chains: BTreeMap<String, Vec<String>>,
    /// CPU, memory, GPUs.
    pub resources: Resources,
    /// Running and queued tasks.
    pub load: Load,
    /// Health and its reasons.
    pub health: Health,
    /// Hex SHA-256 of the certificate, empty in insecure mode.
    pub cert_fingerprint: String,
    /// Unix ms when the process started.
    pub started_at_ms: u64,
    /// Highest tier run for remote callers.
    pub remote_max_tier: Tier,
    /// Sequence number of this node's latest shared-memory write.
    pub memory_seq: u64,
    /// The tools of its MCP servers it offers the fleet (shared, so a snapshot copies none).
    pub mcp_tools: Arc<[McpToolInfo]>,
    /// Whether it is draining (`mesh-cli drain`, or stopping): it takes no new tasks or chats,
    /// and every router leaves it out.
    pub draining: bool,
}

/// A persona as advertised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonaInfo {
    /// The persona's name, which tasks ask for.
    pub name: String,
    /// The role whose model chain it runs on.
    pub role: String,
}

/// A model as advertised.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Name roles refer to.
    pub name: String,
    /// `openai` or `embedded`.
    pub backend: String,
    /// Backend model name or GGUF path.
    pub model: String,
    /// Base URL for `openai`.
    pub base_url: String,
    /// Measured decode speed, tokens/s; 0 until measured.
    pub tokens_per_s: f64,
    /// Whether it makes embeddings (`embeddings = true` in its `[[models]]` entry).
    pub embeds: bool,
}

/// Host resources.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Resources {
    /// Logical CPUs.
    pub cpu_count: u32,
    /// Total memory, bytes.
    pub memory_total_bytes: u64,
    /// Available memory, bytes.
    pub memory_available_bytes: u64,
    /// One-minute load average.
    pub cpu_load: f64,
    /// GPUs: probed, then declared.
    pub gpus: Vec<Gpu>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The GPU's name as reported or declared.
    pub name: String,
    /// Total VRAM, MiB.
    pub vram_mb: u64,
    /// Free VRAM, MiB, when measurable.
    pub vram_free_mb: Option<u64>,
    /// `declared` or `nvidia-smi`.
    pub source: String,
}

/// Task load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Tasks executing.
    pub running: u32,
    /// Tasks waiting.
    pub queued: u32,
    /// Workers (tasks that can run at once).
    pub workers: u32,
    /// Tasks that may wait before the node refuses more.
    pub queue_capacity: u32,
}

/// Overall health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum HealthStatus {
    /// All checks pass.
    #[default]
    Healthy,
    /// Works, with reduced function (e.g. mDNS off, a model unreachable).
    Degraded,
    /// Cannot do its job.
    Unhealthy,
}

impl HealthStatus {
    /// `healthy`, `degraded` or `unhealthy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// Health with reasons.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Health {
    /// Worst status of any check.
    pub status: HealthStatus,
    /// One line per failing check.
    pub reasons: Vec<String>,
}

/// Liveness of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerState {
    /// Its beats arrive.
    Up,
    /// Missed beats or a broken stream; may come back.
    Suspect,
    /// Left, refused connections, or silent too long.
    Down,
    /// Its certificate was revoked by the mesh CA: never dialed, accepted or believed again.
    Revoked,
}

impl PeerState {
    /// `up`, `suspect`, `down` or `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Suspect => "suspect",
            Self::Down => "down",
            Self::Revoked => "revoked",
        }
    }
}
