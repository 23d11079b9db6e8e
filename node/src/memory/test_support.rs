//! Helpers the memory's unit tests share: node ids with their signing keys, records (signed or
//! not), memories on a temporary store, and peers reached in-process. Test code only; nothing
//! outside the tests may use it (the memory's, and those of modules built on it).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, OnceLock},
};

use mesh_cert::{OriginSigner, OriginVerifier};
use mesh_domain::{BoxFuture, NodeId};

use super::{
    error::{MemoryError, PeerCallError},
    push::PushAnswer,
    record::{Entry, Record},
    store::{Memory, MemoryOptions},
    sync::{MemoryPeers, SyncBatch, SyncRequest, answer_sync},
};
use crate::storage::{SledStore, Store};

/// Every test node's signer, by name and by id (one fresh key per name per test process).
fn signers() -> &'static Mutex<BTreeMap<String, Arc<OriginSigner>>> {
    static SIGNERS: OnceLock<Mutex<BTreeMap<String, Arc<OriginSigner>>>> = OnceLock::new();
    SIGNERS.get_or_init(Mutex::default)
}

/// The id of the test node called `n`: the hash of its own (self-certified) key.
pub(crate) fn id(n: &str) -> NodeId {
    let mut signers = signers().lock().expect("lock");
    let signer = signers
        .entry(n.to_owned())
        .or_insert_with(|| Arc::new(OriginSigner::generate().expect("signer")))
        .clone();
    signers.insert(signer.id().to_string(), signer.clone());
    signer.id().clone()
}

/// The signer of the test node whose id is `own` (made by [`id`]).
pub(super) fn signer(own: &NodeId) -> Arc<OriginSigner> {
    signers()
        .lock()
        .expect("lock")
        .get(own.as_str())
        .cloned()
        .expect("ids come from test_support::id")
}

/// A verifier of test nodes' records (their certificates are self-made).
pub(super) fn verifier() -> Arc<OriginVerifier> {
    Arc::new(OriginVerifier::self_certified())
}

/// `entry`, signed by its origin.
pub(super) fn signed(mut entry: Entry) -> Entry {
    let signer = signer(&entry.record.origin);
    entry.record.signature = signer.sign(&entry.signed_bytes()).expect("sign");
    entry
}

/// The certificate of test node `origin`, as a message carries it.
pub(super) fn certificate(origin: &NodeId) -> Vec<Vec<u8>> {
    vec![signer(origin).certificate().to_vec()]
}

/// A record by `origin` stamped `hlc`, with sequence 1 and value `v` (none for a tombstone).
pub(super) fn record(hlc: u64, origin: &NodeId, tombstone: bool) -> Record {
    Record {
        value: if tombstone { vec![] } else { b"v".to_vec() },
        hlc,
        origin: origin.clone(),
        seq: 1,
        tombstone,
        signature: Vec::new(),
    }
}

/// A memory for node `own` on a fresh sled store in a temporary directory (kept alive by the
/// returned guard).
pub(crate) fn open_memory(
    own: &NodeId,
    options: MemoryOptions,
) -> (tempfile::TempDir, Arc<Memory>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db: Arc<dyn Store> = Arc::new(SledStore::new(sled::open(dir.path()).expect("db")));
    let (memory, _writes) = Memory::open(db, signer(own), verifier(), options);
    (dir, memory)
}

/// A node's memory in a mesh with a CA of its own (in a temporary directory), for tests of
/// what only a CA can vouch for: operators' signed statements, the writer rules that check
/// them. More members' signers are issued with [`CaMesh::member`].
pub(crate) struct CaMesh {
    dir: tempfile::TempDir,
    /// The node's memory.
    pub(crate) memory: Arc<Memory>,
}

impl CaMesh {
    /// A fresh CA and the memory of its node `own`.
    pub(crate) fn new(own: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        mesh_cert::ca::ca_init(&dir.path().join("ca")).expect("ca");
        let tls = member_tls(dir.path(), own, mesh_domain::CertRole::Node);
        let db: Arc<dyn Store> = Arc::new(SledStore::new(
            sled::open(dir.path().join("db")).expect("db"),
        ));
        let (memory, _writes) = Memory::open(
            db,
            Arc::new(tls.origin_signer().expect("signer")),
            Arc::new(tls.origin_verifier().expect("verifier")),
            MemoryOptions::default(),
        );
        Self { dir, memory }
    }

