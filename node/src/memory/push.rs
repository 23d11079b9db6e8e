//! Pushes of this node's new writes to its up peers, with back-pressure: one bounded queue and
//! one sending task per peer, so at most one push to a peer is in flight and a peer that is
//! slow or never answers costs a fixed amount of memory, never a task per write. When a peer's
//! queue is full, or a push to it fails, the batch is dropped and the peer is marked for a
//! sync instead: the pull fetches what it lacks from the watermarks. It decides nothing about
//! what to push (`sync::replicate` batches the writes) and speaks to peers only through the
//! call it is given (`MemoryPeers::push`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use mesh_domain::{NodeId, sync::MutexExt};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_util::sync::CancellationToken;

use mesh_domain::BoxFuture;

use super::{error::PeerCallError, record::Entry, store::Memory};

/// How a batch reaches a peer: `(address, records, certificates)` to the peer's frontier for
/// this node's writes. `sync::replicate` makes it from its `MemoryPeers::push`; it is a
/// function here so that this file names nothing above `store`.
pub(super) type PushCall = Arc<
    dyn Fn(
            String,
            Vec<Entry>,
            Vec<Vec<u8>>,
        ) -> BoxFuture<'static, Result<PushAnswer, PeerCallError>>
        + Send
        + Sync,
>;

/// A peer's answer to a push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PushAnswer {
    /// The sequence up to which it holds every write of ours.
    pub frontier: u64,
    /// The records it refused, each `namespace/key: why`.
    pub refused: Vec<String>,
}

impl PushAnswer {
    /// Whether the peer refused the record at `namespace`/`key`, and why.
    pub(crate) fn refusal(&self, namespace: &str, key: &str) -> Option<&str> {
        let place = format!("{namespace}/{key}: ");
        self.refused.iter().find_map(|r| r.strip_prefix(&place))
    }
}

/// Most batches waiting for one peer; past it the peer is marked for a sync.
pub(super) const PUSH_QUEUE: usize = 16;
/// How long one push may take: a peer that never answers must not hold its queue for good.
const PUSH_CALL_DEADLINE: Duration = Duration::from_secs(10);

/// A batch of this node's writes with the certificates it travels with, shared by every
/// peer's queue.
#[derive(Debug)]
pub(super) struct Push {
    /// The records, this node's own writes.
    pub(super) entries: Vec<Entry>,
    /// The certificates of their origins (ours).
    pub(super) certificates: Vec<Vec<u8>>,
}

/// One peer's queue: where its batches go, and the address its task pushes to.
#[derive(Debug)]
struct Queue {
    /// Into the peer's sending task; dropping it ends the task once the queue is drained.
    tx: mpsc::Sender<Arc<Push>>,
    /// The address the task was started with (a peer seen at a new address gets a new task).
    addr: String,
}

/// The per-peer queues and their sending tasks, owned by the replicator.
pub(super) struct PushQueues {
    memory: Arc<Memory>,
    /// Sends one batch to one peer.
    link: PushCall,
    /// Ends every sending task with the replicator.
    cancel: CancellationToken,
    queues: HashMap<NodeId, Queue>,
    /// The sending tasks, reaped as they end.
    tasks: JoinSet<()>,
    /// Peers a batch could not reach (queue full, push failed): due a sync.
    behind: Arc<std::sync::Mutex<HashSet<NodeId>>>,
}

impl std::fmt::Debug for PushQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushQueues")
            .field("peers", &self.queues.len())
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl PushQueues {
    /// No queues yet; each peer gets one with its first batch.
    pub(super) fn new(memory: Arc<Memory>, link: PushCall, cancel: CancellationToken) -> Self {
        Self {
            memory,
            link,
            cancel,
            queues: HashMap::new(),
            tasks: JoinSet::new(),
            behind: Arc::default(),
        }
    }

    /// Queues `push` for `peer` at `addr`; a full queue marks the peer for a sync instead.
    pub(super) fn offer(&mut self, peer: &NodeId, name: &str, addr: &str, push: &Arc<Push>) {
        if self.queues.get(peer).is_none_or(|q| q.addr != addr) {
            let (tx, rx) = mpsc::channel(PUSH_QUEUE);
            self.tasks.spawn(send(
                self.memory.clone(),
                self.link.clone(),
                self.behind.clone(),
                Target {
                    id: peer.clone(),
                    name: name.to_owned(),
                    addr: addr.to_owned(),
                },
                rx,
                self.cancel.clone(),
            ));
            let queue = Queue {
                tx,
                addr: addr.to_owned(),
            };
            self.queues.insert(peer.clone(), queue);
        }
        let full = self
            .queues
            .get(peer)
            .is_some_and(|q| q.tx.try_send(push.clone()).is_err());
        if full {
            tracing::debug!(peer = %name, "push queue full; the peer is synced instead");
            self.behind.lock_unpoisoned().insert(peer.clone());
        }
    }

    /// Drops the queues of peers that are no longer up (their tasks end once drained), and
    /// reaps the tasks that ended.
    pub(super) fn retain(&mut self, up: &HashSet<NodeId>) {
        self.queues.retain(|id, _| up.contains(id));
        while self.tasks.try_join_next().is_some() {}
    }

    /// Takes the peers that missed a batch: each is due a sync.
    pub(super) fn take_behind(&self) -> HashSet<NodeId> {
        std::mem::take(&mut *self.behind.lock_unpoisoned())
    }
}

/// The peer a sending task pushes to.
#[derive(Debug)]
struct Target {
    id: NodeId,
    name: String,
    addr: String,
}

/// One peer's sending task: one push at a time, each bounded by [`PUSH_CALL_DEADLINE`].
async fn send(
    memory: Arc<Memory>,
    link: PushCall,
    behind: Arc<std::sync::Mutex<HashSet<NodeId>>>,
    peer: Target,
    mut queue: mpsc::Receiver<Arc<Push>>,
    cancel: CancellationToken,
) {
    loop {
        let push = tokio::select! {
            () = cancel.cancelled() => return,
            push = queue.recv() => match push {
                Some(push) => push,
                None => return,
            },
        };
        let call = link(
            peer.addr.clone(),
            push.entries.clone(),
            push.certificates.clone(),
        );
        let result = tokio::select! {
            () = cancel.cancelled() => return,
            result = tokio::time::timeout(PUSH_CALL_DEADLINE, call) => result
                .unwrap_or_else(|_| Err(PeerCallError::NoAnswer { seconds: PUSH_CALL_DEADLINE.as_secs() })),
        };
        match result {
            // The peer's frontier for our writes: what lets us collect our tombstones early;
            // and what it was given, which a resync from it may drop.
            Ok(PushAnswer { frontier: held, .. }) => {
                let own = memory.own_id().clone();
                let sent = push.entries.iter().map(|e| e.record.seq).max().unwrap_or(0);
                let noted = memory
                    .note_peer(&peer.id, &BTreeMap::from([(own, held)]))
                    .and_then(|()| memory.note_offered(&peer.id, sent));
                if let Err(e) = noted {
                    tracing::warn!(error = %e, "record a peer's frontier");
                }
            }
            Err(e) => {
                tracing::debug!(peer = %peer.name, error = %e, "push memory (the next sync catches up)");
                behind.lock_unpoisoned().insert(peer.id.clone());
            }
        }
    }
}
