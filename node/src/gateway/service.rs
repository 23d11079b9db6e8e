//! [`Gateway`]: the front door's core as one value, what every dialect's handler calls; its
//! behaviour is in the files beside this one (`call`, `charge`, `conversations`).

use std::sync::Arc;

use super::conversations::Conversations;
use crate::{api_keys::Keys, chat::ChatService, memory::Memory};

/// The front door's core, shared by every dialect.
#[derive(Debug)]
pub(crate) struct Gateway {
    /// Places and runs chats and embeddings: here, or on peers.
    pub(super) chat: Arc<ChatService>,
    /// The API keys, their limits and usage: what each run is admitted and charged against.
    pub(super) keys: Arc<Keys>,
    /// The Responses API's stored conversations.
    conversations: Conversations,
}

impl Gateway {
    /// A gateway running chats with `chat`, charging them to `keys`, and keeping the stored
    /// conversations in `memory`.
    pub(crate) fn new(chat: Arc<ChatService>, keys: Arc<Keys>, memory: Arc<Memory>) -> Self {
        Self {
            chat,
            keys,
            conversations: Conversations::new(memory),
        }
    }

    /// The Responses API's stored conversations.
    pub(crate) fn conversations(&self) -> &Conversations {
        &self.conversations
    }
}
