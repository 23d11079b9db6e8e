//! A durable task's journal, as the replicated memory holds it in [`crate::keys::TASK_JOURNAL`]: the
//! leases that say which node runs the task at which epoch, and the steps of its tools loop.
//! The task journal (`tasks::journal` in the node) writes and reads them, the memory's writer
//! rules and fence check them; both read the key layout here.
//!
//! Keys (the task id is a UUID its origin tagged, [`crate::id::tagged_uuid`]):
//! - `<task id>/lease/<epoch, 6 digits>`: a [`Lease`], written only by the task's origin.
//! - `<task id>/step/<epoch, 6 digits>/<seq, 6 digits>`: a [`Step`], appended only by the
//!   executor the lease of its epoch names, while no higher epoch is known.

use serde::{Deserialize, Serialize};

use crate::{NodeId, TaskError, ToolCall, Usage};

/// Most steps one task's journal holds (every epoch together); past it the journal says it is
/// full and the task is not resumed past that step.
pub const MAX_JOURNAL_STEPS: u32 = 2_000;
/// Most bytes (values as stored) of one task's journal.
pub const MAX_JOURNAL_BYTES: usize = 8 * 1024 * 1024;
/// Most bytes of one tool result the journal keeps (the model is given at most 64 KiB).
pub const MAX_STEP_OUTPUT: usize = 64 * 1024;
/// How long a finished task's journal is kept, for `tasks watch` and `tasks show` on any node.
pub const JOURNAL_RETENTION_MS: u64 = 24 * 3600 * 1000;
/// How long after it started any task's journal is kept at most, finished or not (a task
/// running longer is no longer resumed): nothing of a journal outlives this.
pub const JOURNAL_MAX_AGE_MS: u64 = 7 * 24 * 3600 * 1000;

/// Which node runs a task at an epoch. Each resumption takes a higher epoch; only the
/// executor of the highest epoch may append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// 1 for the first run, then one more per resumption.
    pub epoch: u32,
    /// The executing node's id.
    pub executor: NodeId,
    /// Its name, for people.
    pub executor_name: String,
    /// Steps recorded before this epoch (as its origin held them when it leased it), which
    /// the executor replays instead of running: 0 for the first run.
    pub replayed: u32,
    /// Which earlier steps those are, `(epoch, last seq)` per epoch, as the origin held them:
    /// a step of an earlier epoch past these is refused once this lease is known (written by
    /// a superseded executor), one within them is taken (written before it was superseded,
    /// however late it arrives).
    #[serde(default)]
    pub from: Vec<(u32, u32)>,
    /// When the origin gave the task to it (Unix ms).
    pub at_ms: u64,
}

/// One step of a task's tools loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// The first step of a resumed epoch: which earlier steps it continues from, as
    /// `(epoch, steps of that epoch used)`, oldest first.
    Base { from: Vec<(u32, u32)> },
    /// The model's answer in a round: its text and the tool calls it made.
    Model {
        round: u32,
        content: String,
        tool_calls: Vec<ToolCall>,
        /// What the call cost.
        usage: Usage,
    },
    /// A tool call about to run (recorded, and for a call that may change something
    /// confirmed by the origin, before it runs).
    Intent {
        call_id: String,
        name: String,
        arguments: String,
        /// Whether it may change something (write or shell tier, or a side-effecting MCP
        /// tool): such a call is never re-run without the model or a person deciding.
        side_effects: bool,
    },
    /// What a tool call returned, as the model was given it.
    Result {
        call_id: String,
        ok: bool,
        output: String,
    },
    /// An evaluated task's attempt ended and was judged: what a resumed run starts again from
    /// (the steps after it are the next attempt's).
    Evaluated {
        attempt: u32,
        /// The attempt's answer.
        output: String,
        /// Its score (`None`: unscored).
        score: Option<f64>,
        /// What every attempt and evaluation so far spent, and their rounds.
        spent: Usage,
        rounds: u32,
        /// The prompt of the next attempt.
        next_prompt: String,
    },
    /// The journal reached its cap here: the task is not resumed past this step.
    Full,
    /// How the task ended on its executor.
    Done {
        /// The answer, when it completed.
        output: Option<String>,
        /// Why it failed, when it did.
        error: Option<TaskError>,
        usage: Usage,
        rounds: u32,
    },
}

