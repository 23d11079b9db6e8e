//! [`MeshData`], the port through which the gateway reaches the fleet's node list and shared
//! memory for `/mcp`: the agents' own data tools implement it (`agent::tools::DataTools`), so
//! `/mcp` answers exactly as `list_nodes`, `memory_get`, `memory_search` and `memory_put` do
//! (their bounds, their refusal of the node's own namespaces), without a task or a tool
//! context; `server` wires it. What a front-door caller may do with it is `mesh`'s.

use std::fmt;

use mesh_domain::{BoxFuture, Tier};

use crate::memory::MemoryError;

/// One of the fleet's data tools `/mcp` serves, each the agents' tool of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataTool {
    /// `list_nodes`: the fleet as this node sees it.
    ListNodes,
    /// `memory_get`: one value of the shared memory.
    MemoryGet,
    /// `memory_search`: entries of a namespace by prefix and substring.
    MemorySearch,
    /// `memory_put`: a value written to the shared memory.
    MemoryPut,
}

/// A `memory_search`: the namespace and what to look for, already within their bounds.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemoryQuery {
    /// The namespace (a user namespace: the node's private ones are refused).
    pub namespace: String,
    /// Only keys starting with this.
    pub prefix: String,
    /// Only entries whose key or value contains this.
    pub contains: String,
    /// Continue after this key.
    pub after: String,
    /// Most entries, 1–100 (20 when not given).
    pub limit: Option<u64>,
}

/// Why a data tool gave no answer, in the tool's own words.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MeshDataError {
    /// `memory_get` of a key that is not there (or deleted).
    #[error("no key `{key}` in namespace `{namespace}`")]
    NoKey {
        /// The namespace asked.
        namespace: String,
        /// The key asked.
        key: String,
    },
    /// The memory refused (a namespace callers may not use) or failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// The fleet's node list and shared memory, as the agents' data tools read and write them.
pub(crate) trait MeshData: Send + Sync + fmt::Debug {
    /// What `tool` does, in its own description, and the tier a call of it counts as.
    fn about(&self, tool: DataTool) -> (String, Tier);
    /// `list_nodes`' answer: every node this one knows, with its state, health and load.
    fn list_nodes(&self) -> String;
    /// `memory_get`'s answer: the value of `namespace`/`key` as text.
    fn memory_get(&self, namespace: &str, key: &str) -> Result<String, MeshDataError>;
    /// `memory_search`'s answer: the matching entries, cut where its bounds say.
    fn memory_search(&self, query: &MemoryQuery) -> Result<String, MeshDataError>;
    /// `memory_put`: writes `value` to `namespace`/`key` (durably, before it answers).
    fn memory_put<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<String, MeshDataError>>;
}
