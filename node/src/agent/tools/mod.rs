//! The tool table: every tool an agent can call, registered once with its permission tier.
//!
//! Only tools that really work are registered: `list_nodes` (`nodes.rs`); `file_read` and
//! `file_write` (`fs.rs`, confined to the roots of `roots.rs`); `shell_exec` (`shell.rs`);
//! `memory_get`, `memory_search` and `memory_put` (`memory.rs`); `delegate` (`delegate.rs`); and
//! the fleet's MCP tools, `<server>__<tool>` (`mcp.rs`: this node's and its peers', as they are
//! now). The table is the one place that knows their names and tiers: persona tool lists are
//! checked against it, and whether a call may have changed something (its tier is above `read`)
//! is read from it. Tier checks happen before a call, in the supervisor's hooks, not here.
//! `data.rs` offers the data tools (`list_nodes` and the memory tools) to the front door's
//! `/mcp` as the gateway's `MeshData` port, with their descriptions and tiers.

mod data;
mod delegate;
mod framework;
mod fs;
mod mcp;
mod memory;
mod nodes;
mod roots;
mod shell;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use mesh_domain::{Tier, ToolSpec};
use serde_json::Value;

pub(crate) use self::data::DataTools;
pub use self::mcp::{RemoteCall, RemoteTools};
pub(crate) use self::{
    delegate::SubtaskRunner,
    framework::{DynTool, SubtaskError, ToolContext},
    mcp::RemoteToolError,
};
use self::{
    delegate::{Delegate, RunnerSlot},
    fs::{FileRead, FileWrite},
    mcp::{FleetTools, McpTool, is_mcp_name},
    memory::{MemoryGet, MemoryPut, MemorySearch},
    nodes::ListNodes,
    roots::Roots,
    shell::ShellExec,
};
use crate::{capabilities::Capabilities, mcp::McpHub, memory::Memory, peers::PeerTable};

/// The one table of tools.
#[derive(Debug, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn DynTool>>,
    /// What `delegate` runs its sub-tasks through, once connected.
    subtasks: RunnerSlot,
    /// The fleet's MCP tools, when the node has connected them.
    mcp: Option<Arc<FleetTools>>,
}

impl ToolRegistry {
    /// Registers every tool this node has; file tools get `roots` (created if missing).
    pub fn new(
        caps: Arc<Capabilities>,
        peers: Arc<PeerTable>,
        roots: Vec<PathBuf>,
        memory: Arc<Memory>,
    ) -> Self {
        let roots = Arc::new(Roots::new(roots));
        let subtasks = RunnerSlot::default();
        let tools: Vec<Arc<dyn DynTool>> = vec![
            Arc::new(Delegate {
                runner: subtasks.clone(),
            }),
            Arc::new(MemoryGet {
                memory: memory.clone(),
            }),
            Arc::new(MemorySearch {
                memory: memory.clone(),
            }),
            Arc::new(MemoryPut { memory }),
            Arc::new(ListNodes { caps, peers }),
            Arc::new(FileRead {
                roots: roots.clone(),
            }),
            Arc::new(FileWrite {
                roots: roots.clone(),
            }),
            Arc::new(ShellExec { roots }),
        ];
        Self {
            tools: tools
                .into_iter()
                .map(|tool| (tool.spec().name, tool))
                .collect(),
            subtasks,
            mcp: None,
        }
    }

    /// Offers the fleet's MCP tools: this node's servers (`hub`), and those peers advertise,
    /// called through `remote`.
    pub fn with_mcp(
        mut self,
        hub: Arc<McpHub>,
        peers: Arc<PeerTable>,
        remote: Arc<dyn RemoteTools>,
    ) -> Self {
        self.mcp = Some(Arc::new(FleetTools { hub, peers, remote }));
        self
    }

    /// Connects `delegate` to what runs sub-tasks (the task manager, which needs this table
    /// first). Only the first connection counts.
    pub fn connect_subtasks(&self, runner: Arc<dyn SubtaskRunner>) {
        let _ = self.subtasks.set(runner);
    }

