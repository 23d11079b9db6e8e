//! [`Gateway`]: the front door's core as one value, what every dialect's handler calls; its
//! behaviour is in the files beside this one (`call`, `charge`, `conversations`,
//! `mesh`).

use std::sync::Arc;

use super::{conversations::Conversations, data::MeshData};
use crate::{admission::Admission, api_keys::Keys, chat::ChatService, memory::Memory};

/// The front door's core, shared by every dialect.
#[derive(Debug)]
pub(crate) struct Gateway {
    /// Places and runs chats and embeddings: here, or on peers.
    pub(super) chat: Arc<ChatService>,
    /// The API keys, their limits and usage: what each run is admitted and charged against.
    pub(super) keys: Arc<Keys>,
    /// The Responses API's stored conversations.
    conversations: Conversations,
    /// Whether a front-door caller may do something of a tier (`/mcp`).
    pub(super) admission: Arc<Admission>,
    /// The fleet's node list and shared memory, as the agents' data tools read them (`/mcp`).
    pub(super) data: Arc<dyn MeshData>,
    /// The most tokens a task started through the front door is granted (this node's
    /// `tasks.token_budget`), all of it reserved of its key's budget while it runs.
    pub(super) task_token_budget: u64,
}

/// What a [`Gateway`] is built from.
#[derive(Debug)]
pub(crate) struct GatewayParts {
    /// Places and runs chats and embeddings.
    pub(crate) chat: Arc<ChatService>,
    /// The API keys.
    pub(crate) keys: Arc<Keys>,
    /// Where the stored conversations are kept.
    pub(crate) memory: Arc<Memory>,
    /// Decides what a front-door caller may do.
    pub(crate) admission: Arc<Admission>,
    /// The fleet's data, through the agents' data tools.
    pub(crate) data: Arc<dyn MeshData>,
    /// This node's `tasks.token_budget`.
    pub(crate) task_token_budget: u64,
}

impl Gateway {
    /// A gateway from its parts: chats run with `chat` and charged to `keys`, stored
    /// conversations kept in `memory`.
    pub(crate) fn new(parts: GatewayParts) -> Self {
        Self {
            chat: parts.chat,
            keys: parts.keys,
            conversations: Conversations::new(parts.memory),
            admission: parts.admission,
            data: parts.data,
            task_token_budget: parts.task_token_budget,
        }
    }

    /// The Responses API's stored conversations.
    pub(crate) fn conversations(&self) -> &Conversations {
        &self.conversations
    }
}
