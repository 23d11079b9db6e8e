//! Cron across the mesh: schedules that submit a task at set times, fired by one live node.
//!
//! Schedules live in the replicated memory namespace [`CRON_SCHEDULES`] (key = name), so every
//! node knows every schedule. Each schedule has one owner at a time: the live node (this one, or
//! a peer not `down`) that scores highest for the schedule id by rendezvous hashing ([`owner`]),
//! so when the owner goes away the next node takes over as soon as failure detection says so.
//!
//! A firing is one scheduled time of one schedule; its id is `schedule id @ scheduled ms`. The
//! owner writes the firing record (namespace [`CRON_FIRINGS`]) before it submits the task, and
//! the task id is derived from the firing id, so a node that is handed the same firing twice
//! runs it once. After downtime the latest missed time still runs if it is within the schedule's
//! catch-up window; older ones are recorded `missed` ([`due`]).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    str::FromStr,
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::TimeZone;
use chrono_tz::Tz;
use mesh_domain::{
    EventKind, Lineage, NodeId, PeerState, Principal, TaskEvent, TaskSpec, Tier,
    keys::{self, CRON_FIRINGS, CRON_SCHEDULES},
    sync::MutexExt,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    memory::{Memory, MemoryError, Record},
    peers::PeerTable,
};

/// Catch-up window when a schedule does not set one.
pub const DEFAULT_CATCH_UP_S: u32 = 3600;
/// Firings kept per schedule; older ones are deleted as new ones come.
pub const HISTORY_KEPT: usize = 200;
/// How often the owner looks for new schedules and changes of ownership (it also wakes at the
/// next scheduled time). Each look reads the schedules and, when there are any, the peer
/// table: ten times a second was a fifth of an idle node's CPU.
const TICK: Duration = Duration::from_millis(500);
/// Most `missed` records one catch-up writes (the most recent ones).
const MAX_MISSED_RECORDED: usize = 100;
/// How far back a catch-up looks beyond the catch-up window.
const LOOKBACK_MS: i64 = 24 * 3600 * 1000;
/// A starting node fires nothing for this long, and until it has synced memory with every up
/// peer: until then it may not know its peers (it would own every schedule) or their firings.
const STARTUP_GRACE: Duration = Duration::from_secs(3);

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
    /// Memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

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
    /// schedule's task carries no lineage of its own).
    pub fn check(&self) -> Result<(), String> {
        check_name(&self.name).map_err(|e| e.to_string())?;
        Timetable::parse(&self.expression, &self.timezone).map_err(|e| e.to_string())?;
        self.task.check().map_err(|e| format!("task.{e}"))?;
        if self.task.lineage != Lineage::default() {
            return Err("task.lineage: set by nodes only".into());
        }
        Ok(())
    }
}

/// Checks a schedule name.
pub fn check_name(name: &str) -> Result<(), CronError> {
    keys::check_namespace(name).map_err(|_| {
        CronError::Invalid(format!(
            "name: `{name}` must be 1-64 letters, digits, `-`, `_`, `.`"
        ))
    })
}

/// A parsed cron expression in its time zone.
#[derive(Debug, Clone)]
pub struct Timetable {
    cron: croner::Cron,
    tz: Tz,
}

impl Timetable {
    /// Parses `expression` (5 fields, 6 with leading seconds, or an `@` alias) in `timezone`
    /// (empty: UTC). Errors name the bad field.
    pub fn parse(expression: &str, timezone: &str) -> Result<Self, CronError> {
        let fields = expression.split_whitespace().count();
        if !expression.trim_start().starts_with('@') && fields != 5 && fields != 6 {
            return Err(CronError::Invalid(format!(
                "schedule: `{expression}` has {fields} fields; use 5 (minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\") or 6 with a leading seconds field"
            )));
        }
        // croner takes an empty list item (`5 , * * *`) as a field that matches nothing, and
        // then searches for ~0.5 s before it gives up (the cron fuzz target found it).
        if let Some(field) = expression
            .split_whitespace()
            .find(|f| f.split(',').any(str::is_empty))
        {
            return Err(CronError::Invalid(format!(
                "schedule: the field `{field}` of `{expression}` has an empty list item; separate values with commas, e.g. `1,15`"
            )));
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| {
                CronError::Invalid(format!(
                    "schedule: `{expression}` is not a valid cron expression: {e}"
                ))
            })?;
        let tz = if timezone.is_empty() {
            Tz::UTC
        } else {
            timezone.parse::<Tz>().map_err(|_| {
                CronError::Invalid(format!(
                    "timezone: `{timezone}` is not an IANA time zone; use a name such as `UTC`, `Europe/Berlin` or `America/New_York`"
                ))
            })?
        };
        Ok(Self { cron, tz })
    }

    /// Checks that the schedule fires at all: `0 0 31 2 *` (February 31) parses but never does.
    pub fn check_fires(&self, expression: &str, now_ms: i64) -> Result<(), CronError> {
        match self.next_after(now_ms) {
            Some(_) => Ok(()),
            None => Err(CronError::Invalid(format!(
                "schedule: `{expression}` never fires (no such date, e.g. February 31); check its day-of-month, month and day-of-week fields"
            ))),
        }
    }

