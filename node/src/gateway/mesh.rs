//! What the front door's `/mcp` does with the mesh besides tasks, decided here once: whether
//! this node lets a front-door caller do something of a tier ([`Gateway::allow`], asked of
//! `admission`, `security.mcp_max_tier`), and the fleet's data a caller outside any task reads
//! and writes (the node list and the shared memory) through the [`MeshData`] port, each call
//! once the tier its tool counts as is allowed. This module must not read or write the memory
//! itself.

use mesh_domain::Tier;

use super::{
    data::{DataTool, MemoryQuery, MeshData, MeshDataError},
    error::GatewayError,
    service::Gateway,
};
use crate::admission::Caller;

impl Gateway {
    /// Whether this node lets a front-door caller (`/mcp`) do something of `tier`: the one
    /// decision, `admission`'s (`security.mcp_max_tier`).
    pub(crate) fn allow(&self, tier: Tier) -> Result<(), GatewayError> {
        self.admission
            .allows(tier, &Caller::FrontDoor, None)
            .map_err(GatewayError::from)
    }

    /// What `tool` does, as its description says.
    pub(crate) fn describe(&self, tool: DataTool) -> String {
        self.data.about(tool).0
    }

    /// Runs `call` of `tool` once the tier the tool counts as is allowed.
    fn data_call<T>(
        &self,
        tool: DataTool,
        call: impl FnOnce(&dyn MeshData) -> Result<T, MeshDataError>,
    ) -> Result<T, GatewayError> {
        self.allow(self.data.about(tool).1)?;
        Ok(call(self.data.as_ref())?)
    }

    /// `list_nodes`, for a front-door caller.
    pub(crate) fn list_nodes(&self) -> Result<String, GatewayError> {
        self.data_call(DataTool::ListNodes, |data| Ok(data.list_nodes()))
    }

    /// `memory_get`, for a front-door caller.
    pub(crate) fn memory_get(&self, namespace: &str, key: &str) -> Result<String, GatewayError> {
        self.data_call(DataTool::MemoryGet, |data| data.memory_get(namespace, key))
    }

    /// `memory_search`, for a front-door caller.
    pub(crate) fn memory_search(&self, query: &MemoryQuery) -> Result<String, GatewayError> {
        self.data_call(DataTool::MemorySearch, |data| data.memory_search(query))
    }

    /// `memory_put`, for a front-door caller.
    pub(crate) async fn memory_put(
        &self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<String, GatewayError> {
        self.allow(self.data.about(DataTool::MemoryPut).1)?;
        Ok(self.data.memory_put(namespace, key, value).await?)
    }
}
