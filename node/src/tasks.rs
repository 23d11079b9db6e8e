//! Tasks: admission, a bounded queue with a fixed number of workers, events, cancellation,
//! deadlines, and their history in sled.
//!
//! [`TaskManager::submit`] admits a task or answers at once that the queue is full. Each task's
//! events are numbered from 0, persisted (tree `task_events`, key = task id + sequence), and
//! broadcast to whoever watches; a watcher replays the stored events first, so joining late or
//! lagging loses nothing. A task's summary lives in tree `tasks` (keyed by its UUIDv7 id, so
//! newest last). Tasks that were queued or running when the node died are marked failed on the
//! next start. This module runs tasks but decides nothing about how: that is `agent`.

use std::{
    collections::HashMap,
    fmt,
    ops::Bound,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use mesh_domain::{
    Answer, BoxFuture, EventKind, Load, TaskError, TaskEvent, TaskSpec, TaskStatus, sync::MutexExt,
    time::unix_ms,
};
use serde::{Deserialize, Serialize};
use tokio::{
    sync::{broadcast, mpsc},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::{
    agent::AgentRuntime,
    capabilities::Capabilities,
    config::TaskLimits,
    storage::{StoreError, Write},
};

/// Most tasks `List` returns.
pub const MAX_LIST: usize = 1000;

/// Most forwards and sub-task levels a task may go through.
pub const MAX_HOPS: u32 = 4;

/// Where an admitted task runs.
#[derive(Debug, Clone)]
pub enum Placement {
    /// On this node's workers.
    Local,
    /// On other nodes, tried in order (the first, then failover to the next).
    Remote {
        /// `(name, address)` of the candidates, best first.
        candidates: Vec<(String, String)>,
        /// How to reach them.
        forwarder: Arc<dyn Forwarder>,
    },
}

/// Why forwarding a task to one node did not produce an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// The node's queue is full (`RESOURCE_EXHAUSTED`): try the next.
    #[error("queue full: {0}")]
    Exhausted(String),
    /// The node refused the task or could not be reached: try the next.
    #[error("{0}")]
    Unavailable(String),
    /// The node refused the task for good (tier, hop limit, bad request).
    #[error("{0}")]
    Refused(String),
}

/// Sends a task to another node and streams back its events.
pub trait Forwarder: Send + Sync + fmt::Debug {
    /// Submits `spec` to the node at `addr`; the stream ends with its terminal event, or with an
    /// error when the connection breaks.
    fn forward(
        &self,
        addr: String,
        spec: TaskSpec,
    ) -> BoxFuture<'static, Result<mpsc::Receiver<Result<TaskEvent, ForwardError>>, ForwardError>>;
    /// Asks the node at `addr` to cancel task `task_id` (best effort).
    fn cancel(&self, addr: String, task_id: String) -> BoxFuture<'static, ()>;
}

/// A task's summary as stored and listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Id (UUIDv7).
    pub id: String,
    /// State.
    pub status: TaskStatus,
    /// What it asked for.
    pub spec: TaskSpec,
    /// Unix ms.
    pub created_at_ms: u64,
    /// Unix ms, when finished.
    pub finished_at_ms: Option<u64>,
    /// Node that runs / ran it.
    pub executed_on: String,
    /// Final answer.
    pub output: Option<String>,
    /// Why it failed.
    pub error: Option<TaskError>,
    /// Nodes it was sent to, in order (empty when it ran here).
    #[serde(default)]
    pub route: Vec<String>,
}