    /// The tool named `name`: a built-in one, or an MCP tool the fleet offers now.
    pub fn get(&self, name: &str) -> Option<Arc<dyn DynTool>> {
        if let Some(tool) = self.tools.get(name) {
            return Some(tool.clone());
        }
        let fleet = self.mcp.as_ref()?;
        let info = fleet.find(name)?;
        Some(Arc::new(McpTool {
            info,
            fleet: fleet.clone(),
        }))
    }

    /// Specs of the tools with tier ≤ `tier` and, when `allowed` is given, named in it: the
    /// built-in ones, then the MCP tools the fleet offers now.
    pub fn specs(&self, tier: Tier, allowed: Option<&[String]>) -> Vec<ToolSpec> {
        let offered = self
            .mcp
            .as_ref()
            .map(|fleet| fleet.offered())
            .unwrap_or_default();
        self.tools
            .values()
            .filter(|tool| tool.tier() <= tier)
            .map(|tool| tool.spec())
            .chain(
                offered
                    .iter()
                    .filter(|info| info.tier <= tier)
                    .map(mcp::spec),
            )
            .filter(|spec| allowed.is_none_or(|names| names.contains(&spec.name)))
            .collect()
    }

    /// Names of the built-in tools.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// Whether a persona may list `name`: a built-in tool, or a name of the MCP shape
    /// (`<server>__<tool>`), which may come from a peer that is not up yet.
    pub fn may_list(&self, name: &str) -> bool {
        self.tools.contains_key(name) || is_mcp_name(name)
    }

    /// The tier a call of `name` with these arguments counts as (`delegate` counts as the tier
    /// it asks for; an MCP tool as its host says); `None` when there is no such tool.
    pub fn call_tier(&self, name: &str, arguments: Option<&Value>) -> Option<Tier> {
        match self.tools.get(name) {
            Some(tool) => Some(arguments.map_or(tool.tier(), |args| tool.effective_tier(args))),
            None => Some(self.mcp.as_ref()?.find(name)?.tier),
        }
    }

    /// Whether a call as the model wrote it may have changed something (its tier is above
    /// `read`): once one ran on a node, a task is not re-run elsewhere. A built-in tool this
    /// node does not have counts as harmless, since it cannot have run; an MCP tool no node
    /// advertises now counts as having changed something (its host may be the node that was
    /// lost, and its tier is unknown).
    pub fn has_side_effects(&self, name: &str, arguments: &str) -> bool {
        let arguments: Option<Value> = serde_json::from_str(arguments).ok();
        match self.call_tier(name, arguments.as_ref()) {
            Some(tier) => tier > Tier::Read,
            None => is_mcp_name(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        capabilities::test_support::test_capabilities, memory::MemoryOptions, storage::SledStore,
    };

    #[tokio::test]
    async fn side_effects_are_write_and_shell_tools_and_delegations_above_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(mesh_cert::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_cert::OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        let tools = ToolRegistry::new(
            test_capabilities(),
            Arc::default(),
            vec![dir.path().join("ws")],
            memory,
        );
        assert!(tools.has_side_effects("shell_exec", "{}"));
        assert!(tools.has_side_effects("file_write", "{}"));
        assert!(tools.has_side_effects("memory_put", "{}"));
        assert!(!tools.has_side_effects("file_read", "{}"));
        assert!(!tools.has_side_effects("no_such_tool", "{}"));
        assert!(!tools.has_side_effects("delegate", r#"{"role": "coder", "prompt": "x"}"#));
        assert!(tools.has_side_effects(
            "delegate",
            r#"{"role": "coder", "prompt": "x", "tier": "shell"}"#
        ));
        assert!(!tools.has_side_effects("delegate", "not json"));
        // An MCP tool no node advertises (its host may be the node that was lost).
        assert!(tools.has_side_effects("time__get_current_time", "{}"));
    }
}
