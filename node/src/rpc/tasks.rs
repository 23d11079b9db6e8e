//! The `agentmesh.v1.Tasks` service: protobuf ↔ task types, and task errors → gRPC status.

use std::pin::Pin;

use mesh_proto::v1 as pb;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::check_len;
use crate::{
    config::Tier,
    tasks::{
        EventKind, LookupError, MAX_PROMPT_BYTES, SubmitError, Target, TaskError, TaskEvent,
        TaskManager, TaskRecord, TaskSpec, TaskStatus,
    },
};

/// Longest deadline a caller may ask for.
const MAX_TIMEOUT_S: u32 = 86_400;

/// The Tasks service.
#[derive(Debug, Clone)]
pub struct TasksService {
    tasks: TaskManager,
}

impl TasksService {
    /// Wraps the task manager.
    pub fn new(tasks: TaskManager) -> Self {
        Self { tasks }
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
        let spec = TaskSpec::try_from(request.into_inner())?;
        let id = self.tasks.submit(spec).map_err(submit_status)?;
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
        Ok(TaskSpec {
            prompt: request.prompt,
            target,
            tier,
            timeout: (request.timeout_s > 0)
                .then(|| std::time::Duration::from_secs(u64::from(request.timeout_s))),
            max_rounds: (request.max_rounds > 0).then_some(request.max_rounds),
            token_budget: (request.token_budget > 0).then_some(request.token_budget),
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
        SubmitError::Rejected(task_error) => task_error_status(&task_error),
        SubmitError::Storage(_) => Status::internal(error.to_string()),
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

fn pb_tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Read => pb::Tier::Read,
        Tier::Write => pb::Tier::Write,
        Tier::Shell => pb::Tier::Shell,
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
        };
        Self {
            task_id: event.task_id.clone(),
            seq: event.seq,
            at_ms: event.at_ms,
            kind: Some(kind),
        }
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