    /// The first scheduled time strictly after `after_ms` (Unix ms).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut from = self.tz.timestamp_millis_opt(after_ms).single()?;
        // A few rounds at most: croner works in whole seconds.
        for _ in 0..3 {
            let next = self.cron.find_next_occurrence(&from, false).ok()?;
            if next.timestamp_millis() > after_ms {
                return Some(next.timestamp_millis());
            }
            from = next;
        }
        None
    }
}

/// What is due for a schedule between the last handled time and now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The time to fire now, if any: the latest due time, when within the catch-up window.
    pub run: Option<i64>,
    /// Due times that will not run, oldest first (at most the most recent 100).
    pub missed: Vec<i64>,
    /// Missed times not listed in `missed`.
    pub unrecorded: u64,
    /// The latest due time (or `after` when none): the next call starts after it.
    pub last: i64,
}

/// The scheduled times in (`after`, `now`]: the latest runs when it is at most `catch_up_ms`
/// old, every other one is missed. Looks back at most a day beyond the catch-up window.
pub fn due(table: &Timetable, after: i64, now: i64, catch_up_ms: i64) -> Due {
    let floor = now - catch_up_ms - LOOKBACK_MS;
    let mut cursor = after.max(floor);
    let mut times: VecDeque<i64> = VecDeque::new();
    let mut unrecorded = 0;
    while let Some(t) = table.next_after(cursor) {
        if t > now {
            break;
        }
        times.push_back(t);
        if times.len() > MAX_MISSED_RECORDED + 1 {
            times.pop_front();
            unrecorded += 1;
        }
        cursor = t;
    }
    let Some(&latest) = times.back() else {
        return Due {
            run: None,
            missed: Vec::new(),
            unrecorded,
            last: after,
        };
    };
    let run = (now - latest <= catch_up_ms).then_some(latest);
    if run.is_some() {
        times.pop_back();
    } else if times.len() > MAX_MISSED_RECORDED {
        times.pop_front();
        unrecorded += 1;
    }
    Due {
        run,
        missed: times.into(),
        unrecorded,
        last: latest,
    }
}

fn score(schedule_id: &str, node: &NodeId) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(schedule_id.as_bytes());
    hash.update([0]);
    hash.update(node.as_str().as_bytes());
    hash.finalize().into()
}

/// The owner of a schedule among `nodes`: the highest rendezvous score, the same on every
/// node that sees the same live set; when the owner leaves only its schedules move.
pub fn owner<'a>(
    schedule_id: &str,
    nodes: impl IntoIterator<Item = &'a NodeId>,
) -> Option<&'a NodeId> {
    nodes
        .into_iter()
        .max_by_key(|node| (score(schedule_id, node), *node))
}

/// A node that may own schedules: live as this node sees the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    /// Its id.
    pub id: NodeId,
    /// Its name.
    pub name: String,
    /// Its `security.remote_max_tier`, as it advertises it.
    pub remote_max_tier: Tier,
}

/// The owner of `schedule` among the `live` nodes. A firing is admitted on its owner as a task
/// from the node that wrote the schedule, so a node other than that one would refuse a
/// schedule above its `remote_max_tier`: the owner is chosen ([`owner`]) among the writer and
/// the nodes that accept the schedule's tier from another node, and among all live nodes only
/// when none of those is live (its firings then fail, with the reason, in the history).
pub fn owner_of<'a>(schedule: &Schedule, live: &'a [LiveNode]) -> Option<&'a LiveNode> {
    let accepts = |node: &&LiveNode| {
        schedule.origin.as_ref() == Some(&node.id) || schedule.task.tier <= node.remote_max_tier
    };
    let id = owner(&schedule.id, live.iter().filter(accepts).map(|n| &n.id))
        .or_else(|| owner(&schedule.id, live.iter().map(|n| &n.id)))?;
    live.iter().find(|node| &node.id == id)
}

/// The task id of a firing: a UUIDv7 whose time is the scheduled time and whose other bits
/// come from hashing the firing id, so it is the same on every node and sorts with other tasks
/// by time.
pub fn task_id_for(fire_id: &str, scheduled_ms: i64) -> String {
    let digest = Sha256::digest(fire_id.as_bytes());
    let mut bytes = [0u8; 10];
    bytes.copy_from_slice(&digest[..10]);
    uuid::Builder::from_unix_timestamp_millis(u64::try_from(scheduled_ms).unwrap_or(0), &bytes)
        .into_uuid()
        .to_string()
}

