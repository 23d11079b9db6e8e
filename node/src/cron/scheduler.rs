//! The node's scheduler: adds and removes schedules, fires the ones this node owns when they
//! fall due, and follows each firing's task to record its outcome.
//!
//! [`Scheduler::run`] sleeps until the next scheduled time among the schedules this node owns,
//! and wakes early only when the schedules change in the memory or the live set changes (who
//! owns what may then differ); it does not poll. The schedules come decoded from the
//! [`ScheduleTable`], which decodes a record once per write, and owners are computed again only
//! when the schedules or the live set changed. A firing is written (namespace `cron_firings`)
//! before its task is submitted through the [`Runner`] port, under a task id derived from the
//! firing id, so a node handed the same firing twice runs it once. It must not place or run
//! tasks itself (the task manager does, behind [`Runner`]), nor speak protobuf.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use mesh_domain::{
    EventKind, NodeId, PeerState, TaskSpec, Tier,
    keys::{CRON_FIRINGS, CRON_SCHEDULES},
    sync::MutexExt,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    error::CronError,
    limits::ScheduleLimits,
    owner::{LiveNode, owner_of, task_id_for},
    schedule::{Firing, FiringStatus, Overlap, Schedule, check_name, firing_key},
    table::{Active, ScheduleTable},
    timetable::{Timetable, due},
};
use crate::{
    memory::Memory,
    peers::PeerTable,
    task_handle::{SubmitError, TaskHandle, TaskOutcome},
};

/// Firings kept per schedule; older ones are deleted as new ones come.
pub(super) const HISTORY_KEPT: usize = 200;
/// A starting node fires nothing for this long, and until it has synced memory with every up
/// peer: until then it may not know its peers (it would own every schedule) or their firings.
const STARTUP_GRACE: Duration = Duration::from_secs(3);
/// How often a starting node looks whether it has synced with every up peer.
const STARTUP_POLL: Duration = Duration::from_millis(500);
/// The longest the loop sleeps. It sleeps on the monotonic clock towards a wall-clock time; if
/// the wall clock is stepped (NTP) meanwhile, this bounds how late a firing can be.
const LONGEST_SLEEP: Duration = Duration::from_secs(60);

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Starts tasks for firings: routes and submits a task whose `lineage.task_id` is set,
/// returning it followed (a port: the task manager implements it).
pub(crate) trait Runner: Send + Sync + fmt::Debug {
    /// Submits `spec`, started by its `lineage.started_by` (the schedule's creator), where the
    /// router places it; `written_here` when this node wrote the schedule.
    fn start(&self, spec: TaskSpec, written_here: bool) -> Result<TaskHandle, SubmitError>;
}

/// Per schedule this node owns: the last scheduled time handled and the one after it.
#[derive(Debug, Clone, Copy)]
struct Times {
    last: i64,
    /// The first scheduled time after `last` (none: it never fires again); nothing is due
    /// before it, so a tick skips the schedule without asking its timetable.
    next: Option<i64>,
}

/// Which active schedules this node owns, as of a live set and a re-read of the schedules.
#[derive(Debug, Default)]
struct Owned {
    /// The [`ScheduleTable::active`] generation the owners were computed for.
    generation: Option<u64>,
    /// The live set they were computed for.
    live: Vec<LiveNode>,
    /// The ids of the schedules this node owns.
    ids: HashSet<String>,
    /// Per owned, enabled schedule: where its timetable stands.
    times: HashMap<String, Times>,
}

/// The node's scheduler.
pub(crate) struct Scheduler {
    memory: Arc<Memory>,
    peers: Arc<PeerTable>,
    own: NodeId,
    own_name: String,
    /// `security.remote_max_tier`: which schedules written elsewhere this node may own (a
    /// runtime setting: a change wakes the loop, as a peer's does).
    remote_max_tier: watch::Sender<Tier>,
    runner: Arc<dyn Runner>,
    /// The stored schedules, decoded once per change, and the caps of `[cron]`.
    table: ScheduleTable,
    /// Serialises `add`, so its checks (name taken, caps) and its write are one step here.
    adding: tokio::sync::Mutex<()>,
    /// What this node owns, and where each owned schedule's timetable stands.
    owned: Mutex<Owned>,
    /// Firings this node started and still follows.
    open: Mutex<HashSet<String>>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("own", &self.own_name)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for this node, holding schedules to `limits`.
    pub(crate) fn new(
        memory: Arc<Memory>,
        peers: Arc<PeerTable>,
        own: NodeId,
        own_name: String,
        remote_max_tier: Tier,
        limits: ScheduleLimits,
        runner: Arc<dyn Runner>,
    ) -> Arc<Self> {
        Arc::new(Self {
            table: ScheduleTable::new(memory.clone(), limits),
            memory,
            peers,
            own,
            own_name,
            remote_max_tier: watch::Sender::new(remote_max_tier),
            runner,
            adding: tokio::sync::Mutex::new(()),
            owned: Mutex::default(),
            open: Mutex::default(),
        })
    }

