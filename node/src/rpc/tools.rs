//! The `agentmesh.v1.Tools` service: a task on another node calls a tool of this node's MCP
//! servers; and the client side of it ([`RemoteToolsClient`], the agent's `RemoteTools` port).
//!
//! The handler checks the request's bounds, asks `admission` whether this caller may run the
//! tool's tier here (the same door and caps as a task), passes the call through this node's
//! approval gate (`Approvals::gate`: a tool this node's `[approval]` policy names waits for a
//! person here, whoever calls it), and hands it to `mcp`, which checks the arguments against
//! the tool's schema before its server sees them. `CallStream` sends the gate's events to the
//! caller as they happen; a caller that goes away drops the wait, which cancels the approval.
//! It decides nothing itself.

use std::{pin::Pin, sync::Arc};

use mesh_domain::{
    BoxFuture, EventKind, Principal, TaskEvent, Tier,
    mcp::{MAX_ARGUMENTS_BYTES, MAX_FUNCTION_NAME},
    task::check_task_id,
};
use mesh_proto::{convert::check_len, v1 as pb};
use mesh_tls::deadline;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, Caller},
    agent::tools::{RemoteCall, RemoteToolError, RemoteTools},
    approvals::{Approvals, Call as GatedCall},
    mcp::{McpError, McpHub, McpOutput},
};

/// Most updates of one `CallStream` waiting to be sent (a call makes at most three).
const UPDATES: usize = 4;

/// The Tools service: runs this node's MCP tools for callers admission lets run their tier,
/// after this node's approval gate.
#[derive(Debug, Clone)]
pub(crate) struct ToolsService {
    hub: Arc<McpHub>,
    admission: Arc<Admission>,
    /// This node's approval gate, which its own tools pass whoever calls them.
    approvals: Approvals,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

/// A call admitted here: what to run, and who asked (for its approval).
struct Admitted {
    name: String,
    arguments: Value,
    /// The arguments as sent, which an approval shows and hashes.
    raw: String,
    tier: Tier,
    task_id: String,
    caller: String,
}

impl ToolsService {
    /// Serves the tools of `hub`, admitted by `admission` and gated by `approvals`.
    pub(crate) fn new(
        hub: Arc<McpHub>,
        admission: Arc<Admission>,
        approvals: Approvals,
        tls: bool,
    ) -> Self {
        Self {
            hub,
            admission,
            approvals,
            tls,
        }
    }

