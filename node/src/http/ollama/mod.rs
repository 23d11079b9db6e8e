//! Ollama's API, translated to and from the gateway's `Call` and `Event`s, so that Ollama
//! clients (the `ollama` packages, Open WebUI, editors) see the whole fleet as one Ollama.
//!
//! `POST /api/chat` and `POST /api/generate` answer one JSON object, or (the default, as in
//! Ollama) NDJSON: one object per line, the last `done: true` with `done_reason`, the token
//! counts and the durations in nanoseconds. `POST /api/embed` (and the older
//! `/api/embeddings`) embed through the gateway's one embeddings path. `GET /api/tags` and
//! `GET /api/ps` list the fleet's models, `POST /api/show` describes one, `GET /api/version`
//! names the Ollama release whose API this follows (`wire::VERSION`). Like Ollama's own
//! decoder this ignores fields it does not know; a known field of the wrong type, or a setting
//! that would change the answer and that the mesh cannot honour, is a 400 naming it. The field
//! table is in docs/src/protocol/http-dialects.md.
//!
//! The request bodies' wire shapes are in `wire`, their translation and the answers' JSON in
//! `translate`, the streamed answer in `stream`. It only translates: placing, falling through,
//! streaming, counting usage and cancelling are the gateway's.

mod stream;
mod translate;
mod wire;

#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Instant};

