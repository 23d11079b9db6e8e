//! The `agentmesh.v1.Tasks` service: protobuf ↔ task types, and task errors → gRPC status.

use std::{pin::Pin, sync::Arc};

use mesh_proto::v1 as pb;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::{check_len, pb_tier};
use crate::{
    capabilities::Capabilities,
    config::Tier,
    llm::{BoxFuture, Usage},
    peers::PeerTable,
    router::{self, Choice, Requirements},
    tasks::{
        EventKind, ForwardError, Forwarder, Lineage, LookupError, MAX_HOPS, MAX_PROMPT_BYTES,
        Placement, SubmitError, Target, TaskError, TaskEvent, TaskManager, TaskRecord, TaskSpec,
        TaskStatus,
    },
};

/// Longest deadline a caller may ask for.
const MAX_TIMEOUT_S: u32 = 86_400;

/// The Tasks service: validates, routes (here or to a peer) and hands tasks to `TaskManager`.
#[derive(Debug, Clone)]
pub struct TasksService {
    tasks: TaskManager,
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
    forwarder: Arc<RemoteTasks>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl TasksService {
    /// Wraps the task manager with what routing needs.
    pub fn new(
        tasks: TaskManager,
        caps: Arc<Capabilities>,
        peers: Arc<PeerTable>,
        channels: super::PeerChannels,
        tls: bool,
    ) -> Self {
        Self {
            tasks,
            caps,
            peers,
            forwarder: Arc::new(RemoteTasks { channels }),
            tls,
        }
    }

    /// Whether the caller is another node (its certificate belongs to a peer), or says it
    /// forwards on a node's behalf: then `security.remote_max_tier` applies.
    fn remote_caller<T>(&self, request: &Request<T>) -> bool {
        self.tls
            && super::caller_identity(request)
                .is_ok_and(|caller| self.peers.get(&caller.id).is_some())
    }

    fn rank(&self, spec: &TaskSpec) -> Vec<router::Ranked> {
        router::rank_fleet(
            &self.caps.snapshot(),
            &self.peers.snapshot(),
            &spec.target,
            spec.tier,
            &spec.require,
        )
    }

    /// Checks caps and hops, then decides where the task runs.
    fn place(&self, spec: &TaskSpec, remote: bool) -> Result<Placement, Status> {
        if spec.lineage.hops > MAX_HOPS {
            return Err(Status::failed_precondition(format!(
                "hop limit: this task has been forwarded or nested {} times (at most {MAX_HOPS}); a delegation loop?",
                spec.lineage.hops
            )));
        }
        let cap = self.caps.snapshot().remote_max_tier;
        if remote && spec.tier > cap {
            return Err(Status::permission_denied(format!(
                "this node runs remote tasks up to tier `{cap}` and this one asks for `{}` (security.remote_max_tier)",
                spec.tier
            )));
        }
        let choice = router::choose(&self.rank(spec), spec.lineage.task_id.is_some());
        crate::metrics::metrics().routed(
            "task",
            match &choice {
                Choice::Local => "local",
                Choice::Remote(_) => "remote",
                Choice::Nowhere(_) => "nowhere",
            },
        );
        match choice {
            Choice::Local => Ok(Placement::Local),
            Choice::Nowhere(message) => Err(Status::failed_precondition(message)),
            Choice::Remote(ids) => {
                let candidates = ids
                    .iter()
                    .filter_map(|id| self.peers.get(id))
                    .map(|peer| (peer.info.name, peer.addr))
                    .collect();
                Ok(Placement::Remote {
                    candidates,
                    forwarder: self.forwarder.clone(),
                })
            }
        }
    }

    /// The tonic server, with message size limits.
    pub fn into_server(self) -> pb::tasks_server::TasksServer<Self> {
        pb::tasks_server::TasksServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::TaskEvent, Status>> + Send>>;

fn event_stream(rx: tokio::sync::mpsc::Receiver<TaskEvent>) -> EventStream {
    Box::pin(ReceiverStream::new(rx).map(|event| Ok(pb::TaskEvent::from(&event))))
}

fn task_id(id: &str) -> Result<&str, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("task_id: must not be empty"));
    }
    check_len("task_id", id, 64)?;
    Ok(id)
}