/// Digits of an epoch or a step number in a key.
const DIGITS: usize = 6;

/// The prefix of every record of task `task_id`.
pub fn task_prefix(task_id: &str) -> String {
    format!("{task_id}/")
}

/// The key of the lease of `epoch`.
pub fn lease_key(task_id: &str, epoch: u32) -> String {
    format!("{task_id}/lease/{epoch:0DIGITS$}")
}

/// The prefix of a task's leases.
pub fn lease_prefix(task_id: &str) -> String {
    format!("{task_id}/lease/")
}

/// The key of step `seq` (from 1) of `epoch`.
pub fn step_key(task_id: &str, epoch: u32, seq: u32) -> String {
    format!("{task_id}/step/{epoch:0DIGITS$}/{seq:0DIGITS$}")
}

/// The prefix of the steps of `epoch`.
pub fn epoch_prefix(task_id: &str, epoch: u32) -> String {
    format!("{task_id}/step/{epoch:0DIGITS$}/")
}

/// A journal key, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalKey<'a> {
    /// A lease: `(task id, epoch)`.
    Lease(&'a str, u32),
    /// A step: `(task id, epoch, seq)`.
    Step(&'a str, u32, u32),
}

impl JournalKey<'_> {
    /// The task it belongs to.
    pub fn task_id(&self) -> &str {
        match self {
            Self::Lease(task, _) | Self::Step(task, ..) => task,
        }
    }
}

/// Reads a key of [`crate::keys::TASK_JOURNAL`]; `None` when it is not one [`lease_key`] or [`step_key`]
/// made.
pub fn parse_key(key: &str) -> Option<JournalKey<'_>> {
    let number = |s: &str| {
        (s.len() == DIGITS && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    let (task, rest) = key.split_once('/')?;
    if task.is_empty() {
        return None;
    }
    let mut parts = rest.split('/');
    let parsed = match (parts.next()?, parts.next()?, parts.next()) {
        ("lease", epoch, None) => JournalKey::Lease(task, number(epoch)?),
        ("step", epoch, Some(seq)) => JournalKey::Step(task, number(epoch)?, number(seq)?),
        _ => return None,
    };
    parts.next().is_none().then_some(parsed)
}

/// When a task id (a UUIDv7) was made, in Unix ms; `None` when it is not a UUIDv7.
pub fn task_started_ms(task_id: &str) -> Option<u64> {
    let uuid = uuid::Uuid::try_parse(task_id).ok()?;
    let (seconds, nanos) = uuid.get_timestamp()?.to_unix();
    Some(seconds * 1000 + u64::from(nanos) / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_and_others_do_not() {
        let task = "0190a0a0-0000-7000-8000-000000000000";
        assert_eq!(
            parse_key(&lease_key(task, 3)),
            Some(JournalKey::Lease(task, 3))
        );
        assert_eq!(
            parse_key(&step_key(task, 2, 41)),
            Some(JournalKey::Step(task, 2, 41))
        );
        for bad in [
            "",
            "x",
            "/lease/000001",
            "t/lease/1",
            "t/lease/000001/x",
            "t/step/000001",
            "t/step/000001/00000a",
            "t/step/000001/000001/x",
            "t/other/000001",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
        assert!(step_key(task, 2, 41).starts_with(&epoch_prefix(task, 2)));
        assert!(lease_key(task, 2).starts_with(&lease_prefix(task)));
    }

    #[test]
    fn a_task_ids_time_is_read_from_its_uuid() {
        let id = uuid::Uuid::now_v7().to_string();
        let now = crate::time::now_ms();
        let at = task_started_ms(&id).expect("a v7 id");
        assert!(at <= now && now - at < 60_000, "{at} vs {now}");
        assert_eq!(task_started_ms("not-a-uuid"), None);
    }
}
