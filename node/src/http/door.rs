//! What the front door needs from the node: [`FrontDoor`], the one state every route and
//! dialect reads. Its own file so that the dialects and the gateway name it without naming the
//! router that names them (no circle of files; `node/tests/layers/`).

use std::sync::Arc;

use super::guard::Guard;
use crate::{
    admission::Admission, agent::tools::ToolRegistry, api_keys::Keys, capabilities::Capabilities,
    chat::ChatService, cron::Scheduler, memory::Memory, peers::PeerTable, tasks::TaskManager,
};

/// What the front door needs from the node.
#[derive(Debug)]
pub struct FrontDoor {
    /// Places and runs chats: here, or on peers.
    pub chat: Arc<ChatService>,
    /// This node's advertised info.
    pub caps: Arc<Capabilities>,
    /// Peers and what they serve.
    pub peers: Arc<PeerTable>,
    /// The API keys (`http.api_keys`, `[[http.keys]]`, and those added at run time), their
    /// limits and usage; with none, the front door is open.
    pub keys: Arc<Keys>,
    /// For `/metrics`: replication lag per peer.
    pub memory: Arc<Memory>,
    /// `/mcp`: decides what its callers may do (`security.mcp_max_tier`).
    pub admission: Arc<Admission>,
    /// `/mcp`'s `run_task`: submits and follows tasks.
    pub tasks: TaskManager,
    /// `/mcp`'s memory and fleet tools: the agents' own.
    pub tools: Arc<ToolRegistry>,
    /// `/mcp`'s `cron_list`.
    pub scheduler: Arc<Scheduler>,
    /// What every route refuses of what a web page can send (`http.allowed_hosts`,
    /// `http.allowed_origins`).
    pub guard: Guard,
    /// `/mcp`'s `run_task` on a key with a token limit: the most tokens a task is granted (this
    /// node's `tasks.token_budget`), all of it reserved while it runs.
    pub task_token_budget: u64,
    /// `http.unknown_fields` and `http.model_aliases`: how unknown request fields and model
    /// names are met.
    pub clients: super::clients::Clients,
}