#[tonic::async_trait]
impl pb::tasks_server::Tasks for TasksService {
    type SubmitStream = EventStream;

    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<Self::SubmitStream>, Status> {
        let peer_caller = self.remote_caller(&request);
        let spec = TaskSpec::try_from(request.into_inner())?;
        let placement = self.place(&spec, peer_caller || spec.lineage.hops > 0)?;
        let id = self.tasks.submit(spec, placement).map_err(submit_status)?;
        let events = self.tasks.watch(&id, true).map_err(lookup_status)?;
        Ok(Response::new(event_stream(events)))
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let request = request.into_inner();
        let events = self
            .tasks
            .watch(task_id(&request.task_id)?, request.follow)
            .map_err(lookup_status)?;
        Ok(Response::new(event_stream(events)))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let request = request.into_inner();
        let status = self
            .tasks
            .cancel(task_id(&request.task_id)?, "cancelled by a caller")
            .map_err(lookup_status)?;
        Ok(Response::new(pb::CancelResponse {
            status: pb_status(status) as i32,
        }))
    }

    async fn explain(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let spec = TaskSpec::try_from(request.into_inner())?;
        let candidates = self
            .rank(&spec)
            .into_iter()
            .map(|r| pb::Candidate {
                node: r.node,
                node_id: r.id.to_string(),
                local: r.local,
                eligible: r.verdict.is_ok(),
                score: *r.verdict.as_ref().unwrap_or(&0.0),
                reason: r.verdict.err().unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(pb::Explanation { candidates }))
    }

    async fn list(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let limit = match request.into_inner().limit {
            0 => 50,
            n => n as usize,
        };
        Ok(Response::new(pb::ListTasksResponse {
            tasks: self
                .tasks
                .list(limit)
                .iter()
                .map(pb::TaskSummary::from)
                .collect(),
        }))
    }
}

impl TryFrom<pb::SubmitRequest> for TaskSpec {
    type Error = Status;

    fn try_from(request: pb::SubmitRequest) -> Result<Self, Status> {
        if request.prompt.trim().is_empty() {
            return Err(Status::invalid_argument("prompt: must not be empty"));
        }
        check_len("prompt", &request.prompt, MAX_PROMPT_BYTES)?;
        let name = |field: &str, value: String| -> Result<String, Status> {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "{field}: must not be empty"
                )));
            }
            check_len(field, &value, 63)?;
            Ok(value)
        };
        let target = match request.target {
            Some(pb::submit_request::Target::Role(role)) => Target::Role(name("role", role)?),
            Some(pb::submit_request::Target::Model(model)) => Target::Model(name("model", model)?),
            Some(pb::submit_request::Target::Persona(p)) => Target::Persona(name("persona", p)?),
            None => {
                return Err(Status::invalid_argument(
                    "target: set one of role, model or persona",
                ));
            }
        };
        let tier = match pb::Tier::try_from(request.tier) {
            Ok(pb::Tier::Unspecified | pb::Tier::Read) => Tier::Read,
            Ok(pb::Tier::Write) => Tier::Write,
            Ok(pb::Tier::Shell) => Tier::Shell,
            Err(_) => return Err(Status::invalid_argument("tier: unknown value")),
        };
        if request.timeout_s > MAX_TIMEOUT_S {
            return Err(Status::invalid_argument(format!(
                "timeout_s: at most {MAX_TIMEOUT_S}"
            )));
        }
        if request.max_rounds > 1000 {
            return Err(Status::invalid_argument("max_rounds: at most 1000"));
        }
        let require = request.require.unwrap_or_default();
        if require.labels.len() > 32 {
            return Err(Status::invalid_argument("require.labels: at most 32"));
        }
        for (k, v) in &require.labels {
            check_len("require.labels", k, 63)?;
            check_len("require.labels", v, 253)?;
        }
        check_len("on", &request.on, 63)?;
        let lineage = request.lineage.unwrap_or_default();
        check_len("lineage.task_id", &lineage.task_id, 64)?;
        check_len("lineage.parent_id", &lineage.parent_id, 64)?;
        check_len("lineage.origin_node", &lineage.origin_node, 63)?;
        if !request.session.is_empty() {
            crate::memory::check_key(&request.session)
                .map_err(|e| Status::invalid_argument(format!("session: {e}")))?;
        }
        Ok(TaskSpec {
            prompt: request.prompt,
            target,
            tier,
            timeout: (request.timeout_s > 0)
                .then(|| std::time::Duration::from_secs(u64::from(request.timeout_s))),
            max_rounds: (request.max_rounds > 0).then_some(request.max_rounds),
            token_budget: (request.token_budget > 0).then_some(request.token_budget),
            require: Requirements {
                gpu: require.gpu,
                min_vram_mb: (require.min_vram_mb > 0).then_some(require.min_vram_mb),
                labels: require.labels.into_iter().collect(),
                on: Some(request.on).filter(|on| !on.is_empty()),
            },
            lineage: Lineage {
                task_id: Some(lineage.task_id).filter(|id| !id.is_empty()),
                parent_id: Some(lineage.parent_id).filter(|id| !id.is_empty()),
                origin: lineage.origin_node,
                hops: lineage.hops,
            },
            session: Some(request.session).filter(|s| !s.is_empty()),
        })
    }
}