/// Admission errors.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Queue full.
    #[error("queue full: {queued} tasks waiting for {workers} workers; try another node or later")]
    QueueFull {
        /// Waiting tasks.
        queued: usize,
        /// Workers.
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

/// Records and broadcasts one task's events.
#[derive(Debug)]
pub struct Emitter {
    task: Arc<LiveTask>,
    store: Store,
}

impl Emitter {
    /// Records an event. Storage errors are logged; the event still reaches live watchers.
    pub fn emit(&self, kind: EventKind) {
        let event = TaskEvent {
            task_id: self.task.id.clone(),
            seq: self.task.seq.fetch_add(1, Ordering::SeqCst),
            at_ms: unix_ms(SystemTime::now()),
            kind,
        };
        let outcome = match &event.kind {
            EventKind::Completed { .. } => Some("completed"),
            EventKind::Failed { .. } => Some("failed"),
            _ => None,
        };
        if let Some(status) = outcome {
            crate::metrics::metrics()
                .tasks
                .get_or_create(&crate::metrics::labels(&[("status", status)]))
                .inc();
        }
        if let Err(e) = self.store.put_event(&event) {
            tracing::error!(task = %event.task_id, error = %e, "record task event");
        }
        let _ = self.task.events.send(event);
    }

    /// The task id.
    pub fn task_id(&self) -> &str {
        &self.task.id
    }
}

#[derive(Debug)]
struct LiveTask {
    id: String,
    spec: TaskSpec,
    deadline: Instant,
    cancel: CancellationToken,
    /// Why it was cancelled, for the `failed: cancelled` event.
    cancel_reason: Mutex<Option<String>>,
    seq: AtomicU64,
    events: broadcast::Sender<TaskEvent>,
    record: Mutex<TaskRecord>,
}

/// The task history: records in one tree, events in another.
#[derive(Clone)]
struct Store(Arc<dyn crate::storage::Store>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

const RECORDS: &str = "tasks";
const EVENTS: &str = "task_events";

impl Store {
    fn put(&self, tree: &str, key: Vec<u8>, value: &impl Serialize) -> Result<(), StoreError> {
        let value = serde_json::to_vec(value).map_err(|e| StoreError::Engine(e.to_string()))?;
        self.0.commit(vec![Write::Put(tree.to_owned(), key, value)])
    }

    fn put_record(&self, record: &TaskRecord) -> Result<(), StoreError> {
        self.put(RECORDS, record.id.as_bytes().to_vec(), record)
    }

    fn put_event(&self, event: &TaskEvent) -> Result<(), StoreError> {
        self.put(EVENTS, event_key(&event.task_id, event.seq), event)
    }

    fn record(&self, id: &str) -> Result<Option<TaskRecord>, String> {
        match self
            .0
            .get(RECORDS, id.as_bytes())
            .map_err(|e| e.to_string())?
        {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("task {id}: undecodable record: {e}")),
        }
    }

    fn events_from(&self, id: &str, from: u64) -> Vec<TaskEvent> {
        let start = event_key(id, from);
        let end = event_key(id, u64::MAX);
        self.0
            .range(EVENTS, Bound::Included(start), Bound::Included(end))
            .filter_map(|entry| entry.ok())
            .filter_map(|(_, value)| serde_json::from_slice(&value).ok())
            .collect()
    }

    /// Every stored record, in id order.
    fn records(&self) -> impl DoubleEndedIterator<Item = TaskRecord> {
        self.0
            .range(RECORDS, Bound::Unbounded, Bound::Unbounded)
            .filter_map(|entry| entry.ok())
            .filter_map(|(_, value)| serde_json::from_slice(&value).ok())
    }

    async fn flush(&self) {
        if let Err(e) = crate::storage::flush(&self.0).await {
            tracing::error!(error = %e, "flush task history");
        }
    }
}

fn event_key(id: &str, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + 9);
    key.extend_from_slice(id.as_bytes());
    key.push(0);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

#[derive(Debug)]
struct Inner {
    node: String,
    runtime: Arc<AgentRuntime>,
    limits: TaskLimits,
    store: Store,
    live: Mutex<HashMap<String, Arc<LiveTask>>>,
    queue: Mutex<Option<mpsc::Sender<Arc<LiveTask>>>>,
    caps: Arc<Capabilities>,
    /// Tasks executing; a watch so shutdown can wait for zero instead of polling.
    running: tokio::sync::watch::Sender<u32>,
    queued: AtomicU32,
}

/// Admits, queues, runs, watches and cancels tasks.
#[derive(Debug, Clone)]
pub struct TaskManager {
    inner: Arc<Inner>,
}

impl TaskManager {
    /// Opens the task trees, marks tasks interrupted by a previous crash as failed, and starts
    /// the workers in `workers` (stopped by `stop`).
    pub fn start(
        store: Arc<dyn crate::storage::Store>,
        runtime: Arc<AgentRuntime>,
        limits: TaskLimits,
        caps: Arc<Capabilities>,
        workers: &mut JoinSet<()>,
        stop: CancellationToken,
    ) -> Self {
        let store = Store(store);
        recover(&store);
        let (tx, rx) = mpsc::channel(limits.queue);
        let inner = Arc::new(Inner {
            node: caps.name().to_owned(),
            runtime,
            limits,
            store,
            live: Mutex::default(),
            queue: Mutex::new(Some(tx)),
            caps,
            running: tokio::sync::watch::Sender::new(0),
            queued: AtomicU32::new(0),
        });
        inner.publish_load();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..limits.workers {
            workers.spawn(worker(inner.clone(), rx.clone(), stop.clone()));
        }
        Self { inner }
    }

    /// Admits a task: checks it can run here, reserves a queue slot (or refuses), records it
    /// and emits `Accepted`. Returns the task id.
    pub fn submit(&self, spec: TaskSpec, placement: Placement) -> Result<String, SubmitError> {
        if let Placement::Remote {
            candidates,
            forwarder,
        } = placement
        {
            return self.submit_remote(spec, candidates, forwarder);
        }
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
        candidates: Vec<(String, String)>,
        forwarder: Arc<dyn Forwarder>,
    ) -> Result<String, SubmitError> {
        if self.inner.queue.lock_unpoisoned().is_none() {
            return Err(SubmitError::ShuttingDown);
        }
        let route = candidates
            .first()
            .map(|(name, _)| vec![name.clone()])
            .unwrap_or_default();
        let task = self.inner.admit(spec, TaskStatus::Running, route)?;
        let id = task.id.clone();
        self.inner.emitter(&task).emit(EventKind::Accepted {
            node: self.inner.node.clone(),
            queue_position: 0,
        });
        self.inner.running.send_modify(|n| *n += 1);
        self.inner.publish_load();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let emitter = inner.emitter(&task);
            // The node currently running it, so a cancel or deadline here stops it there too.
            let current: Arc<Mutex<Option<String>>> = Arc::default();
            let run = forward(
                &inner,
                &task,
                &emitter,
                candidates,
                forwarder.clone(),
                current.clone(),
            );
            let result = tokio::select! {
                () = task.cancel.cancelled() => Err(TaskError::Cancelled {
                    reason: task.cancel_reason.lock_unpoisoned().clone()
                        .unwrap_or_else(|| "cancelled by a caller".into()),
                }),
                () = tokio::time::sleep_until(task.deadline) => Err(TaskError::Deadline {
                    seconds: task.spec.timeout.unwrap_or(inner.limits.timeout).as_secs(),
                }),
                result = run => result,
            };
            if matches!(
                result,
                Err(TaskError::Cancelled { .. } | TaskError::Deadline { .. })
            ) && let Some(addr) = current.lock_unpoisoned().take()
            {
                tokio::spawn(forwarder.cancel(addr, task.id.clone()));
            }
            inner.finish(&task, result);
            inner.running.send_modify(|n| *n -= 1);
            inner.publish_load();
        });
        Ok(id)
    }

    /// Streams a task's events: everything recorded from the start, then (with `follow`) new
    /// ones until it ends.
    pub fn watch(&self, id: &str, follow: bool) -> Result<mpsc::Receiver<TaskEvent>, LookupError> {
        let live = self.inner.live(id);
        if live.is_none() && self.record(id)?.is_none() {
            return Err(LookupError::NotFound(id.to_owned()));
        }
        let mut receiver = live.as_ref().map(|task| task.events.subscribe());
        let store = self.inner.store.clone();
        let id = id.to_owned();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut next = 0;
            // Replay from the store; on lag, replay again from where the live stream broke.
            loop {
                for event in store.events_from(&id, next) {
                    next = event.seq + 1;
                    let terminal = event.kind.is_terminal();
                    if tx.send(event).await.is_err() || terminal {
                        return;
                    }
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

    /// Cancels a task; a finished task is left as it is. Returns its status.
    pub fn cancel(&self, id: &str, reason: &str) -> Result<TaskStatus, LookupError> {
        if let Some(task) = self.inner.live(id) {
            let status = task.record.lock_unpoisoned().status;
            if status == TaskStatus::Queued {
                // Not started: finish it now instead of waiting for a worker.
                self.inner.finish(
                    &task,
                    Err(TaskError::Cancelled {
                        reason: reason.into(),
                    }),
                );
            }
            task.cancel_reason
                .lock_unpoisoned()
                .get_or_insert_with(|| reason.to_owned());
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
        self.inner.store.record(id).map_err(LookupError::Storage)
    }

    /// The newest `limit` tasks, newest first.
    pub fn list(&self, limit: usize) -> Vec<TaskRecord> {
        self.inner
            .store
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
        let queued: Vec<_> = self
            .inner
            .live
            .lock_unpoisoned()
            .values()
            .filter(|t| {
                t.record
                    .lock()
                    .map(|r| r.status == TaskStatus::Queued)
                    .unwrap_or(false)
            })
            .cloned()
            .collect();
        for task in queued {
            self.cancel(&task.id, "the node is shutting down").ok();
        }
        let mut running = self.inner.running.subscribe();
        let _ = tokio::time::timeout(grace, running.wait_for(|n| *n == 0)).await;
        let live: Vec<_> = self
            .inner
            .live
            .lock_unpoisoned()
            .values()
            .cloned()
            .collect();
        for task in live {
            self.cancel(&task.id, "the node is shutting down").ok();
        }
        let _ = running.wait_for(|n| *n == 0).await;
        self.inner.store.flush().await;
    }
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
                if self.live(id).is_some() || self.store.record(id).ok().flatten().is_some() {
                    return Err(SubmitError::Duplicate(id.clone()));
                }
                id.clone()
            }
            None => uuid::Uuid::now_v7().to_string(),
        };
        let timeout = spec.timeout.unwrap_or(self.limits.timeout);
        let executed_on = route.first().cloned().unwrap_or_else(|| self.node.clone());
        let record = TaskRecord {
            id: id.clone(),
            status,
            spec: spec.clone(),
            created_at_ms: unix_ms(SystemTime::now()),
            finished_at_ms: None,
            executed_on,
            output: None,
            error: None,
            route,
        };
        self.store
            .put_record(&record)
            .map_err(SubmitError::Storage)?;
        let (events, _) = broadcast::channel(1024);
        let task = Arc::new(LiveTask {
            id: id.clone(),
            spec,
            deadline: Instant::now() + timeout,
            cancel: CancellationToken::new(),
            cancel_reason: Mutex::default(),
            seq: AtomicU64::new(0),
            events,
            record: Mutex::new(record),
        });
        self.live.lock_unpoisoned().insert(id, task.clone());
        Ok(task)
    }

    fn live(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock_unpoisoned().get(id).cloned()
    }

    fn emitter(&self, task: &Arc<LiveTask>) -> Emitter {
        Emitter {
            task: task.clone(),
            store: self.store.clone(),
        }
    }

    fn publish_load(&self) {
        self.caps.load_gauge().set(Load {
            running: *self.running.borrow(),
            queued: self.queued.load(Ordering::SeqCst),
            workers: self.limits.workers as u32,
            queue_capacity: self.limits.queue as u32,
        });
        self.caps.notify();
    }

    /// Records the end of a task (once), emits the terminal event and forgets it.
    fn finish(&self, task: &Arc<LiveTask>, result: Result<Answer, TaskError>) {
        let mut record = task.record.lock_unpoisoned();
        if record.status.finished() {
            return;
        }
        if record.status == TaskStatus::Queued {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        record.finished_at_ms = Some(unix_ms(SystemTime::now()));
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
                record.status = TaskStatus::Failed;
                record.error = Some(error.clone());
                EventKind::Failed { error }
            }
        };
        if let Err(e) = self.store.put_record(&record) {
            tracing::error!(task = %task.id, error = %e, "record task result");
        }
        drop(record);
        self.emitter(task).emit(event);
        self.live.lock_unpoisoned().remove(&task.id);
        self.publish_load();
    }
}

