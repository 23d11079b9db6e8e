//! Running a task on other nodes: the [`Forwarder`] port (implemented by `rpc` over
//! `Tasks.Submit`), and `forward`, which sends the task to each chosen node in turn, relays
//! its events and fails over to the next when a node is lost or full, unless a tool that may
//! have changed something already ran there.
//!
//! It does not choose the nodes (that is `admission`) and keeps no task state of its own: what
//! it learns about the task goes through the `Journey` its manager gives it.

use std::{fmt, sync::Mutex, time::Duration};

use mesh_domain::{Answer, BoxFuture, EventKind, TaskError, TaskEvent, TaskSpec, sync::MutexExt};
use tokio::{sync::mpsc, time::Instant};

use crate::{agent::EventSink, router::Destination};

/// Re-routes after the first node at most this many times.
pub const MAX_FAILOVERS: u32 = 2;

/// Why forwarding a task to one node did not produce an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// The node's queue is full (`RESOURCE_EXHAUSTED`): try the next.
    #[error("queue full: {0}")]
    Exhausted(String),
    /// The node refused the task or could not be reached: try the next.
    #[error("{0}")]
    Unavailable(String),
    /// The node refused the task for good (tier, hop limit, bad request).
    #[error("{0}")]
    Refused(String),
}

/// Sends a task to another node and streams back its events.
pub trait Forwarder: Send + Sync + fmt::Debug {
    /// Submits `spec` to the node at `addr`; the stream ends with its terminal event, or with an
    /// error when the connection breaks.
    fn forward(
        &self,
        addr: String,
        spec: TaskSpec,
    ) -> BoxFuture<'static, Result<mpsc::Receiver<Result<TaskEvent, ForwardError>>, ForwardError>>;
    /// Asks the node at `addr` to cancel task `task_id` (best effort).
    fn cancel(&self, addr: String, task_id: String) -> BoxFuture<'static, ()>;
}

/// The task being forwarded, as its manager tells it.
pub(crate) struct Journey<'a> {
    /// This node's name: the task's origin when it has none yet.
    pub node: &'a str,
    /// The task's id, which it keeps on every node.
    pub task_id: &'a str,
    /// What was asked.
    pub spec: &'a TaskSpec,
    /// When the task's deadline passes here.
    pub deadline: Instant,
    /// Where the relayed events go.
    pub events: &'a dyn EventSink,
    /// Records that the task is now sent to the node named so.
    pub routed: &'a (dyn Fn(&str) + Send + Sync),
    /// Whether a tool call (name, raw arguments) may have changed something.
    pub side_effects: &'a (dyn Fn(&str, &str) -> bool + Send + Sync),
    /// The address of the node running the task now, so a cancel or deadline here stops it
    /// there too.
    pub current: &'a Mutex<Option<String>>,
}

/// Runs a task on other nodes: forwards it to each candidate in turn, relaying its events,
/// until one gives an outcome. A broken stream or a full queue moves on to the next candidate
/// (at most [`MAX_FAILOVERS`] times after the first), unless a side-effecting tool already ran.
pub(crate) async fn forward(
    journey: Journey<'_>,
    candidates: Vec<Destination>,
    forwarder: &dyn Forwarder,
) -> Result<Answer, TaskError> {
    let mut spec = journey.spec.clone();
    spec.lineage.task_id = Some(journey.task_id.to_owned());
    spec.lineage.hops = spec.lineage.hops.saturating_add(1);
    if spec.lineage.origin.is_empty() {
        spec.lineage.origin = journey.node.to_owned();
    }
    let mut failures: Vec<String> = Vec::new();
    for (index, Destination { name, addr }) in candidates.into_iter().enumerate() {
        let attempt = index as u32 + 1;
        if attempt > MAX_FAILOVERS + 1 {
            break;
        }
        let remaining = journey.deadline.saturating_duration_since(Instant::now());
        spec.timeout = Some(remaining.max(Duration::from_secs(1)));
        journey.events.emit(EventKind::Delegated {
            node: name.clone(),
            attempt,
            reason: failures.last().cloned().unwrap_or_default(),
        });
        (journey.routed)(&name);
        *journey.current.lock_unpoisoned() = Some(addr.clone());
        let mut stream = match forwarder.forward(addr.clone(), spec.clone()).await {
            Ok(stream) => stream,
            Err(ForwardError::Refused(why)) => {
                return Err(TaskError::Routing {
                    message: format!("{name} refused the task: {why}"),
                });
            }
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut side_effect: Option<String> = None;
        let lost = loop {
            let event = match stream.recv().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => break e,
                None => break ForwardError::Unavailable("stream ended without an outcome".into()),
            };
            match event.kind {
                EventKind::Completed {
                    output,
                    usage,
                    executed_on,
                    rounds,
                } => {
                    return Ok(Answer {
                        output,
                        usage,
                        rounds,
                        executed_on: Some(executed_on),
                    });
                }
                EventKind::Failed { error } => return Err(error),
                // The executing node's own admission is not news to our caller.
                EventKind::Accepted { .. } => {}
                kind => {
                    if let EventKind::ToolCalled {
                        name: tool,
                        arguments,
                        ..
                    } = &kind
                        && (journey.side_effects)(tool, arguments)
                    {
                        side_effect = Some(tool.clone());
                    }
                    journey.events.emit(kind);
                }
            }
        };
        if let Some(tool) = side_effect {
            return Err(TaskError::Routing {
                message: format!(
                    "node {name} was lost after running `{tool}` (its side effects may have happened), so the task is not re-run elsewhere: {lost}"
                ),
            });
        }
        failures.push(format!("{name}: {lost}"));
    }
    Err(TaskError::Routing {
        message: format!("no node completed the task: {}", failures.join("; ")),
    })
}