/// Every task error has one status code.
pub fn task_error_status(error: &TaskError) -> Status {
    let message = error.to_string();
    match error {
        TaskError::Model { .. } => Status::unavailable(message),
        TaskError::Gate { .. } => Status::aborted(message),
        TaskError::Budget { .. } => Status::resource_exhausted(message),
        TaskError::Protocol { .. } => Status::invalid_argument(message),
        TaskError::Routing { .. } => Status::not_found(message),
        TaskError::Cancelled { .. } => Status::cancelled(message),
        TaskError::Deadline { .. } => Status::deadline_exceeded(message),
        TaskError::Internal { .. } => Status::internal(message),
    }
}

fn submit_status(error: SubmitError) -> Status {
    match error {
        SubmitError::QueueFull { .. } => Status::resource_exhausted(error.to_string()),
        SubmitError::ShuttingDown => Status::unavailable(error.to_string()),
        SubmitError::Duplicate(_) => Status::already_exists(error.to_string()),
        SubmitError::Rejected(task_error) => task_error_status(&task_error),
        // The router takes this as "try the next node", like a full queue.
        SubmitError::Storage(crate::storage::StoreError::DiskFull(_)) => {
            Status::resource_exhausted(error.to_string())
        }
        SubmitError::Storage(_) => Status::unavailable(error.to_string()),
    }
}

fn lookup_status(error: LookupError) -> Status {
    match error {
        LookupError::NotFound(_) => Status::not_found(error.to_string()),
        LookupError::Storage(_) => Status::internal(error.to_string()),
    }
}

fn pb_status(status: TaskStatus) -> pb::TaskStatus {
    match status {
        TaskStatus::Queued => pb::TaskStatus::Queued,
        TaskStatus::Running => pb::TaskStatus::Running,
        TaskStatus::Completed => pb::TaskStatus::Completed,
        TaskStatus::Failed => pb::TaskStatus::Failed,
    }
}

fn pb_error(error: &TaskError) -> pb::TaskError {
    pb::TaskError {
        kind: error.kind().into(),
        message: error.to_string(),
        fields: error.fields().into_iter().collect(),
    }
}

impl From<&TaskRecord> for pb::TaskSummary {
    fn from(record: &TaskRecord) -> Self {
        Self {
            task_id: record.id.clone(),
            status: pb_status(record.status) as i32,
            target: record.spec.target.to_string(),
            prompt: record.spec.prompt.chars().take(200).collect(),
            created_at_ms: record.created_at_ms,
            finished_at_ms: record.finished_at_ms.unwrap_or(0),
            executed_on: record.executed_on.clone(),
            error: record.error.as_ref().map(pb_error),
            tier: pb_tier(record.spec.tier) as i32,
            parent_id: record.spec.lineage.parent_id.clone().unwrap_or_default(),
            origin_node: record.spec.lineage.origin.clone(),
            hops: record.spec.lineage.hops,
            route: record.route.clone(),
        }
    }
}

