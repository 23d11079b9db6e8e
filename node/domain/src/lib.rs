//! agentmesh's shared vocabulary: the types every part of the mesh speaks, and nothing that
//! does I/O.
//!
//! # Layout
//!
//! - [`id`]: [`NodeId`], a node's id (hash of its certificate's public key).
//! - [`tier`]: [`Tier`], the permission tier of a task or a tool.
//! - [`target`]: [`Target`], what runs a task or a chat (a role, a model or a persona).
//! - [`task`]: [`TaskSpec`] and its [`Lineage`], [`Requirements`] and [`Evaluation`],
//!   [`TaskError`], [`TaskStatus`], the events of a task ([`TaskEvent`], [`EventKind`]) and its [`Answer`].
//! - [`node`]: what a node says about itself ([`NodeInfo`] and its parts) and [`PeerState`].
//! - [`mcp`]: tools from MCP servers: their namespaced names (`<server>__<tool>`), how a node
//!   advertises one ([`McpToolInfo`]) and the bounds on them.
//! - [`chat`]: conversations with a model: [`Message`], tool calls and specs, [`Sampling`],
//!   [`ChatRequest`], [`ChatResponse`], [`Usage`].
//! - [`embed`]: embeddings: [`EmbedRequest`] (texts, bounded) and [`EmbedResponse`] (one
//!   vector per text).
//! - [`api_key`]: a front-door API key's name rules and [`KeyPolicy`] ([`KeyLimits`]).
//! - [`origin`]: web origins and host names in the one form the front door compares them in.
//! - [`keys`]: which namespaces and keys of the shared memory are valid.
//! - [`statement`]: what an operator signs with their own key (a decision on an approval, a
//!   front-door key), as it travels and is stored ([`statement::Signed`]).
//! - [`time`], [`text`], [`sync`], [`future`], [`throttle`]: small helpers every layer needs
//!   once.
//!
//! This crate is the bottom layer (layer 0 in docs/src/architecture/layers.md): it uses no other
//! crate of the workspace, no async runtime, no network and no storage, so the node, the CLI and
//! the wire contract (`mesh-proto`, which converts these types to and from protobuf) can all
//! share it.

pub mod api_key;
pub mod chat;
pub mod embed;
pub mod event;
pub mod future;
pub mod id;
pub mod journal;
pub mod keys;
pub mod mcp;
pub mod node;
pub mod origin;
pub mod statement;
pub mod sync;
pub mod target;
pub mod task;
pub mod text;
pub mod throttle;
pub mod tier;
pub mod time;

pub use api_key::{KeyLimits, KeyPolicy};
pub use chat::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolChoice,
    ToolSpec, Usage,
};
pub use embed::{EmbedRequest, EmbedResponse};
pub use event::{EventKind, TaskEvent};
pub use future::BoxFuture;
pub use id::NodeId;
pub use mcp::McpToolInfo;
pub use node::{
    Gpu, Health, HealthStatus, Load, ModelInfo, NodeInfo, PeerState, PersonaInfo, Resources,
};
pub use target::Target;
pub use task::{
    Answer, CertRole, Evaluation, Lineage, Principal, Requirements, TaskError, TaskSpec, TaskStatus,
};
pub use tier::Tier;
