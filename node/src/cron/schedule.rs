//! The stored records of cron, as JSON in the memory: a [`Schedule`] (namespace `cron`, key =
//! its name) with its [`Overlap`] policy, and a [`Firing`] (namespace `cron_firings`, key
//! [`firing_key`]) with its [`FiringStatus`]; plus the checks a stored schedule must pass,
//! since a replicated record may come from anywhere. Plain data: it must not read or write the
//! memory, or decide when anything fires.

use std::{fmt, str::FromStr};

use mesh_domain::{Lineage, NodeId, Principal, TaskSpec, keys};
use serde::{Deserialize, Serialize};

use super::{error::CronError, timetable::Timetable};

/// Catch-up window when a schedule does not set one.
pub(crate) const DEFAULT_CATCH_UP_S: u32 = 3600;

/// What happens to a firing while the previous one of the same schedule still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// It is recorded `skipped`.
    #[default]
    Skip,
    /// It runs too.
    Allow,
}

impl FromStr for Overlap {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, CronError> {
        match s {
            "" | "skip" => Ok(Self::Skip),
            "allow" => Ok(Self::Allow),
            other => Err(CronError::Invalid(format!(
                "overlap: `{other}` is not a policy; use `skip` (default) or `allow`"
            ))),
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Allow => "allow",
        })
    }
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Random id; firings and ownership hang off it.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// Cron expression.
    pub expression: String,
    /// IANA zone (empty: UTC).
    pub timezone: String,
    /// What each firing submits.
    pub task: TaskSpec,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Catch-up window in seconds.
    pub catch_up_s: u32,
    /// Paused when false.
    pub enabled: bool,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Name of the node that created it.
    pub created_on: String,
    /// Who created it (the certificate that called `Cron.Add`); each firing runs as a task
    /// started by them. `None` for a schedule created before creators were kept, or in insecure
    /// mode: such firings are trusted least.
    #[serde(default)]
    pub creator: Option<Principal>,
    /// The node whose record this is (set when read from the memory, not stored): a firing of a
    /// schedule another node wrote reaches this node's tasks as that node's.
    #[serde(skip)]
    pub origin: Option<NodeId>,
}

impl Schedule {
    /// Checks a stored schedule as `Cron.Add` checked it when it was added, since a replicated
    /// record may come from anywhere: its name, its expression and time zone, and its task (a
    /// schedule's task carries no lineage of its own). Returns its parsed timetable.
    pub fn check(&self) -> Result<Timetable, String> {
        check_name(&self.name).map_err(|e| e.to_string())?;
        let timetable =
            Timetable::parse(&self.expression, &self.timezone).map_err(|e| e.to_string())?;
        self.task.check().map_err(|e| format!("task.{e}"))?;
        if self.task.lineage != Lineage::default() {
            return Err("task.lineage: set by nodes only".into());
        }
        Ok(timetable)
    }
}

/// Checks a schedule name.
pub(crate) fn check_name(name: &str) -> Result<(), CronError> {
    keys::check_namespace(name).map_err(|_| {
        CronError::Invalid(format!(
            "name: `{name}` must be 1-64 letters, digits, `-`, `_`, `.`"
        ))
    })
}

/// What became of a firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FiringStatus {
    /// Recorded, task being submitted.
    Pending,
    /// The task started.
    Running,
    /// The task completed.
    Done,
    /// The task (or its submission) failed.
    Failed,
    /// Too old to catch up.
    Missed,
    /// The previous firing still ran (overlap `skip`), or the firing was already handled.
    Skipped,
}

impl FiringStatus {
    /// Pending or running.
    pub(crate) fn is_open(self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }

    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Missed => "missed",
            Self::Skipped => "skipped",
        }
    }
}

/// One firing, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Firing {
    /// `schedule id @ scheduled ms`.
    pub fire_id: String,
    /// Schedule id.
    pub schedule_id: String,
    /// Schedule name.
    pub schedule: String,
    /// Unix ms.
    pub scheduled_at_ms: i64,
    /// Node that fired it.
    pub owner: String,
    /// Node that ran the task.
    pub executed_on: String,
    /// Task id.
    pub task_id: String,
    /// How the firing went.
    pub status: FiringStatus,
    /// Why it failed or was skipped.
    pub error: String,
    /// Unix ms of the last change.
    pub updated_at_ms: i64,
    /// Fired by hand.
    pub manual: bool,
}

/// The key of a schedule's firing at `at_ms` in `cron_firings`: zero-padded, so a schedule's
/// firings list in time order.
pub(super) fn firing_key(schedule_id: &str, at_ms: i64) -> String {
    format!("{schedule_id}/{at_ms:020}")
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use mesh_domain::Target;

    use super::*;

    /// 2026-01-01T00:00:00Z.
    pub(in crate::cron) const T0: i64 = 1_767_225_600_000;

    /// A valid schedule named `name`, created at [`T0`] on node `me`, by nobody.
    pub(in crate::cron) fn schedule(
        name: &str,
        expression: &str,
        overlap: Overlap,
        catch_up_s: u32,
    ) -> Schedule {
        Schedule {
            id: format!("id-{name}"),
            name: name.into(),
            expression: expression.into(),
            timezone: String::new(),
            task: TaskSpec::new("summarise", Target::Role("research".into())),
            overlap,
            catch_up_s,
            enabled: true,
            created_at_ms: T0,
            created_on: "me".into(),
            creator: None,
            origin: None,
        }
    }

    #[test]
    fn a_stored_schedule_is_checked_as_cron_add_checks_one() {
        let good = schedule("good", "*/2 * * * * *", Overlap::Skip, 60);
        assert!(good.check().is_ok());
        let mut endless = good.clone();
        endless.task.timeout = Some(Duration::from_secs(u64::MAX));
        assert!(endless.check().expect_err("refused").contains("timeout_s"));
        let mut bad_name = good.clone();
        bad_name.name = "has space".into();
        assert!(bad_name.check().expect_err("refused").starts_with("name:"));
        let mut with_lineage = good;
        with_lineage.task.lineage.hops = 1;
        assert!(
            with_lineage
                .check()
                .expect_err("refused")
                .contains("lineage")
        );
        assert!("sometimes".parse::<Overlap>().is_err());
        assert_eq!("".parse::<Overlap>().expect("default"), Overlap::Skip);
        assert!(check_name("has space").is_err());
        assert_eq!(firing_key("s", 5), "s/00000000000000000005");
    }
}