impl From<&TaskEvent> for pb::TaskEvent {
    fn from(event: &TaskEvent) -> Self {
        use pb::task_event::Kind;
        let kind = match &event.kind {
            EventKind::Accepted {
                node,
                queue_position,
            } => Kind::Accepted(pb::Accepted {
                node: node.clone(),
                queue_position: *queue_position,
            }),
            EventKind::Started { node } => Kind::Started(pb::Started { node: node.clone() }),
            EventKind::ModelCall {
                model,
                round,
                attempt,
            } => Kind::ModelCall(pb::ModelCall {
                model: model.clone(),
                round: *round,
                attempt: *attempt,
            }),
            EventKind::ModelFailed {
                model,
                error,
                falling_through,
            } => Kind::ModelFailed(pb::ModelFailed {
                model: model.clone(),
                error: error.clone(),
                falling_through: *falling_through,
            }),
            EventKind::ToolCalled {
                call_id,
                name,
                arguments,
            } => Kind::ToolCalled(pb::ToolCalled {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            EventKind::ToolResult {
                call_id,
                name,
                ok,
                output,
                consecutive_failures,
            } => Kind::ToolResult(pb::ToolResult {
                call_id: call_id.clone(),
                name: name.clone(),
                ok: *ok,
                output: output.clone(),
                consecutive_failures: *consecutive_failures,
            }),
            EventKind::Intervention { rule, message } => Kind::Intervention(pb::Intervention {
                rule: rule.clone(),
                message: message.clone(),
            }),
            EventKind::OutputDelta { text } => {
                Kind::OutputDelta(pb::OutputDelta { text: text.clone() })
            }
            EventKind::Completed {
                output,
                usage,
                executed_on,
                rounds,
            } => Kind::Completed(pb::Completed {
                output: output.clone(),
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
                executed_on: executed_on.clone(),
                rounds: *rounds,
            }),
            EventKind::Failed { error } => Kind::Failed(pb::Failed {
                error: Some(pb_error(error)),
            }),
            EventKind::Delegated {
                node,
                attempt,
                reason,
            } => Kind::Delegated(pb::Delegated {
                node: node.clone(),
                attempt: *attempt,
                reason: reason.clone(),
            }),
        };
        Self {
            task_id: event.task_id.clone(),
            seq: event.seq,
            at_ms: event.at_ms,
            kind: Some(kind),
        }
    }
}

impl From<&TaskSpec> for pb::SubmitRequest {
    fn from(spec: &TaskSpec) -> Self {
        use pb::submit_request::Target as T;
        Self {
            prompt: spec.prompt.clone(),
            target: Some(match &spec.target {
                Target::Role(r) => T::Role(r.clone()),
                Target::Model(m) => T::Model(m.clone()),
                Target::Persona(p) => T::Persona(p.clone()),
            }),
            tier: pb_tier(spec.tier) as i32,
            timeout_s: spec
                .timeout
                .map(|t| t.as_secs().clamp(1, u64::from(MAX_TIMEOUT_S)) as u32)
                .unwrap_or(0),
            max_rounds: spec.max_rounds.unwrap_or(0),
            token_budget: spec.token_budget.unwrap_or(0),
            require: Some(pb::Requirements {
                gpu: spec.require.gpu,
                min_vram_mb: spec.require.min_vram_mb.unwrap_or(0),
                labels: spec.require.labels.clone().into_iter().collect(),
            }),
            on: spec.require.on.clone().unwrap_or_default(),
            lineage: Some(pb::Lineage {
                task_id: spec.lineage.task_id.clone().unwrap_or_default(),
                parent_id: spec.lineage.parent_id.clone().unwrap_or_default(),
                origin_node: spec.lineage.origin.clone(),
                hops: spec.lineage.hops,
            }),
            session: spec.session.clone().unwrap_or_default(),
        }
    }
}

/// A task event from another node, checked like any network input.
impl TryFrom<pb::TaskEvent> for TaskEvent {
    type Error = Status;

    fn try_from(event: pb::TaskEvent) -> Result<Self, Status> {
        use pb::task_event::Kind;
        const TEXT: usize = 256 * 1024;
        let text = |field: &str, value: String| check_len(field, &value, TEXT).map(|()| value);
        let kind = match event
            .kind
            .ok_or_else(|| Status::invalid_argument("kind: missing"))?
        {
            Kind::Accepted(a) => EventKind::Accepted {
                node: text("accepted.node", a.node)?,
                queue_position: a.queue_position,
            },
            Kind::Started(s) => EventKind::Started {
                node: text("started.node", s.node)?,
            },
            Kind::ModelCall(m) => EventKind::ModelCall {
                model: text("model_call.model", m.model)?,
                round: m.round,
                attempt: m.attempt,
            },
            Kind::ModelFailed(m) => EventKind::ModelFailed {
                model: text("model_failed.model", m.model)?,
                error: text("model_failed.error", m.error)?,
                falling_through: m.falling_through,
            },
            Kind::ToolCalled(t) => EventKind::ToolCalled {
                call_id: text("tool_called.call_id", t.call_id)?,
                name: text("tool_called.name", t.name)?,
                arguments: text("tool_called.arguments", t.arguments)?,
            },
            Kind::ToolResult(t) => EventKind::ToolResult {
                call_id: text("tool_result.call_id", t.call_id)?,
                name: text("tool_result.name", t.name)?,
                ok: t.ok,
                output: text("tool_result.output", t.output)?,
                consecutive_failures: t.consecutive_failures,
            },
            Kind::Intervention(i) => EventKind::Intervention {
                rule: text("intervention.rule", i.rule)?,
                message: text("intervention.message", i.message)?,
            },
            Kind::OutputDelta(d) => EventKind::OutputDelta {
                text: text("output_delta.text", d.text)?,
            },
            Kind::Completed(c) => EventKind::Completed {
                output: text("completed.output", c.output)?,
                usage: c
                    .usage
                    .map(|u| Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                    })
                    .unwrap_or_default(),
                executed_on: text("completed.executed_on", c.executed_on)?,
                rounds: c.rounds,
            },
            Kind::Failed(f) => EventKind::Failed {
                error: task_error_from_wire(f.error.unwrap_or_default()),
            },
            Kind::Delegated(d) => EventKind::Delegated {
                node: text("delegated.node", d.node)?,
                attempt: d.attempt,
                reason: text("delegated.reason", d.reason)?,
            },
        };
        Ok(Self {
            task_id: event.task_id,
            seq: event.seq,
            at_ms: event.at_ms,
            kind,
        })
    }
}

/// Rebuilds a task error from its wire form (kind + fields); unknown kinds become `internal`.
fn task_error_from_wire(error: pb::TaskError) -> TaskError {
    let mut fields: serde_json::Map<String, serde_json::Value> = error
        .fields
        .into_iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            (k, value)
        })
        .collect();
    fields.insert("kind".into(), serde_json::Value::String(error.kind));
    serde_json::from_value(serde_json::Value::Object(fields)).unwrap_or(TaskError::Internal {
        message: error.message,
    })
}

