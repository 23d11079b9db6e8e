//! `list_nodes`: the fleet as this node sees it (state, roles, models, GPUs, load).

use std::sync::Arc;

use mesh_domain::{BoxFuture, NodeInfo, Tier, ToolSpec};
use serde_json::{Value, json};

use crate::{
    agent::tools::framework::{Tool, ToolContext},
    capabilities::Capabilities,
    peers::PeerTable,
};

/// `list_nodes`: the peer table.
#[derive(Debug)]
pub(crate) struct ListNodes {
    pub(crate) caps: Arc<Capabilities>,
    pub(crate) peers: Arc<PeerTable>,
}

impl Tool for ListNodes {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_nodes".into(),
            description:
                "List the nodes of the mesh with their state, roles, models, GPUs and load.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn call<'a>(
        &'a self,
        _args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let own = self.caps.snapshot();
            let row = |info: &NodeInfo, state: &str| {
                json!({
                    "name": info.name,
                    "state": state,
                    "roles": info.roles,
                    "models": info.models.iter().map(|m| &m.name).collect::<Vec<_>>(),
                    "gpus": info.resources.gpus.iter().map(|g| json!({"name": g.name, "vram_mb": g.vram_mb})).collect::<Vec<_>>(),
                    "load": {"running": info.load.running, "queued": info.load.queued},
                })
            };
            let mut nodes = vec![row(&own, "up")];
            nodes.extend(
                self.peers
                    .snapshot()
                    .iter()
                    .map(|peer| row(&peer.info, peer.state.as_str())),
            );
            Ok(Value::Array(nodes).to_string())
        })
    }
}
