//! The task manager: admission (through `admission`), the bounded queue with a fixed number of
//! workers, the live tasks with their events, cancellation and deadlines, and tasks placed on
//! other nodes (run through `forward`).
//!
//! [`TaskManager::submit`] admits a task or answers at once why not (the hop limit, a tier cap,
//! no node can run it, a full queue). Each task's events are numbered from 0, recorded in the
//! history and broadcast to whoever watches; a watcher replays the recorded events first, so
//! joining late or lagging loses nothing. This module runs tasks but decides nothing about how
//! (that is `agent`) or where (that is `admission`).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use mesh_domain::{
    Answer, BoxFuture, EventKind, Load, TaskError, TaskEvent, TaskSpec, TaskStatus, Usage,
    sync::MutexExt, time::now_ms,
};
use tokio::{
    sync::{broadcast, mpsc},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::{
    admission::{Admission, Caller},
    agent::{
        AgentRuntime, EventSink,
        evaluate::Evaluator,
        tools::{SubtaskError, SubtaskRunner},
    },
    capabilities::Capabilities,
    chat::ChatService,
    config::TaskLimits,
    cron::Runner,
    metrics::{labels, metrics},
    router::{Destination, Placement},
    storage::Store,
    task_handle::{LookupError, SubmitError, TaskHandle, TaskOutcome},
    tasks::{
        forward::{Forwarder, Journey, forward},
        history::{History, Replayed, TaskRecord, recover},
        journal::{Journals, sweep_every},
    },
};

/// Most tasks `List` returns.
pub(crate) const MAX_LIST: usize = 1000;

/// Records and broadcasts one task's events.
#[derive(Debug)]
pub(crate) struct Emitter {
    task: Arc<LiveTask>,
    history: History,
}

impl EventSink for Emitter {
    /// Records an event. Storage errors are logged; the event still reaches live watchers.
    fn emit(&self, kind: EventKind) {
        let event = TaskEvent {
            task_id: self.task.id.clone(),
            seq: self.task.seq.fetch_add(1, Ordering::SeqCst),
            at_ms: now_ms(),
            kind,
        };
        let outcome = match &event.kind {
            EventKind::Completed { .. } => Some("completed"),
            EventKind::Failed { error, .. } => Some(TaskStatus::of_error(error).as_str()),
            _ => None,
        };
        if let EventKind::ModelCall { model, .. } = &event.kind {
            model.clone_into(&mut self.task.model.lock_unpoisoned());
        }
        // A call waiting for a person pauses the task: `input_required` until it is decided.
        let paused = match &event.kind {
            EventKind::ApprovalRequested { .. } => Some(TaskStatus::InputRequired),
            EventKind::ApprovalDecided { .. } => Some(TaskStatus::Running),
            _ => None,
        };
        if let Some(status) = paused {
            let mut record = self.task.record.lock_unpoisoned();
            if !record.status.finished() {
                record.status = status;
                if let Err(e) = self.history.put_record(&record) {
                    tracing::error!(task = %event.task_id, error = %e, "record task status");
                }
            }
        }
        if let Some(status) = outcome {
            metrics()
                .tasks
                .get_or_create(&labels(&[("status", status)]))
                .inc();
        }
        if let Err(e) = self.history.put_event(&event) {
            tracing::error!(task = %event.task_id, error = %e, "record task event");
        }
        let _ = self.task.events.send(event);
    }

    fn task_id(&self) -> &str {
        &self.task.id
    }

    fn spend(&self, usage: Usage) {
        self.task.spent.lock_unpoisoned().add(usage);
    }
}

/// How long a task passed to another node and stopped here (cancelled, or past its deadline)
/// waits for that node's outcome, which says what its model calls spent.
const REMOTE_OUTCOME_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub(super) struct LiveTask {
    pub(super) id: String,
    pub(super) spec: TaskSpec,
    pub(super) deadline: Instant,
    pub(super) cancel: CancellationToken,
    /// How it ends once `cancel` is cancelled: `cancelled` with its reason, or handed over
    /// (a drain).
    stopped_with: Mutex<Option<TaskError>>,
    seq: AtomicU64,
    events: broadcast::Sender<TaskEvent>,
    pub(super) record: Mutex<TaskRecord>,
    /// What its model calls spent so far (here, and as the nodes it was passed to reported).
    spent: Mutex<Usage>,
    /// The model its latest model call went to, for the line logged when it ends.
    pub(super) model: Mutex<String>,
}

impl LiveTask {
    /// The error it ends with, stopped here: as [`TaskManager::stop`] said, else cancelled by
    /// a caller.
    pub(super) fn stop_error(&self) -> TaskError {
        self.stopped_with
            .lock_unpoisoned()
            .clone()
            .unwrap_or_else(|| TaskError::Cancelled {
                reason: "cancelled by a caller".into(),
            })
    }
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) node: String,
    pub(super) runtime: Arc<AgentRuntime>,
    /// Runs the tasks that ask for an evaluation (`--evaluate`).
    pub(super) evaluator: Evaluator,
    pub(super) limits: TaskLimits,
    pub(super) history: History,
    /// Decides whether and where each task runs.
    pub(super) admission: Arc<Admission>,
    /// Reaches the nodes tasks placed elsewhere run on.
    forwarder: Arc<dyn Forwarder>,
    /// The tasks' journals in the replicated memory.
    pub(super) journals: Journals,
    live: Mutex<HashMap<String, Arc<LiveTask>>>,
    queue: Mutex<Option<mpsc::Sender<Arc<LiveTask>>>>,
    pub(super) caps: Arc<Capabilities>,
    /// Tasks executing; a watch so shutdown can wait for zero instead of polling.
    pub(super) running: tokio::sync::watch::Sender<u32>,
    pub(super) queued: AtomicU32,
}