impl crate::agent::tools::Mesh for TasksService {
    fn run_subtask(&self, spec: TaskSpec) -> BoxFuture<'static, Result<String, String>> {
        let service = self.clone();
        Box::pin(async move {
            let placement = service
                .place(&spec, false)
                .map_err(|s| s.message().to_owned())?;
            let id = service
                .tasks
                .submit(spec, placement)
                .map_err(|e| e.to_string())?;
            let mut events = service.tasks.watch(&id, true).map_err(|e| e.to_string())?;
            while let Some(event) = events.recv().await {
                match event.kind {
                    EventKind::Completed { output, .. } => return Ok(output),
                    EventKind::Failed { error } => {
                        return Err(format!("sub-task {id} failed: {error}"));
                    }
                    _ => {}
                }
            }
            Err(format!("sub-task {id} ended without an outcome"))
        })
    }
}

impl crate::cron::Runner for TasksService {
    fn start(&self, spec: TaskSpec) -> Result<tokio::sync::mpsc::Receiver<TaskEvent>, String> {
        // Ranked like any new task: the fixed id only makes a second submission a duplicate.
        let mut ranked = spec.clone();
        ranked.lineage.task_id = None;
        let placement = self
            .place(&ranked, false)
            .map_err(|s| s.message().to_owned())?;
        let id = self
            .tasks
            .submit(spec, placement)
            .map_err(|e| e.to_string())?;
        self.tasks.watch(&id, true).map_err(|e| e.to_string())
    }
}

/// Forwards tasks to other nodes' `Tasks.Submit` over mTLS.
#[derive(Debug, Clone)]
pub struct RemoteTasks {
    channels: super::PeerChannels,
}

impl RemoteTasks {
    async fn channel(&self, addr: &str) -> Result<tonic::transport::Channel, ForwardError> {
        self.channels
            .get(addr)
            .await
            .map_err(|e| ForwardError::Unavailable(e.to_string()))
    }

    fn forget(&self, addr: &str) {
        self.channels.forget(addr);
    }
}

