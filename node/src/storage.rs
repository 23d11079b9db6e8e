//! What memory and the task history need from a storage engine, and sled behind it.
//!
//! [`Store`] is an ordered key-value store of named trees with atomic multi-tree commits and an
//! explicit flush. `memory` and `tasks` talk to storage only through it, so the engine (sled
//! 0.34, whose stable line is old) can change without touching replication. Writers serialise
//! above this layer; a commit only has to be atomic, not a transaction.
//!
//! A full disk is met before it happens: [`SledStore`] refuses writes while the data dir has
//! less free space than its floor (`node.min_free_disk_mb`) and takes them again once there is
//! room. If a write fails anyway, sled 0.34 cannot go on (its later flushes never return), so
//! the store refuses every later write until the node restarts; what was stored stays stored.
//! A flush that outlives its deadline pauses writes instead: they resume by themselves if that
//! flush completes after all (a slow disk), and stay refused if it never does (a failed one).

use std::{
    collections::HashMap,
    ops::Bound,
    path::PathBuf,
    sync::{Arc, OnceLock, RwLock},
    time::Duration,
};

use mesh_domain::sync::RwLockExt;

/// A storage failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The data dir's disk has less free space than the floor; writes resume once it has room.
    #[error("{0}")]
    DiskFull(String),
    /// The engine failed.
    #[error("{0}")]
    Engine(String),
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        Self::Engine(e.to_string())
    }
}

/// How long a flush may take before the disk is taken for failed (sled 0.34 never returns from
/// a flush after a failed write).
const FLUSH_DEADLINE: Duration = Duration::from_secs(30);

/// One write of a [`Store::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` in `tree` to the value.
    Put(String, Vec<u8>, Vec<u8>),
    /// Removes `key` from `tree`.
    Delete(String, Vec<u8>),
}

/// A key and its value.
pub(crate) type KeyValue = (Vec<u8>, Vec<u8>);

/// Entries of a range, in key order from either end.
pub(crate) type Entries = Box<dyn DoubleEndedIterator<Item = Result<KeyValue, StoreError>> + Send>;

/// An ordered key-value store of named trees.
pub trait Store: Send + Sync {
    /// The value under `key` in `tree` (absent trees hold nothing).
    fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The entries of `tree` with keys within the bounds, in key order.
    fn range(&self, tree: &str, from: Bound<Vec<u8>>, to: Bound<Vec<u8>>) -> Entries;
    /// Applies every write, in order, atomically: after a crash all of them or none are there.
    fn commit(&self, writes: Vec<Write>) -> Result<(), StoreError>;
    /// The names of the trees that exist.
    fn trees(&self) -> Result<Vec<String>, StoreError>;
    /// Removes a tree and all it holds.
    fn drop_tree(&self, tree: &str) -> Result<(), StoreError>;
    /// Blocks until every committed write is on disk.
    fn flush(&self) -> Result<(), StoreError>;
    /// Refuses every later write and flush with `why`: the engine cannot be trusted to go on.
    fn fail(&self, why: &str);
    /// Refuses writes and flushes with `why` until [`Store::resume_writes`]: a flush is late,
    /// and the disk may yet turn out to be fine.
    fn pause_writes(&self, why: &str);
    /// Takes writes again after [`Store::pause_writes`] (not after [`Store::fail`]).
    fn resume_writes(&self);

    /// The entries of `tree` whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, tree: &str, prefix: &[u8]) -> Entries {
        let end = match successor(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        self.range(tree, Bound::Included(prefix.to_vec()), end)
    }
}

/// The smallest key greater than every key starting with `prefix` (none for all-0xff).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// [`Store`] on a sled database.
#[derive(Debug)]
pub struct SledStore {
    db: sled::Db,
    /// Trees known to exist, by name (sled creates a tree when it is opened, and listing the
    /// names on every read is slow).
    open: RwLock<HashMap<String, sled::Tree>>,
    /// Writes are refused while this directory's disk has less free space (bytes).
    floor: Option<(PathBuf, u64)>,
    /// Why the store stopped taking writes for good, once it did.
    failed: OnceLock<String>,
    /// Why the store takes no writes for now: a flush outlived its deadline and still runs.
    paused: RwLock<Option<String>>,
}

