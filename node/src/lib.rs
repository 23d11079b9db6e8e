//! agentmesh node: a gRPC node that finds its fleet, shows what it can do, and (in later parts)
//! runs and delegates agent tasks.
//!
//! # Layout
//!
//! One module per concept; `rpc` translates, the others decide.
//!
//! - [`config`]: TOML config and flags → validated [`config::Config`]; every error names its key.
//! - [`discovery`]: where peers might be: mDNS advert/browse and static peers, as events.
//! - [`peers`]: the peer table (up / suspect / down) and the watch sessions that keep it true.
//! - [`capabilities`]: what this node is and has: roles, models, CPU, memory, GPUs, load, health.
//! - [`llm`]: the model registry (role → model chain) and backends (`openai`, `embedded`).
//! - [`agent`]: the tools loop, personas, the supervisor (hooks) and the tool table.
//! - [`tasks`]: admission, the bounded queue and workers, events, cancellation, history in sled.
//! - [`memory`]: replicated key-value records (HLC, last-writer-wins, sync and push).
//! - [`storage`]: the ordered key-value store memory keeps its trees in (sled behind a trait).
//! - [`router`]: pure ranking of candidate nodes for a task, with exclusion reasons.
//! - [`rpc`]: tonic adapters for the `agentmesh.v1` services, server and client side.
//! - [`server`]: binds, starts and stops a node, in a documented order.
//!
//! # Data flow
//!
//! discovery → `DiscoveryEvent` → peers::Membership → dials (tls) → `WatchInfo` stream (rpc)
//! → `PeerTable` → `ListPeers` (rpc) → `mesh-cli status`.

pub mod admission;
pub mod agent;
pub mod capabilities;
pub mod chat;
pub mod config;
pub mod cron;
pub mod discovery;
pub mod http;
pub mod llm;
pub mod memory;
pub mod metrics;
pub mod peers;
pub mod router;
pub mod rpc;
pub mod server;
pub mod storage;
pub mod tasks;
