//! agentmesh node: finds its fleet, shows what it can do, runs agent tasks on its own models,
//! places tasks and chats where they fit best in the mesh, and keeps the fleet's shared memory
//! and schedules.
//!
//! # Layout
//!
//! One module per concept, in layers (docs/src/architecture/layers.md; `node/tests/layers/`
//! checks them): a module uses its own layer and those below; where a lower one must call up, it
//! defines a port (a trait) that a higher one implements and [`server`] wires them. The shared
//! types (ids, tasks, events, node descriptions, chat messages) are the crate `mesh-domain`;
//! certificates, the mesh CA and signatures are `mesh-cert`, mTLS and dialing `mesh-tls`,
//! joining and the zero-config layout `mesh-join`; the wire contract and its conversions are
//! `mesh-proto`.
//!
//! 1. [`config`] (the TOML file and flags, validated), [`storage`] (the ordered store, sled
//!    behind a trait), [`metrics`] (the Prometheus registry), [`connections`] (caps on the
//!    listeners' open connections, and the open-files limit), [`supervise`] (background loops
//!    restarted with back-off when they fail; reports through `LoopHealth`), [`process`]
//!    (child processes killed with everything they started when their owner drops them).
//! 2. [`discovery`] (mDNS and static peers, as events), [`peers`] (the peer table and the
//!    sessions that keep it true; dials through the `PeerLink` port), [`capabilities`] (what
//!    this node is and has), [`llm`] (the model registry and its backends), [`mcp`] (this
//!    node's MCP servers, kept connected, their tools checked and called), [`router`] (pure
//!    ranking and choice), [`memory`] (replicated records; reaches peers through `MemoryPeers`).
//! 3. [`admission`] (the one door: whether and where a task or chat runs), [`api_keys`] (the
//!    front door's keys: who a key is, its budgets and rate limits, usage counted fleet-wide
//!    in the memory), [`chat`] (model
//!    chains with fall-through, chats on peers through `RemoteChat`), [`gateway`] (the front
//!    door's core: a call whichever API it came in through, its key's reservation and charge,
//!    the stored conversations; reaches the fleet's data through `MeshData`), [`agent`] (the tools loop,
//!    the supervisor, the tool table; reports through `EventSink`), [`cron`] (schedules; fires
//!    through `Runner`), [`issuer`] (redeems join tokens for certificates on a node with the CA
//!    key), [`approvals`] (approval gates: which tool calls wait for a person, kept in the
//!    memory so any node can decide them), [`settings`] (the runtime settings `mesh-cli config
//!    set` changes: checked as the config file is, kept in the data dir, applied at once),
//!    [`task_handle`] (a task as its submitter holds it: followed to its outcome; why a task
//!    was not taken or found).
//! 4. [`tasks`] (the task manager: queue, workers, events, history, forwarding through
//!    `Forwarder`).
//! 5. [`rpc`] and [`http`]: the edges, protobuf and JSON in, domain types out; they implement
//!    the ports. `http` has one folder per API dialect over the `gateway`.
//! 6. [`server`]: binds, wires, starts and stops a node, in a documented order.
//!
//! # Data flow
//!
//! A task: `rpc` (or `http`, `delegate`, `cron`) → [`tasks::TaskManager::submit`] →
//! [`admission::Admission::admit`] (hop limit, tier cap, [`router`]) → a worker here
//! ([`agent::AgentRuntime::run`], models through [`chat::fall_through`]) or another node
//! ([`tasks::forward`](tasks::forward)) → events to every watcher.
//!
//! The fleet: [`discovery`] → `DiscoveryEvent` → [`peers::swim::Membership`] (SWIM over signed
//! UDP datagrams says who is up, suspect or down; a member's `NodeInfo` is fetched through the
//! `PeerLink` port, `GetInfo` in rpc, when its gossiped version changes) →
//! [`peers::PeerTable`] → `ListPeers` and `WatchPeers` (rpc) → `mesh-cli status`.

// An item is `pub` only where the crate's users reach it (config, server, testing); the rest is
// `pub(crate)` or narrower, so the compiler reports what nothing uses.
#![warn(unreachable_pub)]

mod admission;
mod agent;
mod api_keys;
mod approvals;
mod capabilities;
mod chat;
pub mod config;
mod connections;
mod cron;
mod discovery;
mod gateway;
mod http;
mod issuer;
mod llm;
mod mcp;
mod memory;
mod metrics;
mod peers;
mod process;
mod router;
mod rpc;
pub mod server;
mod settings;
mod storage;
mod supervise;
mod task_handle;
mod tasks;

pub use connections::raise_open_files_limit;

/// What the integration tests (`tests/`) and the bench binaries reach inside a node, and nothing
/// else: the rest of the crate is private to it. A name here is a seam a test drives directly (a
/// hostile peer built from the node's own membership, a model without a node, a memory on a
/// bare store); everything else is tested through the binaries' sockets.
pub mod testing {
    #[cfg(feature = "embedded")]
    pub use crate::llm::embedded::EmbeddedModel;
    pub use crate::{
        agent::tools::{RemoteCall, RemoteTools},
        api_keys::key_sha256,
        cron::{Overlap, Schedule},
        discovery::{DiscoveryEvent, PeerSource},
        llm::{
            ChatModel, ModelError, delta_channel,
            embedded::{EmbeddedOptions, MEASURE_TOKENS},
        },
        mcp::McpHub,
        memory::{Entry, Memory, MemoryOptions, Record, SYNC_BATCH},
        peers::{
            PeerTable,
            adverts::AdvertGuard,
            budget::{FAILURE_BURST, FAILURES_PER_SECOND},
            envelope::{Opener, Sealer},
            swim::{Member, Membership, MembershipParts, STRANGER_CHECKS_PER_SECOND, lan_config},
        },
        router::{Candidate, rank},
        rpc::{
            NodeLink, PeerChannels, PeerClient,
            accept::{EXPIRED_CONNECTION_GRACE, TlsIncoming},
            tools::RemoteToolsClient,
        },
        storage::SledStore,
        supervise::LoopHealth,
    };
}