async fn worker(
    inner: Arc<Inner>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Arc<LiveTask>>>>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = async { queue.lock().await.recv().await } => next,
        };
        let Some(task) = next else { return };
        {
            let mut record = task.record.lock_unpoisoned();
            if record.status != TaskStatus::Queued {
                continue; // cancelled while queued
            }
            record.status = TaskStatus::Running;
            if let Err(e) = inner.store.put_record(&record) {
                tracing::error!(task = %task.id, error = %e, "record task start");
            }
        }
        inner.queued.fetch_sub(1, Ordering::SeqCst);
        inner.running.send_modify(|n| *n += 1);
        inner.publish_load();

        let emitter = inner.emitter(&task);
        emitter.emit(EventKind::Started {
            node: inner.node.clone(),
        });
        let span = tracing::info_span!("task", task_id = %task.id, target = %task.spec.target);
        let run = inner.runtime.run(&task.spec, &emitter);
        let result = tracing::Instrument::instrument(
            async {
                tokio::select! {
                    () = task.cancel.cancelled() => Err(TaskError::Cancelled {
                        reason: task
                            .cancel_reason
                            .lock_unpoisoned()
                            .clone()
                            .unwrap_or_else(|| "cancelled by a caller".into()),
                    }),
                    () = tokio::time::sleep_until(task.deadline) => Err(TaskError::Deadline {
                        seconds: task.spec.timeout.unwrap_or(inner.limits.timeout).as_secs(),
                    }),
                    result = run => result,
                }
            },
            span,
        )
        .await;
        // `finish` before the running count drops, so shutdown waits for the record.
        inner.finish(&task, result);
        inner.running.send_modify(|n| *n -= 1);
        inner.publish_load();
    }
}

