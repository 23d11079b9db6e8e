//! Key reservation before a run and settlement after. Before a chat or embeddings run, the
//! caller's key (when the front door has keys) is admitted by `api_keys` for what the run may
//! take (its prompt's upper bound, `max_tokens` per choice), which is counted and reserved; the
//! [`Charge`] it answers is settled once with what the run spent (`super::call::run_placed`
//! for chats, [`Gateway::embed`], [`settle_from_outcome`] for a task `/mcp` started), or,
//! dropped unsettled, with its whole reservation. The limits and the counting are `api_keys`';
//! this module only says what each run asks.

use mesh_domain::{EmbedRequest, Message, Role, Target, TaskSpec, chat::prompt_token_bound};

use super::{call::Call, caller::DoorCaller, error::GatewayError, service::Gateway};
use crate::{
    api_keys::{Ask, Charge},
    task_handle::{TaskHandle, TaskOutcome},
};

impl Gateway {
    /// Admits `call` for the caller's key: `max_tokens` becomes what the key grants, and all of
    /// it is reserved. `None` when the front door needs no key.
    pub(super) async fn reserve_chat(
        &self,
        caller: &DoorCaller,
        call: &mut Call,
    ) -> Result<Option<Charge>, GatewayError> {
        let Some(grant) = &caller.key else {
            return Ok(None);
        };
        let ask = Ask {
            prompt: prompt_token_bound(&call.chat.messages, &call.chat.tools),
            completion: call.chat.sampling.max_tokens.map(u64::from),
            choices: call.n,
        };
        let charge = self.keys.admit(grant, &call.model, ask).await?;
        call.chat.sampling.max_tokens = charge.max_tokens();
        Ok(Some(charge))
    }

    /// Admits embeddings of `request` with `model` for the caller's key. Embeddings generate
    /// nothing: the reservation is the inputs' upper bound.
    pub(super) async fn reserve_embed(
        &self,
        caller: &DoorCaller,
        model: &str,
        request: &EmbedRequest,
    ) -> Result<Option<Charge>, GatewayError> {
        let Some(grant) = &caller.key else {
            return Ok(None);
        };
        let ask = Ask {
            prompt: request.token_bound(),
            completion: Some(0),
            choices: 1,
        };
        Ok(Some(self.keys.admit(grant, model, ask).await?))
    }

    /// Admits a task for the caller's key (`/mcp`'s `run_task`), for its target: its budget
    /// covers its prompt and every round after it, at most this node's `tasks.token_budget`,
    /// all of it reserved while it runs; the task's token budget becomes what the key grants.
    pub(crate) async fn reserve_task(
        &self,
        caller: &DoorCaller,
        spec: &mut TaskSpec,
    ) -> Result<Option<Charge>, GatewayError> {
        let Some(grant) = &caller.key else {
            return Ok(None);
        };
        let asked = match &spec.target {
            Target::Model(model) => model.clone(),
            other => other.to_string(),
        };
        // The task's budget covers its prompt and every round after it.
        let prompt = prompt_token_bound(&[Message::text(Role::User, spec.prompt.clone())], &[]);
        let ask = Ask {
            prompt,
            completion: Some(self.task_token_budget.saturating_sub(prompt)),
            choices: 1,
        };
        let charge = self.keys.admit(grant, &asked, ask).await?;
        if charge.reserved() > 0 {
            spec.token_budget = Some(charge.reserved());
        }
        Ok(Some(charge))
    }
}

/// Follows `task` to its end and charges its key what it spent: a completed task its usage,
/// a failed or cancelled one the usage its `failed` event carries (what its model calls
/// reported, and the estimate of a call cut off). Events that end without an outcome drop the
/// charge, which charges its whole reservation.
pub(crate) async fn settle_from_outcome(task: TaskHandle, charge: Charge) {
    match task.outcome().await {
        Some(TaskOutcome::Completed { usage, .. } | TaskOutcome::Failed { usage, .. }) => {
            charge.settle(usage).await;
        }
        None => {}
    }
}
