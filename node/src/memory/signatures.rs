//! Records that say who wrote them, in the memory: this node signs every replicated record it
//! writes ([`Memory::sign`], called by `put`); a message that carries records carries the
//! certificates of their origins ([`Memory::certificates_for`]: ours, and those this node
//! verified and kept in its local `mem_certs` tree so it can pass them on); and every record
//! from a peer, whether written by the sender or relayed from a third node, has its signature
//! checked against its origin's certificate before it is applied ([`Memory::apply_from`]). A
//! record that does not verify is refused, counted (`agentmesh_memory_records_refused_total` by
//! reason) and logged once a minute per relaying peer and claimed origin; the rest of its batch
//! still applies. Also the one-time upgrade of a store written before records were signed
//! ([`Memory::sign_stored`]).
//!
//! It checks and signs; which record wins is `record`'s rule, when to sync is `sync`'s, and the
//! cryptography (what a certificate vouches for) is `mesh_identity::origin`'s.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use mesh_domain::{NodeId, sync::MutexExt};
use mesh_identity::OriginError;

use super::{
    error::MemoryError,
    record::{Entry, Record},
    store::{META, Memory, ns_tree, unindex},
};
use crate::{metrics::metrics, storage::Write};

/// Origin id → the DER certificate of that origin this node verified, to pass on with the
/// origin's records when it relays them. Local to this node, never replicated.
pub(super) const CERTS: &str = "mem_certs";
/// Meta flag: the store's records are signed (the upgrade of [`Memory::sign_stored`] is done).
const SIGNED_KEY: &[u8] = b"signed";
/// How often a refusal of one relaying peer's records in one origin's name is logged.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Most (peer, origin) pairs whose last refusal log is remembered.
const MAX_LOGGED_PAIRS: usize = 1024;

impl Memory {
    /// This node's signature over the record it writes at `ns`/`key`.
    pub(super) fn sign(&self, ns: &str, key: &str, record: &Record) -> Result<Vec<u8>, MemoryError> {
        let entry = Entry {
            namespace: ns.to_owned(),
            key: key.to_owned(),
            record: record.clone(),
        };
        Ok(self.signer.sign(&entry.signed_bytes())?)
    }

    /// The certificates a message carrying `entries` carries: one per origin, ours for our own
    /// records and the kept one for each other origin (an origin whose certificate this node
    /// does not hold is left out; the receiver may know it already).
    pub fn certificates_for(&self, entries: &[Entry]) -> Vec<Vec<u8>> {
        let origins: BTreeSet<&NodeId> = entries.iter().map(|e| &e.record.origin).collect();
        origins
            .into_iter()
            .filter_map(|origin| {
                if origin == &self.own {
                    return Some(self.signer.certificate().to_vec());
                }
                self.store
                    .get(CERTS, origin.as_str().as_bytes())
                    .ok()
                    .flatten()
            })
            .collect()
    }

