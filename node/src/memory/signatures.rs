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
//! cryptography (what a certificate vouches for) is `mesh_cert::origin`'s.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use mesh_cert::OriginError;
use mesh_domain::{NodeId, sync::MutexExt};

use super::{
    error::MemoryError,
    index::unindex,
    record::{Entry, Record},
    store::{META, Memory, ns_tree},
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
    pub(super) fn sign(
        &self,
        ns: &str,
        key: &str,
        record: &Record,
    ) -> Result<Vec<u8>, MemoryError> {
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
    /// the certificates that came with them: each record that would change what is stored has
    /// its signature checked against its origin's certificate first, and only records that
    /// verify reach last-writer-wins. A record that would change nothing (this node holds it,
    /// or something that wins over it) is dropped without a check: checking is most of the
    /// cost of applying a record (tens of microseconds), and after a partition most records
    /// arrive more than once, relayed by every peer. The result for each record, in order.
    pub(super) fn apply_from(
        &self,
        from: Option<&NodeId>,
        entries: &[Entry],
        certificates: &[Vec<u8>],
    ) -> Vec<Result<bool, MemoryError>> {
        let changes: Vec<bool> = entries.iter().map(|e| self.would_change(e)).collect();
        let candidates: Vec<&Entry> = entries
            .iter()
            .zip(&changes)
            .filter_map(|(entry, change)| change.then_some(entry))
            .collect();
        let mut checks = self
            .verify_from(from, &candidates, certificates)
            .into_iter();
        // Per entry: `None` when it changes nothing, else its check.
        let plan: Vec<Option<Result<(), MemoryError>>> = changes
            .iter()
            .map(|change| change.then(|| checks.next().unwrap_or(Ok(()))))
            .collect();
        let verified: Vec<Entry> = entries
            .iter()
            .zip(&plan)
            .filter(|(_, check)| matches!(check, Some(Ok(()))))
            .map(|(entry, _)| entry.clone())
            .collect();
        let mut applied = self.apply_all(&verified).into_iter();
        plan.into_iter()
            .map(|check| match check {
                None => Ok(false),
                Some(Ok(())) => applied.next().unwrap_or(Ok(false)),
                Some(Err(e)) => Err(e),
            })
            .collect()
    }

    /// Whether `entry` would change what this node stores: its namespace is replicated here
    /// and it supersedes what is stored at its place (or nothing is).
    fn would_change(&self, entry: &Entry) -> bool {
        if !self.replicated(&entry.namespace) {
            return false;
        }
        match self.stored(&ns_tree(&entry.namespace), &entry.key) {
            Ok(Some(old)) => entry.record.supersedes(&old),
            // Nothing there, or a read error that applying will report.
            Ok(None) | Err(_) => true,
        }
    }

    /// Checks each record's signature; learns (and keeps, for relaying) the certificates of
    /// the origins the records name. Counts and logs refusals.
    fn verify_from(
        &self,
        from: Option<&NodeId>,
        entries: &[&Entry],
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
        let mut refused: HashMap<(&NodeId, &'static str), (usize, MemoryError)> = HashMap::new();
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
                checked
                    .map_err(MemoryError::Unverified)
                    .and_then(|()| self.check_revocations(entry))
                    .and_then(|()| self.check_writer(entry))
                    .inspect_err(|e| {
                        let reason = refusal_reason(e);
                        refused.entry((origin, reason)).or_insert((0, e.clone())).0 += 1;
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
                    "refused replicated records: the origin's signature does not vouch for them (the peer sent records in another node's name that it cannot prove), the origin was revoked before writing them, or it may not write them (a system namespace's writer rule)"
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
fn refusal_reason(error: &MemoryError) -> &'static str {
    let error = match error {
        MemoryError::Unverified(error) => error,
        MemoryError::Revoked(_) => return "revoked",
        MemoryError::Revocation(_) => return "revocation",
        MemoryError::TooManyNamespaces { .. } => return "namespaces",
        MemoryError::Writer { .. } => return "writer",
        MemoryError::Fenced { .. } => return "fenced",
        MemoryError::Invalid(_)
        | MemoryError::FromTheFuture { .. }
        | MemoryError::Corrupt(_)
        | MemoryError::Storage(_)
        | MemoryError::Reserved(_)
        | MemoryError::Private(_)
        | MemoryError::Resyncing => return "other",
    };
    match error {
        OriginError::BadSignature(_) | OriginError::Signing(_) => "signature",
        OriginError::WrittenAfterExpiry(_) => "expired",
        OriginError::Certificate(_)
        | OriginError::NotFromCa(_)
        | OriginError::ClientCertificate(_)
        | OriginError::UnknownOrigin(_) => "certificate",
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use super::*;
    use crate::memory::{
        store::MemoryOptions,
        sync::{SyncBatch, sync_from},
        test_support::{
            CannedPeer, InProcess, certificate, id, open_memory, record, signed, signer,
            tombstone_of, verifier,
        },
    };

    /// A write of `origin`'s, stamped now, at `notes`/`key`.
    fn write(origin: &NodeId, seq: u64, key: &str, value: &str) -> Entry {
        Entry {
            namespace: "notes".into(),
            key: key.into(),
            record: Record {
                seq,
                value: value.as_bytes().to_vec(),
                ..record(uhlc::system_time_clock().as_u64(), origin, false)
            },
        }
    }

    fn refused_total(reason: &str) -> u64 {
        metrics()
            .memory_records_refused
            .get_or_create(&crate::metrics::labels(&[("reason", reason)]))
            .get()
    }

    #[tokio::test]
    async fn a_relayed_record_forged_in_another_nodes_name_is_refused_and_the_genuine_ones_apply() {
        let (me, writer, relay) = (id("me"), id("writer"), id("relay"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let mut forged = write(&writer, 2, "forged", "lies");
        // The relay signs in the writer's name with the only key it has: its own.
        forged.record.signature = signer(&relay).sign(&forged.signed_bytes()).expect("sign");
        let batch = SyncBatch {
            entries: vec![
                signed(write(&writer, 1, "a", "1")),
                forged,
                signed(write(&writer, 3, "c", "3")),
            ],
            heads: BTreeMap::from([(writer.clone(), 3)]),
            // The writer's real certificate, which the relay passes on.
            certificates: certificate(&writer),
            ..SyncBatch::default()
        };
        let peer = CannedPeer::new(batch);
        let before = refused_total("signature");
        let applied = sync_from(&memory, &peer, &relay, "relay")
            .await
            .expect("sync");
        assert_eq!(applied, 2);
        assert_eq!(tombstone_of(&memory, "a"), Some(false));
        assert_eq!(tombstone_of(&memory, "c"), Some(false));
        assert_eq!(
            tombstone_of(&memory, "forged"),
            None,
            "the forgery is refused"
        );
        assert!(refused_total("signature") > before, "and counted");
        // The relay's watermark for the writer stays below the refused record (the head does
        // not lift it either), so the genuine write 2 is fetched when the relay has it.
        assert_eq!(memory.watermark(&relay, &writer), 1);
        peer.0.lock().expect("lock").entries = vec![signed(write(&writer, 2, "b", "2"))];
        sync_from(&memory, &peer, &relay, "relay")
            .await
            .expect("sync");
        assert_eq!(tombstone_of(&memory, "b"), Some(false));
        assert_eq!(memory.watermark(&relay, &writer), 3);
    }

    #[tokio::test]
    async fn a_pushed_record_whose_signature_is_for_other_bytes_or_another_key_is_refused() {
        let (me, sender, other) = (id("me"), id("sender"), id("other"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let certs = certificate(&sender);
        let genuine = signed(write(&sender, 1, "k", "v"));
        let mut tampered: Vec<(&str, Entry)> = Vec::new();
        let mut tamper = |what, change: &dyn Fn(&mut Entry)| {
            let mut entry = genuine.clone();
            change(&mut entry);
            tampered.push((what, entry));
        };
        tamper("value", &|e| e.record.value = b"w".to_vec());
        tamper("key", &|e| e.key = "other-key".into());
        tamper("namespace", &|e| e.namespace = "elsewhere".into());
        tamper("hlc", &|e| e.record.hlc += 1);
        tamper("seq", &|e| e.record.seq = 2);
        tamper("tombstone", &|e| e.record.tombstone = true);
        tamper("garbage signature", &|e| e.record.signature = vec![0; 64]);
        tamper("no signature", &|e| e.record.signature.clear());
        tamper("another key", &|e| {
            e.record.signature = signer(&other).sign(&e.signed_bytes()).expect("sign");
        });
        for (what, entry) in &tampered {
            let before = refused_total("signature");
            let (applied, refused, _) =
                memory.accept_push(Some(&sender), std::slice::from_ref(entry), &certs);
            assert_eq!((applied, refused.len()), (0, 1), "{what}: {refused:?}");
            assert!(
                refused[0].contains("does not verify"),
                "{what}: {refused:?}"
            );
            assert!(refused_total("signature") > before, "{what}: counted");
        }
        assert!(memory.get("notes", "k").expect("get").is_none());
        assert!(memory.get("elsewhere", "k").expect("get").is_none());
        assert!(memory.get("notes", "other-key").expect("get").is_none());
        // The genuine record applies: what was refused was the alteration.
        let (applied, refused, _) = memory.accept_push(Some(&sender), &[genuine], &certs);
        assert_eq!((applied, refused.len()), (1, 0), "{refused:?}");
    }

    /// A record that would change nothing (a copy of what is held, or one that loses to it) is
    /// dropped without its signature checked, and what is stored stays as it was.
    #[tokio::test]
    async fn a_record_that_changes_nothing_is_dropped_unchecked_and_changes_nothing() {
        let (me, sender) = (id("me"), id("sender"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let certs = certificate(&sender);
        let held = signed(write(&sender, 2, "k", "held"));
        assert_eq!(
            memory
                .accept_push(Some(&sender), std::slice::from_ref(&held), &certs)
                .0,
            1
        );
        let mut copy = held.clone();
        copy.record.signature = vec![0; 64];
        let mut older = write(&sender, 1, "k", "older");
        older.record.hlc = held.record.hlc - 1;
        let (applied, refused, _) = memory.accept_push(Some(&sender), &[copy, older], &certs);
        assert_eq!((applied, refused.len()), (0, 0), "{refused:?}");
        assert_eq!(
            memory.get("notes", "k").expect("get"),
            Some(held.record),
            "unchanged"
        );
    }

    #[tokio::test]
    async fn a_record_whose_origin_no_certificate_vouches_for_is_refused() {
        let (me, sender) = (id("me"), id("sender"));
        let (_dir, memory) = open_memory(&me, MemoryOptions::default());
        let entry = signed(write(&sender, 1, "k", "v"));
        let before = refused_total("certificate");
        let (applied, refused, _) =
            memory.accept_push(Some(&sender), std::slice::from_ref(&entry), &[]);
        assert_eq!((applied, refused.len()), (0, 1));
        assert!(refused[0].contains("no certificate"), "{refused:?}");
        assert!(refused_total("certificate") > before);
        // Another node's certificate does not vouch for the sender either.
        let (applied, _, _) = memory.accept_push(Some(&sender), &[entry], &certificate(&me));
        assert_eq!(applied, 0);
    }

    /// Nodes that never met the writer verify its records with the certificate the relaying
    /// node kept and passed on.
    #[tokio::test]
    async fn relaying_nodes_pass_on_the_certificates_they_verified() {
        let (a, b, c) = (id("relay-a"), id("relay-b"), id("relay-c"));
        let (_da, ma) = open_memory(&a, MemoryOptions::default());
        let (_db, mb) = open_memory(&b, MemoryOptions::default());
        let (_dc, mc) = open_memory(&c, MemoryOptions::default());
        let link = InProcess::default();
        for (node, memory) in [(&a, &ma), (&b, &mb)] {
            link.0
                .lock()
                .expect("lock")
                .insert(node.to_string(), memory.clone());
        }
        ma.put("notes", "from-a", Some(b"v".to_vec()))
            .await
            .expect("put");
        sync_from(&mb, &link, &a, a.as_str())
            .await
            .expect("b from a");
        let applied = sync_from(&mc, &link, &b, b.as_str())
            .await
            .expect("c from b");
        assert_eq!(applied, 1);
        assert_eq!(tombstone_of(&mc, "from-a"), Some(false));
    }

    /// A store written before records were signed: this node's records are signed in place,
    /// another node's stay readable but are not relayed, every watermark is forgotten, and the
    /// writer's signed copy of the same write replaces the unsigned one.
    #[tokio::test]
    async fn a_store_from_before_signatures_is_upgraded_without_losing_a_record() {
        let (me, other, peer) = (id("upgrader"), id("old-writer"), id("old-peer"));
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn crate::storage::Store> = Arc::new(crate::storage::SledStore::new(
            sled::open(dir.path()).expect("db"),
        ));
        let (memory, _) = Memory::open(
            store.clone(),
            signer(&me),
            verifier(),
            MemoryOptions::default(),
        );
        memory
            .put("notes", "mine", Some(b"m".to_vec()))
            .await
            .expect("put");
        let theirs = write(&other, 1, "theirs", "t");
        assert!(memory.apply(&theirs).expect("apply"));
        memory.set_watermark(&peer, &other, 1).expect("watermark");
        // Back to how an old node stored them: version 1 bytes, no signature, no flag.
        let v1 = |record: &Record| {
            let mut bytes = vec![1, u8::from(record.tombstone)];
            bytes.extend_from_slice(&record.hlc.to_be_bytes());
            bytes.extend_from_slice(&record.seq.to_be_bytes());
            bytes.extend_from_slice(record.origin.as_str().as_bytes());
            bytes.extend_from_slice(&record.value);
            bytes
        };
        let mine = memory.get("notes", "mine").expect("get").expect("mine");
        store
            .commit(vec![
                Write::Put(ns_tree("notes"), b"mine".to_vec(), v1(&mine)),
                Write::Put(ns_tree("notes"), b"theirs".to_vec(), v1(&theirs.record)),
                Write::Delete(META.into(), SIGNED_KEY.to_vec()),
            ])
            .expect("downgrade");
        drop(memory);

        let (memory, _) = Memory::open(
            store.clone(),
            signer(&me),
            verifier(),
            MemoryOptions::default(),
        );
        let mine = memory
            .get("notes", "mine")
            .expect("get")
            .expect("mine kept");
        let entry = Entry {
            namespace: "notes".into(),
            key: "mine".into(),
            record: mine,
        };
        let check = verifier_knowing(&me);
        assert_eq!(
            check.verify(
                &me,
                entry.record.written_at(),
                &entry.signed_bytes(),
                &entry.record.signature
            ),
            Ok(()),
            "own record signed in place"
        );
        let kept = memory
            .get("notes", "theirs")
            .expect("get")
            .expect("theirs kept");
        assert!(kept.signature.is_empty());
        assert!(
            memory.since(&other, 0, 10).expect("since").is_empty(),
            "an unsigned record of another node is not relayed"
        );
        assert_eq!(memory.watermark(&peer, &other), 0, "watermarks forgotten");
        assert_eq!(memory.sign_stored().expect("again"), (0, 0), "only once");
        // The writer's signed copy of the same write replaces it, and is relayed from then on.
        let results = memory.apply_from(Some(&peer), &[signed(theirs)], &certificate(&other));
        assert!(matches!(results[..], [Ok(true)]), "{results:?}");
        let replaced = memory.get("notes", "theirs").expect("get").expect("theirs");
        assert!(!replaced.signature.is_empty());
        assert_eq!(memory.since(&other, 0, 10).expect("since").len(), 1);
    }

    /// A verifier that knows test node `origin`'s key.
    fn verifier_knowing(origin: &NodeId) -> Arc<mesh_cert::OriginVerifier> {
        let verifier = verifier();
        verifier.learn(signer(origin).certificate()).expect("learn");
        verifier
    }
}