use axum::{
    Json,
    extract::{Extension, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use mesh_domain::{EmbedRequest, EmbedResponse};
use serde_json::{Value, json};

use self::{
    stream::Lines,
    translate::{
        Clock, EPOCH, Kind, Read, details, done_fields, embed_inputs, model_entry, model_not_found,
        nanos_since, object, read_chat, read_generate, resolve, tool_calls_json,
        unknown_as_not_found,
    },
    wire::{EmbedBody, NDJSON, ShowBody, VERSION, read},
};
use super::{clients::failover, door::FrontDoor, encode, error::ApiError};
use crate::gateway::{Call, DoorCaller};

/// The answer to a request with nothing to say (no messages, or an empty prompt): Ollama loads
/// the model and answers `done_reason: "load"`; mesh models are loaded, so only the name is
/// checked.
fn load_answer(kind: Kind, model: &str) -> Response {
    Json(object(
        kind,
        model,
        "",
        json!({"done": true, "done_reason": "load"}),
    ))
    .into_response()
}

/// Places and runs a chat or generate request, whole or streamed.
async fn answer(
    door: Arc<FrontDoor>,
    caller: DoorCaller,
    headers: &HeaderMap,
    read: Read,
) -> Result<Response, ApiError> {
    let Read {
        kind,
        mut call,
        stream,
    } = read;
    if call.model.is_empty() {
        return Err(ApiError::bad_field(
            "model",
            "is required (GET /api/tags lists the fleet's models)",
        ));
    }
    let fleet = door.fleet_models();
    call = Call::new(resolve(&call.model, &fleet), call.chat);
    call.failover = failover(headers, stream)?;
    if call.chat.messages.is_empty() {
        if !fleet.contains_key(&call.model) {
            return Err(model_not_found(&call.model));
        }
        return Ok(load_answer(kind, &call.model));
    }
    let asked = call.model.clone();
    let max_tokens = call.chat.sampling.max_tokens;
    let clock = Clock::start();
    let run = door
        .gateway
        .start(&caller, call)
        .await
        .map_err(|e| unknown_as_not_found(e, &asked))?;
    if stream {
        let encoder = Lines {
            kind,
            model: asked,
            max_tokens,
            clock,
        };
        return Ok(encode::stream(run, NDJSON, encoder));
    }
    let response = run.answer().await?;
    let mut value = object(
        kind,
        &response.model,
        &response.content,
        done_fields(&response, max_tokens, clock),
    );
    if !response.tool_calls.is_empty() {
        value["message"]["tool_calls"] = Value::Array(tool_calls_json(&response)?);
    }
    Ok(Json(value).into_response())
}

/// `POST /api/chat`.
pub(super) async fn chat(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    answer(door, caller, &headers, read_chat(&body)?).await
}

/// `POST /api/generate`.
pub(super) async fn generate(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    answer(door, caller, &headers, read_generate(&body)?).await
}

/// Embeds the texts through the gateway; a `dimensions` other than the model's is a 400.
async fn embed_texts(
    door: &FrontDoor,
    caller: &DoorCaller,
    body: EmbedBody,
    inputs: Vec<String>,
    started: Instant,
) -> Result<(EmbedResponse, Value), ApiError> {
    if body.model.is_empty() {
        return Err(ApiError::bad_field(
            "model",
            "is required (GET /api/tags lists the fleet's models)",
        ));
    }
    let model = resolve(&body.model, &door.fleet_models());
    let response = door
        .gateway
        .embed(caller, &model, &EmbedRequest { inputs })
        .await
        .map_err(|e| unknown_as_not_found(e, &body.model))?;
    let made = response.vectors.first().map_or(0, Vec::len) as u64;
    if let Some(wanted) = body.dimensions
        && wanted != made
    {
        return Err(ApiError::bad_field(
            "dimensions",
            format!(
                "model `{}` makes {made}-dimensional vectors and the mesh does not shorten them; leave dimensions out or set it to {made}",
                response.model
            ),
        ));
    }
    let timing = json!({"total_duration": nanos_since(started), "load_duration": 0,
                        "prompt_eval_count": response.prompt_tokens});
    Ok((response, timing))
}

/// `POST /api/embed`: `{"model", "embeddings": [[…]], …}`, one vector per input.
pub(super) async fn embed(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let mut body: EmbedBody = read(&body)?;
    let inputs = embed_inputs(body.input.take())?;
    let (response, mut value) = embed_texts(&door, &caller, body, inputs, started).await?;
    value["model"] = json!(response.model);
    value["embeddings"] = json!(response.vectors);
    Ok(Json(value))
}

/// `POST /api/embeddings` (Ollama's older endpoint): one `prompt`, `{"embedding": […]}`.
pub(super) async fn embeddings(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let mut body: EmbedBody = read(&body)?;
    let prompt = body
        .prompt
        .take()
        .ok_or_else(|| ApiError::bad_field("prompt", "is required: the text to embed"))?;
    let (response, _) = embed_texts(&door, &caller, body, vec![prompt], started)
        .await
        .map_err(|e| match e.param.as_deref() {
            // The gateway names OpenAI's `input`; this endpoint's text is `prompt`.
            Some("input") => ApiError::bad_field("prompt", e.message.replacen("input[0]: ", "", 1)),
            _ => e,
        })?;
    let vector = response.vectors.into_iter().next().unwrap_or_default();
    Ok(Json(json!({"embedding": vector})))
}

/// `GET /api/version`.
pub(super) async fn version() -> Json<Value> {
    Json(json!({"version": VERSION}))
}

/// `GET /api/tags`: every model of the fleet (models and `role:<name>` aliases).
pub(super) async fn tags(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let models: Vec<Value> = door.fleet_models().keys().map(|m| model_entry(m)).collect();
    Json(json!({"models": models}))
}

/// `GET /api/ps`: the models running, which in the mesh are all of them (a node loads its
/// models when it starts and keeps them).
pub(super) async fn ps(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let models: Vec<Value> = door
        .fleet_models()
        .keys()
        .map(|m| {
            let mut entry = model_entry(m);
            entry["expires_at"] = json!(EPOCH);
            entry["size_vram"] = json!(0);
            entry
        })
        .collect();
    Json(json!({"models": models}))
}

/// `POST /api/show`: what Ollama says of a model, as far as the mesh knows it; clients read
/// `capabilities` to offer tools (and embeddings).
pub(super) async fn show(
    State(door): State<Arc<FrontDoor>>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: ShowBody = read(&body)?;
    let asked = body
        .model
        .or(body.name)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_field("model", "is required"))?;
    let fleet = door.fleet_models();
    let model = resolve(&asked, &fleet);
    if !fleet.contains_key(&model) {
        return Err(model_not_found(&asked));
    }
    // Every fleet model chats (tools are passed through); Ollama names embedding models so.
    let mut capabilities = vec!["completion", "tools"];
    if door.fleet_embedders().contains(&model) {
        capabilities.push("embedding");
    }
    Ok(Json(json!({
        "modelfile": "", "parameters": "", "template": "", "license": "",
        "details": details(), "model_info": {}, "modified_at": EPOCH,
        "capabilities": capabilities,
    })))
}