/// Whether a tool call may have changed something (tier `write` or `shell`): once one ran on a
/// node, the task is not re-run elsewhere. `delegate` counts as the tier it asked for.
fn has_side_effects(tool: &str, arguments: &str) -> bool {
    match tool {
        "file_write" | "shell_exec" | "memory_put" => true,
        "delegate" => serde_json::from_str::<serde_json::Value>(arguments)
            .ok()
            .and_then(|args| args.get("tier").and_then(|t| t.as_str().map(str::to_owned)))
            .is_some_and(|tier| tier != "read"),
        _ => false,
    }
}

/// Runs a task on other nodes: forwards it to each candidate in turn, relaying its events,
/// until one gives an outcome. A broken stream or a full queue moves on to the next candidate
/// (at most [`MAX_FAILOVERS`] times after the first), unless a side-effecting tool already ran.
async fn forward(
    inner: &Inner,
    task: &LiveTask,
    events: &Emitter,
    candidates: Vec<(String, String)>,
    forwarder: Arc<dyn Forwarder>,
    current: Arc<Mutex<Option<String>>>,
) -> Result<Answer, TaskError> {
    let mut spec = task.spec.clone();
    spec.lineage.task_id = Some(task.id.clone());
    spec.lineage.hops += 1;
    if spec.lineage.origin.is_empty() {
        spec.lineage.origin = inner.node.clone();
    }
    let mut failures: Vec<String> = Vec::new();
    for (index, (name, addr)) in candidates.into_iter().enumerate() {
        let attempt = index as u32 + 1;
        if attempt > MAX_FAILOVERS + 1 {
            break;
        }
        let remaining = task.deadline.saturating_duration_since(Instant::now());
        spec.timeout = Some(remaining.max(Duration::from_secs(1)));
        events.emit(EventKind::Delegated {
            node: name.clone(),
            attempt,
            reason: failures.last().cloned().unwrap_or_default(),
        });
        {
            let mut record = task.record.lock_unpoisoned();
            if record.route.last() != Some(&name) {
                record.route.push(name.clone());
            }
            record.executed_on = name.clone();
            let _ = inner.store.put_record(&record);
        }
        *current.lock_unpoisoned() = Some(addr.clone());
        let mut stream = match forwarder.forward(addr.clone(), spec.clone()).await {
            Ok(stream) => stream,
            Err(ForwardError::Refused(why)) => {
                return Err(TaskError::Routing {
                    message: format!("{name} refused the task: {why}"),
                });
            }
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut side_effect: Option<String> = None;
        let lost = loop {
            let event = match stream.recv().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => break e,
                None => break ForwardError::Unavailable("stream ended without an outcome".into()),
            };
            match event.kind {
                EventKind::Completed {
                    output,
                    usage,
                    executed_on,
                    rounds,
                } => {
                    return Ok(Answer {
                        output,
                        usage,
                        rounds,
                        executed_on: Some(executed_on),
                    });
                }
                EventKind::Failed { error } => return Err(error),
                // The executing node's own admission is not news to our caller.
                EventKind::Accepted { .. } => {}
                kind => {
                    if let EventKind::ToolCalled {
                        name: tool,
                        arguments,
                        ..
                    } = &kind
                        && has_side_effects(tool, arguments)
                    {
                        side_effect = Some(tool.clone());
                    }
                    events.emit(kind);
                }
            }
        };
        if let Some(tool) = side_effect {
            return Err(TaskError::Routing {
                message: format!(
                    "node {name} was lost after running `{tool}` (its side effects may have happened), so the task is not re-run elsewhere: {lost}"
                ),
            });
        }
        failures.push(format!("{name}: {lost}"));
    }
    Err(TaskError::Routing {
        message: format!("no node completed the task: {}", failures.join("; ")),
    })
}

