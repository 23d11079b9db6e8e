//! Durable tasks: each task's journal in the replicated memory (`task_journal`, key layout in
//! `mesh_domain::journal`), so that a task outlives the node running it without repeating what
//! it already did.
//!
//! - The origin writes a lease per epoch ([`Journals::lease`]): epoch 1 when it places the task,
//!   one more each time it resumes the task elsewhere.
//! - The executor opens the journal at its epoch ([`Journals::open`]): when resuming, it first
//!   pulls the origin's memory (which holds every step the origin confirmed), reads the steps
//!   the task continues from ([`Chain`]) and records them as its epoch's first step
//!   (`Step::Base`). Its [`TaskJournal`] appends each step of the tools loop before the next
//!   starts; a step that may change something (a side-effecting tool's intent) is also pushed
//!   to the origin, with every step before it, and runs only once the origin took it.
//! - An append is refused once a higher epoch is known (here before writing, at the origin
//!   when confirming, on every node when replicated: `memory::fence`): the superseded executor
//!   stops.
//!
//! The journal is bounded ([`MAX_JOURNAL_STEPS`], [`MAX_JOURNAL_BYTES`]): past the cap it
//! records `Step::Full` and the task is no longer resumed. A finished task's journal is deleted
//! by its origin after [`JOURNAL_RETENTION_MS`], any journal by any node after
//! [`JOURNAL_MAX_AGE_MS`] ([`Journals::sweep`]).
//!
//! This module keeps the journal; the tools loop decides what to record and how to replay it
//! (`agent`), and the forward loop when to resume (`tasks::forward`).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use mesh_domain::{
    Answer, BoxFuture, EventKind, NodeId, PeerState, TaskError, TaskEvent, Usage,
    journal::{
        self, JOURNAL_MAX_AGE_MS, JOURNAL_RETENTION_MS, JournalKey, Lease, MAX_JOURNAL_BYTES,
        MAX_JOURNAL_STEPS, Step,
    },
    keys::TASK_JOURNAL,
    sync::MutexExt,
    text::truncate,
    time::now_ms,
};

use crate::{
    agent::{Journal, JournalError},
    memory::{Entry, Memory, MemoryError, MemoryPeers, pull_origins, stamp_ms, sync_from},
    metrics::{labels, metrics},
    peers::PeerTable,
};

/// How long an executor waits for the origin to confirm a step that may change something.
const CONFIRM_DEADLINE: Duration = Duration::from_secs(5);
/// Most records of one task the sweep or a read looks at (leases and steps of every epoch).
const MAX_RECORDS: usize = (MAX_JOURNAL_STEPS as usize) + 64;

/// The journals of the tasks this node originates or runs.
#[derive(Debug, Clone)]
pub(crate) struct Journals {
    memory: Arc<Memory>,
    link: Arc<dyn MemoryPeers>,
    peers: Arc<PeerTable>,
}

/// The steps a task continues from: every epoch's steps taken, in order, and where each
/// epoch's part ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Chain {
    /// `(epoch, last seq taken)`, oldest first.
    pub from: Vec<(u32, u32)>,
    /// The steps, oldest first (no `Base`).
    pub steps: Vec<Step>,
    /// Bytes of the steps as stored.
    pub bytes: usize,
    /// The highest lease.
    pub lease: Option<Lease>,
}

impl Chain {
    /// How the task ended, when its journal says so.
    pub(crate) fn done(&self) -> Option<&Step> {
        self.steps.last().filter(|s| matches!(s, Step::Done { .. }))
    }

    /// Whether the journal reached its cap (the task cannot be resumed).
    pub(crate) fn full(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Full))
    }
}

impl Journals {
    pub(crate) fn new(
        memory: Arc<Memory>,
        link: Arc<dyn MemoryPeers>,
        peers: Arc<PeerTable>,
    ) -> Self {
        Self {
            memory,
            link,
            peers,
        }
    }

    /// This node's id.
    pub(crate) fn own_id(&self) -> &NodeId {
        self.memory.own_id()
    }

    /// A new task id, tagged as this node's (only this node may then lease the task).
    pub(crate) fn new_task_id(&self) -> String {
        mesh_domain::id::tagged_uuid(self.memory.own_id()).to_string()
    }

