//! The hybrid logical clock: how a node's HLC is built from its id, the skew bound that refuses
//! a peer's record stamped further ahead of this node's clock than `memory.max_clock_skew_ms`,
//! and the `clock` health reason that names those writers. It judges stamps only: which record
//! wins is `record`'s rule, and it stores nothing but the recent refusals it reports.

use std::time::Duration;

use mesh_domain::{NodeId, sync::MutexExt};

use super::{error::MemoryError, record::Entry, store::Memory};

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
