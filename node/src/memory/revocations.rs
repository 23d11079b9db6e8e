//! Revocations in the memory: the CA-signed entries (namespace `revocations`, key = the revoked
//! certificate's id) are replicated like any record, and this file is where the memory acts on
//! them. Every node checks the CA's signature on every entry before it stores or believes it;
//! it loads them into the node's [`RevokedSet`] at start, so a revocation survives restarts; and
//! it refuses records whose origin is revoked and that are stamped after the revocation time,
//! whoever relays them. It decides nothing about connections (the gate, the TLS verifier and the
//! peer table consult the same set).

use mesh_cert::{Revocation, RevocationError, RevokedSet, revocation::MAX_REVOCATIONS};
use mesh_domain::keys::REVOCATIONS;

use super::{error::MemoryError, record::Entry, store::Memory};

/// Unix ms of an HLC stamp (NTP64: seconds in the high 32 bits, the fraction in the low 32).
pub(crate) fn stamp_ms(hlc: u64) -> u64 {
    (hlc >> 32) * 1000 + (((hlc & 0xffff_ffff) * 1000) >> 32)
}

fn log_revoked(revocation: &Revocation) {
    tracing::warn!(id = %revocation.id.short(), name = %revocation.name, revoked_at_ms = revocation.revoked_at_ms, reason = %revocation.reason, "certificate revoked by the mesh CA: refused from now on");
}

impl Memory {
    /// The certificates revoked in this mesh, as this node knows them.
    pub fn revoked(&self) -> &RevokedSet {
        self.verifier.revoked()
    }

    /// Records a CA-signed revocation (`Node.Revoke`): checks the signature, stores it so it
    /// replicates and survives restarts, and adds it to the revoked set. Returns the entry and
    /// whether it was new here.
    pub async fn revoke(&self, signed: &[u8]) -> Result<(Revocation, bool), MemoryError> {
        let revocation = self.revoked().verify(signed)?;
        let key = revocation.id.to_string();
        let stored = self
            .get(REVOCATIONS, &key)?
            .is_some_and(|r| !r.tombstone && self.revoked().verify(&r.value).is_ok());
        if !stored {
            self.put(REVOCATIONS, &key, Some(signed.to_vec())).await?;
        }
        let new = self.revoked().insert(revocation.clone())?;
        if new {
            log_revoked(&revocation);
        }
        Ok((revocation, new))
    }

    /// Loads the stored revocations into the revoked set (at start). An entry that does not
    /// verify is skipped and logged; returns how many were loaded.
    pub(super) fn load_revocations(&self) -> usize {
        let entries = match self.list(REVOCATIONS, "", MAX_REVOCATIONS) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "load revocations");
                return 0;
            }
        };
        let mut loaded = 0;
        for entry in entries {
            match self.revocation_in(&entry) {
                Ok(revocation) => match self.revoked().insert(revocation) {
                    Ok(_) => loaded += 1,
                    Err(e) => tracing::warn!(error = %e, "load revocations"),
                },
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "ignoring a stored revocation")
                }
            }
        }
        loaded
    }

    /// Checks a peer's record (its origin's signature already verified) against the
    /// revocations: refused when its origin is revoked and it is stamped after the revocation.
    pub(super) fn check_revocations(&self, entry: &Entry) -> Result<(), MemoryError> {
        let record = &entry.record;
        if let Some(at) = self.revoked().revoked_at(&record.origin)
            && stamp_ms(record.hlc) > at
        {
            return Err(MemoryError::Revoked(record.origin.short().to_owned()));
        }
        Ok(())
    }

    /// The writer rule of namespace `revocations` (see `writers`): a record must be a
    /// CA-signed entry for the certificate its key names, and is believed at once.
    pub(super) fn believe_revocation(&self, entry: &Entry) -> Result<(), MemoryError> {
        let revocation = self.revocation_in(entry)?;
        if self.revoked().insert(revocation.clone())? {
            log_revoked(&revocation);
        }
        Ok(())
    }

    /// The verified revocation a record of namespace `revocations` holds.
    fn revocation_in(&self, entry: &Entry) -> Result<Revocation, MemoryError> {
        if entry.record.tombstone {
            return Err(RevocationError::Malformed("a revocation cannot be deleted".into()).into());
        }
        let revocation = self.revoked().verify(&entry.record.value)?;
        if revocation.id.as_str() != entry.key {
            return Err(RevocationError::Malformed(format!(
                "stored under `{}` but revokes {}",
                entry.key, revocation.id
            ))
            .into());
        }
        Ok(revocation)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mesh_domain::NodeId;

    use super::*;
    use crate::memory::{
        record::Record,
        store::MemoryOptions,
        sync::{SyncBatch, sync_from},
        test_support::{CannedPeer, certificate, id, open_memory, record, signed, tombstone_of},
    };

    /// A genuine write of `origin`'s at `notes`/`key`, stamped `ms` (Unix ms).
    fn write_at(origin: &NodeId, seq: u64, key: &str, ms: u64) -> Entry {
        let hlc = ((ms / 1000) << 32) | (((ms % 1000) << 32) / 1000);
        signed(Entry {
            namespace: "notes".into(),
            key: key.into(),
            record: Record {
                seq,
                value: b"v".to_vec(),
                ..record(hlc, origin, false)
            },
        })
    }

    #[tokio::test]
    async fn a_revoked_origins_records_written_after_the_revocation_are_refused_when_relayed() {
        let (me, revoked, relay) = (id("me"), id("revoked"), id("relay"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let at = stamp_ms(uhlc::system_time_clock().as_u64()) - 10_000;
        memory
            .revoked()
            .insert(Revocation {
                id: revoked.clone(),
                name: "revoked".into(),
                revoked_at_ms: at,
                reason: String::new(),
            })
            .expect("insert");
        let peer = CannedPeer::new(SyncBatch {
            entries: vec![
                write_at(&revoked, 1, "before", at - 1000),
                write_at(&revoked, 2, "after", at + 1000),
            ],
            heads: BTreeMap::from([(revoked.clone(), 2)]),
            certificates: certificate(&revoked),
            ..SyncBatch::default()
        });
        let applied = sync_from(&memory, &peer, &relay, "relay")
            .await
            .expect("sync");
        assert_eq!(applied, 1);
        assert_eq!(tombstone_of(&memory, "before"), Some(false), "kept");
        assert_eq!(tombstone_of(&memory, "after"), None, "refused");
    }

    #[test]
    fn stamps_convert_to_unix_ms() {
        assert_eq!(stamp_ms(0), 0);
        assert_eq!(stamp_ms(5 << 32), 5000);
        assert_eq!(stamp_ms((5 << 32) | (1 << 31)), 5500);
    }
}