    /// As the task's origin: gives epoch `epoch` of task `task_id` to the node `executor`,
    /// which replays the steps of `replayed` (the journal as this node holds it; empty for
    /// the first run).
    pub(crate) async fn lease(
        &self,
        task_id: &str,
        epoch: u32,
        executor: &NodeId,
        executor_name: &str,
        replayed: &Chain,
    ) -> Result<(), MemoryError> {
        let lease = Lease {
            epoch,
            executor: executor.clone(),
            executor_name: executor_name.to_owned(),
            replayed: replayed.steps.len() as u32,
            from: replayed.from.clone(),
            at_ms: now_ms(),
        };
        let value = serde_json::to_vec(&lease).map_err(|e| MemoryError::Invalid(e.to_string()))?;
        self.memory
            .put(
                TASK_JOURNAL,
                &journal::lease_key(task_id, epoch),
                Some(value),
            )
            .await?;
        Ok(())
    }

    /// Whether the node named `name` is down (or gone) in the membership: an executor lost
    /// even while its connection stays open (a stopped process).
    pub(crate) fn is_down(&self, name: &str) -> bool {
        // A node no longer in the table at all is gone too.
        self.peers
            .id_by_name(name)
            .and_then(|id| self.peers.get(&id))
            .is_none_or(|peer| matches!(peer.state, PeerState::Down | PeerState::Revoked))
    }

    /// The id of the node named `name`, when the membership knows it (this node included).
    pub(crate) fn id_of(&self, name: &str) -> Option<NodeId> {
        self.peers.id_by_name(name)
    }

    /// The steps task `task_id` continues from, as this node holds them, as of the latest
    /// epoch (below `before`, when given) whose executor started: that epoch's `Base` (the
    /// earlier epochs' steps it took) and then its own steps. Each epoch's steps are taken
    /// only from the executor its lease names, and only up to the first one missing here.
    pub(crate) fn chain(&self, task_id: &str, before: Option<u32>) -> Result<Chain, MemoryError> {
        let entries =
            self.memory
                .list(TASK_JOURNAL, &journal::task_prefix(task_id), MAX_RECORDS)?;
        let mut leases: BTreeMap<u32, Lease> = BTreeMap::new();
        let mut raw: Vec<(u32, u32, &Entry)> = Vec::new();
        for entry in entries.iter().filter(|e| !e.record.tombstone) {
            match journal::parse_key(&entry.key) {
                Some(JournalKey::Lease(_, epoch)) => {
                    if let Ok(lease) = serde_json::from_slice::<Lease>(&entry.record.value) {
                        leases.insert(epoch, lease);
                    }
                }
                Some(JournalKey::Step(_, epoch, seq)) => raw.push((epoch, seq, entry)),
                None => {}
            }
        }
        // Per epoch, its executor's steps by seq, with their stored size.
        let mut epochs: BTreeMap<u32, BTreeMap<u32, (Step, usize)>> = BTreeMap::new();
        for (epoch, seq, entry) in raw {
            let Some(lease) = leases.get(&epoch) else {
                continue;
            };
            if entry.record.origin != lease.executor {
                continue;
            }
            if let Ok(step) = serde_json::from_slice::<Step>(&entry.record.value) {
                epochs
                    .entry(epoch)
                    .or_default()
                    .insert(seq, (step, entry.record.value.len()));
            }
        }
        let contiguous = |epoch: u32, upto: u32| -> Vec<(u32, Step, usize)> {
            let mut out = Vec::new();
            if let Some(steps) = epochs.get(&epoch) {
                for seq in 1..=upto {
                    match steps.get(&seq) {
                        Some((step, size)) => out.push((seq, step.clone(), *size)),
                        None => break,
                    }
                }
            }
            out
        };
        let mut chain = Chain {
            lease: leases.values().next_back().cloned(),
            ..Chain::default()
        };
        // The latest epoch whose executor started (recorded its first step); an epoch leased
        // to a node that never ran it adds nothing.
        let Some(last) = leases
            .keys()
            .rev()
            .copied()
            .filter(|epoch| before.is_none_or(|b| *epoch < b))
            .find(|epoch| epochs.get(epoch).is_some_and(|s| s.contains_key(&1)))
        else {
            return Ok(chain);
        };
        let own = contiguous(last, u32::MAX);
        let base = match own.first() {
            Some((_, Step::Base { from }, _)) => from.clone(),
            _ => Vec::new(),
        };
        let take = |epoch: u32, steps: Vec<(u32, Step, usize)>, chain: &mut Chain| {
            let end = steps.last().map_or(0, |(seq, ..)| *seq);
            for (_, step, size) in steps {
                if !matches!(step, Step::Base { .. }) {
                    chain.bytes += size;
                    chain.steps.push(step);
                }
            }
            chain.from.push((epoch, end));
        };
        for (epoch, upto) in base {
            take(epoch, contiguous(epoch, upto), &mut chain);
        }
        take(last, own, &mut chain);
        Ok(chain)
    }

