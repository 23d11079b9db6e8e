//! The `agentmesh.v1.Memory` service, and the client side used for replication.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use mesh_cert::{CertRole, OriginError, origin::MAX_CERTIFICATE_BYTES};
use mesh_domain::{BoxFuture, NodeId, keys};
use mesh_proto::{convert::check_len, v1 as pb};
use mesh_tls::deadline;
use tonic::{Request, Response, Status};

use crate::memory::{
    self, Entry, MAX_SIGNATURE, Memory, MemoryError, MemoryPeers, PeerCallError, Record,
    SYNC_BATCH, SyncBatch,
};

/// The byte budget of one `List` answer (keys, values and signatures): far below the 16 MiB a
/// message may have, and what a caller must hold at once. Past it the answer is cut and names
/// the key to continue after.
pub(crate) const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;
/// Most records one `Push` may carry.
const MAX_PUSH: usize = 4096;
/// Most entries in a per-origin map (`after`, `frontier`, `heads`, `known`).
const MAX_ORIGINS: usize = 10_000;
/// Most origin certificates one `Sync` answer or `Push` carries (one per origin in it).
const MAX_CERTIFICATES: usize = SYNC_BATCH;

/// The Memory service.
#[derive(Debug, Clone)]
pub(crate) struct MemoryService {
    memory: Arc<Memory>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl MemoryService {
    /// Wraps the node's memory.
    pub(crate) fn new(memory: Arc<Memory>, tls: bool) -> Self {
        Self { memory, tls }
    }

    /// The calling node, for the calls only nodes make (`Sync`, `Push`): with mTLS the id of its
    /// certificate (a declared id must match it, and a client certificate is refused); in
    /// insecure mode the id it declares, if any.
    fn caller<T>(&self, request: &Request<T>, declared: &str) -> Result<Option<NodeId>, Status> {
        let declared = if declared.is_empty() {
            None
        } else {
            Some(
                NodeId::parse(declared)
                    .map_err(|e| Status::invalid_argument(format!("node: {e}")))?,
            )
        };
        if !self.tls {
            return Ok(declared);
        }
        let presented = super::caller_identity(request)?;
        if presented.role == Some(CertRole::Client) {
            return Err(Status::permission_denied(
                "only nodes replicate the memory: a client certificate may not call Sync or Push",
            ));
        }
        let presented = presented.id;
        match declared {
            Some(id) if id != presented => Err(Status::invalid_argument(format!(
                "node: {} is not the id of the client certificate ({})",
                id.short(),
                presented.short()
            ))),
            _ => Ok(Some(presented)),
        }
    }

    /// The tonic server, with message size limits (a value may be 1 MiB).
    pub(crate) fn into_server(self) -> pb::memory_server::MemoryServer<Self> {
        pb::memory_server::MemoryServer::new(self)
            .max_decoding_message_size(8 * super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(16 * super::MAX_MESSAGE_BYTES)
    }
}

/// Every memory error has one status code.
impl From<MemoryError> for Status {
    fn from(error: MemoryError) -> Self {
        let message = error.to_string();
        match error {
            MemoryError::Invalid(_) | MemoryError::FromTheFuture { .. } => {
                Status::invalid_argument(message)
            }
            MemoryError::Corrupt(_) => Status::data_loss(message),
            MemoryError::Storage(store) => super::store_status(&store, message),
            MemoryError::Resyncing | MemoryError::Fenced { .. } => {
                Status::failed_precondition(message)
            }
            MemoryError::TooManyNamespaces { .. } => Status::resource_exhausted(message),
            MemoryError::Reserved(_)
            | MemoryError::Private(_)
            | MemoryError::Revoked(_)
            | MemoryError::Writer { .. } => Status::permission_denied(message),
            MemoryError::Revocation(revocation) => match revocation {
                // (listed in full so a new kind of refusal gets its status here)
                mesh_cert::RevocationError::Malformed(_) => Status::invalid_argument(message),
                mesh_cert::RevocationError::BadSignature => Status::permission_denied(message),
                mesh_cert::RevocationError::NoCa => Status::failed_precondition(message),
                mesh_cert::RevocationError::Signing(_) => Status::internal(message),
                mesh_cert::RevocationError::Full => Status::resource_exhausted(message),
            },
            MemoryError::Unverified(origin) => match origin {
                OriginError::Signing(_) => Status::internal(message),
                OriginError::Certificate(_)
                | OriginError::NotFromCa(_)
                | OriginError::ClientCertificate(_)
                | OriginError::UnknownOrigin(_)
                | OriginError::WrittenAfterExpiry(_)
                | OriginError::BadSignature(_) => Status::permission_denied(message),
            },
        }
    }
}

fn to_pb(entry: &Entry) -> pb::MemoryRecord {
    pb::MemoryRecord {
        namespace: entry.namespace.clone(),
        key: entry.key.clone(),
        value: entry.record.value.clone(),
        hlc: entry.record.hlc,
        origin: entry.record.origin.to_string(),
        seq: entry.record.seq,
        tombstone: entry.record.tombstone,
        signature: entry.record.signature.clone(),
    }
}

/// Origin certificates from the wire, bounded in count and size.
fn check_certificates(certificates: &[Vec<u8>]) -> Result<(), String> {
    if certificates.len() > MAX_CERTIFICATES {
        return Err(format!(
            "certificates: at most {MAX_CERTIFICATES} (one per origin)"
        ));
    }
    match certificates
        .iter()
        .position(|c| c.len() > MAX_CERTIFICATE_BYTES)
    {
        Some(i) => Err(format!(
            "certificates[{i}]: at most {MAX_CERTIFICATE_BYTES} bytes"
        )),
        None => Ok(()),
    }
}

impl TryFrom<pb::MemoryRecord> for Entry {
    type Error = Status;

    fn try_from(record: pb::MemoryRecord) -> Result<Self, Status> {
        keys::check_namespace(&record.namespace).map_err(MemoryError::from)?;
        keys::check_key(&record.key).map_err(MemoryError::from)?;
        if record.value.len() > keys::MAX_VALUE {
            return Err(Status::invalid_argument("value: too large"));
        }
        let origin = NodeId::parse(&record.origin)
            .map_err(|e| Status::invalid_argument(format!("origin: {e}")))?;
        if record.signature.len() > MAX_SIGNATURE {
            return Err(Status::invalid_argument(format!(
                "signature: at most {MAX_SIGNATURE} bytes"
            )));
        }
        Ok(Entry {
            namespace: record.namespace,
            key: record.key,
            record: Record {
                value: record.value,
                hlc: record.hlc,
                origin,
                seq: record.seq,
                tombstone: record.tombstone,
                signature: record.signature,
            },
        })
    }
}

fn entry(ns: &str, key: &str, record: Record) -> Entry {
    Entry {
        namespace: ns.to_owned(),
        key: key.to_owned(),
        record,
    }
}

#[tonic::async_trait]
impl pb::memory_server::Memory for MemoryService {
    async fn get(
        &self,
        request: Request<pb::MemoryGetRequest>,
    ) -> Result<Response<pb::MemoryGetResponse>, Status> {
        let r = request.into_inner();
        memory::readable_by_callers(&r.namespace)?;
        let record = self.memory.get(&r.namespace, &r.key)?;
        Ok(Response::new(pb::MemoryGetResponse {
            record: record.map(|rec| to_pb(&entry(&r.namespace, &r.key, rec))),
        }))
    }

    async fn put(
        &self,
        request: Request<pb::MemoryPutRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        let r = request.into_inner();
        memory::writable_by_callers(&r.namespace)?;
        let record = self.memory.put(&r.namespace, &r.key, Some(r.value)).await?;
        Ok(Response::new(to_pb(&entry(&r.namespace, &r.key, record))))
    }

    async fn delete(
        &self,
        request: Request<pb::MemoryDeleteRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        let r = request.into_inner();
        memory::writable_by_callers(&r.namespace)?;
        let record = self.memory.put(&r.namespace, &r.key, None).await?;
        Ok(Response::new(to_pb(&entry(&r.namespace, &r.key, record))))
    }

    async fn list(
        &self,
        request: Request<pb::MemoryListRequest>,
    ) -> Result<Response<pb::MemoryListResponse>, Status> {
        let r = request.into_inner();
        memory::readable_by_callers(&r.namespace)?;
        check_len("prefix", &r.prefix, keys::MAX_KEY)?;
        let limit = match r.limit {
            0 => 100,
            n => (n as usize).min(10_000),
        };
        check_len("after", &r.after, keys::MAX_KEY)?;
        let page = self
            .memory
            .page(&r.namespace, &r.prefix, &r.after, limit, MAX_LIST_BYTES)?;
        Ok(Response::new(pb::MemoryListResponse {
            records: page.entries.iter().map(to_pb).collect(),
            next_after: page.next_after.unwrap_or_default(),
        }))
    }

    async fn namespaces(
        &self,
        _request: Request<pb::MemoryNamespacesRequest>,
    ) -> Result<Response<pb::MemoryNamespacesResponse>, Status> {
        let namespaces = self
            .memory
            .namespaces()?
            .into_iter()
            .map(|(name, kind)| pb::MemoryNamespace {
                name,
                kind: kind.as_str().to_owned(),
            })
            .collect();
        Ok(Response::new(pb::MemoryNamespacesResponse { namespaces }))
    }

    async fn sync(
        &self,
        request: Request<pb::MemorySyncRequest>,
    ) -> Result<Response<pb::MemorySyncResponse>, Status> {
        let caller = self.caller(&request, &request.get_ref().node)?;
        let r = request.into_inner();
        let sync = memory::SyncRequest {
            node: caller,
            after: parse_seqs("after", r.after).map_err(Status::invalid_argument)?,
            frontier: parse_seqs("frontier", r.frontier).map_err(Status::invalid_argument)?,
        };
        let batch = memory::answer_sync(&self.memory, &sync)?;
        Ok(Response::new(pb::MemorySyncResponse {
            records: batch.entries.iter().map(to_pb).collect(),
            more: batch.more,
            heads: wire_seqs(&batch.heads),
            frontier: wire_seqs(&batch.frontier),
            known: wire_seqs(&batch.known),
            certificates: batch.certificates,
        }))
    }

    async fn push(
        &self,
        request: Request<pb::MemoryPushRequest>,
    ) -> Result<Response<pb::MemoryPushResponse>, Status> {
        let sender = self.caller(&request, &request.get_ref().node)?;
        let r = request.into_inner();
        if r.records.len() > MAX_PUSH {
            return Err(Status::invalid_argument(format!(
                "records: at most {MAX_PUSH} per push"
            )));
        }
        check_certificates(&r.certificates).map_err(Status::invalid_argument)?;
        let entries = r
            .records
            .into_iter()
            .map(Entry::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        // A node pushes only its own writes; others' reach us by `Sync`, from nodes we chose.
        if self.tls
            && let Some(sender) = &sender
            && let Some(foreign) = entries.iter().find(|e| &e.record.origin != sender)
        {
            return Err(Status::permission_denied(format!(
                "records: {}/{} was written by {}, not by the pushing node {}; a node pushes only its own writes",
                foreign.namespace,
                foreign.key,
                foreign.record.origin.short(),
                sender.short()
            )));
        }
        let (applied, refused, frontier) =
            self.memory
                .accept_push(sender.as_ref(), &entries, &r.certificates);
        if applied > 0 || frontier > 0 {
            self.memory.flush().await?;
        }
        Ok(Response::new(pb::MemoryPushResponse {
            applied,
            refused,
            frontier,
        }))
    }
}

/// Per-origin sequence numbers from the wire, bounded.
fn parse_seqs(field: &str, map: HashMap<String, u64>) -> Result<BTreeMap<NodeId, u64>, String> {
    if map.len() > MAX_ORIGINS {
        return Err(format!("{field}: at most {MAX_ORIGINS} entries"));
    }
    map.into_iter()
        .map(|(id, seq)| {
            NodeId::parse(&id)
                .map(|id| (id, seq))
                .map_err(|e| format!("{field}: {e}"))
        })
        .collect()
}

fn wire_seqs(map: &BTreeMap<NodeId, u64>) -> HashMap<String, u64> {
    map.iter().map(|(id, seq)| (id.to_string(), *seq)).collect()
}

/// Replication over gRPC, on the node's shared peer channels.
#[derive(Debug, Clone)]
pub(crate) struct RemoteMemory {
    channels: super::PeerChannels,
    own: NodeId,
}

impl RemoteMemory {
    /// Uses `channels` to reach peers, as node `own`.
    pub(crate) fn new(channels: super::PeerChannels, own: NodeId) -> Self {
        Self { channels, own }
    }

    async fn client(
        &self,
        addr: &str,
    ) -> Result<pb::memory_client::MemoryClient<tonic::transport::Channel>, PeerCallError> {
        let channel = self
            .channels
            .get(addr)
            .await
            .map_err(|e| PeerCallError::Unreachable(e.to_string()))?;
        Ok(pb::memory_client::MemoryClient::new(channel)
            .max_decoding_message_size(16 * super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(8 * super::MAX_MESSAGE_BYTES))
    }

    fn forget(&self, addr: &str) {
        self.channels.forget(addr);
    }
}

impl MemoryPeers for RemoteMemory {
    fn sync(
        &self,
        addr: String,
        request: memory::SyncRequest,
    ) -> BoxFuture<'static, Result<SyncBatch, PeerCallError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut client = this.client(&addr).await?;
            let request = pb::MemorySyncRequest {
                after: wire_seqs(&request.after),
                frontier: wire_seqs(&request.frontier),
                node: this.own.to_string(),
            };
            let limit = this.channels.deadlines().sync;
            let call = client.sync(request);
            let response = match deadline::within(limit, "Memory.Sync", call).await {
                Ok(response) => response.into_inner(),
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    return Err(PeerCallError::Resyncing);
                }
                Err(s) => {
                    this.forget(&addr);
                    return Err(refused(&s));
                }
            };
            let bad = PeerCallError::BadAnswer;
            check_certificates(&response.certificates).map_err(bad)?;
            let mut entries = Vec::with_capacity(response.records.len());
            for record in response.records {
                entries.push(Entry::try_from(record).map_err(|s| bad(s.message().to_owned()))?);
            }
            Ok(SyncBatch {
                entries,
                more: response.more,
                heads: parse_seqs("heads", response.heads).map_err(bad)?,
                frontier: parse_seqs("frontier", response.frontier).map_err(bad)?,
                known: parse_seqs("known", response.known).map_err(bad)?,
                certificates: response.certificates,
            })
        })
    }

