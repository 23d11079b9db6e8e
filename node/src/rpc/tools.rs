//! The `agentmesh.v1.Tools` service: a task on another node calls a tool of this node's MCP
//! servers; and the client side of it ([`RemoteToolsClient`], the agent's `RemoteTools` port).
//!
//! The handler checks the request's bounds, asks `admission` whether this caller may run the
//! tool's tier here (the same door and caps as a task), and hands the call to `mcp`, which
//! checks the arguments against the tool's schema before its server sees them. It decides
//! nothing itself.

use std::sync::Arc;

use mesh_domain::{
    BoxFuture, Principal, Tier,
    mcp::{MAX_ARGUMENTS_BYTES, MAX_FUNCTION_NAME},
    task::check_task_id,
};
use mesh_identity::deadline;
use mesh_proto::{convert::check_len, v1 as pb};
use serde_json::Value;
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, Caller},
    agent::tools::{RemoteCall, RemoteToolError, RemoteTools},
    mcp::{McpError, McpHub, McpOutput},
};

/// The Tools service: runs this node's MCP tools for callers admission lets run their tier.
#[derive(Debug, Clone)]
pub struct ToolsService {
    hub: Arc<McpHub>,
    admission: Arc<Admission>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl ToolsService {
    /// Serves the tools of `hub`, admitted by `admission`.
    pub fn new(hub: Arc<McpHub>, admission: Arc<Admission>, tls: bool) -> Self {
        Self {
            hub,
            admission,
            tls,
        }
    }

    /// The tonic server, with message size limits.
    pub fn into_server(self) -> pb::tools_server::ToolsServer<Self> {
        pb::tools_server::ToolsServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(super::MAX_MESSAGE_BYTES)
    }
}

/// A tier from the wire; unknown values are refused (0, unset, is `read`).
fn tier(value: i32) -> Result<Tier, Status> {
    match pb::Tier::try_from(value) {
        Ok(pb::Tier::Unspecified | pb::Tier::Read) => Ok(Tier::Read),
        Ok(pb::Tier::Write) => Ok(Tier::Write),
        Ok(pb::Tier::Shell) => Ok(Tier::Shell),
        Err(_) => Err(Status::invalid_argument("tier: unknown value")),
    }
}

impl From<McpError> for Status {
    fn from(error: McpError) -> Self {
        let message = error.to_string();
        match error {
            McpError::NotFound(_) => Status::not_found(message),
            McpError::InvalidArguments { .. } => Status::invalid_argument(message),
            McpError::Down(_) | McpError::Timeout { .. } | McpError::Failed { .. } => {
                Status::unavailable(message)
            }
        }
    }
}

#[tonic::async_trait]
impl pb::tools_server::Tools for ToolsService {
    async fn call(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        // In insecure mode nobody is known: a call counts as coming from another node.
        let caller = if self.tls {
            Caller::Certificate(super::caller_identity(&request)?.principal())
        } else {
            Caller::Unauthenticated { forwarded: true }
        };
        let call = request.into_inner();
        check_len("name", &call.name, MAX_FUNCTION_NAME)?;
        check_len("arguments", &call.arguments, MAX_ARGUMENTS_BYTES)?;
        if !call.task_id.is_empty() {
            check_task_id("task_id", &call.task_id).map_err(Status::invalid_argument)?;
        }
        let task_tier = tier(call.tier)?;
        let started_by = call.started_by.map(Principal::try_from).transpose()?;
        let tool = self
            .hub
            .tool(&call.name)
            .ok_or_else(|| Status::from(McpError::NotFound(call.name.clone())))?;
        self.admission
            .allows_tool_call(tool.tier, task_tier, &caller, started_by.as_ref())?;
        let arguments: Value = serde_json::from_str(&call.arguments)
            .map_err(|e| Status::invalid_argument(format!("arguments: not JSON ({e})")))?;
        tracing::debug!(tool = %call.name, task_id = %call.task_id, "MCP tool called from another node");
        let output = self.hub.call(&call.name, &arguments).await?;
        Ok(Response::new(pb::CallToolResponse {
            output: output.text,
            is_error: output.is_error,
        }))
    }
}

/// Calls peers' MCP tools through their `Tools.Call`, over the node's kept peer channels, each
/// within the `tool` deadline whatever the peer does.
#[derive(Debug, Clone)]
pub struct RemoteToolsClient {
    channels: super::PeerChannels,
}

impl RemoteToolsClient {
    /// Reaches peers through `channels`.
    pub fn new(channels: super::PeerChannels) -> Self {
        Self { channels }
    }
}

impl RemoteTools for RemoteToolsClient {
    fn call<'a>(
        &'a self,
        addr: &'a str,
        call: &'a RemoteCall,
    ) -> BoxFuture<'a, Result<McpOutput, RemoteToolError>> {
        Box::pin(async move {
            let channel = self
                .channels
                .get(addr)
                .await
                .map_err(|e| RemoteToolError::Unreachable(e.to_string()))?;
            let mut client = pb::tools_client::ToolsClient::new(channel)
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(super::MAX_MESSAGE_BYTES);
            let request = pb::CallToolRequest {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                tier: pb::Tier::from(call.tier) as i32,
                task_id: call.task_id.clone(),
                started_by: call.started_by.as_ref().map(pb::Principal::from),
            };
            let limit = self.channels.deadlines().tool;
            match deadline::within(limit, "Tools.Call", client.call(request)).await {
                Ok(response) => {
                    let response = response.into_inner();
                    Ok(McpOutput {
                        text: mesh_domain::chat::cap_tool_output(response.output),
                        is_error: response.is_error,
                    })
                }
                Err(status) => {
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) {
                        self.channels.forget(addr);
                    }
                    Err(RemoteToolError::Failed(format!(
                        "{:?} from the hosting node ({addr}): {}",
                        status.code(),
                        status.message()
                    )))
                }
            }
        })
    }
}