impl SledStore {
    /// Wraps an open database, with no free-space floor.
    pub fn new(db: sled::Db) -> Self {
        Self {
            db,
            open: RwLock::default(),
            floor: None,
            failed: OnceLock::new(),
            paused: RwLock::new(None),
        }
    }

    /// Refuses writes while `dir`'s file system has fewer than `min_free` bytes free for
    /// unprivileged users (0: no floor).
    pub fn with_floor(mut self, dir: PathBuf, min_free: u64) -> Self {
        self.floor = (min_free > 0).then_some((dir, min_free));
        self
    }

    /// What is wrong with the disk, for the node's health: `Err` while the store takes no
    /// writes (for good, or until a late flush completes), `Ok(Some)` while it waits for free
    /// space, `Ok(None)` when all is well.
    pub fn disk_problem(&self) -> Result<Option<String>, String> {
        self.check_failed().map_err(|e| e.to_string())?;
        Ok(self.check_space().err().map(|e| e.to_string()))
    }

    fn check_failed(&self) -> Result<(), StoreError> {
        if let Some(why) = self.failed.get() {
            return Err(StoreError::Engine(why.clone()));
        }
        match self.paused.read_unpoisoned().as_ref() {
            Some(why) => Err(StoreError::Engine(why.clone())),
            None => Ok(()),
        }
    }

    /// Whether the floor allows a write (an unreadable free-space figure does not stop one).
    fn check_space(&self) -> Result<(), StoreError> {
        let Some((dir, min_free)) = &self.floor else {
            return Ok(());
        };
        let Ok(stat) = rustix::fs::statvfs(dir) else {
            return Ok(());
        };
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free >= *min_free {
            return Ok(());
        }
        const MIB: u64 = 1 << 20;
        Err(StoreError::DiskFull(format!(
            "disk full: the data dir {} has {} MiB free, below node.min_free_disk_mb = {}; \
             free disk space there (writes resume by themselves) or lower node.min_free_disk_mb",
            dir.display(),
            free / MIB,
            min_free / MIB
        )))
    }

    /// Passes a sled error on, and stops taking writes when it was the disk's.
    fn engine_error(&self, e: sled::Error) -> StoreError {
        if let sled::Error::Io(io) = &e {
            let why = format!("a write to disk failed ({io})");
            self.fail(&why);
            return StoreError::Engine(failure(&why));
        }
        StoreError::Engine(e.to_string())
    }

    /// The tree if it exists; reads never create trees.
    fn tree(&self, tree: &str) -> Result<Option<sled::Tree>, StoreError> {
        if let Some(t) = self.open.read_unpoisoned().get(tree) {
            return Ok(Some(t.clone()));
        }
        let exists = self
            .db
            .tree_names()
            .iter()
            .any(|n| n.as_ref() == tree.as_bytes());
        if exists {
            Ok(Some(self.create(tree)?))
        } else {
            Ok(None)
        }
    }

    /// The tree, created when missing.
    fn create(&self, tree: &str) -> Result<sled::Tree, StoreError> {
        if let Some(t) = self.open.read_unpoisoned().get(tree) {
            return Ok(t.clone());
        }
        let t = self.db.open_tree(tree)?;
        self.open
            .write_unpoisoned()
            .insert(tree.to_owned(), t.clone());
        Ok(t)
    }
}

