//! The agents' data tools (`list_nodes`, `memory_get`, `memory_search`, `memory_put`) as the
//! gateway's [`MeshData`] port: what the front door's `/mcp` serves outside any task, answered
//! by the same code as the tools (their bounds, their refusal of the node's own namespaces),
//! with their descriptions and tiers. `server` wires it into the gateway.

use std::sync::Arc;

use mesh_domain::{BoxFuture, Tier};

use super::{
    framework::DynTool,
    memory::{self, MemoryGet, MemoryPut, MemorySearch},
    nodes::{self, ListNodes},
};
use crate::{
    capabilities::Capabilities,
    gateway::{DataTool, MemoryQuery, MeshData, MeshDataError},
    memory::Memory,
    peers::PeerTable,
};

/// The data tools, for a caller outside any task.
#[derive(Debug)]
pub(crate) struct DataTools {
    nodes: ListNodes,
    get: MemoryGet,
    search: MemorySearch,
    put: MemoryPut,
}

impl DataTools {
    /// The data tools over this node's `memory`, its capabilities and its peer table.
    pub(crate) fn new(memory: Arc<Memory>, caps: Arc<Capabilities>, peers: Arc<PeerTable>) -> Self {
        Self {
            nodes: ListNodes { caps, peers },
            get: MemoryGet {
                memory: memory.clone(),
            },
            search: MemorySearch {
                memory: memory.clone(),
            },
            put: MemoryPut { memory },
        }
    }

    fn tool(&self, tool: DataTool) -> &dyn DynTool {
        match tool {
            DataTool::ListNodes => &self.nodes,
            DataTool::MemoryGet => &self.get,
            DataTool::MemorySearch => &self.search,
            DataTool::MemoryPut => &self.put,
        }
    }
}

impl MeshData for DataTools {
    fn about(&self, tool: DataTool) -> (String, Tier) {
        let tool = self.tool(tool);
        (tool.spec().description, tool.tier())
    }

    fn list_nodes(&self) -> String {
        nodes::listing(&self.nodes.caps, &self.nodes.peers)
    }

    fn memory_get(&self, namespace: &str, key: &str) -> Result<String, MeshDataError> {
        memory::get(&self.get.memory, namespace, key)
    }

    fn memory_search(&self, query: &MemoryQuery) -> Result<String, MeshDataError> {
        memory::search_text(&self.search.memory, query)
    }

    fn memory_put<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<String, MeshDataError>> {
        Box::pin(memory::put(&self.put.memory, namespace, key, value))
    }
}