impl Forwarder for RemoteTasks {
    fn cancel(&self, addr: String, task_id: String) -> BoxFuture<'static, ()> {
        let this = self.clone();
        Box::pin(async move {
            let Ok(channel) = this.channel(&addr).await else {
                return;
            };
            let request = pb::CancelRequest { task_id };
            if let Err(status) = pb::tasks_client::TasksClient::new(channel)
                .cancel(request)
                .await
            {
                tracing::warn!(%addr, error = %status.message(), "cancel the delegated task");
            }
        })
    }

    fn forward(
        &self,
        addr: String,
        spec: TaskSpec,
    ) -> BoxFuture<
        'static,
        Result<tokio::sync::mpsc::Receiver<Result<TaskEvent, ForwardError>>, ForwardError>,
    > {
        let this = self.clone();
        Box::pin(async move {
            let channel = this.channel(&addr).await?;
            let mut client = pb::tasks_client::TasksClient::new(channel)
                .max_decoding_message_size(4 * super::MAX_MESSAGE_BYTES);
            let mut stream = match client.submit(pb::SubmitRequest::from(&spec)).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    if status.code() == tonic::Code::Unavailable {
                        this.forget(&addr);
                    }
                    let message = status.message().to_owned();
                    return Err(match status.code() {
                        tonic::Code::ResourceExhausted => ForwardError::Exhausted(message),
                        tonic::Code::PermissionDenied
                        | tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::AlreadyExists => ForwardError::Refused(message),
                        _ => ForwardError::Unavailable(format!("{}: {message}", status.code())),
                    });
                }
            };
            let (tx, rx) = tokio::sync::mpsc::channel(256);
            tokio::spawn(async move {
                loop {
                    let item = match stream.message().await {
                        Ok(Some(event)) => TaskEvent::try_from(event).map_err(|s| {
                            ForwardError::Unavailable(format!("invalid event: {}", s.message()))
                        }),
                        Ok(None) => return,
                        Err(status) => Err(ForwardError::Unavailable(format!(
                            "stream broke: {}: {}",
                            status.code(),
                            status.message()
                        ))),
                    };
                    let end = item.is_err();
                    if tx.send(item).await.is_err() || end {
                        return;
                    }
                }
            });
            Ok(rx)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_requests_are_validated_field_by_field() {
        let good = pb::SubmitRequest {
            prompt: "hi".into(),
            target: Some(pb::submit_request::Target::Role("chat".into())),
            ..Default::default()
        };
        let spec = TaskSpec::try_from(good.clone()).expect("valid");
        assert_eq!(spec.tier, Tier::Read);
        assert_eq!(spec.timeout, None);

        let cases: Vec<(pb::SubmitRequest, &str)> = vec![
            (
                pb::SubmitRequest {
                    prompt: " ".into(),
                    ..good.clone()
                },
                "prompt",
            ),
            (
                pb::SubmitRequest {
                    target: None,
                    ..good.clone()
                },
                "target",
            ),
            (
                pb::SubmitRequest {
                    target: Some(pb::submit_request::Target::Role("r".repeat(64))),
                    ..good.clone()
                },
                "role",
            ),
            (
                pb::SubmitRequest {
                    tier: 42,
                    ..good.clone()
                },
                "tier",
            ),
            (
                pb::SubmitRequest {
                    timeout_s: 90_000,
                    ..good.clone()
                },
                "timeout_s",
            ),
            (
                pb::SubmitRequest {
                    prompt: "x".repeat(MAX_PROMPT_BYTES + 1),
                    ..good.clone()
                },
                "prompt",
            ),
        ];
        for (request, field) in cases {
            let status = TaskSpec::try_from(request).expect_err(field);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(field), "{}", status.message());
        }
    }

    #[test]
    fn task_errors_map_to_their_status_codes() {
        let code = |e: TaskError| task_error_status(&e).code();
        assert_eq!(
            code(TaskError::Deadline { seconds: 1 }),
            tonic::Code::DeadlineExceeded
        );
        assert_eq!(
            code(TaskError::Cancelled {
                reason: String::new()
            }),
            tonic::Code::Cancelled
        );
        assert_eq!(
            code(TaskError::Budget {
                what: "tokens".into(),
                limit: 1,
                used: 2
            }),
            tonic::Code::ResourceExhausted
        );
    }
}