    /// Changes `security.remote_max_tier` (a runtime setting), as this node advertises it.
    pub(crate) fn set_remote_max_tier(&self, tier: Tier) {
        self.remote_max_tier
            .send_if_modified(|held| std::mem::replace(held, tier) != tier);
    }

    /// This node's name.
    pub(crate) fn node_name(&self) -> &str {
        &self.own_name
    }

    /// The stored schedules (decoded once per write), to list or look up. A record that does
    /// not decode, or that `Cron.Add` would have refused, is logged (once) and left out: it
    /// never fires.
    pub(crate) fn table(&self) -> &ScheduleTable {
        &self.table
    }

    /// Stores a new schedule: checked as a stored one is, and refused past the caps of
    /// `[cron]` (every stored schedule counts, held ones too).
    pub(crate) async fn add(&self, schedule: Schedule) -> Result<Schedule, CronError> {
        check_name(&schedule.name)?;
        Timetable::parse(&schedule.expression, &schedule.timezone)?
            .check_fires(&schedule.expression, now_ms())?;
        // Its task as each firing will submit it (bounds such as `timeout_s`), so nothing is
        // stored that would never fire.
        schedule
            .task
            .check()
            .map_err(|e| CronError::Invalid(format!("task.{e}")))?;
        let value = serde_json::to_vec(&schedule)
            .map_err(|e| CronError::Invalid(format!("schedule: {e}")))?;
        let _adding = self.adding.lock().await;
        if self.table.get(&schedule.name).is_ok() {
            return Err(CronError::Exists(schedule.name));
        }
        self.table.room_for(&schedule, value.len())?;
        self.memory
            .put(CRON_SCHEDULES, &schedule.name, Some(value))
            .await?;
        Ok(schedule)
    }

