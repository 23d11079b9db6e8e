//! What the front door needs from the node: [`FrontDoor`], the one state every route and
//! dialect reads, and what the dialects share of the fleet (its model list, the model a name
//! or alias goes to). Its own file so that the dialects name it without naming the router that
//! names them (no circle of files; `node/tests/layers/`).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use mesh_domain::PeerState;

use super::{clients::Clients, guard::Guard};
use crate::{
    api_keys::Keys, capabilities::Capabilities, cron::Scheduler, gateway::Gateway,
    metrics::ScrapedGauges, peers::PeerTable, tasks::TaskManager,
};

/// What the front door needs from the node.
#[derive(Debug)]
pub(crate) struct FrontDoor {
    /// The front door's core: chats, embeddings, the keys they are charged to, stored
    /// conversations, and what `/mcp` may do with the mesh.
    pub(crate) gateway: Arc<Gateway>,
    /// This node's advertised info.
    pub(crate) caps: Arc<Capabilities>,
    /// Peers and what they serve.
    pub(crate) peers: Arc<PeerTable>,
    /// The API keys (`http.api_keys`, `[[http.keys]]`, and those added at run time): who a
    /// presented key is; with none, the front door is open.
    pub(crate) keys: Arc<Keys>,
    /// For `/metrics`: the gauges read at each scrape (replication lag per peer, decode speed
    /// per model).
    pub(crate) gauges: Vec<Arc<dyn ScrapedGauges>>,
    /// `/mcp`'s `run_task`: submits and follows tasks.
    pub(crate) tasks: TaskManager,
    /// `/mcp`'s `cron_list`.
    pub(crate) scheduler: Arc<Scheduler>,
    /// What every route refuses of what a web page can send (`http.allowed_hosts`,
    /// `http.allowed_origins`).
    pub(crate) guard: Guard,
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

    /// The models some node of the fleet (this one or an up peer) makes embeddings with.
    pub(crate) fn fleet_embedders(&self) -> BTreeSet<String> {
        let own = self.caps.snapshot();
        let peers = self.peers.snapshot();
        std::iter::once(&own)
            .chain(
                peers
                    .iter()
                    .filter(|p| p.state == PeerState::Up)
                    .map(|p| &p.info),
            )
            .flat_map(|info| info.models.iter())
            .filter(|m| m.embeds)
            .map(|m| m.name.clone())
            .collect()
    }

    /// Every model id the fleet serves (models and `role:<name>` aliases), each with the first
    /// node seen serving it (this node first, then up peers).
    pub(crate) fn fleet_models(&self) -> BTreeMap<String, String> {
        let own = self.caps.snapshot();
        let mut infos = vec![own];
        infos.extend(
            self.peers
                .snapshot()
                .into_iter()
                .filter(|p| p.state == PeerState::Up)
                .map(|p| p.info),
        );
        let mut seen = BTreeMap::new();
        for info in &infos {
            for model in &info.models {
                seen.entry(model.name.clone())
                    .or_insert_with(|| info.name.clone());
            }
            for (role, chain) in &info.role_chains {
                if !chain.is_empty() {
                    seen.entry(format!("role:{role}"))
                        .or_insert_with(|| info.name.clone());
                }
            }
        }
        seen
    }
}