/// Re-routes after the first node at most this many times.
pub const MAX_FAILOVERS: u32 = 2;

/// Marks tasks left queued or running by a previous process as failed.
fn recover(store: &Store) {
    for mut record in store.records() {
        if record.status.finished() {
            continue;
        }
        let error = TaskError::Internal {
            message: "the node stopped while the task was running; submit it again".into(),
        };
        record.status = TaskStatus::Failed;
        record.error = Some(error.clone());
        record.finished_at_ms = Some(unix_ms(SystemTime::now()));
        let next = store
            .events_from(&record.id, 0)
            .last()
            .map_or(0, |e| e.seq + 1);
        let event = TaskEvent {
            task_id: record.id.clone(),
            seq: next,
            at_ms: unix_ms(SystemTime::now()),
            kind: EventKind::Failed { error },
        };
        if store
            .put_event(&event)
            .and_then(|()| store.put_record(&record))
            .is_err()
        {
            tracing::error!(task = %record.id, "cannot mark interrupted task as failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_effects_are_write_and_shell_tools_and_delegations_above_read() {
        assert!(has_side_effects("shell_exec", "{}"));
        assert!(has_side_effects("file_write", "{}"));
        assert!(!has_side_effects("file_read", "{}"));
        assert!(!has_side_effects(
            "delegate",
            r#"{"role": "coder", "prompt": "x"}"#
        ));
        assert!(has_side_effects(
            "delegate",
            r#"{"role": "coder", "prompt": "x", "tier": "shell"}"#
        ));
    }

    #[test]
    fn event_keys_sort_by_task_then_sequence() {
        let a = event_key("task", 2);
        let b = event_key("task", 10);
        assert!(a < b);
        assert!(event_key("task", u64::MAX) < event_key("task0", 0));
    }
}
