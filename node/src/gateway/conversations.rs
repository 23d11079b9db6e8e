//! The stored conversations of OpenAI's Responses API: what `previous_response_id` continues
//! and `GET /v1/responses/{id}` reads.
//!
//! An answer and the conversation up to it are kept in the replicated memory's private
//! namespace `responses`, under the response's id, with the id of the key that asked, for
//! [`TTL_S`]: any node can continue it once it has replicated there, and only the same key
//! sees it. A conversation over the memory's value limit is not kept. [`sweep_loop`] deletes
//! expired entries and, past [`Bounds::default`], the oldest. The Response object itself is the
//! dialect's JSON, kept and served as it was answered; this module never reads it.

use std::{sync::Arc, time::Duration};

use mesh_domain::{
    ChatResponse, Message, Role,
    keys::{MAX_VALUE, RESPONSES, response_id},
    time::now_s,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{caller::DoorCaller, error::GatewayError};
use crate::memory::{Memory, MemoryError};

/// How long a stored response is kept and served: 30 days, as OpenAI keeps them.
pub(crate) const TTL_S: u64 = 30 * 24 * 3600;

/// How often [`sweep_loop`] looks for expired responses.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// A stored response: who may read it, until when, the conversation a continuation needs, and
/// the Response object as answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    /// Unix second after which it is neither served nor kept.
    pub expires_at: u64,
    /// The id of the key that created it (`api_keys::key_id`; `None` when the front door has
    /// no keys). Not its name: another key given the same name owns none of it.
    pub owner: Option<String>,
    /// The conversation up to and including this answer, without `instructions`.
    pub messages: Vec<Message>,
    /// The Response object.
    pub response: Value,
}

/// The only field the sweep reads of a stored response.
#[derive(Debug, Deserialize)]
struct Expiry {
    expires_at: u64,
}

/// The stored conversations, in the memory's private namespace `responses`.
#[derive(Debug, Clone)]
pub(crate) struct Conversations {
    memory: Arc<Memory>,
}

impl Conversations {
    /// The conversations stored in `memory`.
    pub(crate) fn new(memory: Arc<Memory>) -> Self {
        Self { memory }
    }

    /// Conversations in a memory of their own on a temp dir (kept while the dir lives), for
    /// the tests of the edges that store them, which do not reach memory themselves.
    #[cfg(test)]
    pub(crate) fn in_temp_memory() -> (tempfile::TempDir, Self) {
        let (dir, memory) = crate::memory::test_support::open_memory(
            &crate::memory::test_support::id("responses"),
            crate::memory::MemoryOptions::default(),
        );
        (dir, Self::new(memory))
    }

    /// A new response id, unique in the fleet (it names this node's id).
    pub(crate) fn new_id(&self) -> String {
        response_id(self.memory.own_id())
    }

    /// The stored response `id` as `caller` may see it at `now`: absent, expired, unreadable
    /// and another key's are all the same [`GatewayError::NotStored`] (the last so a key cannot
    /// learn of others' ids). `param` is the request field that named the id, if one did.
    pub(crate) fn load(
        &self,
        caller: &DoorCaller,
        id: &str,
        now: u64,
        param: Option<&str>,
    ) -> Result<Stored, GatewayError> {
        let not_stored = || GatewayError::NotStored {
            id: id.to_owned(),
            param: param.map(str::to_owned),
        };
        let record = match self.memory.get(RESPONSES, id) {
            Ok(Some(record)) if !record.tombstone => record,
            Ok(_) | Err(MemoryError::Invalid(_)) => return Err(not_stored()),
            Err(error) => {
                return Err(GatewayError::Store {
                    id: id.to_owned(),
                    error,
                });
            }
        };
        let stored: Stored = match serde_json::from_slice(&record.value) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(%id, error = %e, "a stored response does not decode; treated as absent");
                return Err(not_stored());
            }
        };
        if stored.expires_at <= now || stored.owner.as_deref() != caller.key_id() {
            return Err(not_stored());
        }
        Ok(stored)
    }

    /// Keeps `stored` under `id`; whether it was kept (a conversation over the memory's value
    /// limit, or a failed write, is not).
    pub(crate) async fn keep(&self, id: &str, stored: &Stored) -> bool {
        let value = match serde_json::to_vec(stored) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(%id, error = %e, "encode a response to store it");
                return false;
            }
        };
        // The memory refuses a value over its limit (`mesh_domain::keys::MAX_VALUE`).
        match self.memory.put(RESPONSES, id, Some(value)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(%id, error = %e, "response not stored");
                false
            }
        }
    }

    /// What the answer to `conversation` is kept with, for `caller`.
    pub(crate) fn keeper(&self, caller: &DoorCaller, conversation: Vec<Message>) -> Keeper {
        Keeper {
            conversations: self.clone(),
            owner: caller.key_id().map(str::to_owned),
            conversation,
        }
    }
}