impl Store for SledStore {
    fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.tree(tree)? {
            Some(t) => Ok(t.get(key)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    fn range(&self, tree: &str, from: Bound<Vec<u8>>, to: Bound<Vec<u8>>) -> Entries {
        match self.tree(tree) {
            Ok(Some(t)) => Box::new(t.range::<Vec<u8>, _>((from, to)).map(|item| {
                item.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            })),
            Ok(None) => Box::new(std::iter::empty()),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }

    fn commit(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        use sled::Transactional;
        self.check_failed()?;
        self.check_space()?;
        let mut names: Vec<&str> = Vec::new();
        let mut batches: Vec<sled::Batch> = Vec::new();
        for write in &writes {
            let (name, key, value) = match write {
                Write::Put(tree, key, value) => (tree, key, Some(value)),
                Write::Delete(tree, key) => (tree, key, None),
            };
            let slot = match names.iter().position(|n| *n == name) {
                Some(slot) => slot,
                None => {
                    names.push(name);
                    batches.push(sled::Batch::default());
                    names.len() - 1
                }
            };
            match value {
                Some(value) => batches[slot].insert(key.as_slice(), value.as_slice()),
                None => batches[slot].remove(key.as_slice()),
            }
        }
        match names.as_slice() {
            [] => Ok(()),
            // One tree: its batch is atomic on its own, no transaction needed.
            [one] => self
                .create(one)?
                .apply_batch(batches.remove(0))
                .map_err(|e| self.engine_error(e)),
            _ => {
                let trees = names
                    .iter()
                    .map(|n| self.create(n))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&sled::Tree> = trees.iter().collect();
                refs.as_slice()
                    .transaction(|views| {
                        for (view, batch) in views.iter().zip(&batches) {
                            view.apply_batch(batch)?;
                        }
                        Ok(())
                    })
                    .map_err(|e: sled::transaction::TransactionError<()>| match e {
                        sled::transaction::TransactionError::Storage(e) => self.engine_error(e),
                        sled::transaction::TransactionError::Abort(()) => {
                            StoreError::Engine("transaction aborted".into())
                        }
                    })
            }
        }
    }

    fn trees(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .db
            .tree_names()
            .iter()
            .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_owned))
            .collect())
    }

    fn drop_tree(&self, tree: &str) -> Result<(), StoreError> {
        self.open.write_unpoisoned().remove(tree);
        self.db.drop_tree(tree)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        self.db.flush().map_err(|e| self.engine_error(e))?;
        Ok(())
    }

    fn fail(&self, why: &str) {
        let why = failure(why);
        if self.failed.set(why.clone()).is_ok() {
            tracing::error!(error = %why, "storage stopped taking writes");
        }
    }

    fn pause_writes(&self, why: &str) {
        let why = pause(why);
        tracing::error!(error = %why, "storage paused writes");
        *self.paused.write_unpoisoned() = Some(why);
    }

    fn resume_writes(&self) {
        if self.paused.write_unpoisoned().take().is_some() {
            tracing::info!("storage takes writes again: the late flush completed");
        }
    }
}

/// The message of a store that stopped taking writes because of `why`.
fn failure(why: &str) -> String {
    format!(
        "stopped taking writes: {why}; this node takes no more writes until it restarts: free \
         disk space or fix the disk, then restart the node (what was stored before is kept)"
    )
}

/// The message of a store that takes no writes until a late flush completes.
fn pause(why: &str) -> String {
    format!(
        "writes paused: {why}; they resume by themselves when that flush completes; if they do \
         not, free disk space or fix the disk, then restart the node (what was stored before is \
         kept)"
    )
}

/// Flushes `store` to disk on the blocking pool. Not with sled's `flush_async`: concurrent
/// `flush_async` calls deadlock in sled 0.34 (spacejam/sled#1308). A flush that takes longer
/// than [`FLUSH_DEADLINE`] pauses the store's writes until it completes: sled never returns from
/// a flush after a failed write, but a slow one may yet return.
pub(crate) async fn flush(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    flush_within(store, FLUSH_DEADLINE).await
}

