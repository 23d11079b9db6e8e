//! The `agentmesh.v1.Tasks` service: protobuf ↔ task types, and task errors → gRPC status.

use std::{pin::Pin, sync::Arc};

use mesh_domain::{BoxFuture, TaskError, TaskEvent, TaskSpec, task::check_task_id};
use mesh_proto::v1 as pb;
use mesh_tls::deadline;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, AdmissionError, Caller},
    tasks::{ForwardError, Forwarder, LookupError, SubmitError, TaskManager, TaskRecord},
};

/// How long `Cancel` waits for the task to end before it answers (a task ends at its next
/// await point; a forwarded one once the executing node is told).
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The Tasks service: validates requests and hands tasks to the task manager, which admits
/// and places them.
#[derive(Debug, Clone)]
pub(crate) struct TasksService {
    tasks: TaskManager,
    admission: Arc<Admission>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl TasksService {
    /// Serves `tasks`; `admission` explains placements.
    pub(crate) fn new(tasks: TaskManager, admission: Arc<Admission>, tls: bool) -> Self {
        Self {
            tasks,
            admission,
            tls,
        }
    }

    /// Who the caller is: the holder of the certificate it presents (insecure mode: nobody).
    fn caller<T>(&self, request: &Request<T>, spec: &TaskSpec) -> Result<Caller, Status> {
        if !self.tls {
            return Ok(Caller::Unauthenticated {
                forwarded: spec.lineage.hops > 0,
            });
        }
        Ok(Caller::Certificate(
            super::caller_identity(request)?.principal(),
        ))
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::tasks_server::TasksServer<Self> {
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
    check_task_id("task_id", id).map_err(Status::invalid_argument)?;
    Ok(id)
}

#[tonic::async_trait]
impl pb::tasks_server::Tasks for TasksService {
    type SubmitStream = EventStream;

    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<Self::SubmitStream>, Status> {
        let spec = TaskSpec::try_from(request.get_ref().clone())?;
        let caller = self.caller(&request, &spec)?;
        let id = self.tasks.submit(spec, &caller)?;
        let events = self.tasks.watch(&id, true)?;
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
            .watch(task_id(&request.task_id)?, request.follow)?;
        Ok(Response::new(event_stream(events)))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let request = request.into_inner();
        let status = self
            .tasks
            .cancel_and_wait(
                task_id(&request.task_id)?,
                "cancelled by a caller",
                CANCEL_WAIT,
            )
            .await?;
        Ok(Response::new(pb::CancelResponse {
            status: pb::TaskStatus::from(status) as i32,
        }))
    }

    async fn explain(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let spec = TaskSpec::try_from(request.into_inner())?;
        let candidates = self
            .admission
            .rank(&spec.target, spec.tier, &spec.require, |ranked| {
                ranked
                    .iter()
                    .map(|r| pb::Candidate {
                        node: r.node.to_owned(),
                        node_id: r.id.to_string(),
                        local: r.local,
                        eligible: r.verdict.is_ok(),
                        score: *r.verdict.as_ref().unwrap_or(&0.0),
                        reason: r.verdict.clone().err().unwrap_or_default(),
                    })
                    .collect()
            });
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

/// Every task error has one status code.
pub(crate) fn task_error_status(error: &TaskError) -> Status {
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
        // Like a node lost: the task's origin runs it elsewhere.
        TaskError::HandedOver { .. } => Status::unavailable(message),
    }
}

impl From<SubmitError> for Status {
    fn from(error: SubmitError) -> Self {
        let message = error.to_string();
        match error {
            SubmitError::Admission(admission) => admission.into(),
            SubmitError::QueueFull { .. } => Status::resource_exhausted(message),
            SubmitError::ShuttingDown => Status::unavailable(message),
            SubmitError::Duplicate(_) => Status::already_exists(message),
            SubmitError::Rejected(task_error) => task_error_status(&task_error),
            SubmitError::Storage(store) => super::store_status(&store, message),
            SubmitError::Unfollowed(lookup) => lookup.into(),
        }
    }
}

impl From<AdmissionError> for Status {
    fn from(error: AdmissionError) -> Self {
        let message = error.to_string();
        match error {
            AdmissionError::HopLimit { .. }
            | AdmissionError::Nowhere(_)
            | AdmissionError::UnknownModel(_)
            | AdmissionError::NoEvaluator { .. }
            | AdmissionError::CannotEmbed(_) => Status::failed_precondition(message),
            AdmissionError::TierCap { .. } => Status::permission_denied(message),
            // The sender tries its next candidate.
            AdmissionError::Draining { .. } => Status::unavailable(message),
        }
    }
}

impl From<LookupError> for Status {
    fn from(error: LookupError) -> Self {
        let message = error.to_string();
        match error {
            LookupError::NotFound(_) => Status::not_found(message),
            LookupError::Storage(_) => Status::internal(message),
        }
    }
}

impl From<&TaskRecord> for pb::TaskSummary {
    fn from(record: &TaskRecord) -> Self {
        Self {
            task_id: record.id.clone(),
            status: pb::TaskStatus::from(record.status) as i32,
            target: record.spec.target.to_string(),
            prompt: record.spec.prompt.chars().take(200).collect(),
            created_at_ms: record.created_at_ms,
            finished_at_ms: record.finished_at_ms.unwrap_or(0),
            executed_on: record.executed_on.clone(),
            error: record.error.as_ref().map(pb::TaskError::from),
            tier: pb::Tier::from(record.spec.tier) as i32,
            parent_id: record.spec.lineage.parent_id.clone().unwrap_or_default(),
            origin_node: record.spec.lineage.origin.clone(),
            hops: record.spec.lineage.hops,
            route: record.route.clone(),
            evaluate: record.spec.evaluate.as_ref().map(pb::Evaluation::from),
        }
    }
}

/// Forwards tasks to other nodes' `Tasks.Submit` over mTLS.
#[derive(Debug, Clone)]
pub(crate) struct RemoteTasks {
    channels: super::PeerChannels,
}

impl RemoteTasks {
    /// Forwards over the node's kept peer channels.
    pub(crate) fn new(channels: super::PeerChannels) -> Self {
        Self { channels }
    }

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
            let limit = this.channels.deadlines().unary;
            let mut client = pb::tasks_client::TasksClient::new(channel);
            let call = client.cancel(pb::CancelRequest { task_id });
            if let Err(status) = deadline::within(limit, "Tasks.Cancel", call).await {
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
            let deadlines = this.channels.deadlines();
            // The opening has a deadline, and then each event: the task's own deadline bounds
            // how long it runs there.
            let call = client.submit(pb::SubmitRequest::from(&spec));
            let mut stream = match deadline::within(deadlines.open, "Tasks.Submit", call).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) {
                        this.forget(&addr);
                    }
                    let message = status.message().to_owned();
                    return Err(match status.code() {
                        tonic::Code::ResourceExhausted => ForwardError::Exhausted(message),
                        tonic::Code::PermissionDenied
                        | tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::AlreadyExists => ForwardError::Refused(message),
                        _ => ForwardError::Unavailable(super::status_words(&status)),
                    });
                }
            };
            let (tx, rx) = tokio::sync::mpsc::channel(256);
            tokio::spawn(async move {
                loop {
                    let next = stream.message();
                    let item = match deadline::within(
                        deadlines.task_idle,
                        "Tasks.Submit stream",
                        next,
                    )
                    .await
                    {
                        Ok(Some(event)) => TaskEvent::try_from(event).map_err(|s| {
                            ForwardError::Unavailable(format!("invalid event: {}", s.message()))
                        }),
                        Ok(None) => return,
                        Err(status) => {
                            // The transport's words (`h2 protocol error: …`) are for
                            // debugging; the caller is told what happened.
                            tracing::debug!(%addr, code = ?status.code(), error = status.message(), "a forwarded task's stream broke");
                            Err(ForwardError::Lost(
                                if status.code() == tonic::Code::DeadlineExceeded {
                                    let idle = deadlines.task_idle;
                                    if idle.as_secs() > 0 {
                                        format!("it sent nothing for {} s", idle.as_secs())
                                    } else {
                                        format!("it sent nothing for {} ms", idle.as_millis())
                                    }
                                } else {
                                    "the connection to it closed".into()
                                },
                            ))
                        }
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
        assert_eq!(
            code(TaskError::HandedOver {
                node: "b".into(),
                reason: "the node was drained".into()
            }),
            tonic::Code::Unavailable
        );
    }
}
