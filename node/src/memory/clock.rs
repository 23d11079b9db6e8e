//! The hybrid logical clock: how a node's HLC is built from its id, the skew bound that refuses
//! a peer's record stamped further ahead of this node's clock than `memory.max_clock_skew_ms`,
//! and the `clock` health reason that names those writers. It judges stamps only: which record
//! wins is `record`'s rule, and it stores nothing but the recent refusals it reports.

use std::time::Duration;

use mesh_domain::{NodeId, sync::MutexExt};

use super::{
    error::MemoryError,
    record::{Entry, Record},
    store::Memory,
};

impl Memory {
    /// The HLC of node `own`: stamps its writes, and refuses a stamp more than `max_skew` ahead
    /// of the system clock.
    pub(super) fn new_clock(own: &NodeId, max_skew: Duration) -> uhlc::HLC {
        uhlc::HLCBuilder::new()
            .with_id(hlc_id(own))
            .with_max_delta(max_skew)
            .build()
    }

    /// The writers whose records this node refused lately as stamped too far ahead of its
    /// clock, as a health reason (`None` once none was refused for two sync rounds, since a
    /// refused record is fetched again every round).
    pub fn clock_problem(&self) -> Option<String> {
        let recent = self
            .sync_interval
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(5));
        let mut ahead = self.ahead.lock_unpoisoned();
        ahead.retain(|_, (_, at)| at.elapsed() < recent);
        if ahead.is_empty() {
            return None;
        }
        let writers: Vec<String> = ahead
            .iter()
            .map(|(origin, (by, _))| format!("{} by {} ms", origin.short(), by.as_millis()))
            .collect();
        Some(format!(
            "records from {} are stamped ahead of this node's clock by more than \
             memory.max_clock_skew_ms = {}; they are refused until the clocks agree: check the \
             clocks of these nodes and this one (NTP)",
            writers.join(", "),
            self.max_skew.as_millis()
        ))
    }

    /// The stamp of a local write that replaces `old`: the clock's next stamp, or just past
    /// `old`'s when `old` is stamped at or ahead of it (a peer's record stamped within the
    /// allowed skew ahead of a clock that a restart started afresh). A local write never loses
    /// to the record it replaces: it would be stored here while every other node kept the
    /// newer record, and the two would disagree on the key for good. Called under the writer
    /// lock, so no record can land between the read of `old` and the stamp.
    pub(super) fn stamp_after(&self, old: Option<&Record>) -> Result<u64, MemoryError> {
        let next = self.hlc.new_timestamp().get_time().as_u64();
        let Some(old) = old.filter(|old| old.hlc >= next) else {
            return Ok(next);
        };
        let past = old.hlc.checked_add(1).ok_or_else(|| {
            MemoryError::Invalid(format!(
                "the record stored at this key (written by {}) is stamped at the end of time; \
                 it cannot be replaced",
                old.origin.short()
            ))
        })?;
        // Later stamps follow it (refused only beyond the skew bound; this one stands anyway).
        let _ = self
            .hlc
            .update_with_timestamp(&uhlc::Timestamp::new(uhlc::NTP64(past), hlc_id(&self.own)));
        Ok(past)
    }

    /// Moves this node's clock up to the stamp of a record from another node, or refuses the
    /// record when it is stamped further ahead than the allowed skew: logged, and its writer
    /// kept for [`Memory::clock_problem`].
    pub(super) fn check_stamp(&self, entry: &Entry) -> Result<(), MemoryError> {
        let stamp =
            uhlc::Timestamp::new(uhlc::NTP64(entry.record.hlc), hlc_id(&entry.record.origin));
        if self.hlc.update_with_timestamp(&stamp).is_err() {
            let now = uhlc::system_time_clock();
            let ahead = uhlc::NTP64(entry.record.hlc.saturating_sub(now.as_u64())).to_duration();
            let error = MemoryError::FromTheFuture {
                origin: entry.record.origin.short().to_owned(),
                ahead_ms: ahead.as_millis() as u64,
                max_ms: self.max_skew.as_millis() as u64,
            };
            tracing::warn!(namespace = %entry.namespace, key = %entry.key, error = %error, "refused a replicated record");
            self.ahead.lock_unpoisoned().insert(
                entry.record.origin.clone(),
                (ahead, std::time::Instant::now()),
            );
            return Err(error);
        }
        Ok(())
    }
}

