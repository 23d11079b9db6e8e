//! `list_nodes`: the fleet as this node sees it, with what `mesh-cli status` shows (id, address,
//! state, health, roles, labels, models, GPUs, load, when it was last heard from). The front
//! door's `/mcp` serves the same tool.

use std::sync::Arc;

use mesh_domain::{NodeInfo, Tier, ToolSpec, time::now_ms as unix_ms};
use serde_json::{Value, json};

use crate::{
    agent::tools::framework::{Tool, ToolContext, ToolError},
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
                "List the nodes of the mesh with their state, health, roles, labels, models, GPUs and load."
                    .into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    async fn call(&self, _args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        Ok(listing(&self.caps, &self.peers))
    }
}

/// `list_nodes`' answer: this node and every peer it knows, one JSON object each.
pub(crate) fn listing(caps: &Capabilities, peers: &PeerTable) -> String {
    let own = caps.snapshot();
    let row = |info: &NodeInfo, addr: &str, state: &str, last_seen_ms: u64| {
        json!({
            "name": info.name,
            "id": info.id.to_string(),
            "addr": addr,
            "state": state,
            "health": {"status": info.health.status.as_str(), "reasons": info.health.reasons},
            "last_seen_ms": last_seen_ms,
            "roles": info.roles,
            "labels": info.labels,
            "models": info.models.iter().map(|m| &m.name).collect::<Vec<_>>(),
            "gpus": info.resources.gpus.iter().map(|g| json!({"name": g.name, "vram_mb": g.vram_mb})).collect::<Vec<_>>(),
            "load": {"running": info.load.running, "queued": info.load.queued},
        })
    };
    let here = own.addrs.first().map_or("", String::as_str);
    let mut nodes = vec![row(&own, here, "up", unix_ms())];
    nodes.extend(peers.snapshot().iter().map(|peer| {
        row(
            &peer.info,
            &peer.addr,
            peer.state.as_str(),
            peer.last_seen_ms(),
        )
    }));
    Value::Array(nodes).to_string()
}
