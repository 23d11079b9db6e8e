//! A task as whoever submitted it holds it: [`TaskHandle`], its events followed to its
//! [`TaskOutcome`] (what `delegate`, cron, `/mcp` and forwarding each used to follow in a loop of
//! their own), and why a task was not taken ([`SubmitError`]) or not found ([`LookupError`]).
//!
//! Below the task manager (which hands handles out) so that the ports of `agent` and `cron`
//! can name them; it runs nothing and decides nothing.

use mesh_domain::{EventKind, TaskError, TaskEvent, Usage};
use tokio::sync::mpsc;

use crate::{admission::AdmissionError, storage::StoreError};

/// How a followed task ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// It completed with this answer.
    Completed {
        output: String,
        usage: Usage,
        /// The node that ran it.
        executed_on: String,
        rounds: u32,
    },
    /// It failed, was cancelled or ran out of time, having spent `usage`.
    Failed { error: TaskError, usage: Usage },
}

impl TaskOutcome {
    /// The outcome `kind` says, or `kind` back when it is not the task's end.
    pub fn of(kind: EventKind) -> Result<Self, EventKind> {
        match kind {
            EventKind::Completed {
                output,
                usage,
                executed_on,
                rounds,
            } => Ok(Self::Completed {
                output,
                usage,
                executed_on,
                rounds,
            }),
            EventKind::Failed { error, usage } => Ok(Self::Failed { error, usage }),
            other => Err(other),
        }
    }
}

/// A task being followed: its events until its end, then its [`TaskOutcome`]. Take the events
/// with [`TaskHandle::progress`] to see them (`/mcp` relays them as progress, cron records
/// where the task started), or go straight to [`TaskHandle::outcome`].
#[derive(Debug)]
pub struct TaskHandle {
    id: String,
    events: mpsc::Receiver<TaskEvent>,
    /// The outcome, once its event came.
    end: Option<TaskOutcome>,
}

impl TaskHandle {
    /// The task `id`, followed through `events` (which end with its terminal event).
    pub fn new(id: String, events: mpsc::Receiver<TaskEvent>) -> Self {
        Self {
            id,
            events,
            end: None,
        }
    }

    /// The task's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The task's next event before its end; `None` once it ended (or its events did), when
    /// [`TaskHandle::outcome`] answers at once. Cancel-safe: an event is never lost to a
    /// `select!` that drops this future.
    pub async fn progress(&mut self) -> Option<TaskEvent> {
        if self.end.is_some() {
            return None;
        }
        let event = self.events.recv().await?;
        match TaskOutcome::of(event.kind) {
            Ok(outcome) => {
                self.end = Some(outcome);
                None
            }
            Err(kind) => Some(TaskEvent { kind, ..event }),
        }
    }

    /// Follows the task to its end, passing over the progress not yet taken; `None` when its
    /// events ended without an outcome (the node shut down, or the task's record was lost).
    pub async fn outcome(mut self) -> Option<TaskOutcome> {
        while self.progress().await.is_some() {}
        self.end
    }
}

/// Why a task was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// It may not run, or cannot run anywhere.
    #[error(transparent)]
    Admission(AdmissionError),
    /// Queue full.
    #[error("queue full: {queued} tasks waiting for {workers} workers; try another node or later")]
    QueueFull {
        /// Tasks waiting.
        queued: usize,
        /// Tasks that run at once.
        workers: usize,
    },
    /// The node is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
    /// The task cannot run here.
    #[error(transparent)]
    Rejected(TaskError),
    /// A task with this id already exists here: a forwarding loop.
    #[error("task `{0}` already exists on this node (a delegation loop?)")]
    Duplicate(String),
    /// Storage failed, or the disk is full.
    #[error("storage: {0}")]
    Storage(StoreError),
    /// It was taken, but its events cannot be followed.
    #[error("follow the task: {0}")]
    Unfollowed(LookupError),
}

/// Lookup errors.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// No such task.
    #[error("no task with id `{0}`")]
    NotFound(String),
    /// Storage failed.
    #[error("storage: {0}")]
    Storage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, kind: EventKind) -> TaskEvent {
        TaskEvent {
            task_id: "t1".into(),
            seq,
            at_ms: 0,
            kind,
        }
    }

    fn started() -> EventKind {
        EventKind::Started { node: "gpu".into() }
    }

    /// A cancelled task's outcome is its failure, with what it spent, after its progress.
    #[tokio::test]
    async fn progress_comes_before_the_outcome_and_a_cancel_is_a_failure() {
        let (tx, rx) = mpsc::channel(8);
        let spent = Usage {
            prompt_tokens: 3,
            completion_tokens: 4,
        };
        let cancelled = TaskError::Cancelled {
            reason: "by alice".into(),
        };
        for (seq, kind) in [
            (0, started()),
            (
                1,
                EventKind::Failed {
                    error: cancelled.clone(),
                    usage: spent,
                },
            ),
            // Nothing after the end is taken as progress.
            (2, started()),
        ] {
            tx.send(event(seq, kind)).await.expect("send");
        }
        let mut task = TaskHandle::new("t1".into(), rx);
        assert_eq!(task.id(), "t1");
        let first = task.progress().await.expect("the start");
        assert_eq!((first.seq, first.kind), (0, started()));
        assert!(task.progress().await.is_none(), "the failure ends it");
        assert!(task.progress().await.is_none(), "and it stays ended");
        assert_eq!(
            task.outcome().await,
            Some(TaskOutcome::Failed {
                error: cancelled,
                usage: spent,
            })
        );
    }

    #[tokio::test]
    async fn outcome_passes_over_progress_to_the_answer_or_says_there_was_none() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(event(0, started())).await.expect("send");
        let completed = EventKind::Completed {
            output: "42".into(),
            usage: Usage::default(),
            executed_on: "gpu".into(),
            rounds: 2,
        };
        tx.send(event(1, completed.clone())).await.expect("send");
        assert_eq!(
            TaskHandle::new("t1".into(), rx).outcome().await,
            TaskOutcome::of(completed).ok()
        );

        let (tx, rx) = mpsc::channel(8);
        tx.send(event(0, started())).await.expect("send");
        drop(tx);
        assert_eq!(TaskHandle::new("t1".into(), rx).outcome().await, None);
    }
}
