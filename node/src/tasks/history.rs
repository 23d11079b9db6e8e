//! The task history, in the store: each task's record (tree `tasks`, keyed by its UUIDv7 id, so
//! newest last) and its numbered events (tree `task_events`, key = task id + sequence), and the
//! recovery at start of tasks a previous process left queued or running.
//!
//! It stores and reads (a task's events a page at a time, so replaying a long history to a
//! watcher never holds all of it); it runs nothing.

use std::{fmt, ops::Bound, sync::Arc};

use mesh_domain::{EventKind, TaskError, TaskEvent, TaskSpec, TaskStatus, time::now_ms};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

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
/// Most events read from the store at once when replaying a task's events.
pub(crate) const EVENT_PAGE: usize = 256;

/// How a [`History::replay`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replayed {
    /// The terminal event was sent, or the watcher went away: nothing more to send.
    Ended,
    /// Every stored event was sent; the next one will have this sequence number.
    UpTo(u64),
}

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

    /// At most `limit` stored events of task `id` from sequence `from` on (an undecodable one
    /// is skipped), and the sequence to read on from when there may be more.
    fn events_page(&self, id: &str, from: u64, limit: usize) -> (Vec<TaskEvent>, Option<u64>) {
        let start = event_key(id, from);
        let end = event_key(id, u64::MAX);
        let mut events = Vec::new();
        let mut read = 0;
        let mut next = from;
        for (key, value) in self
            .0
            .range(EVENTS, Bound::Included(start), Bound::Included(end))
            .filter_map(|entry| entry.ok())
            .take(limit)
        {
            read += 1;
            if let Some(seq) = event_seq(&key) {
                next = seq.saturating_add(1);
            }
            if let Ok(event) = serde_json::from_slice(&value) {
                events.push(event);
            }
        }
        (events, (read == limit).then_some(next))
    }

    /// Sends task `id`'s stored events from sequence `from` on to `tx`, a page at a time
    /// ([`EVENT_PAGE`]), so a long history is never all in memory at once.
    pub(crate) async fn replay(
        &self,
        id: &str,
        mut from: u64,
        tx: &mpsc::Sender<TaskEvent>,
    ) -> Replayed {
        loop {
            let (events, more) = self.events_page(id, from, EVENT_PAGE);
            for event in events {
                from = event.seq.saturating_add(1);
                let terminal = event.kind.is_terminal();
                if tx.send(event).await.is_err() || terminal {
                    return Replayed::Ended;
                }
            }
            match more {
                Some(next) => from = from.max(next),
                None => return Replayed::UpTo(from),
            }
        }
    }

    /// The sequence number task `id`'s next event gets (0 when it has none).
    fn next_seq(&self, id: &str) -> u64 {
        self.0
            .range(
                EVENTS,
                Bound::Included(event_key(id, 0)),
                Bound::Included(event_key(id, u64::MAX)),
            )
            .next_back()
            .and_then(|entry| entry.ok())
            .and_then(|(key, _)| event_seq(&key))
            .map_or(0, |seq| seq.saturating_add(1))
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

/// The sequence number at the end of an event key.
fn event_seq(key: &[u8]) -> Option<u64> {
    let tail = &key[key.len().checked_sub(8)?..];
    tail.try_into().ok().map(u64::from_be_bytes)
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
        let next = store.next_seq(&record.id);
        let event = TaskEvent {
            task_id: record.id.clone(),
            seq: next,
            at_ms: now_ms(),
            kind: EventKind::Failed {
                error,
                usage: mesh_domain::Usage::default(),
            },
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::storage::{Entries, KeyValue, SledStore};

    /// A store that remembers the most entries one range read has yielded.
    struct Counting {
        inner: SledStore,
        most: Arc<AtomicUsize>,
    }

    impl Store for Counting {
        fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(tree, key)
        }
        fn range(&self, tree: &str, from: Bound<Vec<u8>>, to: Bound<Vec<u8>>) -> Entries {
            let (read, most) = (Arc::new(AtomicUsize::new(0)), self.most.clone());
            Box::new(
                self.inner
                    .range(tree, from, to)
                    .inspect(move |_: &Result<KeyValue, _>| {
                        most.fetch_max(read.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    }),
            )
        }
        fn commit(&self, writes: Vec<Write>) -> Result<(), StoreError> {
            self.inner.commit(writes)
        }
        fn trees(&self) -> Result<Vec<String>, StoreError> {
            self.inner.trees()
        }
        fn drop_tree(&self, tree: &str) -> Result<(), StoreError> {
            self.inner.drop_tree(tree)
        }
        fn flush(&self) -> Result<(), StoreError> {
            self.inner.flush()
        }
        fn fail(&self, why: &str) {
            self.inner.fail(why);
        }
        fn pause_writes(&self, why: &str) {
            self.inner.pause_writes(why);
        }
        fn resume_writes(&self) {
            self.inner.resume_writes();
        }
    }

    /// Issue 16, point 3: replaying a task's history to a watcher reads the store a page at a
    /// time, never the whole history at once, and still sends every event once, in order.
    #[tokio::test]
    async fn a_long_history_is_replayed_in_pages_and_in_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let most = Arc::new(AtomicUsize::new(0));
        let history = History::new(Arc::new(Counting {
            inner: SledStore::new(sled::open(dir.path()).expect("db")),
            most: most.clone(),
        }));
        let event = |task: &str, seq: u64, kind: EventKind| TaskEvent {
            task_id: task.into(),
            seq,
            at_ms: 0,
            kind,
        };
        let total = 4 * EVENT_PAGE as u64 + 7;
        for seq in 0..total {
            let text = format!("{seq}");
            history
                .put_event(&event("task", seq, EventKind::OutputDelta { text }))
                .expect("put");
        }
        history
            .put_event(&event(
                "task0",
                0,
                EventKind::OutputDelta {
                    text: "other".into(),
                },
            ))
            .expect("put");
        assert_eq!(history.next_seq("task"), total);

        let (tx, mut rx) = mpsc::channel::<TaskEvent>(8);
        let drain = tokio::spawn(async move {
            let mut seqs = Vec::new();
            while let Some(event) = rx.recv().await {
                seqs.push(event.seq);
            }
            seqs
        });
        assert_eq!(history.replay("task", 0, &tx).await, Replayed::UpTo(total));
        assert_eq!(
            history.replay("task", total - 3, &tx).await,
            Replayed::UpTo(total)
        );
        let error = TaskError::Internal {
            message: "x".into(),
        };
        history
            .put_event(&event(
                "task",
                total,
                EventKind::Failed {
                    error,
                    usage: mesh_domain::Usage::default(),
                },
            ))
            .expect("put");
        assert_eq!(history.replay("task", total, &tx).await, Replayed::Ended);
        drop(tx);
        let seqs = drain.await.expect("drain");
        let want: Vec<u64> = (0..total).chain(total - 3..=total).collect();
        assert_eq!(seqs, want);
        let most = most.load(Ordering::SeqCst);
        assert!(most <= EVENT_PAGE, "one read yielded {most} events");
    }

    #[test]
    fn event_keys_sort_by_task_then_sequence() {
        let a = event_key("task", 2);
        let b = event_key("task", 10);
        assert!(a < b);
        assert!(event_key("task", u64::MAX) < event_key("task0", 0));
    }
}
