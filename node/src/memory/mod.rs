//! Shared memory: namespaced key-value records in sled, ordered by a hybrid logical clock and
//! replicated to every peer.
//!
//! A [`Record`] carries its value, an HLC timestamp, the writing node's id, that node's write
//! sequence number and a tombstone flag; the greater `(timestamp, node id)` wins, the same on
//! every node ([`Record::wins_over`]). Each node numbers its own writes; the index tree maps
//! `(origin, seq)` to the one key whose latest record has it, so "records from origin X after
//! sequence n" is a range scan whose size is bounded by the data, not by history. Each record
//! carries its origin's signature, checked on every node that applies it, so a node that relays
//! others' records cannot forge or alter them. Peers pull
//! with `Sync` (when they come up and every 30 s) and are pushed new writes at once. A remote
//! record stamped further ahead of our clock than the allowed skew is refused and logged.
//!
//! This module owns the stores and the replication loop. It must not speak protobuf or open
//! connections: it reaches peers through the [`MemoryPeers`] port, which `rpc::memory`
//! implements over gRPC; `rpc::memory` translates the wire format, and decides nothing.
//!
//! # Layout
//!
//! One concern per file, modelled on garage's `src/table/`; each file adds its own
//! `impl Memory` block:
//!
//! - `record`: [`Record`] and [`Entry`], the last-writer-wins rule and the storage encoding.
//! - `error`: [`MemoryError`], shared by every file.
//! - `store`: [`Memory`] itself and [`MemoryOptions`]; open, put, get, list, applying peers'
//!   records, reads of the `(origin, seq)` index, and the trees and their key layout.
//! - `clock`: the HLC, the skew bound on peers' stamps and [`Memory::clock_problem`].
//! - `frontier`: own sequence, watermarks, peers' frontiers, the nodes heard of
//!   ([`Memory::known`]), the contact clock and [`Memory::lag`].
//! - `gc`: tombstone collection, forgetting nodes not heard of, [`Memory::stale`], and dropping
//!   what a peer deleted while this node was away.
//! - `signatures`: signing own records, verifying every peer's record against its origin's
//!   certificate before it is applied, keeping origins' certificates to relay them, counting
//!   and logging refusals, and the upgrade of a store written before records were signed.
//! - `writers`: who may write each system namespace, checked on every peer's record after its
//!   signature.
//! - `fence`: who may write a durable task's journal: leases from the task's origin only, and
//!   steps refused once a higher epoch is known (the one rule that reads what is stored).
//! - `push`: the per-peer bounded push queues ([`replicate`]'s back-pressure: one push in
//!   flight per peer; a full queue marks the peer for a sync).
//! - `sync`: the `Sync` exchange ([`SyncRequest`], [`SyncBatch`], [`answer_sync`],
//!   [`sync_from`], [`resync_from`]), batching pushes, the [`MemoryPeers`] port and
//!   [`replicate`].
//!
//! Imports point one way: `record` and `error` at the bottom, then `store`, which names no
//! sibling above it; `clock`, `frontier`, `gc`, `signatures`, `writers`, `fence` and `sync` name `store` (and `gc`
//! names `frontier`), never the reverse; `push` names `store` and `record` only (it is handed
//! the call that sends a batch), and `sync` names it. `store` reaches them by calling methods only. This file
//! declares and re-exports; it defines nothing.

mod clock;
mod error;
mod fence;
mod frontier;
mod gc;
mod index;
mod lag;
mod push;
mod record;
mod revocations;
mod signatures;
mod store;
mod sync;
#[cfg(test)]
pub(crate) mod test_support;
mod writers;

pub(crate) use error::{MemoryError, PeerCallError, readable_by_callers, writable_by_callers};
pub(crate) use lag::LagGauges;
pub(crate) use push::PushAnswer;
pub(crate) use record::MAX_SIGNATURE;
pub use record::{Entry, Record};
pub(crate) use revocations::stamp_ms;
pub use store::{Memory, MemoryOptions};
pub use sync::SYNC_BATCH;
pub(crate) use sync::{
    MemoryPeers, SyncBatch, SyncRequest, answer_sync, pull_origins, replicate, sync_from,
};