    fn push(
        &self,
        addr: String,
        entries: Vec<Entry>,
        certificates: Vec<Vec<u8>>,
    ) -> BoxFuture<'static, Result<memory::PushAnswer, PeerCallError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut client = this.client(&addr).await?;
            let request = pb::MemoryPushRequest {
                records: entries.iter().map(to_pb).collect(),
                node: this.own.to_string(),
                certificates,
            };
            let limit = this.channels.deadlines().push;
            let call = client.push(request);
            match deadline::within(limit, "Memory.Push", call).await {
                Ok(response) => {
                    let response = response.into_inner();
                    Ok(memory::PushAnswer {
                        frontier: response.frontier,
                        refused: response.refused,
                    })
                }
                Err(s) => {
                    this.forget(&addr);
                    Err(refused(&s))
                }
            }
        })
    }
}

/// A peer's error answer to a memory call, as the memory reports it: `{code}: {message}`.
fn refused(status: &Status) -> PeerCallError {
    PeerCallError::Refused(format!("{}: {}", status.code(), status.message()))
}

#[cfg(test)]
mod tests {
    use mesh_cert::{OriginSigner, OriginVerifier};
    use mesh_proto::v1::memory_server::Memory as _;

    use super::*;
    use crate::{memory::MemoryOptions, storage::SledStore};

