//! What can go wrong in the memory: one error enum for every file of it, so callers branch on
//! one type (`rpc::memory` maps each variant to a gRPC status once); and, apart, why a call to
//! a peer's memory failed ([`PeerCallError`], what the `MemoryPeers` port returns) and why a
//! pull from a peer stopped ([`SyncError`]). It describes failures and decides nothing; in
//! particular it knows no status codes.

use mesh_cert::{OriginError, RevocationError};
use mesh_domain::keys::{InvalidName, PRIVATE_NAMESPACES, SYSTEM_NAMESPACES};

use crate::storage::StoreError;

/// Why a memory operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MemoryError {
    /// A name, key or value breaks a limit.
    #[error("{0}")]
    Invalid(String),
    /// A remote record is stamped too far in the future.
    #[error(
        "record from {origin} is stamped {ahead_ms} ms ahead of this node's clock (at most {max_ms} ms allowed); check the clocks"
    )]
    FromTheFuture {
        /// The writing node (its short id).
        origin: String,
        /// How far ahead of this node's clock the record is stamped.
        ahead_ms: u64,
        /// The allowed skew (`memory.max_clock_skew_ms`).
        max_ms: u64,
    },
    /// Stored bytes do not decode.
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    /// Storage failed, or the disk is full.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// A namespace the node writes only through its own services (cron, sessions).
    #[error(
        "namespace `{0}` belongs to the node ({list}): only its own service writes it (cron schedules through `mesh-cli cron`); use another namespace",
        list = SYSTEM_NAMESPACES.join(", ")
    )]
    Reserved(String),
    /// A namespace only the node's own services read (the front door's stored responses).
    #[error(
        "namespace `{0}` is private to the node's own services ({list}): it cannot be read through the memory API or an agent's tools",
        list = PRIVATE_NAMESPACES.join(", ")
    )]
    Private(String),
    /// A record's signature does not prove its origin wrote it (or signing our own failed).
    #[error("record refused: {0}")]
    Unverified(#[from] OriginError),
    /// A revocation entry that does not verify (or cannot be kept).
    #[error("revocation refused: {0}")]
    Revocation(#[from] RevocationError),
    /// A record written by a revoked certificate after its revocation.
    #[error("record refused: its origin {0} was revoked by the mesh CA before writing it")]
    Revoked(String),
    /// A replicated record of a system namespace that its origin may not write (see
    /// `writers`).
    #[error("record refused: {place} may not be written by node {origin}: {why}")]
    Writer {
        /// `namespace/key`.
        place: String,
        /// The writing node (its short id).
        origin: String,
        /// The rule it breaks.
        why: String,
    },
    /// A task journal's step appended at an epoch lower than the highest lease this node
    /// knows of the task: its executor was superseded (see `fence`).
    #[error(
        "record refused: {place} was appended by node {origin} at epoch {epoch}, and the task runs at epoch {current} now (its executor was superseded)"
    )]
    Fenced {
        /// `namespace/key`.
        place: String,
        /// The appending node (its short id).
        origin: String,
        /// The step's epoch.
        epoch: u32,
        /// The highest epoch known here.
        current: u32,
    },
    /// A write would create a namespace past the node's bound on namespaces.
    #[error(
        "namespace `{namespace}` would be new, and this node already holds {limit} namespaces, the most it keeps (memory.max_namespaces): write into an existing namespace, or raise memory.max_namespaces in the node's config"
    )]
    TooManyNamespaces {
        /// The namespace that would have been created.
        namespace: String,
        /// The bound (`memory.max_namespaces`).
        limit: usize,
    },
    /// This node was away longer than the tombstone window and has not resynced yet.
    #[error(
        "this node was out of touch longer than memory.tombstone_window_s and is resyncing; ask another node"
    )]
    Resyncing,
}

impl MemoryError {
    /// Whether a replicated record refused with this error still counts as received, so that
    /// replication moves past it: a writer rule's refusal is of a record its origin really
    /// wrote, and no copy of it will ever be accepted; so is a fenced step (epochs only rise). Every other refusal (a signature that
    /// does not verify, a stamp too far ahead) may be of a bad copy, or pass later, so the
    /// record is asked for again.
    pub fn counts_as_received(&self) -> bool {
        matches!(self, Self::Writer { .. } | Self::Fenced { .. })
    }
}

/// Why a call to a peer's memory (`MemoryPeers::sync` or `push`) gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PeerCallError {
    /// No connection to the peer could be opened.
    #[error("{0}")]
    Unreachable(String),
    /// The peer is resyncing itself and answers no `Sync` until it is done.
    #[error("the peer is resyncing")]
    Resyncing,
    /// The peer answered with an error (its status code and message).
    #[error("{0}")]
    Refused(String),
    /// The peer's answer breaks the protocol; the text names what.
    #[error("{0}")]
    BadAnswer(String),
    /// No answer within the call's deadline.
    #[error("no answer within {seconds} s")]
    NoAnswer { seconds: u64 },
}

/// Why a pull (or a full resync) from a peer stopped before the end.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum SyncError {
    /// A call to the peer failed.
    #[error(transparent)]
    Peer(#[from] PeerCallError),
    /// This node's memory could not take what came.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The peer answered `more` with nothing past what it had sent.
    #[error("the peer answered `more` with nothing new; giving up this pull")]
    Stuck,
    /// A resync's peer had more to send than one resync takes.
    #[error("the peer had more than {batches} batches to send; resyncing from another")]
    TooLong { batches: usize },
}

/// Whether a caller outside the node's own services (a client or node over `Memory.Put` and
/// `Memory.Delete`, an agent's `memory_put`) may write namespace `ns`: not the system
/// namespaces, which only the cron service, the scheduler and the session code write.
pub(crate) fn writable_by_callers(ns: &str) -> Result<(), MemoryError> {
    if SYSTEM_NAMESPACES.contains(&ns) {
        return Err(MemoryError::Reserved(ns.to_owned()));
    }
    Ok(())
}

/// Whether a caller outside the node's own services (a client or node over `Memory.Get` and
/// `Memory.List`, an agent's `memory_get` and `memory_search`) may read namespace `ns`: not the
/// private namespaces.
pub(crate) fn readable_by_callers(ns: &str) -> Result<(), MemoryError> {
    if PRIVATE_NAMESPACES.contains(&ns) {
        return Err(MemoryError::Private(ns.to_owned()));
    }
    Ok(())
}

impl From<InvalidName> for MemoryError {
    fn from(error: InvalidName) -> Self {
        Self::Invalid(error.0)
    }
}
