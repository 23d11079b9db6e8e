//! Tasks: admission, a bounded queue with a fixed number of workers, events, cancellation,
//! deadlines, forwarding to other nodes with failover, and the history in the store.
//!
//! - [`manager`]: the [`TaskManager`]: it admits tasks (through `admission`), queues and runs
//!   them, keeps the live ones with their events, cancels them, and forwards those placed
//!   elsewhere.
//! - [`history`]: each task's record and events in the store, and the recovery at start.
//! - [`forward`]: the [`Forwarder`] port and the failover loop of a task run on other nodes.
//!
//! This module runs tasks but decides nothing about how (that is `agent`) or where (that is
//! `admission`).

pub mod forward;
pub mod history;
pub mod manager;

pub use self::{
    forward::{ForwardError, Forwarder},
    history::TaskRecord,
    manager::{TaskManager, TaskParts},
};
pub use crate::task_handle::{LookupError, SubmitError, TaskOutcome};