/// What became of a firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FiringStatus {
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
    pub fn is_open(self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
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
pub struct Firing {
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

fn firing_key(schedule_id: &str, at_ms: i64) -> String {
    format!("{schedule_id}/{at_ms:020}")
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Starts tasks for firings: routes and submits a task whose `lineage.task_id` is set,
/// returning its events (a port: the task manager implements it).
pub trait Runner: Send + Sync + fmt::Debug {
    /// Submits `spec`, started by its `lineage.started_by` (the schedule's creator), where the
    /// router places it; `written_here` when this node wrote the schedule.
    fn start(
        &self,
        spec: TaskSpec,
        written_here: bool,
    ) -> Result<mpsc::Receiver<TaskEvent>, String>;
}

/// The node's scheduler.
pub struct Scheduler {
    memory: Arc<Memory>,
    peers: Arc<PeerTable>,
    own: NodeId,
    own_name: String,
    /// `security.remote_max_tier`: which schedules written elsewhere this node may own (a
    /// runtime setting).
    remote_max_tier: Mutex<Tier>,
    runner: Arc<dyn Runner>,
    /// Per owned schedule: the last scheduled time handled.
    last: Mutex<HashMap<String, i64>>,
    /// Firings this node started and still follows.
    open: Mutex<HashSet<String>>,
    /// Stored schedules refused, with why, so each is logged once.
    refused: Mutex<HashSet<(String, String)>>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("own", &self.own_name)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for this node.
    pub fn new(
        memory: Arc<Memory>,
        peers: Arc<PeerTable>,
        own: NodeId,
        own_name: String,
        remote_max_tier: Tier,
        runner: Arc<dyn Runner>,
    ) -> Arc<Self> {
        Arc::new(Self {
            memory,
            peers,
            own,
            own_name,
            remote_max_tier: Mutex::new(remote_max_tier),
            runner,
            last: Mutex::default(),
            open: Mutex::default(),
            refused: Mutex::default(),
        })
    }

    /// Changes `security.remote_max_tier` (a runtime setting), as this node advertises it.
    pub fn set_remote_max_tier(&self, tier: Tier) {
        *self.remote_max_tier.lock_unpoisoned() = tier;
    }

    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.own_name
    }

    /// Every schedule, by name. A record that does not decode, or that `Cron.Add` would have
    /// refused, is logged (once) and left out: it never fires.
    pub fn schedules(&self) -> Result<Vec<Schedule>, CronError> {
        Ok(self
            .memory
            .list(CRON_SCHEDULES, "", usize::MAX)?
            .into_iter()
            .filter_map(|entry| self.stored(&entry.key, &entry.record).ok())
            .collect())
    }

    /// The schedule named `name`.
    pub fn get(&self, name: &str) -> Result<Schedule, CronError> {
        check_name(name)?;
        match self.memory.get(CRON_SCHEDULES, name)? {
            Some(record) if !record.tombstone => self.stored(name, &record),
            _ => Err(CronError::NotFound(name.to_owned())),
        }
    }

    /// The schedule a stored record holds, checked like a new one; a refused record is logged
    /// once per schedule and reason.
    fn stored(&self, name: &str, record: &Record) -> Result<Schedule, CronError> {
        let checked = serde_json::from_slice::<Schedule>(&record.value)
            .map_err(|e| e.to_string())
            .and_then(|schedule| schedule.check().map(|()| schedule));
        match checked {
            Ok(mut schedule) => {
                schedule.origin = Some(record.origin.clone());
                Ok(schedule)
            }
            Err(why) => {
                if self
                    .refused
                    .lock_unpoisoned()
                    .insert((name.to_owned(), why.clone()))
                {
                    tracing::warn!(schedule = %name, writer = %record.origin.short(), error = %why, "ignoring a stored schedule that Cron.Add would refuse; it never fires");
                }
                Err(CronError::Invalid(format!(
                    "stored schedule `{name}` is not valid: {why}"
                )))
            }
        }
    }

    /// Stores a new schedule (validated by the caller: [`Timetable::parse`]).
    pub async fn add(&self, schedule: Schedule) -> Result<Schedule, CronError> {
        check_name(&schedule.name)?;
        Timetable::parse(&schedule.expression, &schedule.timezone)?
            .check_fires(&schedule.expression, chrono::Utc::now().timestamp_millis())?;
        // Its task as each firing will submit it (bounds such as `timeout_s`), so nothing is
        // stored that would never fire.
        schedule
            .task
            .check()
            .map_err(|e| CronError::Invalid(format!("task.{e}")))?;
        if self.get(&schedule.name).is_ok() {
            return Err(CronError::Exists(schedule.name));
        }
        let value = serde_json::to_vec(&schedule)
            .map_err(|e| CronError::Invalid(format!("schedule: {e}")))?;
        self.memory
            .put(CRON_SCHEDULES, &schedule.name, Some(value))
            .await?;
        Ok(schedule)
    }

    /// Deletes a schedule.
    pub async fn remove(&self, name: &str) -> Result<(), CronError> {
        check_name(name)?;
        // Any stored record goes, also one that is refused (it never fires, but it would stay
        // listed in the log and hold its name).
        match self.memory.get(CRON_SCHEDULES, name)? {
            Some(record) if !record.tombstone => {}
            _ => return Err(CronError::NotFound(name.to_owned())),
        }
        self.memory.put(CRON_SCHEDULES, name, None).await?;
        Ok(())
    }

    /// The live nodes: this one and every peer not `down`.
    fn live(&self) -> Vec<LiveNode> {
        let mut live = vec![LiveNode {
            id: self.own.clone(),
            name: self.own_name.clone(),
            remote_max_tier: *self.remote_max_tier.lock_unpoisoned(),
        }];
        live.extend(
            self.peers
                .snapshot()
                .into_iter()
                .filter(|p| p.state != PeerState::Down)
                .map(|p| LiveNode {
                    id: p.info.id,
                    name: p.info.name,
                    remote_max_tier: p.info.remote_max_tier,
                }),
        );
        live
    }

    /// The name of the node that owns `schedule` as this node sees the fleet.
    pub fn owner_name(&self, schedule: &Schedule) -> String {
        let live = self.live();
        owner_of(schedule, &live)
            .map(|node| node.name.clone())
            .unwrap_or_default()
    }

    /// A schedule's firings, oldest first.
    pub fn history(&self, schedule_id: &str) -> Result<Vec<Firing>, CronError> {
        Ok(self
            .memory
            .list(CRON_FIRINGS, &format!("{schedule_id}/"), usize::MAX)?
            .into_iter()
            .filter_map(|entry| serde_json::from_slice(&entry.record.value).ok())
            .collect())
    }

    async fn save(&self, firing: &mut Firing) -> Result<(), CronError> {
        firing.updated_at_ms = now_ms();
        let value =
            serde_json::to_vec(&firing).map_err(|e| CronError::Invalid(format!("firing: {e}")))?;
        self.memory
            .put(
                CRON_FIRINGS,
                &firing_key(&firing.schedule_id, firing.scheduled_at_ms),
                Some(value),
            )
            .await?;
        Ok(())
    }

    /// Keeps the newest [`HISTORY_KEPT`] firings of a schedule.
    async fn trim(&self, schedule_id: &str) -> Result<(), CronError> {
        let entries = self
            .memory
            .list(CRON_FIRINGS, &format!("{schedule_id}/"), usize::MAX)?;
        let excess = entries.len().saturating_sub(HISTORY_KEPT);
        for entry in entries.into_iter().take(excess) {
            self.memory.put(CRON_FIRINGS, &entry.key, None).await?;
        }
        Ok(())
    }

    /// An earlier firing of `schedule` that still runs. Open firings whose owner is gone (or
    /// that this node no longer follows, after a restart) are closed as failed on the way.
    async fn still_running(&self, schedule: &Schedule) -> Result<Option<Firing>, CronError> {
        let live: HashSet<String> = self.live().into_iter().map(|node| node.name).collect();
        for mut firing in self.history(&schedule.id)? {
            if !firing.status.is_open() {
                continue;
            }
            let followed = self.open.lock_unpoisoned().contains(&firing.fire_id);
            let elsewhere = firing.owner != self.own_name && live.contains(&firing.owner);
            if followed || elsewhere {
                return Ok(Some(firing));
            }
            firing.status = FiringStatus::Failed;
            firing.error = format!(
                "node {} went away before it recorded the outcome (task {}{})",
                firing.owner,
                firing.task_id,
                if firing.executed_on.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", firing.executed_on)
                }
            );
            self.save(&mut firing).await?;
        }
        Ok(None)
    }

    /// The latest scheduled time recorded for a schedule.
    fn latest_recorded(&self, schedule_id: &str) -> Option<i64> {
        self.history(schedule_id)
            .ok()?
            .iter()
            .filter(|f| !f.manual)
            .map(|f| f.scheduled_at_ms)
            .max()
    }

    /// Fires what is due at `now` (Unix ms) among the schedules this node owns, and returns
    /// the next scheduled time among them.
    pub async fn tick(self: &Arc<Self>, now: i64) -> Option<i64> {
        let schedules = match self.schedules() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "read schedules");
                return None;
            }
        };
        if schedules.is_empty() {
            self.last.lock_unpoisoned().clear();
            return None;
        }
        let mut next: Option<i64> = None;
        let live = self.live();
        let mut work = Vec::new();
        {
            let mut last = self.last.lock_unpoisoned();
            let ids: HashSet<&str> = schedules.iter().map(|s| s.id.as_str()).collect();
            last.retain(|id, _| ids.contains(id.as_str()));
            for schedule in &schedules {
                let owned = owner_of(schedule, &live).is_some_and(|node| node.id == self.own);
                if !schedule.enabled || !owned {
                    last.remove(&schedule.id);
                    continue;
                }
                let table = match Timetable::parse(&schedule.expression, &schedule.timezone) {
                    Ok(table) => table,
                    Err(e) => {
                        tracing::warn!(schedule = %schedule.name, error = %e, "skip a schedule");
                        continue;
                    }
                };
                let after = *last.entry(schedule.id.clone()).or_insert_with(|| {
                    self.latest_recorded(&schedule.id)
                        .unwrap_or(schedule.created_at_ms)
                });
                let due = due(&table, after, now, i64::from(schedule.catch_up_s) * 1000);
                last.insert(schedule.id.clone(), due.last);
                if let Some(at) = table.next_after(now) {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                if due.run.is_some() || !due.missed.is_empty() || due.unrecorded > 0 {
                    work.push((schedule.clone(), due));
                }
            }
        }
        for (schedule, due) in work {
            if due.unrecorded > 0 {
                tracing::warn!(schedule = %schedule.name, count = due.unrecorded, "missed firings too old to record");
            }
            for at in due.missed {
                if let Err(e) = self.record_missed(&schedule, at).await {
                    tracing::warn!(schedule = %schedule.name, error = %e, "record a missed firing");
                }
            }
            if let Some(at) = due.run
                && let Err(e) = self.fire(&schedule, at, false).await
            {
                tracing::warn!(schedule = %schedule.name, error = %e, "fire");
            }
        }
        next
    }

    async fn record_missed(&self, schedule: &Schedule, at: i64) -> Result<(), CronError> {
        if self
            .memory
            .get(CRON_FIRINGS, &firing_key(&schedule.id, at))?
            .is_some()
        {
            return Ok(());
        }
        let mut firing = self.new_firing(schedule, at, false);
        firing.status = FiringStatus::Missed;
        firing.error = "the node that owned the schedule was down at that time, and it is older than the catch-up window".into();
        self.save(&mut firing).await
    }

    fn new_firing(&self, schedule: &Schedule, at: i64, manual: bool) -> Firing {
        let fire_id = format!("{}@{at}", schedule.id);
        Firing {
            task_id: task_id_for(&fire_id, at),
            fire_id,
            schedule_id: schedule.id.clone(),
            schedule: schedule.name.clone(),
            scheduled_at_ms: at,
            owner: self.own_name.clone(),
            executed_on: String::new(),
            status: FiringStatus::Pending,
            error: String::new(),
            updated_at_ms: 0,
            manual,
        }
    }

    /// Fires `schedule` for time `at`: records the firing, submits the task and follows it.
    /// A firing already recorded (by this node or a previous owner) is left alone.
    pub async fn fire(
        self: &Arc<Self>,
        schedule: &Schedule,
        at: i64,
        manual: bool,
    ) -> Result<Firing, CronError> {
        if let Some(record) = self
            .memory
            .get(CRON_FIRINGS, &firing_key(&schedule.id, at))?
            && !record.tombstone
            && let Ok(existing) = serde_json::from_slice::<Firing>(&record.value)
        {
            return Ok(existing);
        }
        let mut firing = self.new_firing(schedule, at, manual);
        // Also closes firings whose owner went away, whatever the policy.
        let previous = self.still_running(schedule).await?;
        if schedule.overlap == Overlap::Skip
            && !manual
            && let Some(previous) = previous
        {
            firing.status = FiringStatus::Skipped;
            firing.error = format!(
                "overlap skip: the firing of {} is still {} (task {})",
                previous.scheduled_at_ms,
                previous.status.as_str(),
                previous.task_id
            );
            self.save(&mut firing).await?;
            self.trim(&schedule.id).await?;
            return Ok(firing);
        }
        self.save(&mut firing).await?;
        self.trim(&schedule.id).await?;
        let mut spec = schedule.task.clone();
        spec.lineage.task_id = Some(firing.task_id.clone());
        spec.lineage.started_by = schedule.creator.clone();
        let written_here = schedule.origin.as_ref() == Some(&self.own);
        match self.runner.start(spec, written_here) {
            Err(e) => {
                firing.status = FiringStatus::Failed;
                firing.error = e;
                self.save(&mut firing).await?;
            }
            Ok(events) => {
                tracing::info!(schedule = %schedule.name, fire_id = %firing.fire_id, task_id = %firing.task_id, "fired");
                self.open.lock_unpoisoned().insert(firing.fire_id.clone());
                let this = self.clone();
                let followed = firing.clone();
                tokio::spawn(async move { this.follow(followed, events).await });
            }
        }
        Ok(firing)
    }

    /// Records a firing's progress from its task's events.
    async fn follow(self: Arc<Self>, mut firing: Firing, mut events: mpsc::Receiver<TaskEvent>) {
        let mut outcome = None;
        while let Some(event) = events.recv().await {
            match event.kind {
                EventKind::Accepted { node, .. } => firing.executed_on = node,
                EventKind::Started { node } => {
                    firing.executed_on = node;
                    firing.status = FiringStatus::Running;
                    if let Err(e) = self.save(&mut firing).await {
                        tracing::warn!(fire_id = %firing.fire_id, error = %e, "record a firing");
                    }
                }
                EventKind::Completed { executed_on, .. } => {
                    if !executed_on.is_empty() {
                        firing.executed_on = executed_on;
                    }
                    outcome = Some((FiringStatus::Done, String::new()));
                    break;
                }
                EventKind::Failed { error } => {
                    outcome = Some((FiringStatus::Failed, error.to_string()));
                    break;
                }
                _ => {}
            }
        }
        let (status, error) = outcome.unwrap_or((
            FiringStatus::Failed,
            "the task's events ended without an outcome".into(),
        ));
        firing.status = status;
        firing.error = error;
        if let Err(e) = self.save(&mut firing).await {
            tracing::warn!(fire_id = %firing.fire_id, error = %e, "record a firing");
        }
        self.open.lock_unpoisoned().remove(&firing.fire_id);
    }

    /// Fires schedules as they fall due until `cancel`: wakes at the next scheduled time, and
    /// at least every [`TICK`] to notice new schedules and changes of ownership.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let started = tokio::time::Instant::now();
        // Ready once, then for good: a peer whose sync keeps failing later must not stop cron.
        while started.elapsed() < STARTUP_GRACE
            || !self
                .peers
                .snapshot()
                .iter()
                .filter(|p| p.state == PeerState::Up)
                .all(|p| self.memory.since_sync(&p.info.id) != Duration::MAX)
        {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
        }
        loop {
            let now = now_ms();
            let next = self.tick(now).await;
            let wait = next
                .map(|at| {
                    Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0))
                })
                .map_or(TICK, |until| until.min(TICK));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::Target;

    use super::*;
    use crate::{memory::MemoryOptions, storage::SledStore};

    /// 2026-01-01T00:00:00Z.
    const T0: i64 = 1_767_225_600_000;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("time")
            .timestamp_millis()
    }

    fn times(table: &Timetable, from: i64, until: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cursor = from;
        while let Some(t) = table.next_after(cursor) {
            if t > until {
                break;
            }
            out.push(t);
            cursor = t;
        }
        out
    }

    #[test]
    fn the_latest_due_time_runs_within_the_window_and_older_ones_are_missed() {
        let every_10s = Timetable::parse("*/10 * * * * *", "").expect("parse");
        let due_now = due(&every_10s, T0, T0 + 35_000, 60_000);
        assert_eq!(due_now.run, Some(T0 + 30_000));
        assert_eq!(due_now.missed, [T0 + 10_000, T0 + 20_000]);
        assert_eq!(due_now.last, T0 + 30_000);
        let too_late = due(&every_10s, T0, T0 + 35_000, 3_000);
        assert_eq!(too_late.run, None);
        assert_eq!(too_late.missed, [T0 + 10_000, T0 + 20_000, T0 + 30_000]);
        let nothing = due(&every_10s, T0, T0 + 5_000, 60_000);
        assert_eq!(
            (nothing.run, nothing.missed.len(), nothing.last),
            (None, 0, T0)
        );
        // A long outage records the most recent 100 and counts the rest.
        let long = due(&every_10s, T0, T0 + 3_600_000, 60_000);
        assert_eq!(long.run, Some(T0 + 3_600_000));
        assert_eq!(long.missed.len(), 100);
        assert_eq!(long.unrecorded, 359 - 100);
    }

    #[test]
    fn five_and_six_field_expressions_and_bad_input_name_the_field() {
        let nightly = Timetable::parse("0 2 * * *", "UTC").expect("5 fields");
        assert_eq!(nightly.next_after(T0), Some(T0 + 2 * 3_600_000));
        let seconds = Timetable::parse("30 0 2 * * *", "").expect("6 fields");
        assert_eq!(seconds.next_after(T0), Some(T0 + 2 * 3_600_000 + 30_000));
        assert!(Timetable::parse("@daily", "").is_ok());
        for (expression, zone, field) in [
            ("61 * * * *", "", "schedule:"),
            ("* * *", "", "schedule:"),
            ("0 2 * * * * * *", "", "schedule:"),
            ("0 2 * * *", "Mars/Olympus", "timezone:"),
            ("5 , * * *", "", "schedule:"),
            ("1,,2 * * * *", "", "schedule:"),
        ] {
            let error = Timetable::parse(expression, zone)
                .expect_err("rejected")
                .to_string();
            assert!(error.starts_with(field), "{expression} {zone}: {error}");
        }
        let february_31 = Timetable::parse("0 0 31 2 *", "UTC").expect("parses");
        let error = february_31
            .check_fires("0 0 31 2 *", 1_700_000_000_000)
            .expect_err("never fires")
            .to_string();
        assert!(error.contains("never fires"), "{error}");
        assert!(
            Timetable::parse("0 0 29 2 *", "UTC")
                .expect("parses")
                .check_fires("0 0 29 2 *", 1_700_000_000_000)
                .is_ok(),
            "February 29 comes every four years"
        );
        assert!("sometimes".parse::<Overlap>().is_err());
        assert!(check_name("has space").is_err());
    }

    #[test]
    fn daylight_saving_gaps_and_overlaps_fire_once_in_a_real_zone() {
        let berlin = Timetable::parse("30 2 * * *", "Europe/Berlin").expect("parse");
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day; the
        // job runs at the first instant after the gap, once.
        assert_eq!(
            times(
                &berlin,
                at("2026-03-28T12:00:00Z"),
                at("2026-03-30T12:00:00Z")
            ),
            [at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]
        );
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice; once.
        assert_eq!(
            times(
                &berlin,
                at("2026-10-24T12:00:00Z"),
                at("2026-10-26T12:00:00Z")
            ),
            [at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
        );
        // An hourly job follows real hours: 23 on the short day, 25 on the long one.
        let hourly = Timetable::parse("0 * * * *", "Europe/Berlin").expect("parse");
        let short_day = times(
            &hourly,
            at("2026-03-28T22:59:59Z"),
            at("2026-03-29T21:59:59Z"),
        );
        assert_eq!(short_day.len(), 23);
        let long_day = times(
            &hourly,
            at("2026-10-24T21:59:59Z"),
            at("2026-10-25T22:59:59Z"),
        );
        assert_eq!(long_day.len(), 25);
        assert!(long_day.windows(2).all(|w| w[1] - w[0] == 3_600_000));
    }

    #[test]
    fn the_owner_is_the_same_everywhere_and_only_its_schedules_move_when_it_leaves() {
        let nodes: Vec<NodeId> = (0..5)
            .map(|i| NodeId::from_spki_der(format!("node{i}").as_bytes()))
            .collect();
        let ids: Vec<String> = (0..200).map(|i| format!("schedule-{i}")).collect();
        let before: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter()).expect("owner"))
            .collect();
        let reversed: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter().rev()).expect("owner"))
            .collect();
        assert_eq!(before, reversed, "order of the live set does not matter");
        for node in &nodes {
            let share = before.iter().filter(|o| **o == node).count();
            assert!((15..=70).contains(&share), "{share} of 200 on one node");
        }
        let gone = &nodes[2];
        let after: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter().filter(|n| *n != gone)).expect("owner"))
            .collect();
        for (b, a) in before.iter().zip(&after) {
            if *b != gone {
                assert_eq!(b, a, "a schedule moved although its owner stayed");
            }
        }
    }

    #[test]
    fn a_schedule_is_owned_by_its_writer_or_a_node_that_accepts_its_tier_from_others() {
        let node = |name: &str, remote_max_tier| LiveNode {
            id: NodeId::from_spki_der(name.as_bytes()),
            name: name.into(),
            remote_max_tier,
        };
        let (laptop, gpu, server) = (
            node("laptop", Tier::Read),
            node("gpu", Tier::Read),
            node("server", Tier::Write),
        );
        let at_tier = |id: usize, tier, origin: &LiveNode| {
            let mut s = schedule(&format!("s{id}"), "* * * * *", Overlap::Skip, 60);
            s.id = format!("schedule-{id}");
            s.task.tier = tier;
            s.origin = Some(origin.id.clone());
            s
        };
        let fleet = [laptop.clone(), gpu.clone(), server.clone()];
        let mut owners = HashSet::new();
        for i in 0..200 {
            // Read: anyone; every node ends up owning some.
            owners.insert(
                owner_of(&at_tier(i, Tier::Read, &laptop), &fleet)
                    .expect("owner")
                    .name
                    .clone(),
            );
            // Write, written by the laptop: the laptop or the server, never gpu.
            let owner = owner_of(&at_tier(i, Tier::Write, &laptop), &fleet).expect("owner");
            assert_ne!(owner.name, "gpu", "schedule {i}");
            // Shell: only its writer accepts it.
            let owner = owner_of(&at_tier(i, Tier::Shell, &gpu), &fleet).expect("owner");
            assert_eq!(owner.name, "gpu", "schedule {i}");
        }
        assert_eq!(owners.len(), 3, "{owners:?}");
        // With its writer gone and nobody accepting its tier, someone still owns it (and its
        // firings fail with the reason in the history instead of never happening).
        let without_gpu = [laptop, server];
        assert!(owner_of(&at_tier(1, Tier::Shell, &gpu), &without_gpu).is_some());
    }

    /// Starts nothing: completes each task at once, or holds it open.
    #[derive(Debug, Default)]
    struct FakeRunner {
        hold: bool,
        started: Mutex<Vec<TaskSpec>>,
        held: Mutex<Vec<mpsc::Sender<TaskEvent>>>,
    }

    impl Runner for FakeRunner {
        fn start(
            &self,
            spec: TaskSpec,
            _written_here: bool,
        ) -> Result<mpsc::Receiver<TaskEvent>, String> {
            let (tx, rx) = mpsc::channel(8);
            let id = spec.lineage.task_id.clone().unwrap_or_default();
            let event = |seq, kind| TaskEvent {
                task_id: id.clone(),
                seq,
                at_ms: 0,
                kind,
            };
            let started = event(
                0,
                EventKind::Started {
                    node: "worker".into(),
                },
            );
            let _ = tx.try_send(started);
            if self.hold {
                self.held.lock().expect("lock").push(tx);
            } else {
                let _ = tx.try_send(event(
                    1,
                    EventKind::Completed {
                        output: "ok".into(),
                        usage: Default::default(),
                        executed_on: "worker".into(),
                        rounds: 1,
                    },
                ));
            }
            self.started.lock().expect("lock").push(spec);
            Ok(rx)
        }
    }

    fn scheduler(memory: &Arc<Memory>, runner: &Arc<FakeRunner>) -> Arc<Scheduler> {
        Scheduler::new(
            memory.clone(),
            Arc::new(PeerTable::default()),
            memory.own_id().clone(),
            "me".into(),
            Tier::Read,
            runner.clone(),
        )
    }

    fn schedule(name: &str, expression: &str, overlap: Overlap, catch_up_s: u32) -> Schedule {
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

    fn open_memory() -> (tempfile::TempDir, Arc<Memory>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        let (memory, _writes) = Memory::open(
            Arc::new(SledStore::new(db)),
            Arc::new(mesh_identity::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_identity::OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        (dir, memory)
    }

    async fn statuses(scheduler: &Scheduler, id: &str, want: &[FiringStatus]) -> Vec<Firing> {
        // The follower runs on its own task: poll until it has written the outcomes.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let history = scheduler.history(id).expect("history");
            let got: Vec<FiringStatus> = history.iter().map(|f| f.status).collect();
            if got == want {
                return history;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "history {got:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await; // poll interval
        }
    }

    #[tokio::test]
    async fn a_due_time_fires_once_across_ticks_and_restarts() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let first = scheduler(&memory, &runner);
        first
            .add(schedule("often", "*/2 * * * * *", Overlap::Allow, 3600))
            .await
            .expect("add");
        first.tick(T0 + 2_000).await;
        first.tick(T0 + 2_000).await;
        // The next scheduled time tells the loop when to wake.
        assert_eq!(first.tick(T0 + 2_500).await, Some(T0 + 4_000));
        statuses(&first, "id-often", &[FiringStatus::Done]).await;
        // A restarted node (or the next owner) reads what was fired from the records.
        let second = scheduler(&memory, &runner);
        second.tick(T0 + 2_900).await;
        second.tick(T0 + 4_000).await;
        let history = statuses(&second, "id-often", &[FiringStatus::Done; 2]).await;
        let started: Vec<Option<String>> = runner
            .started
            .lock()
            .expect("lock")
            .iter()
            .map(|s| s.lineage.task_id.clone())
            .collect();
        assert_eq!(
            started,
            [
                Some(task_id_for(&format!("id-often@{}", T0 + 2_000), T0 + 2_000)),
                Some(task_id_for(&format!("id-often@{}", T0 + 4_000), T0 + 4_000))
            ]
        );
        assert_eq!(history[1].executed_on, "worker");
        assert_eq!(history[1].owner, "me");
        // Firing an already recorded time again is a no-op.
        let again = second
            .fire(
                &schedule("often", "*/2 * * * * *", Overlap::Allow, 3600),
                T0 + 4_000,
                false,
            )
            .await
            .expect("fire");
        assert_eq!(again.status, FiringStatus::Done);
        assert_eq!(runner.started.lock().expect("lock").len(), 2);
    }

    #[tokio::test]
    async fn overlap_skip_skips_while_the_previous_firing_runs_and_allow_does_not() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner {
            hold: true,
            ..FakeRunner::default()
        });
        let cron = scheduler(&memory, &runner);
        cron.add(schedule("skip", "*/2 * * * * *", Overlap::Skip, 3600))
            .await
            .expect("add");
        cron.add(schedule("allow", "*/2 * * * * *", Overlap::Allow, 3600))
            .await
            .expect("add");
        cron.tick(T0 + 2_000).await;
        statuses(&cron, "id-skip", &[FiringStatus::Running]).await;
        cron.tick(T0 + 4_000).await;
        let skipped = statuses(
            &cron,
            "id-skip",
            &[FiringStatus::Running, FiringStatus::Skipped],
        )
        .await;
        assert!(
            skipped[1].error.contains("still running"),
            "{}",
            skipped[1].error
        );
        statuses(&cron, "id-allow", &[FiringStatus::Running; 2]).await;
        assert_eq!(runner.started.lock().expect("lock").len(), 3);
    }

    #[tokio::test]
    async fn after_downtime_one_catch_up_runs_and_older_times_are_missed() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let cron = scheduler(&memory, &runner);
        cron.add(schedule("within", "*/10 * * * * *", Overlap::Skip, 15))
            .await
            .expect("add");
        cron.add(schedule("beyond", "*/10 * * * * *", Overlap::Skip, 3))
            .await
            .expect("add");
        cron.tick(T0 + 65_000).await;
        let mut want = vec![FiringStatus::Missed; 5];
        want.push(FiringStatus::Done);
        let within = statuses(&cron, "id-within", &want).await;
        assert_eq!(within[5].scheduled_at_ms, T0 + 60_000);
        statuses(&cron, "id-beyond", &[FiringStatus::Missed; 6]).await;
        assert_eq!(runner.started.lock().expect("lock").len(), 1);
    }

    /// A replicated schedule may come from anywhere: one that `Cron.Add` would refuse (a bad
    /// expression, an empty or oversized prompt, a lineage of its own, bytes that are not a
    /// schedule) is left out of the list, never fired, and can still be removed.
    #[tokio::test]
    async fn a_stored_schedule_cron_add_would_refuse_never_fires_and_can_be_removed() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let cron = scheduler(&memory, &runner);
        let mut bad = Vec::new();
        let mut empty_list_item = schedule("empty-list-item", "* * * * * *", Overlap::Skip, 60);
        empty_list_item.expression = "5 , * * *".into();
        bad.push(empty_list_item);
        let mut empty_prompt = schedule("empty-prompt", "* * * * * *", Overlap::Skip, 60);
        empty_prompt.task.prompt = "  ".into();
        bad.push(empty_prompt);
        let mut huge_prompt = schedule("huge-prompt", "* * * * * *", Overlap::Skip, 60);
        huge_prompt.task.prompt = "x".repeat(mesh_domain::task::MAX_PROMPT_BYTES + 1);
        bad.push(huge_prompt);
        let mut with_lineage = schedule("with-lineage", "* * * * * *", Overlap::Skip, 60);
        with_lineage.task.lineage.hops = 3;
        bad.push(with_lineage);
        // Issue 16, point 5: a timeout of `u64::MAX` seconds must neither panic nor fire.
        let mut endless = schedule("endless", "* * * * * *", Overlap::Skip, 60);
        endless.task.timeout = Some(Duration::from_secs(u64::MAX));
        let refused = cron
            .add(endless.clone())
            .await
            .expect_err("Cron.Add refuses it");
        assert!(refused.to_string().contains("timeout_s"), "{refused}");
        bad.push(endless);
        for schedule in &bad {
            let value = serde_json::to_vec(schedule).expect("json");
            memory
                .put(CRON_SCHEDULES, &schedule.name, Some(value))
                .await
                .expect("stored as replication would");
        }
        memory
            .put(CRON_SCHEDULES, "not-json", Some(b"{".to_vec()))
            .await
            .expect("stored");
        let good = schedule("good", "* * * * * *", Overlap::Skip, 60);
        cron.add(good).await.expect("add");

        cron.tick(T0 + 1_000).await;
        let names: Vec<String> = cron
            .schedules()
            .expect("list")
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["good"]);
        statuses(&cron, "id-good", &[FiringStatus::Done]).await;
        let started = runner.started.lock().expect("lock").clone();
        assert_eq!(started.len(), 1, "only the good schedule fired");
        for schedule in &bad {
            assert!(cron.history(&schedule.id).expect("history").is_empty());
            cron.remove(&schedule.name).await.expect("removed");
        }
        cron.remove("not-json").await.expect("removed");
        assert!(matches!(
            cron.remove("not-json").await,
            Err(CronError::NotFound(_))
        ));
    }
}