    /// Checks a call's bounds and admits it (the same door and caps as a task).
    fn admit(&self, request: Request<pb::CallToolRequest>) -> Result<Admitted, Status> {
        // In insecure mode nobody is known: a call counts as coming from another node.
        let (caller, who) = if self.tls {
            let principal = super::caller_identity(&request)?.principal();
            let who = principal.to_string();
            (Caller::Certificate(principal), who)
        } else {
            (
                Caller::Unauthenticated { forwarded: true },
                "an unidentified caller (insecure mode)".to_owned(),
            )
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
        Ok(Admitted {
            name: call.name,
            arguments,
            raw: call.arguments,
            tier: tool.tier,
            task_id: call.task_id,
            caller: who,
        })
    }

    /// Runs an admitted call: through this node's approval gate when its policy names the
    /// tool (`report` gets the gate's events), then the tool. A denial is an answer with
    /// `is_error`, the reason its text.
    async fn run(
        &self,
        call: Admitted,
        report: &(dyn Fn(EventKind) + Sync),
    ) -> Result<pb::CallToolResponse, Status> {
        if self.approvals.policy().needs(&call.name, call.tier) {
            let gated = GatedCall {
                task_id: &call.task_id,
                tool: &call.name,
                arguments: &call.raw,
                tier: call.tier,
                called_from: &call.caller,
            };
            if let Err(denied) = self.approvals.gate(gated, report).await {
                return Ok(pb::CallToolResponse {
                    output: denied,
                    is_error: true,
                });
            }
        }
        tracing::debug!(tool = %call.name, task_id = %call.task_id, "MCP tool called from another node");
        let output = self.hub.call(&call.name, &call.arguments).await?;
        Ok(pb::CallToolResponse {
            output: output.text,
            is_error: output.is_error,
        })
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::tools_server::ToolsServer<Self> {
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

/// The updates of one `CallStream`.
type Updates = Pin<Box<dyn Stream<Item = Result<pb::CallToolUpdate, Status>> + Send>>;

/// A task event the gate reports, as a `CallStream` update (its only kinds).
fn update(kind: EventKind) -> Option<pb::CallToolUpdate> {
    use pb::{call_tool_update::Kind as Update, task_event::Kind};
    let event = TaskEvent {
        task_id: String::new(),
        seq: 0,
        at_ms: 0,
        kind,
    };
    let kind = match pb::TaskEvent::from(&event).kind? {
        Kind::ApprovalRequested(requested) => Update::ApprovalRequested(requested),
        Kind::ApprovalDecided(decided) => Update::ApprovalDecided(decided),
        _ => return None,
    };
    Some(pb::CallToolUpdate { kind: Some(kind) })
}

#[tonic::async_trait]
impl pb::tools_server::Tools for ToolsService {
    async fn call(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        let call = self.admit(request)?;
        Ok(Response::new(self.run(call, &|_| {}).await?))
    }

    type CallStreamStream = Updates;

    async fn call_stream(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<Self::CallStreamStream>, Status> {
        let call = self.admit(request)?;
        let (updates, stream) = mpsc::channel(UPDATES);
        let service = self.clone();
        tokio::spawn(async move {
            let report = |kind| {
                // At most three updates per call: the channel has room for all of them.
                if let Some(update) = update(kind) {
                    let _ = updates.try_send(Ok(update));
                }
            };
            // A caller that goes away drops the wait (and cancels its approval) and the call.
            let answer = tokio::select! {
                answer = service.run(call, &report) => answer,
                () = updates.closed() => return,
            };
            let last = answer.map(|result| pb::CallToolUpdate {
                kind: Some(pb::call_tool_update::Kind::Result(result)),
            });
            let _ = updates.send(last).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
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
        events: Option<&'a mpsc::Sender<EventKind>>,
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
            // Each message within the deadline: the host answers the call's approval within
            // its `approval.timeout_s` (at most 540 s), and the call within its tool's.
            let limit = self.channels.deadlines().tool;
            let failed = |status: Status| {
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) {
                    self.channels.forget(addr);
                }
                RemoteToolError::Failed(format!(
                    "{:?} from the hosting node ({addr}): {}",
                    status.code(),
                    status.message()
                ))
            };
            let mut updates =
                deadline::within(limit, "Tools.CallStream", client.call_stream(request))
                    .await
                    .map_err(failed)?
                    .into_inner();
            loop {
                let update = deadline::within(limit, "Tools.CallStream", updates.message())
                    .await
                    .map_err(failed)?
                    .ok_or_else(|| {
                        RemoteToolError::Failed(format!(
                            "the hosting node ({addr}) ended the call without an answer"
                        ))
                    })?;
                use pb::{call_tool_update::Kind as Update, task_event::Kind};
                let relayed = match update.kind {
                    Some(Update::Result(response)) => {
                        return Ok(McpOutput {
                            text: mesh_domain::chat::cap_tool_output(response.output),
                            is_error: response.is_error,
                        });
                    }
                    Some(Update::ApprovalRequested(requested)) => {
                        Kind::ApprovalRequested(requested)
                    }
                    Some(Update::ApprovalDecided(decided)) => Kind::ApprovalDecided(decided),
                    None => continue,
                };
                let event = pb::TaskEvent {
                    kind: Some(relayed),
                    ..Default::default()
                };
                // Checked like any event from another node; one that is not is not relayed.
                if let (Some(events), Ok(event)) = (events, TaskEvent::try_from(event)) {
                    let _ = events.send(event.kind).await;
                }
            }
        })
    }
}
