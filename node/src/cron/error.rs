//! [`CronError`], shared by every file of `cron`. It says what went wrong and how to fix it; it
//! must not pick a status code (that is `rpc::cron`).

use crate::memory::MemoryError;

/// Cron errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CronError {
    /// A field of a request is wrong; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// No schedule by that name.
    #[error("no schedule named `{0}`; `mesh-cli cron ls` lists them")]
    NotFound(String),
    /// The name is taken.
    #[error("a schedule named `{0}` already exists; remove it first with `mesh-cli cron rm {0}`")]
    Exists(String),
    /// One more schedule would pass a cap of `[cron]`; the message names the cap, how to raise
    /// it and how to remove schedules.
    #[error("{0}")]
    Full(String),
    /// Memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}