    /// Applies records that peer `from` sent (its own writes, or relayed from third nodes), with
    /// the certificates that came with them: each record's signature is checked against its
    /// origin's certificate first, and only records that verify reach last-writer-wins. The
    /// result for each record, in order.
    pub(super) fn apply_from(
        &self,
        from: Option<&NodeId>,
        entries: &[Entry],
        certificates: &[Vec<u8>],
    ) -> Vec<Result<bool, MemoryError>> {
        let checked = self.verify_from(from, entries, certificates);
        let verified: Vec<Entry> = entries
            .iter()
            .zip(&checked)
            .filter(|(_, check)| check.is_ok())
            .map(|(entry, _)| entry.clone())
            .collect();
        let mut applied = self.apply_all(&verified).into_iter();
        checked
            .into_iter()
            .map(|check| match check {
                Ok(()) => applied.next().unwrap_or(Ok(false)),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Checks each record's signature; learns (and keeps, for relaying) the certificates of
    /// the origins the records name. Counts and logs refusals.
    fn verify_from(
        &self,
        from: Option<&NodeId>,
        entries: &[Entry],
        certificates: &[Vec<u8>],
    ) -> Vec<Result<(), MemoryError>> {
        let named: BTreeSet<&NodeId> = entries.iter().map(|e| &e.record.origin).collect();
        let mut keep = Vec::new();
        for certificate in certificates {
            // A certificate that vouches for nothing is not an error by itself: the records in
            // its name fail below, with the reason counted there.
            if let Ok(origin) = self.verifier.learn(certificate)
                && named.contains(&origin)
                && origin != self.own
                && self
                    .store
                    .get(CERTS, origin.as_str().as_bytes())
                    .ok()
                    .flatten()
                    .is_none_or(|kept| &kept != certificate)
            {
                keep.push(Write::Put(
                    CERTS.into(),
                    origin.as_str().as_bytes().to_vec(),
                    certificate.clone(),
                ));
            }
        }
        if !keep.is_empty()
            && let Err(e) = self.store.commit(keep)
        {
            tracing::warn!(error = %e, "keep origin certificates for relaying");
        }
        let mut refused: HashMap<(&NodeId, &'static str), (usize, OriginError)> = HashMap::new();
        let results = entries
            .iter()
            .map(|entry| {
                let origin = &entry.record.origin;
                if !self.verifier.knows(origin)
                    && let Ok(Some(kept)) = self.store.get(CERTS, origin.as_str().as_bytes())
                {
                    let _ = self.verifier.learn(&kept);
                }
                let checked = self.verifier.verify(
                    origin,
                    entry.record.written_at(),
                    &entry.signed_bytes(),
                    &entry.record.signature,
                );
                checked.map_err(|e| {
                    let reason = refusal_reason(&e);
                    refused.entry((origin, reason)).or_insert((0, e.clone())).0 += 1;
                    MemoryError::Unverified(e)
                })
            })
            .collect();
        for ((origin, reason), (count, error)) in refused {
            metrics()
                .memory_records_refused
                .get_or_create(&crate::metrics::labels(&[("reason", reason)]))
                .inc_by(count as u64);
            if self.first_refusal_in_a_while(from, origin) {
                tracing::warn!(
                    peer = from.map_or("(undeclared)", NodeId::short), origin = %origin.short(), records = count, reason, %error,
                    "refused replicated records: the origin's signature does not vouch for them (the peer sent records in another node's name that it cannot prove)"
                );
            }
        }
        results
    }

    /// Whether a refusal of `from`'s records in `origin`'s name should be logged now.
    fn first_refusal_in_a_while(&self, from: Option<&NodeId>, origin: &NodeId) -> bool {
        let mut logged = self.refusals_logged.lock_unpoisoned();
        let pair = (from.cloned(), origin.clone());
        if logged.get(&pair).is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return false;
        }
        if logged.len() >= MAX_LOGGED_PAIRS {
            logged.retain(|_, at| at.elapsed() < LOG_EVERY);
        }
        logged.insert(pair, Instant::now());
        true
    }

    /// The one-time upgrade of a store written before records were signed: signs this node's
    /// own records in place; takes other nodes' unsigned records out of the `(origin, seq)`
    /// index (they stay readable here, but this node never relays what it cannot prove, and the
    /// writer's signed copy replaces each, see [`Record::supersedes`]); and forgets every
    /// watermark, so the next sync with each peer fetches those signed copies. Nothing stored
    /// is dropped. Returns (own records signed, others' records left unsigned).
    pub fn sign_stored(&self) -> Result<(usize, usize), MemoryError> {
        if self.meta_u64(SIGNED_KEY).is_some() {
            return Ok((0, 0));
        }
        let (mut signed, mut unsigned) = (0, 0);
        for ns in self.replicated_namespaces()? {
            let tree = ns_tree(&ns);
            let mut writes = Vec::new();
            for item in self.store.scan_prefix(&tree, b"") {
                let (key, bytes) = item?;
                let Ok(mut record) = Record::decode(&bytes) else {
                    continue;
                };
                if !record.signature.is_empty() {
                    continue;
                }
                if record.origin == self.own {
                    let key = String::from_utf8_lossy(&key).into_owned();
                    record.signature = self.sign(&ns, &key, &record)?;
                    writes.push(Write::Put(tree.clone(), key.into_bytes(), record.encode()));
                    signed += 1;
                } else {
                    unindex(&mut writes, &record);
                    unsigned += 1;
                }
            }
            let _writer = self.write_lock();
            self.store.commit(writes)?;
        }
        let mut writes: Vec<Write> = self
            .store
            .scan_prefix(META, b"wm/")
            .filter_map(|item| item.ok())
            .map(|(key, _)| Write::Delete(META.into(), key))
            .collect();
        writes.push(Write::Put(
            META.into(),
            SIGNED_KEY.to_vec(),
            1u64.to_be_bytes().to_vec(),
        ));
        self.store.commit(writes)?;
        Ok((signed, unsigned))
    }
}

/// The `reason` label a refusal is counted under.
fn refusal_reason(error: &OriginError) -> &'static str {
    match error {
        OriginError::BadSignature(_) | OriginError::Signing(_) => "signature",
        OriginError::WrittenAfterExpiry(_) => "expired",
        OriginError::Certificate(_)
        | OriginError::NotFromCa(_)
        | OriginError::ClientCertificate(_)
        | OriginError::UnknownOrigin(_) => "certificate",
    }
}
