//! What memory needs from a storage engine, and sled behind it.
//!
//! [`Store`] is an ordered key-value store of named trees with atomic multi-tree commits and an
//! explicit flush. `memory` talks to storage only through it, so the engine (sled 0.34, whose
//! stable line is old) can change without touching replication. Writers serialise above this
//! layer; a commit only has to be atomic, not a transaction.

use std::{collections::HashMap, ops::Bound, sync::RwLock};

/// A storage failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        Self(e.to_string())
    }
}

/// One write of a [`Store::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` in `tree` to the value.
    Put(String, Vec<u8>, Vec<u8>),
    /// Removes `key` from `tree`.
    Delete(String, Vec<u8>),
}

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Entries of a range, in key order from either end.
pub type Entries = Box<dyn DoubleEndedIterator<Item = Result<KeyValue, StoreError>> + Send>;

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
}

impl SledStore {
    /// Wraps an open database.
    pub fn new(db: sled::Db) -> Self {
        Self {
            db,
            open: RwLock::default(),
        }
    }

    /// The tree if it exists; reads never create trees.
    fn tree(&self, tree: &str) -> Result<Option<sled::Tree>, StoreError> {
        if let Some(t) = self
            .open
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tree)
        {
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
        if let Some(t) = self
            .open
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tree)
        {
            return Ok(t.clone());
        }
        let t = self.db.open_tree(tree)?;
        self.open
            .write()
            .unwrap_or_else(|p| p.into_inner())
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
            [one] => Ok(self.create(one)?.apply_batch(batches.remove(0))?),
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
                    .map_err(|e: sled::transaction::TransactionError<()>| {
                        StoreError(format!("{e:?}"))
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
        self.open
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tree);
        self.db.drop_tree(tree)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

/// Flushes the database behind `tree` to disk (sled keeps one log for all trees). Not with
/// `flush_async`: concurrent `flush_async` calls deadlock in sled 0.34 (spacejam/sled#1308) —
/// memory-bench froze a node with concurrent puts — so a blocking flush runs on the blocking
/// pool instead.
pub async fn flush_to_disk(tree: &sled::Tree) -> Result<(), sled::Error> {
    let tree = tree.clone();
    tokio::task::spawn_blocking(move || tree.flush())
        .await
        .map_err(|e| sled::Error::ReportableBug(format!("flush task: {e}")))??;
    Ok(())
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
}