/// What a task manager works with (the server wires them).
pub struct TaskParts {
    /// Where the task history is kept.
    pub store: Arc<dyn Store>,
    /// Runs tasks placed here.
    pub runtime: Arc<AgentRuntime>,
    /// Runs the evaluator of tasks that ask for one, wherever the mesh serves its role.
    pub chat: Arc<ChatService>,
    /// Queue, workers and the default budgets.
    pub limits: TaskLimits,
    /// This node's name, and the load gauge the manager keeps current.
    pub caps: Arc<Capabilities>,
    /// Decides whether and where each task runs.
    pub admission: Arc<Admission>,
    /// Reaches the nodes tasks placed elsewhere run on.
    pub forwarder: Arc<dyn Forwarder>,
    /// Where each task's steps are kept, so another node can resume it.
    pub(crate) journals: Journals,
}

impl std::fmt::Debug for TaskParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskParts")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Admits, queues, runs, watches and cancels tasks.
#[derive(Debug, Clone)]
pub struct TaskManager {
    pub(super) inner: Arc<Inner>,
}

impl TaskManager {
    /// Opens the task history in the store, marks tasks interrupted by a previous crash as
    /// failed, and starts the workers in `workers` (stopped by `stop`).
    pub fn start(parts: TaskParts, workers: &mut JoinSet<()>, stop: CancellationToken) -> Self {
        let TaskParts {
            store,
            runtime,
            chat,
            limits,
            caps,
            admission,
            forwarder,
            journals,
        } = parts;
        let history = History::new(store);
        recover(&history);
        let (tx, rx) = mpsc::channel(limits.queue);
        let inner = Arc::new(Inner {
            node: caps.name().to_owned(),
            evaluator: Evaluator::new(runtime.clone(), chat, caps.name().to_owned()),
            runtime,
            limits,
            history,
            admission,
            forwarder,
            journals,
            live: Mutex::default(),
            queue: Mutex::new(Some(tx)),
            caps,
            running: tokio::sync::watch::Sender::new(0),
            queued: AtomicU32::new(0),
        });
        inner.publish_load();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        workers.spawn(sweep_every(inner.journals.clone(), stop.clone()));
        for _ in 0..limits.workers {
            workers.spawn(inner.clone().work(rx.clone(), stop.clone()));
        }
        Self { inner }
    }