    /// The signer of a new member `name` of this mesh, a node or a person's client.
    pub(crate) fn member(&self, name: &str, role: mesh_domain::CertRole) -> OriginSigner {
        member_tls(self.dir.path(), name, role)
            .origin_signer()
            .expect("signer")
    }
}

/// The TLS material of a new member `name` of the mesh whose CA is in `dir/ca`.
fn member_tls(dir: &std::path::Path, name: &str, role: mesh_domain::CertRole) -> mesh_tls::MeshTls {
    let ca = dir.join("ca");
    let (cert, key) = mesh_cert::ca::issue(&ca, name, &[], role).expect("issue");
    mesh_tls::MeshTls::load(&mesh_tls::TlsFiles {
        ca: ca.join(mesh_cert::ca::CA_CERT_FILE),
        cert,
        key,
    })
    .expect("load")
}

/// Peers reached in-process: `addr` is the peer's id.
#[derive(Debug, Default)]
pub(crate) struct InProcess(pub(crate) std::sync::Mutex<BTreeMap<String, Arc<Memory>>>);

impl MemoryPeers for InProcess {
    fn sync(
        &self,
        addr: String,
        request: SyncRequest,
    ) -> BoxFuture<'static, Result<SyncBatch, PeerCallError>> {
        let peer = self.0.lock().expect("lock").get(&addr).cloned();
        Box::pin(async move {
            let peer = peer.ok_or_else(|| PeerCallError::Unreachable("no such peer".into()))?;
            match answer_sync(&peer, &request) {
                Err(MemoryError::Resyncing) => Err(PeerCallError::Resyncing),
                other => other.map_err(|e| PeerCallError::Refused(e.to_string())),
            }
        })
    }

    fn push(
        &self,
        addr: String,
        entries: Vec<Entry>,
        certificates: Vec<Vec<u8>>,
    ) -> BoxFuture<'static, Result<PushAnswer, PeerCallError>> {
        let peer = self.0.lock().expect("lock").get(&addr).cloned();
        Box::pin(async move {
            let peer = peer.ok_or_else(|| PeerCallError::Unreachable("no such peer".into()))?;
            let sender = entries.first().map(|e| e.record.origin.clone());
            let (_, refused, frontier) = peer.accept_push(sender.as_ref(), &entries, &certificates);
            Ok(PushAnswer { frontier, refused })
        })
    }
}

/// Whether `key` of namespace `notes` is a tombstone (`None` when nothing is stored there).
pub(super) fn tombstone_of(memory: &Memory, key: &str) -> Option<bool> {
    memory.get("notes", key).expect("get").map(|r| r.tombstone)
}

/// A peer that answers every `Sync` with the batch it holds (a relaying node that may lie), and
/// takes every push.
#[derive(Debug)]
pub(super) struct CannedPeer(pub(super) Mutex<SyncBatch>);

impl CannedPeer {
    /// A peer answering with `batch`.
    pub(super) fn new(batch: SyncBatch) -> Self {
        Self(Mutex::new(batch))
    }
}

impl MemoryPeers for CannedPeer {
    fn sync(
        &self,
        _: String,
        _: SyncRequest,
    ) -> BoxFuture<'static, Result<SyncBatch, PeerCallError>> {
        let batch = self.0.lock().expect("lock").clone();
        Box::pin(async move { Ok(batch) })
    }

    fn push(
        &self,
        _: String,
        _: Vec<Entry>,
        _: Vec<Vec<u8>>,
    ) -> BoxFuture<'static, Result<PushAnswer, PeerCallError>> {
        Box::pin(async { Ok(PushAnswer::default()) })
    }
}

/// Makes `memory` look back from two hours away (its last completed sync that long ago), so a
/// tombstone window of an hour makes it stale.
pub(crate) fn age_contact(memory: &Memory) {
    let long_ago = mesh_domain::time::now_ms() - 2 * 3600 * 1000;
    memory
        .store
        .commit(vec![crate::storage::Write::Put(
            super::store::META.into(),
            super::frontier::CONTACT_KEY.to_vec(),
            long_ago.to_be_bytes().to_vec(),
        )])
        .expect("age the contact clock");
}
