//! Why the task manager refused: [`SubmitError`] (a task not taken) and [`LookupError`] (a
//! task asked for by id). Apart from the manager so that what callers match on reads on its
//! own.

use mesh_domain::TaskError;

use crate::{admission::AdmissionError, storage::StoreError};

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