/// [`flush`] with its deadline. The deadline starts when a blocking thread starts the flush, not
/// when the flush is queued: a pool busy with other blocking work is not a failing disk.
async fn flush_within(store: &Arc<dyn Store>, deadline: Duration) -> Result<(), StoreError> {
    let blocking = store.clone();
    let (started, on_started) = tokio::sync::oneshot::channel();
    let mut flushing = tokio::task::spawn_blocking(move || {
        let _ = started.send(());
        blocking.flush()
    });
    if on_started.await.is_err() {
        // The closure never ran: the runtime is shutting down.
        return match flushing.await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Engine(format!("flush task: {e}"))),
        };
    }
    match tokio::time::timeout(deadline, &mut flushing).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(StoreError::Engine(format!("flush task: {e}"))),
        Err(_) => {
            let why = format!(
                "a flush to disk did not finish within {} s (is the disk full or failing?)",
                deadline.as_secs_f64()
            );
            store.pause_writes(&why);
            // Paused before this watch starts, so a flush that completes at once still resumes.
            let late = store.clone();
            tokio::spawn(async move {
                if let Ok(Ok(())) = flushing.await {
                    late.resume_writes();
                }
            });
            Err(StoreError::Engine(pause(&why)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        (dir, SledStore::new(db))
    }

    fn keys(entries: Entries) -> Vec<Vec<u8>> {
        entries.map(|e| e.expect("entry").0).collect()
    }

    #[test]
    fn a_commit_spans_trees_and_applies_in_order() {
        let (_dir, s) = store();
        s.commit(vec![
            Write::Put("a".into(), b"k".to_vec(), b"1".to_vec()),
            Write::Put("b".into(), b"k".to_vec(), b"2".to_vec()),
            Write::Put("a".into(), b"k".to_vec(), b"3".to_vec()),
            Write::Put("b".into(), b"gone".to_vec(), b"x".to_vec()),
            Write::Delete("b".into(), b"gone".to_vec()),
        ])
        .expect("commit");
        assert_eq!(s.get("a", b"k").expect("get"), Some(b"3".to_vec()));
        assert_eq!(s.get("b", b"k").expect("get"), Some(b"2".to_vec()));
        assert_eq!(s.get("b", b"gone").expect("get"), None);
        s.flush().expect("flush");
    }

    #[test]
    fn reads_never_create_trees() {
        let (_dir, s) = store();
        assert_eq!(s.get("nope", b"k").expect("get"), None);
        assert_eq!(keys(s.scan_prefix("nope", b"")).len(), 0);
        assert!(!s.trees().expect("trees").contains(&"nope".to_owned()));
        s.commit(vec![Write::Put("t".into(), b"k".to_vec(), vec![])])
            .expect("commit");
        assert!(s.trees().expect("trees").contains(&"t".to_owned()));
        s.drop_tree("t").expect("drop");
        assert_eq!(s.get("t", b"k").expect("get"), None);
    }

    #[test]
    fn ranges_and_prefixes_are_ordered_from_both_ends() {
        let (_dir, s) = store();
        let writes = [&b"a\xff"[..], b"a\xff\xff", b"ab", b"b", b"a"]
            .iter()
            .map(|k| Write::Put("t".into(), k.to_vec(), vec![]))
            .collect();
        s.commit(writes).expect("commit");
        assert_eq!(
            keys(s.scan_prefix("t", b"a")),
            vec![
                b"a".to_vec(),
                b"ab".to_vec(),
                b"a\xff".to_vec(),
                b"a\xff\xff".to_vec()
            ]
        );
        assert_eq!(
            keys(s.scan_prefix("t", b"a\xff")),
            vec![b"a\xff".to_vec(), b"a\xff\xff".to_vec()]
        );
        let last = s
            .range("t", Bound::Unbounded, Bound::Excluded(b"a\xff".to_vec()))
            .next_back()
            .expect("some")
            .expect("entry");
        assert_eq!(last.0, b"ab".to_vec());
        assert_eq!(successor(b"\xff\xff"), None);
    }

    #[test]
    fn below_the_floor_writes_are_refused_naming_the_setting_and_reads_go_on() {
        let (dir, s) = store();
        s.commit(vec![Write::Put("t".into(), b"k".to_vec(), b"v".to_vec())])
            .expect("commit");
        let s = s.with_floor(dir.path().to_owned(), u64::MAX / 2);
        let e = s
            .commit(vec![Write::Put("t".into(), b"k2".to_vec(), vec![])])
            .expect_err("below the floor");
        assert!(matches!(e, StoreError::DiskFull(_)), "{e:?}");
        assert!(e.to_string().contains("node.min_free_disk_mb"), "{e}");
        assert_eq!(s.get("t", b"k").expect("get"), Some(b"v".to_vec()));
        assert!(matches!(s.disk_problem(), Ok(Some(_))));
        s.flush().expect("a flush is still allowed");
        let s = s.with_floor(dir.path().to_owned(), 1);
        s.commit(vec![Write::Put("t".into(), b"k2".to_vec(), vec![])])
            .expect("room again");
        assert_eq!(s.disk_problem(), Ok(None));
    }

    #[test]
    fn a_failed_store_refuses_writes_and_flushes_at_once_until_restarted() {
        let (dir, s) = store();
        s.commit(vec![Write::Put("t".into(), b"k".to_vec(), b"v".to_vec())])
            .expect("commit");
        s.fail("a write to disk failed (No space left on device)");
        for e in [
            s.commit(vec![Write::Put("t".into(), b"k2".to_vec(), vec![])])
                .expect_err("failed"),
            s.flush().expect_err("failed"),
        ] {
            assert!(matches!(e, StoreError::Engine(_)), "{e:?}");
            assert!(e.to_string().contains("restart the node"), "{e}");
        }
        assert!(s.disk_problem().is_err());
        assert_eq!(s.get("t", b"k").expect("get"), Some(b"v".to_vec()));
        drop(s);
        // sled's background flusher lets go of the file lock a moment after the last handle
        // is dropped: poll for the reopen with a deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let db = loop {
            match sled::open(dir.path()) {
                Ok(db) => break db,
                Err(e) => assert!(std::time::Instant::now() < deadline, "reopen: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20)); // poll interval
        };
        let s = SledStore::new(db);
        assert_eq!(s.get("t", b"k").expect("get"), Some(b"v".to_vec()));
        s.commit(vec![Write::Put("t".into(), b"k2".to_vec(), vec![])])
            .expect("a restart clears it");
    }

    fn put(store: &dyn Store, key: &str) -> Result<(), StoreError> {
        store.commit(vec![Write::Put("t".into(), key.into(), b"v".to_vec())])
    }

    /// Issue 26, point 8: the flush deadline counted the time a flush waited for a blocking
    /// thread, so a pool busy with other work failed the store until a restart.
    #[test]
    fn a_flush_queued_behind_a_busy_blocking_pool_is_not_timed_out() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .max_blocking_threads(1)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let (_dir, s) = store();
            let s = Arc::new(s);
            let dyn_store: Arc<dyn Store> = s.clone();
            put(&*s, "k").expect("commit");
            // Take the pool's only thread until the test lets go of it.
            let (taken, on_taken) = tokio::sync::oneshot::channel();
            let (release, on_release) = std::sync::mpsc::channel::<()>();
            let busy = tokio::task::spawn_blocking(move || {
                let _ = taken.send(());
                let _ = on_release.recv();
            });
            on_taken.await.expect("the pool's thread is taken");
            let deadline = Duration::from_millis(100);
            let flushing = tokio::spawn({
                let store = dyn_store.clone();
                async move { flush_within(&store, deadline).await }
            });
            // The flush waits in the queue three times its deadline: what is being tested.
            tokio::time::sleep(deadline * 3).await;
            release.send(()).expect("release the pool");
            busy.await.expect("busy task");
            flushing
                .await
                .expect("flush task")
                .expect("a flush's deadline starts when the flush starts");
            assert_eq!(s.disk_problem(), Ok(None));
            put(&*s, "k2").expect("writes go on");
        });
    }

    /// A sled store whose flushes take until the test lets them go on.
    struct LateFlush {
        inner: SledStore,
        gate: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl Store for LateFlush {
        fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(tree, key)
        }
        fn range(&self, tree: &str, from: Bound<Vec<u8>>, to: Bound<Vec<u8>>) -> Entries {
            self.inner.range(tree, from, to)
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
            // As `SledStore::flush`, with the wait where the disk would be slow.
            self.inner.check_failed()?;
            let _ = self.gate.lock().expect("gate").recv();
            self.inner.db.flush()?;
            Ok(())
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

    /// Issue 26, point 8: a flush past its deadline refused writes until a restart, even when
    /// the disk was only slow and the flush completed a moment later.
    #[tokio::test]
    async fn a_store_whose_flush_was_late_takes_writes_again_once_it_completes() {
        let (_dir, inner) = store();
        let (release, gate) = std::sync::mpsc::channel();
        let s = Arc::new(LateFlush {
            inner,
            gate: std::sync::Mutex::new(gate),
        });
        let dyn_store: Arc<dyn Store> = s.clone();
        put(&*s, "k").expect("commit");
        let late = flush_within(&dyn_store, Duration::from_millis(50))
            .await
            .expect_err("past its deadline");
        assert!(late.to_string().contains("did not finish within"), "{late}");
        let refused = put(&*s, "k2").expect_err("writes paused while the flush runs");
        assert!(
            refused.to_string().contains("resume by themselves"),
            "{refused}"
        );
        assert!(s.inner.disk_problem().is_err());
        release.send(()).expect("let the flush complete");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while put(&*s, "k2").is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "writes never resumed after the late flush completed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await; // poll interval
        }
        assert_eq!(s.inner.disk_problem(), Ok(None));
        assert_eq!(s.get("t", b"k").expect("get"), Some(b"v".to_vec()));
    }
}
