//! OpenAI's API, translated to and from the gateway: chat completions and the models list
//! (here), embeddings ([`embeddings`]) and the Responses API ([`responses`]).
//!
//! `POST /v1/chat/completions` takes OpenAI's request (messages with text or text parts,
//! tools, `tool_choice`, `response_format`, `n`, the generation settings, `stream` and
//! `stream_options.include_usage`) and answers its JSON, or server-sent events of
//! `chat.completion.chunk`s. A field OpenAI defines that the mesh cannot honour (`logprobs`,
//! `audio`, a non-zero penalty, …) is a 400 naming it; a field OpenAI does not define is
//! ignored (or, with `http.unknown_fields = "refuse"`, refused in OpenAI's words); fields that
//! do not change the answer (`user`, `metadata`, `store`, …) are accepted. The table is in
//! docs/src/protocol/http.md. `GET /v1/models` lists every model of the fleet.
//!
//! The request's wire shape is in `wire`, its translation to a `gateway::Call` and the answer's
//! JSON in `translate`, the streamed answer in `stream`. It only translates: checking, placing,
//! running, charging and cancelling are the gateway's.

mod embeddings;
mod responses;
mod stream;
mod translate;
mod wire;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::{
    Json,
    extract::{Extension, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use mesh_domain::Usage;
use serde_json::{Value, json};

pub(super) use self::translate::{ChatCompletion, read_chat_completion};
pub(super) use self::{
    embeddings::embeddings,
    responses::{create, retrieve},
};
use self::{
    stream::Chunks,
    translate::{completion_id, completion_json, model_entry},
};
use super::{
    clients::{client_name, failover},
    door::FrontDoor,
    encode,
    error::ApiError,
};
use mesh_domain::time::now_s;

use crate::gateway::DoorCaller;

/// `POST /v1/chat/completions`.
pub(super) async fn chat_completions(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut unknown = door.clients.reading();
    let ChatCompletion {
        mut call,
        stream,
        include_usage,
    } = read_chat_completion(&body, &mut unknown)?;
    call.failover = failover(&headers, stream)?;
    door.clients.ignored(
        &client_name(caller.key_name(), &headers),
        "/v1/chat/completions",
        &unknown,
    );
    let asked = call.model.clone();
    let run = door.gateway.start(&caller, door.aliased(call)).await?;
    let id = completion_id();
    let created = now_s();
    if stream {
        let encoder = Chunks {
            id,
            created,
            model: asked,
            include_usage,
            usage: Usage::default(),
            n: 0,
        };
        return Ok(encode::stream(run, "text/event-stream", encoder));
    }
    let answers = run.finish().await?;
    Ok(Json(completion_json(&id, created, &asked, &answers)).into_response())
}

/// `GET /v1/models` in OpenAI's shape: every model the fleet serves (this node's and its up
/// peers'), and a `role:<name>` alias per role; `owned_by` names the first node seen serving
/// it, and `capabilities` includes `embeddings` when some node's model of that name makes them.
pub(super) fn models(door: &FrontDoor) -> Value {
    let embedders = door.fleet_embedders();
    let data: Vec<Value> = door
        .fleet_models()
        .iter()
        .map(|(id, owner)| model_entry(id, owner, embedders.contains(id)))
        .collect();
    json!({"object": "list", "data": data})
}