fn hlc_id(id: &NodeId) -> uhlc::ID {
    let bytes = hex_prefix(id);
    uhlc::ID::try_from(&bytes[..]).unwrap_or_else(|_| uhlc::ID::rand())
}

fn hex_prefix(id: &NodeId) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, chunk) in id.as_str().as_bytes().chunks(2).take(16).enumerate() {
        let text = std::str::from_utf8(chunk).unwrap_or("00");
        out[i] = u8::from_str_radix(text, 16).unwrap_or(0);
    }
    if out.iter().all(|b| *b == 0) {
        out[0] = 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        memory::{
            store::MemoryOptions,
            test_support::{id, record, signer, verifier},
        },
        storage::{SledStore, Store},
    };

    /// Regression: a local write took its stamp before the writer lock and never compared it
    /// with what it replaced, so after a restart (a fresh clock) a write over a peer's record
    /// stamped a little ahead was stored with the older stamp: this node kept its write, the
    /// writer kept its own newer record, and neither ever took the other's.
    #[tokio::test]
    async fn a_local_write_over_a_newer_replicated_record_wins_and_both_nodes_converge() {
        use crate::memory::{
            sync::sync_from,
            test_support::{InProcess, open_memory, signed},
        };
        let (a, b) = (id("clock-a"), id("clock-b"));
        let (_da, ma) = open_memory(&a, MemoryOptions::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let open_b = || {
            let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
            Memory::open(db, signer(&b), verifier(), MemoryOptions::default()).0
        };
        // a's write, stamped 400 ms ahead (within the 500 ms skew), reaches b.
        let ahead = uhlc::system_time_clock().as_u64()
            + uhlc::NTP64::from(Duration::from_millis(400)).as_u64();
        let theirs = signed(Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: record(ahead, &a, false),
        });
        assert!(ma.apply(&theirs).expect("a holds its write"));
        {
            let mb = open_b();
            assert!(mb.apply(&theirs).expect("b takes a's write"));
        }
        // b restarts (its clock starts from the system time again) and writes the key at once.
        let mb = open_b();
        let ours = mb
            .put("notes", "k", Some(b"b's".to_vec()))
            .await
            .expect("put");
        assert!(
            ours.wins_over(&theirs.record),
            "a local write wins over what it replaces"
        );
        let link = InProcess::default();
        link.0
            .lock()
            .expect("lock")
            .insert(a.to_string(), ma.clone());
        link.0
            .lock()
            .expect("lock")
            .insert(b.to_string(), mb.clone());
        sync_from(&ma, &link, &b, b.as_str())
            .await
            .expect("a pulls");
        sync_from(&mb, &link, &a, a.as_str())
            .await
            .expect("b pulls");
        let on = |m: &Memory| m.get("notes", "k").expect("get").expect("k").value;
        assert_eq!(on(&ma), b"b's");
        assert_eq!(on(&mb), b"b's");
    }

    #[tokio::test]
    async fn a_record_from_the_far_future_is_refused_and_its_writer_named_in_health() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
        let (memory, _writes) =
            Memory::open(db, signer(&id("me")), verifier(), MemoryOptions::default());
        assert_eq!(memory.clock_problem(), None);
        let future = uhlc::system_time_clock().as_u64()
            + uhlc::NTP64::from(Duration::from_secs(60)).as_u64();
        let entry = Entry {
            namespace: "notes".into(),
            key: "k".into(),
            record: record(future, &id("other"), false),
        };
        assert!(matches!(
            memory.apply(&entry),
            Err(MemoryError::FromTheFuture { .. })
        ));
        assert!(memory.get("notes", "k").expect("get").is_none());
        let problem = memory.clock_problem().expect("a clock reason");
        assert!(problem.contains(id("other").short()), "{problem}");
        assert!(
            problem.contains("memory.max_clock_skew_ms = 500"),
            "{problem}"
        );
    }
}
