//! Tasks: admission, a bounded queue with a fixed number of workers, events, cancellation,
//! deadlines, forwarding to other nodes with failover, and the history in the store.
//!
//! - [`manager`]: the [`TaskManager`]: it admits tasks (through `admission`), queues and runs
//!   them, keeps the live ones with their events, cancels them, and forwards those placed
//!   elsewhere.
//! - [`history`]: each task's record and events in the store, and the recovery at start.
//! - [`forward`]: the [`Forwarder`] port and the failover loop of a task run on other nodes.
//! - `worker`: the workers that run queued tasks here, each with its journal.
//! - [`journal`]: each task's journal in the replicated memory, for resuming it elsewhere.
//! - [`drain`]: draining this node: no new work, queued tasks to other nodes, the rest ended
//!   at a timeout.
//!
//! This module runs tasks but decides nothing about how (that is `agent`) or where (that is
//! `admission`).

pub(crate) mod drain;
pub(crate) mod forward;
pub(crate) mod history;
pub(crate) mod journal;
pub(crate) mod manager;
mod worker;

pub(crate) use self::{
    drain::{Drain, DrainReport},
    forward::{ForwardError, Forwarder},
    history::TaskRecord,
    manager::{TaskManager, TaskParts},
};
pub(crate) use crate::task_handle::{LookupError, SubmitError, TaskOutcome};
