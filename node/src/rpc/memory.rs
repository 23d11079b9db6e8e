//! The `agentmesh.v1.Memory` service, and the client side used for replication.

use std::{collections::BTreeMap, sync::Arc};

use mesh_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::{
    identity::NodeId,
    llm::BoxFuture,
    memory::{self, Entry, Memory, MemoryError, MemoryPeers, Record, SyncBatch},
};

/// Most records one `Push` may carry.
const MAX_PUSH: usize = 4096;

/// The Memory service.
#[derive(Debug, Clone)]
pub struct MemoryService {
    memory: Arc<Memory>,
}

impl MemoryService {
    /// Wraps the node's memory.
    pub fn new(memory: Arc<Memory>) -> Self {
        Self { memory }
    }

    /// The tonic server, with message size limits (a value may be 1 MiB).
    pub fn into_server(self) -> pb::memory_server::MemoryServer<Self> {
        pb::memory_server::MemoryServer::new(self)
            .max_decoding_message_size(8 * super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(16 * super::MAX_MESSAGE_BYTES)
    }
}

/// Every memory error has one status code.
fn status(error: MemoryError) -> Status {
    match error {
        MemoryError::Invalid(_) | MemoryError::FromTheFuture { .. } => {
            Status::invalid_argument(error.to_string())
        }
        MemoryError::Corrupt(_) => Status::data_loss(error.to_string()),
        MemoryError::Storage(_) => Status::unavailable(error.to_string()),
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
    }
}

impl TryFrom<pb::MemoryRecord> for Entry {
    type Error = Status;