    /// Admits a task started by `caller`: checks it may run and where, then queues it here
    /// (reserving a queue slot, or refusing) or starts forwarding it; records it and emits
    /// `Accepted`. Returns the task id.
    pub fn submit(&self, mut spec: TaskSpec, caller: &Caller) -> Result<String, SubmitError> {
        match self
            .inner
            .admission
            .admit(&mut spec, caller)
            .map_err(SubmitError::Admission)?
        {
            Placement::Local => self.submit_local(spec),
            Placement::Remote(candidates) => self.submit_remote(spec, candidates),
        }
    }

    fn submit_local(&self, spec: TaskSpec) -> Result<String, SubmitError> {
        self.inner
            .runtime
            .check(&spec)
            .map_err(SubmitError::Rejected)?;
        let sender = self
            .inner
            .queue
            .lock_unpoisoned()
            .clone()
            .ok_or(SubmitError::ShuttingDown)?;
        let permit = sender.try_reserve().map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => SubmitError::QueueFull {
                queued: self.inner.limits.queue,
                workers: self.inner.limits.workers,
            },
            mpsc::error::TrySendError::Closed(()) => SubmitError::ShuttingDown,
        })?;

        let task = self.inner.admit(spec, TaskStatus::Queued, Vec::new())?;
        let id = task.id.clone();
        let position = self.inner.queued.fetch_add(1, Ordering::SeqCst);
        self.inner.publish_load();
        self.inner.emitter(&task).emit(EventKind::Accepted {
            node: self.inner.node.clone(),
            queue_position: position,
        });
        permit.send(task);
        Ok(id)
    }

    fn submit_remote(
        &self,
        spec: TaskSpec,
        candidates: Vec<Destination>,
    ) -> Result<String, SubmitError> {
        if self.inner.queue.lock_unpoisoned().is_none() {
            return Err(SubmitError::ShuttingDown);
        }
        let route = candidates
            .first()
            .map(|first| vec![first.name.clone()])
            .unwrap_or_default();
        let task = self.inner.admit(spec, TaskStatus::Running, route)?;
        let id = task.id.clone();
        self.inner.emitter(&task).emit(EventKind::Accepted {
            node: self.inner.node.clone(),
            queue_position: 0,
        });
        self.inner.running.send_modify(|n| *n += 1);
        self.inner.publish_load();
        forward_task(self.inner.clone(), task, candidates);
        Ok(id)
    }

    /// Streams a task's events: everything recorded from the start, then (with `follow`) new
    /// ones until it ends.
    pub fn watch(&self, id: &str, follow: bool) -> Result<mpsc::Receiver<TaskEvent>, LookupError> {
        let live = self.inner.live(id);
        if live.is_none() && self.record(id)?.is_none() {
            // Neither started nor run here: another node's task, told by its journal.
            let known = self
                .inner
                .journals
                .chain(id, None)
                .map_err(|e| LookupError::Storage(e.to_string()))?
                .lease
                .is_some();
            if !known {
                return Err(LookupError::NotFound(id.to_owned()));
            }
            let (tx, rx) = mpsc::channel(256);
            let (journals, id) = (self.inner.journals.clone(), id.to_owned());
            tokio::spawn(async move { journals.follow(id, tx, follow).await });
            return Ok(rx);
        }
        let mut receiver = live.as_ref().map(|task| task.events.subscribe());
        let history = self.inner.history.clone();
        let id = id.to_owned();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut next = 0;
            // Replay from the store (a page at a time); on lag, replay again from where the
            // live stream broke.
            loop {
                match history.replay(&id, next, &tx).await {
                    Replayed::Ended => return,
                    Replayed::UpTo(seq) => next = seq,
                }
                let Some(live) = receiver.as_mut().filter(|_| follow) else {
                    return;
                };
                loop {
                    match live.recv().await {
                        Ok(event) if event.seq < next => {}
                        Ok(event) => {
                            next = event.seq + 1;
                            let terminal = event.kind.is_terminal();
                            if tx.send(event).await.is_err() || terminal {
                                return;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => {
                            receiver = None;
                            break;
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Follows task `id` to its outcome: its events from the start, then new ones until it
    /// ends.
    pub fn follow(&self, id: &str) -> Result<TaskHandle, LookupError> {
        Ok(TaskHandle::new(id.to_owned(), self.watch(id, true)?))
    }

    /// Submits `spec` for `caller` and follows it ([`TaskManager::submit`], then
    /// [`TaskManager::follow`]).
    pub fn run(&self, spec: TaskSpec, caller: &Caller) -> Result<TaskHandle, SubmitError> {
        let id = self.submit(spec, caller)?;
        self.follow(&id).map_err(SubmitError::Unfollowed)
    }

    /// Cancels a task and waits (at most `wait`) until it has ended, so the status returned is
    /// the one after the cancel (`cancelled`, or how it ended first); a finished task is left
    /// as it is.
    pub async fn cancel_and_wait(
        &self,
        id: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<TaskStatus, LookupError> {
        // Subscribed before the cancel, so its terminal event cannot be missed.
        let mut events = self.inner.live(id).map(|task| task.events.subscribe());
        let status = self.cancel(id, reason)?;
        if let Some(events) = events.as_mut().filter(|_| !status.finished()) {
            let ended = async {
                loop {
                    match events.recv().await {
                        Ok(event) if event.kind.is_terminal() => return,
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            };
            let _ = tokio::time::timeout(wait, ended).await;
        }
        self.record(id)?
            .map(|r| r.status)
            .ok_or_else(|| LookupError::NotFound(id.to_owned()))
    }

    /// Cancels a task without waiting for it to end; a finished task is left as it is. Returns
    /// its status at once (a running task is still `running` here).
    pub fn cancel(&self, id: &str, reason: &str) -> Result<TaskStatus, LookupError> {
        self.stop(
            id,
            TaskError::Cancelled {
                reason: reason.into(),
            },
        )
    }

    /// Stops a task without waiting for it to end, ending it with `error` (a cancellation, or
    /// a hand-over); a finished task is left as it is, and a task already stopped keeps the
    /// first error. Returns its status at once (a running task is still `running` here).
    pub(super) fn stop(&self, id: &str, error: TaskError) -> Result<TaskStatus, LookupError> {
        if let Some(task) = self.inner.live(id) {
            let error = task
                .stopped_with
                .lock_unpoisoned()
                .get_or_insert(error)
                .clone();
            let status = task.record.lock_unpoisoned().status;
            if status == TaskStatus::Queued {
                // Not started: finish it now instead of waiting for a worker.
                self.inner.finish(&task, Err(error));
            }
            task.cancel.cancel();
            let record = task.record.lock_unpoisoned();
            return Ok(record.status);
        }
        self.record(id)?
            .map(|r| r.status)
            .ok_or_else(|| LookupError::NotFound(id.to_owned()))
    }

    /// A task's record.
    pub fn record(&self, id: &str) -> Result<Option<TaskRecord>, LookupError> {
        if let Some(task) = self.inner.live(id) {
            return Ok(Some(task.record.lock_unpoisoned().clone()));
        }
        self.inner.history.record(id).map_err(LookupError::Storage)
    }

    /// The newest `limit` tasks, newest first.
    pub fn list(&self, limit: usize) -> Vec<TaskRecord> {
        self.inner
            .history
            .records()
            .rev()
            .take(limit.min(MAX_LIST))
            .map(|record| self.record(&record.id).ok().flatten().unwrap_or(record))
            .collect()
    }

    /// Stops admitting tasks, gives running ones `grace` to finish, cancels the rest, and
    /// flushes the history. Workers exit once the queue is drained.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.queue.lock_unpoisoned().take();
        // Queued tasks are handed back at once: their callers can submit them elsewhere.
        for task in self.inner.tasks_with(Some(TaskStatus::Queued)) {
            self.cancel(&task.id, "the node is shutting down").ok();
        }
        let mut running = self.inner.running.subscribe();
        let _ = tokio::time::timeout(grace, running.wait_for(|n| *n == 0)).await;
        for task in self.inner.tasks_with(None) {
            self.cancel(&task.id, "the node is shutting down").ok();
        }
        let _ = running.wait_for(|n| *n == 0).await;
        self.inner.history.flush().await;
    }
}

/// How far ahead a deadline that does not fit in an [`Instant`] is put instead.
const FAR_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + timeout`, checked: `Instant + Duration` panics on overflow, and a timeout may come
/// from a stored record or a peer; one that does not fit means "about never".
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(FAR_DEADLINE))
        .unwrap_or(now)
}

/// Runs `task` on the nodes `candidates` names (through `forward`), as a running task of this
/// node (its caller already counted it in `running`), and records its outcome here.
pub(super) fn forward_task(inner: Arc<Inner>, task: Arc<LiveTask>, candidates: Vec<Destination>) {
    tokio::spawn(async move {
        let emitter = inner.emitter(&task);
        let current = Mutex::new(None);
        let routed = |name: &str| {
            let mut record = task.record.lock_unpoisoned();
            if record.route.last().map(String::as_str) != Some(name) {
                record.route.push(name.to_owned());
            }
            name.clone_into(&mut record.executed_on);
            let _ = inner.history.put_record(&record);
        };
        let tools = inner.runtime.tools();
        let side_effects = |tool: &str, arguments: &str| tools.has_side_effects(tool, arguments);
        let down = |name: &str| inner.journals.is_down(name);
        // Only the task's origin leases it (a task relayed for another node is not resumed
        // from here).
        let journals = inner
            .journals
            .is_own_task(&task.id)
            .then_some(&inner.journals);
        let stop = CancellationToken::new();
        let run = forward(
            Journey {
                node: &inner.node,
                task_id: &task.id,
                spec: &task.spec,
                deadline: task.deadline,
                events: &emitter,
                routed: &routed,
                side_effects: &side_effects,
                down: &down,
                journals,
                current: &current,
                stop: &stop,
            },
            candidates,
            inner.forwarder.as_ref(),
        );
        tokio::pin!(run);
        // Whether it was stopped here, `run` still running (a `run` that ended, also with
        // the other node's own `cancelled` or `deadline`, must not be polled again).
        let (result, stopped) = tokio::select! {
            () = task.cancel.cancelled() => (Err(task.stop_error()), true),
            () = tokio::time::sleep_until(task.deadline) => (Err(TaskError::Deadline {
                seconds: task.spec.timeout.unwrap_or(inner.limits.timeout).as_secs(),
            }), true),
            result = &mut run => (result, false),
        };
        if stopped {
            stop.cancel();
            let running_on = current.lock_unpoisoned().clone();
            if let Some(addr) = running_on {
                tokio::spawn(inner.forwarder.cancel(addr, task.id.clone()));
                // The node stops the task and sends its outcome, with what it spent (which
                // `forward` adds to the task's); the outcome here stays this node's.
                let _ = tokio::time::timeout(REMOTE_OUTCOME_GRACE, &mut run).await;
            }
        }
        inner.finish(&task, result);
        inner.running.send_modify(|n| *n -= 1);
        inner.publish_load();
    });
}

impl Inner {
    /// Records a new task and makes it live.
    fn admit(
        &self,
        spec: TaskSpec,
        status: TaskStatus,
        route: Vec<String>,
    ) -> Result<Arc<LiveTask>, SubmitError> {
        let id = match &spec.lineage.task_id {
            Some(id) => {
                if self.live(id).is_some() || self.history.record(id).ok().flatten().is_some() {
                    return Err(SubmitError::Duplicate(id.clone()));
                }
                id.clone()
            }
            // Tagged as this node's: only the origin may lease its task to a node.
            None => self.journals.new_task_id(),
        };
        let timeout = spec.timeout.unwrap_or(self.limits.timeout);
        let executed_on = route.first().cloned().unwrap_or_else(|| self.node.clone());
        let record = TaskRecord {
            id: id.clone(),
            status,
            spec: spec.clone(),
            created_at_ms: now_ms(),
            finished_at_ms: None,
            executed_on,
            output: None,
            error: None,
            route,
        };
        self.history
            .put_record(&record)
            .map_err(SubmitError::Storage)?;
        let (events, _) = broadcast::channel(1024);
        let task = Arc::new(LiveTask {
            id: id.clone(),
            spec,
            deadline: deadline_after(timeout),
            cancel: CancellationToken::new(),
            stopped_with: Mutex::default(),
            seq: AtomicU64::new(0),
            events,
            record: Mutex::new(record),
            spent: Mutex::default(),
            model: Mutex::default(),
        });
        self.live.lock_unpoisoned().insert(id, task.clone());
        Ok(task)
    }

    pub(super) fn live(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock_unpoisoned().get(id).cloned()
    }

    /// The live tasks, or those of `status` only.
    pub(super) fn tasks_with(&self, status: Option<TaskStatus>) -> Vec<Arc<LiveTask>> {
        self.live
            .lock_unpoisoned()
            .values()
            .filter(|t| status.is_none_or(|s| t.record.lock_unpoisoned().status == s))
            .cloned()
            .collect()
    }

    pub(super) fn emitter(&self, task: &Arc<LiveTask>) -> Emitter {
        Emitter {
            task: task.clone(),
            history: self.history.clone(),
        }
    }

    pub(super) fn publish_load(&self) {
        self.caps.load_gauge().set(Load {
            running: *self.running.borrow(),
            queued: self.queued.load(Ordering::SeqCst),
            workers: self.limits.workers as u32,
            queue_capacity: self.limits.queue as u32,
        });
        self.caps.notify();
    }

    /// Records the end of a task (once), emits the terminal event and forgets it.
    pub(super) fn finish(&self, task: &Arc<LiveTask>, result: Result<Answer, TaskError>) {
        let mut record = task.record.lock_unpoisoned();
        if record.status.finished() {
            return;
        }
        if record.status == TaskStatus::Queued {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        record.finished_at_ms = Some(now_ms());
        let event = match result {
            Ok(answer) => {
                record.status = TaskStatus::Completed;
                record.output = Some(answer.output.clone());
                let executed_on = answer.executed_on.unwrap_or_else(|| self.node.clone());
                record.executed_on = executed_on.clone();
                EventKind::Completed {
                    output: answer.output,
                    usage: answer.usage,
                    executed_on,
                    rounds: answer.rounds,
                }
            }
            Err(error) => {
                record.status = TaskStatus::of_error(&error);
                record.error = Some(error.clone());
                EventKind::Failed {
                    error,
                    usage: *task.spent.lock_unpoisoned(),
                }
            }
        };
        if let Err(e) = self.history.put_record(&record) {
            tracing::error!(task = %task.id, error = %e, "record task result");
        }
        drop(record);
        self.emitter(task).emit(event);
        self.live.lock_unpoisoned().remove(&task.id);
        self.publish_load();
    }
}

/// The `delegate` tool's sub-tasks are admitted like any task, as this node's own.
impl SubtaskRunner for TaskManager {
    fn run_subtask(&self, spec: TaskSpec) -> BoxFuture<'static, Result<String, SubtaskError>> {
        let tasks = self.clone();
        Box::pin(async move {
            let task = tasks.run(spec, &Caller::Subtask)?;
            let id = task.id().to_owned();
            match task.outcome().await {
                Some(TaskOutcome::Completed { output, .. }) => Ok(output),
                Some(TaskOutcome::Failed { error, .. }) => Err(SubtaskError::Failed { id, error }),
                None => Err(SubtaskError::NoOutcome { id }),
            }
        })
    }
}

/// Cron firings are admitted like any task, as their schedule's creator, placed as new ones.
impl Runner for TaskManager {
    fn start(&self, spec: TaskSpec, written_here: bool) -> Result<TaskHandle, SubmitError> {
        self.run(spec, &Caller::Schedule { written_here })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Point 5 of issue 16: `Instant::now() + timeout` panicked for a timeout of `u64::MAX`
    /// seconds (a stored or forwarded spec); the deadline is now checked.
    #[test]
    fn a_deadline_that_does_not_fit_is_far_away_instead_of_a_panic() {
        let now = Instant::now();
        let far = deadline_after(Duration::from_secs(u64::MAX));
        assert!(far >= now + Duration::from_secs(365 * 24 * 3600), "{far:?}");
        assert!(deadline_after(Duration::MAX) > now);
        let near = deadline_after(Duration::from_secs(5));
        assert!(near > now && near <= Instant::now() + Duration::from_secs(5));
    }
}
