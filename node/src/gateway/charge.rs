//! Key reservation before a run and settlement after. Before a chat or embeddings run, the
//! caller's key (when the front door has keys) is admitted by `api_keys` for what the run may
//! take (its prompt's upper bound, `max_tokens` per choice), which is counted and reserved; the
//! [`Charge`] it answers is settled once with what the run spent (`super::call::run_placed`
//! for chats, [`Gateway::embed`]), or, dropped unsettled, with its whole reservation. The
//! limits and the counting are `api_keys`'; this module only says what each run asks.

use mesh_domain::{EmbedRequest, chat::prompt_token_bound};

use super::{call::Call, caller::Caller, error::GatewayError, service::Gateway};
use crate::api_keys::{Ask, Charge};

impl Gateway {
    /// Admits `call` for the caller's key: `max_tokens` becomes what the key grants, and all of
    /// it is reserved. `None` when the front door needs no key.
    pub(super) async fn reserve_chat(
        &self,
        caller: &Caller,
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
        caller: &Caller,
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
}
