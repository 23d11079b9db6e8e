//! What the front door needs from the node, in a file of its own: every part of the front door
//! (the routes in `mod.rs`, the gateway, each dialect) reads it, and none of them may name
//! `mod.rs`, which names them all (no circle of files; `node/tests/layers.rs`).

use std::sync::Arc;

use crate::{
    api_keys::Keys, capabilities::Capabilities, chat::ChatService, memory::Memory, peers::PeerTable,
};

/// What the front door needs from the node.
#[derive(Debug)]
pub struct FrontDoor {
    /// Places and runs chats: here, or on peers.
    pub chat: Arc<ChatService>,
    /// This node's advertised info.
    pub caps: Arc<Capabilities>,
    /// Peers and what they serve.
    pub peers: Arc<PeerTable>,
    /// The API keys (`http.api_keys`, `[[http.keys]]`, and those added at run time), their
    /// limits and usage; with none, the front door is open.
    pub keys: Arc<Keys>,
    /// For `/metrics`: replication lag per peer.
    pub memory: Arc<Memory>,
}