    fn service_with(options: MemoryOptions) -> (tempfile::TempDir, MemoryService) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(OriginSigner::generate().expect("signer")),
            Arc::new(OriginVerifier::self_certified()),
            options,
        );
        (dir, MemoryService::new(memory, false))
    }

    fn service() -> (tempfile::TempDir, MemoryService) {
        service_with(MemoryOptions::default())
    }

    /// A `Put` that would create a namespace past `memory.max_namespaces` is refused with
    /// `RESOURCE_EXHAUSTED`, naming the key to raise; existing namespaces stay writable.
    #[tokio::test]
    async fn a_put_past_the_namespace_bound_is_resource_exhausted_naming_the_key() {
        let (_dir, service) = service_with(MemoryOptions {
            max_namespaces: 1,
            ..MemoryOptions::default()
        });
        let put = |namespace: &str| pb::MemoryPutRequest {
            namespace: namespace.into(),
            key: "k".into(),
            value: b"v".to_vec(),
        };
        service.put(Request::new(put("a"))).await.expect("put");
        let status = service
            .put(Request::new(put("b")))
            .await
            .expect_err("a second namespace is refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("memory.max_namespaces"),
            "{}",
            status.message()
        );
        service
            .put(Request::new(put("a")))
            .await
            .expect("a is still writable");
    }

    /// `Get` and `List` of a private namespace (clients' stored conversations) are
    /// `PERMISSION_DENIED` for any caller, whatever its tier; without the check both answer the
    /// record.
    #[tokio::test]
    async fn the_private_namespaces_are_not_readable_through_the_memory_api() {
        let (_dir, service) = service();
        for ns in keys::PRIVATE_NAMESPACES {
            service
                .memory
                .put(ns, "resp_1", Some(b"a client's conversation".to_vec()))
                .await
                .expect("the node's own service writes it");
            let get = service
                .get(Request::new(pb::MemoryGetRequest {
                    namespace: (*ns).into(),
                    key: "resp_1".into(),
                }))
                .await
                .expect_err("get refused");
            assert_eq!(get.code(), tonic::Code::PermissionDenied, "{get:?}");
            let list = service
                .list(Request::new(pb::MemoryListRequest {
                    namespace: (*ns).into(),
                    ..Default::default()
                }))
                .await
                .expect_err("list refused");
            assert_eq!(list.code(), tonic::Code::PermissionDenied, "{list:?}");
        }
    }

    /// Issue 28: `Namespaces` lists every namespace holding records with its kind, sorted,
    /// and never a private one (without the filter, `responses` is listed).
    #[tokio::test]
    async fn namespaces_are_listed_with_their_kind_and_never_a_private_one() {
        let (_dir, service) = service_with(MemoryOptions {
            local_namespaces: vec!["scratch".into()],
            ..MemoryOptions::default()
        });
        let memory = &service.memory;
        for ns in ["notes", "scratch", keys::CRON_SCHEDULES, keys::RESPONSES] {
            memory.put(ns, "k", Some(b"v".to_vec())).await.expect("put");
        }
        let listed: Vec<(String, String)> = service
            .namespaces(Request::new(pb::MemoryNamespacesRequest {}))
            .await
            .expect("namespaces")
            .into_inner()
            .namespaces
            .into_iter()
            .map(|n| (n.name, n.kind))
            .collect();
        let want = |name: &str, kind: &str| (name.to_owned(), kind.to_owned());
        assert_eq!(
            listed,
            [
                want(keys::CRON_SCHEDULES, "system"),
                want("notes", "shared"),
                want("scratch", "local"),
            ]
        );
    }

    /// A namespace holding more than a `List` answer's byte budget is listed in pages that
    /// each stay within the budget and name where to continue; following them returns every
    /// live key once, tombstones and other prefixes left out.
    #[tokio::test]
    async fn a_list_answer_stops_at_its_byte_budget_and_the_cursor_returns_the_rest() {
        let (_dir, service) = service();
        let memory = &service.memory;
        let big = vec![b'x'; keys::MAX_VALUE];
        let mut want = Vec::new();
        for i in 0..(MAX_LIST_BYTES / keys::MAX_VALUE + 3) {
            let key = format!("big/{i:02}");
            memory
                .put("bulk", &key, Some(big.clone()))
                .await
                .expect("put");
            let small = format!("big/{i:02}-small");
            memory
                .put("bulk", &small, Some(b"s".to_vec()))
                .await
                .expect("put");
            want.extend([key, small]);
        }
        memory
            .put("bulk", "big/gone", Some(b"g".to_vec()))
            .await
            .expect("put");
        memory.put("bulk", "big/gone", None).await.expect("delete");
        memory
            .put("bulk", "other", Some(b"o".to_vec()))
            .await
            .expect("put");

        let (mut got, mut after, mut pages) = (Vec::new(), String::new(), 0);
        loop {
            let answer = service
                .list(Request::new(pb::MemoryListRequest {
                    namespace: "bulk".into(),
                    prefix: "big/".into(),
                    limit: 10_000,
                    after: after.clone(),
                }))
                .await
                .expect("list")
                .into_inner();
            pages += 1;
            let bytes: usize = answer
                .records
                .iter()
                .map(|r| r.namespace.len() + r.key.len() + r.value.len() + r.signature.len())
                .sum();
            assert!(bytes <= MAX_LIST_BYTES, "page {pages}: {bytes} bytes");
            assert!(!answer.records.is_empty(), "page {pages} is empty");
            got.extend(answer.records.into_iter().map(|r| r.key));
            if answer.next_after.is_empty() {
                break;
            }
            assert_eq!(
                Some(&answer.next_after),
                got.last(),
                "the cursor is the last key"
            );
            after = answer.next_after;
        }
        assert!(pages >= 2, "the answer was never cut");
        want.sort();
        assert_eq!(got, want, "every live key once, in order");

        // The count limit cuts too, and says so.
        let answer = service
            .list(Request::new(pb::MemoryListRequest {
                namespace: "bulk".into(),
                prefix: "big/".into(),
                limit: 1,
                after: String::new(),
            }))
            .await
            .expect("list")
            .into_inner();
        assert_eq!(answer.records.len(), 1);
        assert_eq!(answer.next_after, want[0]);
    }
}