    fn try_from(record: pb::MemoryRecord) -> Result<Self, Status> {
        memory::check_namespace(&record.namespace).map_err(status)?;
        memory::check_key(&record.key).map_err(status)?;
        if record.value.len() > memory::MAX_VALUE {
            return Err(Status::invalid_argument("value: too large"));
        }
        let origin = NodeId::parse(&record.origin)
            .map_err(|e| Status::invalid_argument(format!("origin: {e}")))?;
        Ok(Entry {
            namespace: record.namespace,
            key: record.key,
            record: Record {
                value: record.value,
                hlc: record.hlc,
                origin,
                seq: record.seq,
                tombstone: record.tombstone,
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
        let record = self.memory.get(&r.namespace, &r.key).map_err(status)?;
        Ok(Response::new(pb::MemoryGetResponse {
            record: record.map(|rec| to_pb(&entry(&r.namespace, &r.key, rec))),
        }))
    }

    async fn put(
        &self,
        request: Request<pb::MemoryPutRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        let r = request.into_inner();
        let record = self
            .memory
            .put(&r.namespace, &r.key, Some(r.value))
            .await
            .map_err(status)?;
        Ok(Response::new(to_pb(&entry(&r.namespace, &r.key, record))))
    }

    async fn delete(
        &self,
        request: Request<pb::MemoryDeleteRequest>,
    ) -> Result<Response<pb::MemoryRecord>, Status> {
        let r = request.into_inner();
        let record = self
            .memory
            .put(&r.namespace, &r.key, None)
            .await
            .map_err(status)?;
        Ok(Response::new(to_pb(&entry(&r.namespace, &r.key, record))))
    }

    async fn list(
        &self,
        request: Request<pb::MemoryListRequest>,
    ) -> Result<Response<pb::MemoryListResponse>, Status> {
        let r = request.into_inner();
        super::check_len("prefix", &r.prefix, memory::MAX_KEY)?;
        let limit = match r.limit {
            0 => 100,
            n => (n as usize).min(10_000),
        };
        let entries = self
            .memory
            .list(&r.namespace, &r.prefix, limit)
            .map_err(status)?;
        Ok(Response::new(pb::MemoryListResponse {
            records: entries.iter().map(to_pb).collect(),
        }))
    }

    async fn sync(
        &self,
        request: Request<pb::MemorySyncRequest>,
    ) -> Result<Response<pb::MemorySyncResponse>, Status> {
        let r = request.into_inner();
        if r.after.len() > 10_000 {
            return Err(Status::invalid_argument("after: too many origins"));
        }
        let mut after = BTreeMap::new();
        for (origin, seq) in r.after {
            let origin = NodeId::parse(&origin)
                .map_err(|e| Status::invalid_argument(format!("after: {e}")))?;
            after.insert(origin, seq);
        }
        let batch = memory::answer_sync(&self.memory, &after).map_err(status)?;
        Ok(Response::new(pb::MemorySyncResponse {
            records: batch.entries.iter().map(to_pb).collect(),
            more: batch.more,
            heads: batch
                .heads
                .iter()
                .map(|(origin, seq)| (origin.to_string(), *seq))
                .collect(),
        }))
    }

    async fn push(
        &self,
        request: Request<pb::MemoryPushRequest>,
    ) -> Result<Response<pb::MemoryPushResponse>, Status> {
        let r = request.into_inner();
        if r.records.len() > MAX_PUSH {
            return Err(Status::invalid_argument(format!(
                "records: at most {MAX_PUSH} per push"
            )));
        }
        let mut applied = 0;
        let mut refused = Vec::new();
        for record in r.records {
            let entry = Entry::try_from(record)?;
            match self.memory.apply(&entry) {
                Ok(true) => applied += 1,
                Ok(false) => {}
                Err(e) => refused.push(format!("{}/{}: {e}", entry.namespace, entry.key)),
            }
        }
        if applied > 0 {
            self.memory.flush().await.map_err(status)?;
        }
        Ok(Response::new(pb::MemoryPushResponse { applied, refused }))
    }
}

/// Replication over gRPC, on the node's shared peer channels.
#[derive(Debug, Clone)]
pub struct RemoteMemory {
    channels: super::PeerChannels,
}

impl RemoteMemory {
    /// Uses `channels` to reach peers.
    pub fn new(channels: super::PeerChannels) -> Self {
        Self { channels }
    }

    async fn client(
        &self,
        addr: &str,
    ) -> Result<pb::memory_client::MemoryClient<tonic::transport::Channel>, String> {
        let channel = self.channels.get(addr).await.map_err(|e| e.to_string())?;
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
        after: BTreeMap<NodeId, u64>,
    ) -> BoxFuture<'static, Result<SyncBatch, String>> {
        let this = self.clone();
        Box::pin(async move {
            let mut client = this.client(&addr).await?;
            let request = pb::MemorySyncRequest {
                after: after.into_iter().map(|(o, s)| (o.to_string(), s)).collect(),
            };
            let response = match client.sync(request).await {
                Ok(response) => response.into_inner(),
                Err(s) => {
                    this.forget(&addr);
                    return Err(format!("{}: {}", s.code(), s.message()));
                }
            };
            let mut entries = Vec::with_capacity(response.records.len());
            for record in response.records {
                entries.push(Entry::try_from(record).map_err(|s| s.message().to_owned())?);
            }
            if response.heads.len() > 10_000 {
                return Err("sync answer: too many heads".into());
            }
            let mut heads = BTreeMap::new();
            for (origin, seq) in response.heads {
                let origin = NodeId::parse(&origin).map_err(|e| format!("heads: {e}"))?;
                heads.insert(origin, seq);
            }
            Ok(SyncBatch {
                entries,
                more: response.more,
                heads,
            })
        })
    }

    fn push(&self, addr: String, entries: Vec<Entry>) -> BoxFuture<'static, Result<(), String>> {
        let this = self.clone();
        Box::pin(async move {
            let mut client = this.client(&addr).await?;
            let request = pb::MemoryPushRequest {
                records: entries.iter().map(to_pb).collect(),
            };
            match client.push(request).await {
                Ok(_) => Ok(()),
                Err(s) => {
                    this.forget(&addr);
                    Err(format!("{}: {}", s.code(), s.message()))
                }
            }
        })
    }
}