    /// Whether this node is the origin of task `task_id` (it made the id).
    pub(crate) fn is_own_task(&self, task_id: &str) -> bool {
        mesh_domain::id::is_tagged_by(task_id, self.own_id())
    }

    /// The origin of task `task_id` when it is another node: the peer that made (tagged) its
    /// id, which leases it and confirms its side-effecting steps.
    fn origin_of(&self, task_id: &str) -> Option<(NodeId, String)> {
        if self.is_own_task(task_id) {
            return None;
        }
        self.peers
            .snapshot()
            .into_iter()
            .find(|peer| mesh_domain::id::is_tagged_by(task_id, &peer.info.id))
            .map(|peer| (peer.info.id, peer.info.name))
    }

    /// As the executor of task `task_id` at `epoch`: the journal to append to, with the steps
    /// it continues from. When resuming, first pulls what the task's origin holds, so every
    /// step the origin confirmed is here.
    pub(crate) async fn open(
        &self,
        task_id: &str,
        epoch: u32,
    ) -> Result<TaskJournal, JournalError> {
        let origin = self.origin_of(task_id);
        if epoch > 1
            && let Some((id, name)) = &origin
            && let Some(peer) = self.peers.get(id)
        {
            // The leases first (the origin's own writes), then every record of the earlier
            // executors the origin holds, however they reached it.
            let pulled = match sync_from(&self.memory, self.link.as_ref(), id, &peer.addr).await {
                Ok(_) => {
                    let executors: Vec<NodeId> = self
                        .memory
                        .journal_leases(task_id)
                        .map_err(storage)?
                        .into_iter()
                        .map(|lease| lease.executor)
                        .filter(|executor| executor != self.own_id())
                        .collect();
                    pull_origins(&self.memory, self.link.as_ref(), id, &peer.addr, &executors).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = pulled {
                tracing::warn!(task_id, origin = %name, error = %e, "pull the journal from the task's origin");
            }
        }
        let chain = if epoch > 1 {
            self.chain(task_id, Some(epoch)).map_err(storage)?
        } else {
            Chain::default()
        };
        // The origin said how many steps it held when it leased this epoch: with fewer here,
        // replaying would run some again.
        if epoch > 1 {
            let lease = self
                .memory
                .get(TASK_JOURNAL, &journal::lease_key(task_id, epoch))
                .map_err(storage)?
                .filter(|r| !r.tombstone)
                .and_then(|r| serde_json::from_slice::<Lease>(&r.value).ok());
            match lease {
                Some(lease) if chain.steps.len() as u32 >= lease.replayed => {}
                Some(lease) => {
                    return Err(JournalError::Storage(format!(
                        "this node holds {} of the {} steps the origin recorded before epoch {epoch}",
                        chain.steps.len(),
                        lease.replayed
                    )));
                }
                None => {
                    return Err(JournalError::Storage(format!(
                        "the lease of epoch {epoch} has not reached this node"
                    )));
                }
            }
        }
        let journal = TaskJournal {
            journals: self.clone(),
            task_id: task_id.to_owned(),
            epoch,
            origin,
            state: Mutex::new(Appends {
                next_seq: 1,
                steps: chain.steps.len() as u32,
                bytes: chain.bytes,
                full: false,
                unconfirmed: Vec::new(),
                superseded: false,
            }),
            replayed: chain.steps.clone(),
        };
        if epoch > 1 {
            journal.write(Step::Base { from: chain.from }).await?;
        }
        Ok(journal)
    }

    /// Streams the events of task `task_id` as its journal tells them (with `follow`, until it
    /// ends): for a node that neither originated nor runs the task, such as one a caller
    /// re-attaches to after the origin was lost. Events are rebuilt from the steps: the text
    /// of each model answer, each tool call and result, each resumption, and the outcome.
    pub(crate) async fn follow(&self, task_id: String, tx: mpsc::Sender<TaskEvent>, follow: bool) {
        let mut changes = self.memory.changes_in(TASK_JOURNAL);
        let mut seq = 0;
        let mut sent = 0;
        let mut epoch = 0;
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let chain = match self.chain(&task_id, None) {
                Ok(chain) => chain,
                Err(e) => {
                    tracing::warn!(task_id, error = %e, "read a task's journal");
                    return;
                }
            };
            let mut kinds = Vec::new();
            let executor = chain
                .lease
                .as_ref()
                .map(|l| l.executor_name.clone())
                .unwrap_or_default();
            if let Some(lease) = chain.lease.as_ref().filter(|l| l.epoch > epoch) {
                kinds.push(if epoch == 0 {
                    EventKind::Started {
                        node: lease.executor_name.clone(),
                    }
                } else {
                    EventKind::Resumed {
                        node: lease.executor_name.clone(),
                        from_step: lease.replayed + 1,
                        epoch: lease.epoch,
                        reason: "its previous node was lost".into(),
                    }
                });
                epoch = lease.epoch;
            }
            // A resumption may take fewer steps than the lost node had recorded.
            sent = sent.min(chain.steps.len());
            for step in &chain.steps[sent..] {
                kinds.extend(events_of(step, &executor, &mut names));
            }
            sent = chain.steps.len();
            for kind in kinds {
                let event = TaskEvent {
                    task_id: task_id.clone(),
                    seq,
                    at_ms: now_ms(),
                    kind,
                };
                seq += 1;
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            if chain.done().is_some() || !follow {
                return;
            }
            tokio::select! {
                () = tx.closed() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Deletes the journals this node may collect: of tasks it originated that ended more than
    /// [`JOURNAL_RETENTION_MS`] ago, and of any task older than [`JOURNAL_MAX_AGE_MS`].
    /// Returns how many records it deleted.
    pub(crate) async fn sweep(&self) -> Result<usize, MemoryError> {
        let now = now_ms();
        // The tasks with a journal here: one lease each at least.
        let mut tasks: Vec<String> = Vec::new();
        let mut after = String::new();
        loop {
            let page = self
                .memory
                .page(TASK_JOURNAL, "", &after, 1000, 1024 * 1024)?;
            for entry in &page.entries {
                if let Some(JournalKey::Lease(task, _)) = journal::parse_key(&entry.key)
                    && tasks.last().map(String::as_str) != Some(task)
                {
                    tasks.push(task.to_owned());
                }
            }
            match page.next_after {
                Some(next) => after = next,
                None => break,
            }
        }
        let mut deleted = 0;
        for task_id in tasks {
            let started = journal::task_started_ms(&task_id).unwrap_or(0);
            let too_old = now.saturating_sub(started) > JOURNAL_MAX_AGE_MS;
            let entries =
                self.memory
                    .list(TASK_JOURNAL, &journal::task_prefix(&task_id), MAX_RECORDS)?;
            let ended_long_ago = mesh_domain::id::is_tagged_by(&task_id, self.own_id())
                && entries.iter().any(|e| {
                    matches!(
                        serde_json::from_slice::<Step>(&e.record.value),
                        Ok(Step::Done { .. })
                    ) && now.saturating_sub(stamp_ms(e.record.hlc)) > JOURNAL_RETENTION_MS
                });
            if too_old || ended_long_ago {
                for entry in entries.iter().filter(|e| !e.record.tombstone) {
                    self.memory.put(TASK_JOURNAL, &entry.key, None).await?;
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}

/// How often the journals of ended and of too old tasks are collected.
const JOURNAL_SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Collects the journals this node may delete, every [`JOURNAL_SWEEP_EVERY`] until `stop`.
pub(crate) async fn sweep_every(journals: Journals, stop: CancellationToken) {
    let mut every = tokio::time::interval(JOURNAL_SWEEP_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        match journals.sweep().await {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(deleted, "collected ended task journals"),
            Err(e) => tracing::warn!(error = %e, "collect ended task journals"),
        }
    }
}

/// The events a step of a journal stands for, as a watcher sees them.
fn events_of(step: &Step, executor: &str, names: &mut BTreeMap<String, String>) -> Vec<EventKind> {
    match step {
        Step::Model {
            content,
            tool_calls,
            ..
        } => {
            for call in tool_calls {
                names.insert(call.id.clone(), call.name.clone());
            }
            (!content.is_empty())
                .then(|| EventKind::OutputDelta {
                    text: content.clone(),
                })
                .into_iter()
                .collect()
        }
        Step::Intent {
            call_id,
            name,
            arguments,
            ..
        } => vec![EventKind::ToolCalled {
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
        }],
        Step::Result {
            call_id,
            ok,
            output,
        } => vec![EventKind::ToolResult {
            call_id: call_id.clone(),
            name: names.get(call_id).cloned().unwrap_or_default(),
            ok: *ok,
            output: truncate(output, EVENT_OUTPUT_CAP).to_owned(),
            consecutive_failures: 0,
        }],
        Step::Done {
            output,
            error,
            usage,
            rounds,
        } => vec![match error {
            Some(error) => EventKind::Failed {
                error: error.clone(),
                usage: *usage,
            },
            None => EventKind::Completed {
                output: output.clone().unwrap_or_default(),
                usage: *usage,
                executed_on: executor.to_owned(),
                rounds: *rounds,
            },
        }],
        Step::Full => vec![EventKind::Warning {
            message: "the task's journal reached its cap: it is not resumed past this step".into(),
        }],
        Step::Base { .. } | Step::Evaluated { .. } => Vec::new(),
    }
}

/// Cap on a tool's output copied into a rebuilt event (as the executor's own events do).
const EVENT_OUTPUT_CAP: usize = 4096;

fn storage(e: MemoryError) -> JournalError {
    JournalError::Storage(e.to_string())
}

/// What an executor has appended at its epoch.
#[derive(Debug)]
struct Appends {
    next_seq: u32,
    /// Steps of the whole chain, for the cap.
    steps: u32,
    bytes: usize,
    /// The cap was reached (and `Step::Full` recorded): nothing more is appended.
    full: bool,
    /// Steps appended since the origin last confirmed one, sent with the next confirmation.
    unconfirmed: Vec<Entry>,
    /// A higher epoch took over: nothing more is appended.
    superseded: bool,
}

/// One task's journal, as its executor appends to it at its epoch.
#[derive(Debug)]
pub(crate) struct TaskJournal {
    journals: Journals,
    task_id: String,
    epoch: u32,
    /// The task's origin when it is another node: it confirms side-effecting steps.
    origin: Option<(NodeId, String)>,
    state: Mutex<Appends>,
    replayed: Vec<Step>,
}

impl TaskJournal {
    /// Appends `step` at the next seq, unless a higher epoch is known here or the cap is
    /// reached. Returns the entry written (`None` once full).
    async fn write(&self, step: Step) -> Result<Option<Entry>, JournalError> {
        let memory = &self.journals.memory;
        if let Some(current) = memory.journal_epoch(&self.task_id).map_err(storage)?
            && current.epoch > self.epoch
        {
            return Err(self.superseded(&current));
        }
        let value = serde_json::to_vec(&step).map_err(|e| JournalError::Storage(e.to_string()))?;
        let (seq, step_value) = {
            let mut state = self.state.lock_unpoisoned();
            if state.full {
                return Ok(None);
            }
            let over = state.steps + 1 >= MAX_JOURNAL_STEPS
                || state.bytes + value.len() >= MAX_JOURNAL_BYTES;
            let (step_value, full) = if over {
                state.full = true;
                (
                    serde_json::to_vec(&Step::Full)
                        .map_err(|e| JournalError::Storage(e.to_string()))?,
                    true,
                )
            } else {
                (value, false)
            };
            let seq = state.next_seq;
            state.next_seq += 1;
            state.steps += 1;
            state.bytes += step_value.len();
            if full {
                tracing::warn!(task_id = %self.task_id, steps = state.steps, bytes = state.bytes, "the task's journal is full: it is not resumed past this step");
            }
            (seq, step_value)
        };
        let started = std::time::Instant::now();
        let size = step_value.len();
        let key = journal::step_key(&self.task_id, self.epoch, seq);
        let record = memory
            .put(TASK_JOURNAL, &key, Some(step_value))
            .await
            .map_err(storage)?;
        let metrics = metrics();
        metrics.journal_appends.inc();
        metrics.journal_bytes.inc_by(size as u64);
        metrics
            .journal_append_seconds
            .observe(started.elapsed().as_secs_f64());
        let entry = Entry {
            namespace: TASK_JOURNAL.to_owned(),
            key,
            record,
        };
        self.state.lock_unpoisoned().unconfirmed.push(entry.clone());
        Ok(Some(entry))
    }

    /// This run was superseded by `current`: counted as a fenced append (refused here,
    /// before it was written) and nothing more is appended.
    fn superseded(&self, current: &Lease) -> JournalError {
        self.state.lock_unpoisoned().superseded = true;
        metrics()
            .memory_records_refused
            .get_or_create(&labels(&[("reason", "fenced")]))
            .inc();
        JournalError::Superseded {
            epoch: self.epoch,
            current: current.epoch,
            by: current.executor_name.clone(),
        }
    }

    /// Has the origin take every step appended since it last confirmed one, and waits (at most
    /// [`CONFIRM_DEADLINE`]) for its answer. The origin refusing one (it knows a higher epoch)
    /// is [`JournalError::Superseded`]; an origin that cannot be reached confirms nothing, and
    /// the step goes ahead (a node that lost its origin has nobody who would resume it).
    async fn confirm(&self) -> Result<(), JournalError> {
        let Some((origin, name)) = &self.origin else {
            return Ok(());
        };
        // Tried whatever state the membership gives the origin: a node just resumed from a
        // stop may not have heard from it yet, and an origin that is gone refuses at once.
        let Some(peer) = self.journals.peers.get(origin) else {
            tracing::warn!(task_id = %self.task_id, origin = %name, "the task's origin is not known here: a side-effecting step goes ahead unconfirmed");
            return Ok(());
        };
        let entries = std::mem::take(&mut self.state.lock_unpoisoned().unconfirmed);
        if entries.is_empty() {
            return Ok(());
        }
        let certificates = self.journals.memory.certificates_for(&entries);
        let push = self
            .journals
            .link
            .push(peer.addr.clone(), entries.clone(), certificates);
        match tokio::time::timeout(CONFIRM_DEADLINE, push).await {
            Ok(Ok(answer)) => {
                if let Some(why) = entries
                    .iter()
                    .find_map(|e| answer.refusal(TASK_JOURNAL, &e.key))
                {
                    tracing::warn!(task_id = %self.task_id, origin = %name, why, "the origin refused this node's journal step");
                    let current = self
                        .journals
                        .memory
                        .journal_epoch(&self.task_id)
                        .ok()
                        .flatten();
                    self.state.lock_unpoisoned().superseded = true;
                    return Err(JournalError::Superseded {
                        epoch: self.epoch,
                        current: current
                            .as_ref()
                            .map_or(self.epoch + 1, |l| l.epoch.max(self.epoch + 1)),
                        by: current.map_or_else(|| "another node".to_owned(), |l| l.executor_name),
                    });
                }
                Ok(())
            }
            Ok(Err(e)) => {
                tracing::warn!(task_id = %self.task_id, origin = %name, error = %e, "the origin did not confirm a side-effecting step; it goes ahead");
                Ok(())
            }
            Err(_) => {
                tracing::warn!(task_id = %self.task_id, origin = %name, "the origin did not confirm a side-effecting step in time; it goes ahead");
                Ok(())
            }
        }
    }
}

impl TaskJournal {
    /// Records how the task ended here (its last step), so a node watching the journal, or
    /// the origin after this node's stream broke, learns the outcome. A superseded run records
    /// nothing (it would be refused), nor one handed back to its origin (it goes on elsewhere).
    pub(crate) async fn end(&self, result: &Result<Answer, TaskError>) {
        if self.state.lock_unpoisoned().superseded {
            return;
        }
        let step = match result {
            // Given back to its origin, which runs it on: not the task's end.
            Err(TaskError::HandedOver { .. }) => return,
            Ok(answer) => Step::Done {
                output: Some(answer.output.clone()),
                error: None,
                usage: answer.usage,
                rounds: answer.rounds,
            },
            Err(error) => Step::Done {
                output: None,
                error: Some(error.clone()),
                usage: Usage::default(),
                rounds: 0,
            },
        };
        if let Err(e) = self.write(step).await {
            tracing::warn!(task_id = %self.task_id, error = %e, "record the task's end in its journal");
        }
    }
}

impl Journal for TaskJournal {
    fn replayed(&self) -> &[Step] {
        &self.replayed
    }

    fn append(&self, step: Step, confirm: bool) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async move {
            self.write(step).await?;
            if confirm {
                self.confirm().await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::ToolCall;

    use super::*;
    use crate::memory::{
        MemoryOptions,
        test_support::{InProcess, id, open_memory},
    };

    fn model(round: u32) -> Step {
        Step::Model {
            round,
            content: format!("round {round}"),
            tool_calls: vec![ToolCall {
                id: format!("c{round}"),
                name: "t".into(),
                arguments: "{}".into(),
            }],
            usage: Usage::default(),
        }
    }

    async fn put_step(memory: &Memory, task: &str, epoch: u32, seq: u32, step: &Step) {
        let value = serde_json::to_vec(step).expect("json");
        memory
            .put(
                TASK_JOURNAL,
                &journal::step_key(task, epoch, seq),
                Some(value),
            )
            .await
            .expect("put");
    }

    /// A resumed epoch's chain is the steps its `Base` took from the earlier epochs, then its
    /// own; an epoch leased to a node that never started adds nothing, and a step recorded
    /// by the superseded executor after the resumer read the journal is left out.
    #[tokio::test]
    async fn the_chain_follows_each_epochs_base_and_skips_epochs_that_never_ran() {
        let (_dir, memory) = open_memory(&id("me"), MemoryOptions::default());
        let own = memory.own_id().clone();
        let journals = Journals::new(
            memory.clone(),
            Arc::new(InProcess(Default::default())),
            Arc::new(PeerTable::for_node(own.clone(), "me".into())),
        );
        let task = journals.new_task_id();
        assert_eq!(
            journals.chain(&task, None).expect("chain"),
            Chain::default()
        );
        journals
            .lease(&task, 1, &own, "me", &Chain::default())
            .await
            .expect("lease");
        for seq in 1..=3 {
            put_step(&memory, &task, 1, seq, &model(seq)).await;
        }
        // Epoch 2 resumed after the first two steps; its executor's step 3 came late.
        journals
            .lease(
                &task,
                2,
                &own,
                "me",
                &journals.chain(&task, None).expect("chain"),
            )
            .await
            .expect("lease");
        put_step(&memory, &task, 2, 1, &Step::Base { from: vec![(1, 2)] }).await;
        put_step(&memory, &task, 2, 2, &model(9)).await;
        // Epoch 3 leased, never started.
        journals
            .lease(
                &task,
                3,
                &own,
                "me",
                &journals.chain(&task, None).expect("chain"),
            )
            .await
            .expect("lease");
        let chain = journals.chain(&task, None).expect("chain");
        assert_eq!(chain.steps, [model(1), model(2), model(9)]);
        assert_eq!(chain.from, [(1, 2), (2, 2)]);
        assert_eq!(chain.lease.as_ref().map(|l| l.epoch), Some(3));
        // What a resumer at epoch 4 reads, and at epoch 2 (before epoch 2 existed).
        assert_eq!(
            journals.chain(&task, Some(4)).expect("chain").steps.len(),
            3
        );
        let first = journals.chain(&task, Some(2)).expect("chain");
        assert_eq!(first.steps, [model(1), model(2), model(3)]);
        assert!(first.done().is_none() && !first.full());
    }
}
