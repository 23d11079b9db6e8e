//! Who may write a durable task's journal ([`TASK_JOURNAL`], key layout in
//! `mesh_domain::journal`), checked on every replicated record of it after its signature, and
//! by the node appending before it writes ([`Memory::journal_epoch`]).
//!
//! - A lease only from the task's origin: the task id is a UUID its origin tagged, so a node
//!   certificate cannot take over another node's task by writing a higher epoch.
//! - A step is fenced: refused when this node knows a lease of a higher epoch that did not take
//!   it (its executor was superseded: a node stopped and resumed, or on the far side of a
//!   partition; the next epoch's lease names the steps of earlier epochs it continues from,
//!   which are taken however late they arrive), and when the lease of its own epoch names
//!   another executor. Unlike the writer rules, this reads what
//!   the node stores (the task's leases), so a step that arrives before the lease that
//!   supersedes it is applied; the readers of a journal take only the steps of the executor
//!   each epoch's lease names, up to where the next epoch took over (`tasks::journal`).
//! - A delete from the task's origin (which collects the journal when the task has ended), or
//!   from any node once the task is older than `JOURNAL_MAX_AGE_MS`.
//!
//! A refused step is counted (`agentmesh_memory_records_refused_total{reason="fenced"}`) and
//! counts as received, like a writer rule's refusal: epochs only rise, so no later copy of it
//! will be taken.

use mesh_domain::{
    NodeId,
    id::is_tagged_by,
    journal::{self, JOURNAL_MAX_AGE_MS, JournalKey, Lease, Step},
    keys::TASK_JOURNAL,
};

use super::{error::MemoryError, record::Entry, revocations::stamp_ms, store::Memory};

/// Most leases of one task read to find its current epoch (a task is resumed a few times).
const MAX_LEASES: usize = 64;

impl Memory {
    /// The highest lease this node holds of task `task_id`, if any.
    pub fn journal_epoch(&self, task_id: &str) -> Result<Option<Lease>, MemoryError> {
        Ok(self.journal_leases(task_id)?.into_iter().next_back())
    }

    /// The leases this node holds of task `task_id`, lowest epoch first.
    pub fn journal_leases(&self, task_id: &str) -> Result<Vec<Lease>, MemoryError> {
        let entries = self.list(TASK_JOURNAL, &journal::lease_prefix(task_id), MAX_LEASES)?;
        let mut leases: Vec<Lease> = entries
            .iter()
            .filter(|entry| !entry.record.tombstone)
            .filter_map(|entry| serde_json::from_slice::<Lease>(&entry.record.value).ok())
            .collect();
        leases.sort_by_key(|lease| lease.epoch);
        Ok(leases)
    }

    /// Whether `entry`, a peer's record of [`TASK_JOURNAL`] whose signature verified, may be
    /// applied.
    pub(super) fn task_journal(&self, entry: &Entry) -> Result<(), MemoryError> {
        let record = &entry.record;
        let writer = |why: String| MemoryError::Writer {
            place: format!("{}/{}", entry.namespace, entry.key),
            origin: record.origin.short().to_owned(),
            why,
        };
        let key = journal::parse_key(&entry.key)
            .ok_or_else(|| writer("not a task journal key".into()))?;
        let task_id = key.task_id();
        let from_origin = is_origin(task_id, &record.origin);
        if record.tombstone {
            let old = journal::task_started_ms(task_id).is_some_and(|started| {
                stamp_ms(record.hlc).saturating_sub(started) > JOURNAL_MAX_AGE_MS
            });
            return if from_origin || old {
                Ok(())
            } else {
                Err(writer(
                    "a task's journal is deleted only by its origin, or by any node once it is older than the journal's maximum age".into(),
                ))
            };
        }
        match key {
            JournalKey::Lease(_, epoch) => {
                if !from_origin {
                    return Err(writer(
                        "a lease is written only by the task's origin (the task id ends with that node's short id)".into(),
                    ));
                }
                let lease: Lease = serde_json::from_slice(&record.value)
                    .map_err(|e| writer(format!("not a lease: {e}")))?;
                if lease.epoch != epoch {
                    return Err(writer(format!(
                        "a lease of epoch {} under the key of epoch {epoch}",
                        lease.epoch
                    )));
                }
                Ok(())
            }
            JournalKey::Step(_, epoch, seq) => {
                serde_json::from_slice::<Step>(&record.value)
                    .map_err(|e| writer(format!("not a journal step: {e}")))?;
                let leases = self.journal_leases(task_id)?;
                let Some(current) = leases.last() else {
                    return Ok(());
                };
                // Whether a later epoch continues from this step (its lease names it).
                let taken = leases
                    .iter()
                    .filter(|lease| lease.epoch > epoch)
                    .any(|next| {
                        next.from
                            .iter()
                            .any(|(e, last)| *e == epoch && seq <= *last)
                    });
                if epoch < current.epoch && !taken {
                    return Err(MemoryError::Fenced {
                        place: format!("{}/{}", entry.namespace, entry.key),
                        origin: record.origin.short().to_owned(),
                        epoch,
                        current: current.epoch,
                    });
                }
                if epoch == current.epoch && current.executor != record.origin {
                    return Err(writer(format!(
                        "epoch {epoch}'s steps are appended only by {}, the executor its lease names",
                        current.executor_name
                    )));
                }
                Ok(())
            }
        }
    }
}

/// Whether `node` is the origin of task `task_id` (the node that tagged its id).
fn is_origin(task_id: &str, node: &NodeId) -> bool {
    uuid::Uuid::try_parse(task_id).is_ok() && is_tagged_by(task_id, node)
}
