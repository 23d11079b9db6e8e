//! Cron across the mesh: schedules that submit a task at set times, fired by one live node.
//!
//! Schedules live in the replicated memory namespace `cron` (key = name), so every node knows
//! every schedule. Each schedule has one owner at a time: the live node (this one, or a peer not
//! `down`) that scores highest for the schedule id by rendezvous hashing ([`owner`]), so when
//! the owner goes away the next node takes over as soon as failure detection says so.
//!
//! A firing is one scheduled time of one schedule; its id is `schedule id @ scheduled ms`. The
//! owner writes the firing record (namespace `cron_firings`) before it submits the task, and
//! the task id is derived from the firing id, so a node that is handed the same firing twice
//! runs it once. After downtime the latest missed time still runs if it is within the schedule's
//! catch-up window; older ones are recorded `missed` ([`due`]).
//!
//! Schedules are bounded ([`ScheduleLimits`], `[cron]` in the config): `Cron.Add` refuses one
//! past a cap per creator or in all, by count or bytes. Nodes that each accepted schedules up to
//! a cap before they saw each other's can hold more than it together; every node then holds back
//! the same newest ones (listed, never fired, never deleted) until older ones are removed.
//!
//! # Layout
//!
//! - `error`: [`CronError`], shared by every file.
//! - `timetable`: [`Timetable`] and [`due`]: cron expressions in time zones, and what is due.
//! - `schedule`: the stored records, [`Schedule`] and [`Firing`], and the checks a stored
//!   schedule must pass.
//! - `owner`: [`owner`], [`owner_of`] and [`task_id_for`]: who fires a schedule, and as which
//!   task.
//! - `limits`: [`ScheduleLimits`]: whether one more schedule fits, and which are held back.
//! - `table`: [`ScheduleTable`]: the stored schedules, decoded once per change.
//! - `scheduler`: [`Scheduler`] and its [`Runner`] port: add, remove, list, the loop, firing
//!   and following firings.
//!
//! `timetable`, `schedule`, `owner` and `limits` are pure (no I/O, no clock of their own).
//! Imports point one way: `error` at the bottom, then `timetable`, `schedule` (which names
//! `timetable`), `owner` (names `schedule`), `limits`; `table` names those, `scheduler` names
//! them all. This file declares and re-exports; it defines nothing.

mod error;
mod limits;
mod owner;
mod schedule;
mod scheduler;
mod table;
mod timetable;

pub(crate) use error::CronError;
pub(crate) use limits::ScheduleLimits;
pub(crate) use owner::{LiveNode, owner_of};
pub(crate) use schedule::{DEFAULT_CATCH_UP_S, Firing, check_name};
pub use schedule::{Overlap, Schedule};
pub(crate) use scheduler::{Runner, Scheduler};
pub(crate) use timetable::Timetable;