    /// Deletes a schedule.
    pub(crate) async fn remove(&self, name: &str) -> Result<(), CronError> {
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
    pub(crate) fn live(&self) -> Vec<LiveNode> {
        let mut live = vec![LiveNode {
            id: self.own.clone(),
            name: self.own_name.clone(),
            remote_max_tier: *self.remote_max_tier.borrow(),
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

    /// A schedule's firings, oldest first.
    pub(crate) fn history(&self, schedule_id: &str) -> Result<Vec<Firing>, CronError> {
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
    pub(crate) async fn tick(self: &Arc<Self>, now: i64) -> Option<i64> {
        let Active {
            generation,
            schedules: active,
        } = match self.table.active() {
            Ok(active) => active,
            Err(e) => {
                tracing::warn!(error = %e, "read schedules");
                return None;
            }
        };
        if active.is_empty() {
            *self.owned.lock_unpoisoned() = Owned::default();
            return None;
        }
        let live = self.live();
        let mut next: Option<i64> = None;
        let mut work = Vec::new();
        {
            let mut owned = self.owned.lock_unpoisoned();
            if owned.generation != Some(generation) || owned.live != live {
                let ids: HashSet<String> = active
                    .iter()
                    .filter(|parsed| {
                        owner_of(&parsed.schedule, &live).is_some_and(|node| node.id == self.own)
                    })
                    .map(|parsed| parsed.schedule.id.clone())
                    .collect();
                owned.times.retain(|id, _| ids.contains(id));
                *owned = Owned {
                    generation: Some(generation),
                    live,
                    ids,
                    times: std::mem::take(&mut owned.times),
                };
            }
            let owned = &mut *owned;
            for parsed in active.iter() {
                let schedule = &parsed.schedule;
                if !schedule.enabled || !owned.ids.contains(&schedule.id) {
                    owned.times.remove(&schedule.id);
                    continue;
                }
                let times = owned.times.entry(schedule.id.clone()).or_insert_with(|| {
                    // A schedule this node just took over continues after the latest firing
                    // recorded, by whichever node fired it.
                    let last = self
                        .latest_recorded(&schedule.id)
                        .unwrap_or(schedule.created_at_ms);
                    Times {
                        last,
                        next: parsed.timetable.next_after(last),
                    }
                });
                if times.next.is_some_and(|at| at <= now) {
                    let catch_up_ms = i64::from(schedule.catch_up_s) * 1000;
                    let due = due(&parsed.timetable, times.last, now, catch_up_ms);
                    *times = Times {
                        last: due.last,
                        next: parsed.timetable.next_after(now),
                    };
                    if due.run.is_some() || !due.missed.is_empty() || due.unrecorded > 0 {
                        work.push((parsed.clone(), due));
                    }
                }
                if let Some(at) = times.next {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        for (parsed, due) in work {
            let schedule = &parsed.schedule;
            if due.unrecorded > 0 {
                tracing::warn!(schedule = %schedule.name, count = due.unrecorded, "missed firings too old to record");
            }
            for at in due.missed {
                if let Err(e) = self.record_missed(schedule, at).await {
                    tracing::warn!(schedule = %schedule.name, error = %e, "record a missed firing");
                }
            }
            if let Some(at) = due.run
                && let Err(e) = self.fire(schedule, at, false).await
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
    pub(crate) async fn fire(
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
                firing.error = e.to_string();
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
    async fn follow(self: Arc<Self>, mut firing: Firing, mut task: TaskHandle) {
        while let Some(event) = task.progress().await {
            match event.kind {
                EventKind::Accepted { node, .. } => firing.executed_on = node,
                EventKind::Started { node } => {
                    firing.executed_on = node;
                    firing.status = FiringStatus::Running;
                    if let Err(e) = self.save(&mut firing).await {
                        tracing::warn!(fire_id = %firing.fire_id, error = %e, "record a firing");
                    }
                }
                _ => {}
            }
        }
        let (status, error) = match task.outcome().await {
            Some(TaskOutcome::Completed { executed_on, .. }) => {
                if !executed_on.is_empty() {
                    firing.executed_on = executed_on;
                }
                (FiringStatus::Done, String::new())
            }
            Some(TaskOutcome::Failed { error, .. }) => (FiringStatus::Failed, error.to_string()),
            None => (
                FiringStatus::Failed,
                "the task's events ended without an outcome".into(),
            ),
        };
        firing.status = status;
        firing.error = error;
        if let Err(e) = self.save(&mut firing).await {
            tracing::warn!(fire_id = %firing.fire_id, error = %e, "record a firing");
        }
        self.open.lock_unpoisoned().remove(&firing.fire_id);
    }

    /// Fires schedules as they fall due until `cancel`: sleeps until the next scheduled time
    /// among the schedules this node owns, and wakes early when the schedules or the live set
    /// change.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
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
                () = tokio::time::sleep(STARTUP_POLL) => {}
            }
        }
        let mut schedules = self.memory.changes_in(CRON_SCHEDULES);
        let mut live = self.peers.liveness();
        let mut own_tier = self.remote_max_tier.subscribe();
        loop {
            // Marked before the tick reads them: a change during the tick wakes the next sleep.
            schedules.mark_unchanged();
            live.mark_unchanged();
            own_tier.mark_unchanged();
            let now = now_ms();
            let next = self.tick(now).await;
            let wait = next.map_or(LONGEST_SLEEP, |at| {
                Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0))
                    .min(LONGEST_SLEEP)
            });
            tokio::select! {
                () = cancel.cancelled() => return,
                Ok(()) = schedules.changed() => {}
                Ok(()) = live.changed() => {}
                Ok(()) = own_tier.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::TaskEvent;
    use tokio::sync::mpsc;

    use super::*;
    use crate::cron::{
        schedule::tests::{T0, schedule},
        table::tests::open_memory,
    };

    /// Starts nothing: completes each task at once, or holds it open.
    #[derive(Debug, Default)]
    struct FakeRunner {
        hold: bool,
        started: Mutex<Vec<TaskSpec>>,
        held: Mutex<Vec<mpsc::Sender<TaskEvent>>>,
    }

    impl Runner for FakeRunner {
        fn start(&self, spec: TaskSpec, _written_here: bool) -> Result<TaskHandle, SubmitError> {
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
            Ok(TaskHandle::new(id, rx))
        }
    }

    fn scheduler(memory: &Arc<Memory>, runner: &Arc<FakeRunner>) -> Arc<Scheduler> {
        Scheduler::new(
            memory.clone(),
            Arc::new(PeerTable::default()),
            memory.own_id().clone(),
            "me".into(),
            Tier::Read,
            ScheduleLimits::default(),
            runner.clone(),
        )
    }

    /// Polls `done` until it holds, failing with `what` after `within`.
    async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        while !done() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not in time: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll interval
        }
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
            .table()
            .schedules()
            .expect("list")
            .into_iter()
            .map(|s| s.parsed.schedule.name.clone())
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

    /// Issue 26, point 7: every node re-read and re-parsed every schedule twice a second (800
    /// schedules with 250 KiB prompts: ~30% of a core). Ticks read the decoded schedules; a
    /// record is decoded again only when it is written again.
    #[tokio::test]
    async fn ticks_do_not_decode_unchanged_schedules_again() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let cron = scheduler(&memory, &runner);
        for name in ["a", "b", "c"] {
            cron.add(schedule(name, "*/2 * * * * *", Overlap::Allow, 3600))
                .await
                .expect("add");
        }
        for i in 0..20 {
            cron.tick(T0 + 1_000 * i).await;
        }
        cron.table().schedules().expect("list");
        assert_eq!(cron.table.decoded(), 3, "one decode per schedule written");
        cron.remove("b").await.expect("remove");
        cron.add(schedule("d", "*/2 * * * * *", Overlap::Allow, 3600))
            .await
            .expect("add");
        cron.tick(T0 + 30_000).await;
        assert_eq!(cron.table.decoded(), 4);
    }

    /// Issue 26, point 7: any certificate could add schedules without bound. `add` refuses one
    /// past a cap, per creator and in all; a schedule held back (the set went past a cap by
    /// replication) stays stored and listed but never fires.
    #[tokio::test]
    async fn past_the_caps_add_is_refused_and_a_held_schedule_never_fires() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let cron = Scheduler::new(
            memory.clone(),
            Arc::new(PeerTable::default()),
            memory.own_id().clone(),
            "me".into(),
            Tier::Read,
            ScheduleLimits {
                schedules: 3,
                schedules_per_creator: 2,
                ..ScheduleLimits::default()
            },
            runner.clone(),
        );
        let by = |name: &str, who: &str| {
            let mut s = schedule(name, "*/2 * * * * *", Overlap::Allow, 3600);
            s.id = format!("id-{name}");
            s.creator = Some(mesh_domain::Principal {
                id: NodeId::from_spki_der(who.as_bytes()),
                name: who.into(),
                role: None,
            });
            s
        };
        cron.add(by("a1", "alice")).await.expect("add");
        cron.add(by("a2", "alice")).await.expect("add");
        let refused = cron.add(by("a3", "alice")).await.expect_err("alice's cap");
        assert!(matches!(refused, CronError::Full(_)), "{refused:?}");
        assert!(
            refused
                .to_string()
                .contains("`cron.max_schedules_per_creator` = 2"),
            "{refused}"
        );
        cron.add(by("b1", "bob"))
            .await
            .expect("bob has room of his own");
        let refused = cron
            .add(by("b2", "bob"))
            .await
            .expect_err("the fleet's cap");
        assert!(
            refused.to_string().contains("`cron.max_schedules` = 3"),
            "{refused}"
        );
        // A node that had not seen these accepted an older one of alice's: it keeps its room,
        // her newest is held back on this node, and nothing is deleted.
        let mut older = by("a0", "alice");
        older.created_at_ms = T0 - 1;
        let value = serde_json::to_vec(&older).expect("json");
        memory
            .put(CRON_SCHEDULES, "a0", Some(value))
            .await
            .expect("replicated");
        let held: Vec<(String, bool)> = cron
            .table()
            .schedules()
            .expect("list")
            .iter()
            .map(|s| (s.parsed.schedule.name.clone(), s.held.is_some()))
            .collect();
        let held: Vec<(&str, bool)> = held.iter().map(|(n, h)| (n.as_str(), *h)).collect();
        assert_eq!(
            held,
            [("a0", false), ("a1", false), ("a2", true), ("b1", false)]
        );
        cron.tick(T0 + 2_000).await;
        statuses(&cron, "id-a1", &[FiringStatus::Done]).await;
        // Created a moment before T0, a0 also had T0 due: missed, then the latest time ran.
        statuses(&cron, "id-a0", &[FiringStatus::Missed, FiringStatus::Done]).await;
        assert!(cron.history("id-a2").expect("history").is_empty());
        assert_eq!(runner.started.lock().expect("lock").len(), 3);
    }

    /// The loop sleeps until the next time it owns, however far: a schedule added meanwhile
    /// wakes it (without the wake it would sleep on for up to a minute).
    #[tokio::test]
    async fn a_schedule_added_while_the_loop_sleeps_wakes_it() {
        let (_dir, memory) = open_memory();
        let runner = Arc::new(FakeRunner::default());
        let cron = scheduler(&memory, &runner);
        cron.add(schedule("yearly", "0 0 1 1 *", Overlap::Skip, 60))
            .await
            .expect("add");
        let cancel = CancellationToken::new();
        let running = tokio::spawn(cron.clone().run(cancel.clone()));
        // Once the loop has ticked (past the start-up grace) it sleeps its longest.
        wait_until(
            "the loop ticked",
            STARTUP_GRACE + Duration::from_secs(10),
            || cron.owned.lock_unpoisoned().generation.is_some(),
        )
        .await;
        let mut every_second = schedule("often", "* * * * * *", Overlap::Allow, 3600);
        every_second.created_at_ms = now_ms();
        cron.add(every_second).await.expect("add");
        wait_until("the new schedule fired", Duration::from_secs(10), || {
            !runner.started.lock().expect("lock").is_empty()
        })
        .await;
        cancel.cancel();
        running.await.expect("loop");
    }
}
