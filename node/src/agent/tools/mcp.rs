//! The fleet's MCP tools as tools of this node's tasks: this node's own (through `mcp`) and those
//! its up peers advertise in their `NodeInfo`, each offered once under its namespaced name
//! (`<server>__<tool>`, this node's first, then peers' by name) with the tier its host gives it.
//! A call of a tool hosted here goes to the hub; one hosted on a peer goes through the
//! [`RemoteTools`] port (`Tools.Call`, implemented by `rpc`), to the least loaded up peer that
//! has it, the next one only when a peer cannot be reached at all.
//!
//! It must not decide who may call a tool: the supervisor's tier gate and this node's approval
//! policy did before the call, and the hosting node's `admission` and its own approval policy
//! do again for a call from elsewhere (whose approval events it passes on to the task).

use std::{collections::BTreeSet, sync::Arc};

use mesh_domain::{
    BoxFuture, EventKind, McpToolInfo, PeerState, Principal, Tier, ToolSpec,
    mcp::{self, MAX_ARGUMENTS_BYTES},
};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::{
    agent::tools::framework::{Tool, ToolContext, ToolError},
    mcp::{McpHub, McpOutput},
    peers::PeerTable,
};

/// One call of a peer's MCP tool, as the calling node sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCall {
    /// `<server>__<tool>`.
    pub name: String,
    /// The arguments, one JSON object.
    pub arguments: String,
    /// The calling task's tier.
    pub tier: Tier,
    /// The calling task's id.
    pub task_id: String,
    /// Who started the calling task.
    pub started_by: Option<Principal>,
}

/// Why a call of a peer's tool did not give a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteToolError {
    /// The peer could not be reached at all (the call never arrived): another host may be tried.
    #[error("{0}")]
    Unreachable(String),
    /// The peer refused the call or it failed there (it may have run).
    #[error("{0}")]
    Failed(String),
}

/// Calls MCP tools hosted on peers (a port: `rpc` implements it with `Tools.CallStream`).
pub trait RemoteTools: Send + Sync + std::fmt::Debug {
    /// Runs `call` on the peer at `addr`, sending what the peer reports meanwhile (its
    /// approval gate's `ApprovalRequested` and `ApprovalDecided`) to `events`.
    fn call<'a>(
        &'a self,
        addr: &'a str,
        call: &'a RemoteCall,
        events: Option<&'a mpsc::Sender<EventKind>>,
    ) -> BoxFuture<'a, Result<McpOutput, RemoteToolError>>;
}

/// The fleet's MCP tools as this node sees them.
#[derive(Debug)]
pub(crate) struct FleetTools {
    /// This node's MCP servers.
    pub(crate) hub: Arc<McpHub>,
    /// Peers and what they advertise.
    pub(crate) peers: Arc<PeerTable>,
    /// How a peer's tool is called.
    pub(crate) remote: Arc<dyn RemoteTools>,
}

impl FleetTools {
    /// Every MCP tool on offer: this node's, then the up peers' (sorted by node name), each
    /// name once.
    pub(crate) fn offered(&self) -> Vec<McpToolInfo> {
        let mut tools = self.hub.tools();
        let mut names: BTreeSet<String> = tools.iter().map(|t| t.name.clone()).collect();
        let mut peers = self.peers.snapshot();
        peers.retain(|p| p.state == PeerState::Up);
        peers.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        for peer in &peers {
            for tool in peer.info.mcp_tools.iter() {
                if names.insert(tool.name.clone()) {
                    tools.push(tool.clone());
                }
            }
        }
        tools
    }

    /// The tool `name` as this node's hub or any peer (in whatever state: a call of it may have
    /// run there) advertises it.
    pub(crate) fn find(&self, name: &str) -> Option<McpToolInfo> {
        self.hub.tool(name).or_else(|| {
            self.peers
                .snapshot()
                .iter()
                .find_map(|peer| peer.info.mcp_tools.iter().find(|t| t.name == name).cloned())
        })
    }

    /// The addresses of the up peers offering `name`, least loaded first.
    fn hosts(&self, name: &str) -> Vec<String> {
        let mut hosts: Vec<_> = self
            .peers
            .snapshot()
            .into_iter()
            .filter(|p| p.state == PeerState::Up && p.info.mcp_tools.iter().any(|t| t.name == name))
            .collect();
        hosts.sort_by_key(|p| {
            (
                p.info.load.running + p.info.load.queued,
                p.info.name.clone(),
            )
        });
        hosts.into_iter().map(|p| p.addr).collect()
    }

    /// Runs `name` here when this node hosts it, else on a peer.
    async fn call(&self, name: &str, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let result = if self.hub.tool(name).is_some() {
            self.hub.call(name, args).await.map_err(ToolError::from)
        } else {
            self.call_remote(name, args, ctx).await
        };
        match result? {
            McpOutput {
                text,
                is_error: false,
            } => Ok(text),
            McpOutput {
                text,
                is_error: true,
            } => Err(ToolError::Failed(text)),
        }
    }

    async fn call_remote(
        &self,
        name: &str,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<McpOutput, ToolError> {
        let hosts = self.hosts(name);
        if hosts.is_empty() {
            return Err(ToolError::NoHost(name.to_owned()));
        }
        let arguments = args.to_string();
        if arguments.len() > MAX_ARGUMENTS_BYTES {
            return Err(ToolError::Arguments(format!(
                "the arguments have {} bytes, more than {MAX_ARGUMENTS_BYTES}",
                arguments.len()
            )));
        }
        let call = RemoteCall {
            name: name.to_owned(),
            arguments,
            tier: ctx.spec.tier,
            task_id: ctx.task_id.clone(),
            started_by: ctx.spec.lineage.started_by.clone(),
        };
        let mut unreachable = Vec::new();
        for addr in &hosts {
            match self.remote.call(addr, &call, ctx.events.as_ref()).await {
                Ok(output) => return Ok(output),
                Err(RemoteToolError::Failed(message)) => return Err(ToolError::Failed(message)),
                Err(RemoteToolError::Unreachable(message)) => {
                    unreachable.push(format!("{addr}: {message}"));
                }
            }
        }
        Err(ToolError::Unreachable {
            name: name.to_owned(),
            reasons: unreachable,
        })
    }
}

/// One MCP tool of the fleet, as the tool table hands it to the loop.
#[derive(Debug)]
pub(crate) struct McpTool {
    pub(crate) info: McpToolInfo,
    pub(crate) fleet: Arc<FleetTools>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        spec(&self.info)
    }

    fn tier(&self) -> Tier {
        self.info.tier
    }

    async fn call(&self, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        self.fleet.call(&self.info.name, args, ctx).await
    }
}

/// What a model is offered for an MCP tool.
pub(crate) fn spec(info: &McpToolInfo) -> ToolSpec {
    ToolSpec {
        name: info.name.clone(),
        description: info.description.clone(),
        parameters: (*info.input_schema).clone(),
    }
}

/// Whether `name` has the shape of an MCP tool's name (`<server>__<tool>`, a valid function
/// name): no built-in tool has one.
pub(crate) fn is_mcp_name(name: &str) -> bool {
    mcp::is_function_name(name) && mcp::split_tool_name(name).is_some()
}