/// What one answer is kept with: where, for whom, and the conversation before it.
#[derive(Debug)]
pub(crate) struct Keeper {
    conversations: Conversations,
    owner: Option<String>,
    conversation: Vec<Message>,
}

impl Keeper {
    /// Stores `response` (the Response object) under `id`, with the conversation and `answer`
    /// appended; whether it was kept.
    pub(crate) async fn keep(self, id: &str, answer: &ChatResponse, response: &Value) -> bool {
        let mut messages = self.conversation;
        messages.push(Message {
            tool_calls: answer.tool_calls.clone(),
            ..Message::text(Role::Assistant, answer.content.clone())
        });
        let stored = Stored {
            expires_at: now_s().saturating_add(TTL_S),
            owner: self.owner,
            messages,
            response: response.clone(),
        };
        self.conversations.keep(id, &stored).await
    }
}

/// Bounds on the stored responses: past them the sweep drops the oldest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Most stored responses.
    pub entries: usize,
    /// Most bytes of stored responses.
    pub bytes: usize,
}

impl Default for Bounds {
    /// 10,000 responses and 256 MiB on every node, whichever is reached first.
    fn default() -> Self {
        Self {
            entries: 10_000,
            bytes: 256 * 1024 * 1024,
        }
    }
}

/// Deletes the stored responses expired at `now` and then, past `bounds`, the oldest (ids are
/// UUIDv7s, so key order is creation order); how many it deleted. It reads the namespace a page
/// at a time, so its memory use is bounded by a page, not by the namespace.
pub(crate) async fn sweep(memory: &Memory, now: u64, bounds: Bounds) -> Result<usize, MemoryError> {
    const PAGE: usize = 64;
    const PAGE_BYTES: usize = 4 * MAX_VALUE;
    let mut kept: Vec<(String, usize)> = Vec::new();
    let mut deleted = 0;
    let mut after = String::new();
    loop {
        let page = memory.page(RESPONSES, "", &after, PAGE, PAGE_BYTES)?;
        for entry in page.entries {
            // One that does not decode is never served: it goes like an expired one.
            let expired = serde_json::from_slice::<Expiry>(&entry.record.value)
                .map_or(true, |e| e.expires_at <= now);
            if expired {
                memory.put(RESPONSES, &entry.key, None).await?;
                deleted += 1;
            } else {
                kept.push((entry.key, entry.record.value.len()));
            }
        }
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let mut entries = kept.len();
    let mut bytes: usize = kept.iter().map(|(_, size)| size).sum();
    for (key, size) in kept {
        if entries <= bounds.entries && bytes <= bounds.bytes {
            break;
        }
        memory.put(RESPONSES, &key, None).await?;
        entries -= 1;
        bytes -= size;
        deleted += 1;
    }
    Ok(deleted)
}

/// Runs [`sweep`] every ten minutes until `stop`.
pub(crate) async fn sweep_loop(memory: Arc<Memory>, stop: CancellationToken) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        tokio::select! {
            result = sweep(&memory, now_s(), Bounds::default()) => match result {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "stored responses swept"),
                Err(e) => tracing::warn!(error = %e, "sweep the stored responses"),
            },
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::keys::RESPONSES;
    use serde_json::json;

    use super::*;
    use crate::{api_keys::KeyGrant, memory::MemoryOptions};

    fn memory() -> (tempfile::TempDir, Arc<Memory>) {
        crate::memory::test_support::open_memory(
            &crate::memory::test_support::id("responses"),
            MemoryOptions::default(),
        )
    }

    /// Alice's key.
    const ALICE: &str = "sk-alice-0123456789";

    fn stored(owner: Option<&str>, expires_at: u64) -> Stored {
        Stored {
            expires_at,
            owner: owner.map(str::to_owned),
            messages: vec![Message::text(Role::User, "hi")],
            response: json!({"id": "x"}),
        }
    }

    /// A stored response is served to the key that created it, until it expires: another key,
    /// no key, an expired or unknown id are the same refusal (a 404 at the front door). Issue
    /// 26, item 4: it was owned by the key's name, so another key with that name (another
    /// node's config, or a key added under the name after the first was revoked) read it; it
    /// is the key's id now.
    #[tokio::test]
    async fn a_stored_response_is_served_only_to_its_key_until_it_expires() {
        let (_dir, memory) = memory();
        let conversations = Conversations::new(memory.clone());
        let alice = DoorCaller {
            key: Some(KeyGrant::named("alice", ALICE)),
        };
        assert!(
            conversations
                .keep("resp_1", &stored(alice.key_id(), 100))
                .await
        );
        let bob = DoorCaller {
            key: Some(KeyGrant::named("bob", "sk-bob-0123456789")),
        };
        let another_alice = DoorCaller {
            key: Some(KeyGrant::named("alice", "sk-not-alice-0123456789")),
        };
        assert_eq!(
            conversations
                .load(&alice, "resp_1", 99, None)
                .expect("alice's")
                .messages
                .len(),
            1
        );
        for (caller, id, now) in [
            (&bob, "resp_1", 99),
            (&another_alice, "resp_1", 99),
            (&DoorCaller::default(), "resp_1", 99),
            (&alice, "resp_1", 100),
            (&alice, "resp_2", 99),
            (&alice, "", 99),
        ] {
            let error = conversations
                .load(caller, id, now, Some("previous_response_id"))
                .expect_err("not served");
            assert!(
                matches!(&error, GatewayError::NotStored { param: Some(param), .. } if param == "previous_response_id"),
                "{caller:?} {id} {now}: {error:?}"
            );
        }
        // A conversation over the memory's value limit is not kept.
        let mut big = stored(None, 100);
        big.messages = vec![Message::text(Role::User, "x".repeat(MAX_VALUE))];
        assert!(!conversations.keep("resp_big", &big).await);
        assert!(memory.get(RESPONSES, "resp_big").expect("get").is_none());
    }

    /// The sweep deletes the expired responses, and past the bounds the oldest; the rest stay.
    #[tokio::test]
    async fn the_sweep_deletes_expired_and_then_the_oldest() {
        let (_dir, memory) = memory();
        let conversations = Conversations::new(memory.clone());
        for (key, expires_at) in [
            ("resp_1", 50),
            ("resp_2", 200),
            ("resp_3", 200),
            ("resp_4", 60),
            ("resp_5", 200),
        ] {
            assert!(conversations.keep(key, &stored(None, expires_at)).await);
        }
        let live = |memory: &Memory| -> Vec<String> {
            memory
                .list(RESPONSES, "", 100)
                .expect("list")
                .into_iter()
                .map(|e| e.key)
                .collect()
        };
        let roomy = Bounds::default();
        assert_eq!(sweep(&memory, 10, roomy).await.expect("sweep"), 0);
        assert_eq!(live(&memory).len(), 5);
        assert_eq!(sweep(&memory, 100, roomy).await.expect("sweep"), 2);
        assert_eq!(live(&memory), ["resp_2", "resp_3", "resp_5"]);
        let two = Bounds {
            entries: 2,
            bytes: usize::MAX,
        };
        assert_eq!(sweep(&memory, 100, two).await.expect("sweep"), 1);
        assert_eq!(live(&memory), ["resp_3", "resp_5"]);
        let one_entry_of_bytes = Bounds {
            entries: 10,
            bytes: live_bytes(&memory) / 2,
        };
        assert_eq!(
            sweep(&memory, 100, one_entry_of_bytes)
                .await
                .expect("sweep"),
            1
        );
        assert_eq!(live(&memory), ["resp_5"]);
    }

    fn live_bytes(memory: &Memory) -> usize {
        memory
            .list(RESPONSES, "", 100)
            .expect("list")
            .iter()
            .map(|e| e.record.value.len())
            .sum()
    }
}
