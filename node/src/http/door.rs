//! What the front door needs from the node: [`FrontDoor`], the one state every route and
//! dialect reads. Its own file so that the dialects name it without naming the router that
//! names them (no circle of files; `node/tests/layers.rs`).

use std::sync::Arc;

use super::{clients::Clients, guard::Guard};
use crate::{
    admission::Admission, agent::tools::ToolRegistry, api_keys::Keys, capabilities::Capabilities,
    cron::Scheduler, gateway::Gateway, memory::Memory, peers::PeerTable, tasks::TaskManager,
};

/// What the front door needs from the node.
#[derive(Debug)]
pub(crate) struct FrontDoor {
    /// The front door's core: chats, embeddings, and the keys they are charged to.
    pub(crate) gateway: Arc<Gateway>,
    /// This node's advertised info.
    pub(crate) caps: Arc<Capabilities>,
    /// Peers and what they serve.
    pub(crate) peers: Arc<PeerTable>,
    /// The API keys (`http.api_keys`, `[[http.keys]]`, and those added at run time): who a
    /// presented key is; with none, the front door is open.
    pub(crate) keys: Arc<Keys>,
    /// For `/metrics`: replication lag per peer.
    pub(crate) memory: Arc<Memory>,
    /// `/mcp`: decides what its callers may do (`security.mcp_max_tier`).
    pub(crate) admission: Arc<Admission>,
    /// `/mcp`'s `run_task`: submits and follows tasks.
    pub(crate) tasks: TaskManager,
    /// `/mcp`'s memory and fleet tools: the agents' own.
    pub(crate) tools: Arc<ToolRegistry>,
    /// `/mcp`'s `cron_list`.
    pub(crate) scheduler: Arc<Scheduler>,
    /// What every route refuses of what a web page can send (`http.allowed_hosts`,
    /// `http.allowed_origins`).
    pub(crate) guard: Guard,
    /// `/mcp`'s `run_task` on a key with a token limit: the most tokens a task is granted (this
    /// node's `tasks.token_budget`), all of it reserved while it runs.
    pub(crate) task_token_budget: u64,
    /// `http.unknown_fields` and `http.model_aliases`: how unknown request fields and model
    /// names are met.
    pub(crate) clients: Clients,
}

impl FrontDoor {
    /// The model a request naming `asked` goes to: `asked`, or what `http.model_aliases` maps
    /// it to when no model or role of the fleet has that name.
    pub(crate) fn model_for(&self, asked: &str) -> String {
        self.clients
            .resolve(asked, |name| self.fleet_models().contains_key(name))
    }

    /// `call`, sent to what [`FrontDoor::model_for`] says its model stands for.
    pub(crate) fn aliased(&self, call: crate::gateway::Call) -> crate::gateway::Call {
        let model = self.model_for(&call.model);
        call.for_model(model)
    }
}
