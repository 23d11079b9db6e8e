//! The task history, in the store: each task's record (tree `tasks`, keyed by its UUIDv7 id, so
//! newest last) and its numbered events (tree `task_events`, key = task id + sequence), and the
//! recovery at start of tasks a previous process left queued or running.
//!
//! It stores and reads; it runs nothing.

use std::{fmt, ops::Bound, sync::Arc};

use mesh_domain::{EventKind, TaskError, TaskEvent, TaskSpec, TaskStatus, time::now_ms};
use serde::{Deserialize, Serialize};

use crate::storage::{Store, StoreError, Write, flush};

/// A task's summary as stored and listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Id (UUIDv7).
    pub id: String,
    /// Where it is in its life.
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

/// The task history: records in one tree, events in another.
#[derive(Clone)]
pub(crate) struct History(Arc<dyn Store>);

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("History")
    }
}

const RECORDS: &str = "tasks";
const EVENTS: &str = "task_events";

impl History {
    /// The history kept in `store`.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self(store)
    }

    fn put(&self, tree: &str, key: Vec<u8>, value: &impl Serialize) -> Result<(), StoreError> {
        let value = serde_json::to_vec(value).map_err(|e| StoreError::Engine(e.to_string()))?;
        self.0.commit(vec![Write::Put(tree.to_owned(), key, value)])
    }

    pub(crate) fn put_record(&self, record: &TaskRecord) -> Result<(), StoreError> {
        self.put(RECORDS, record.id.as_bytes().to_vec(), record)
    }

    pub(crate) fn put_event(&self, event: &TaskEvent) -> Result<(), StoreError> {
        self.put(EVENTS, event_key(&event.task_id, event.seq), event)
    }

    pub(crate) fn record(&self, id: &str) -> Result<Option<TaskRecord>, String> {
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

    pub(crate) fn events_from(&self, id: &str, from: u64) -> Vec<TaskEvent> {
        let start = event_key(id, from);
        let end = event_key(id, u64::MAX);
        self.0
            .range(EVENTS, Bound::Included(start), Bound::Included(end))
            .filter_map(|entry| entry.ok())
            .filter_map(|(_, value)| serde_json::from_slice(&value).ok())
            .collect()
    }

    /// Every stored record, in id order.
    pub(crate) fn records(&self) -> impl DoubleEndedIterator<Item = TaskRecord> {
        self.0
            .range(RECORDS, Bound::Unbounded, Bound::Unbounded)
            .filter_map(|entry| entry.ok())
            .filter_map(|(_, value)| serde_json::from_slice(&value).ok())
    }

    pub(crate) async fn flush(&self) {
        if let Err(e) = flush(&self.0).await {
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

/// Marks tasks left queued or running by a previous process as failed.
pub(crate) fn recover(store: &History) {
    for mut record in store.records() {
        if record.status.finished() {
            continue;
        }
        let error = TaskError::Internal {
            message: "the node stopped while the task was running; submit it again".into(),
        };
        record.status = TaskStatus::Failed;
        record.error = Some(error.clone());
        record.finished_at_ms = Some(now_ms());
        let next = store
            .events_from(&record.id, 0)
            .last()
            .map_or(0, |e| e.seq.saturating_add(1));
        let event = TaskEvent {
            task_id: record.id.clone(),
            seq: next,
            at_ms: now_ms(),
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
    fn event_keys_sort_by_task_then_sequence() {
        let a = event_key("task", 2);
        let b = event_key("task", 10);
        assert!(a < b);
        assert!(event_key("task", u64::MAX) < event_key("task0", 0));
    }
}
