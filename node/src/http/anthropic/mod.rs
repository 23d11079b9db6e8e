//! Anthropic's Messages API, translated to and from the gateway's `Call` and `Event`s.
//!
//! `POST /v1/messages` takes Anthropic's request (a system prompt, user, assistant and system
//! messages of text, `tool_use` and `tool_result` blocks, client tools, `tool_choice`, the
//! generation settings, `stream`) and answers Anthropic's `message` object, or its server-sent
//! events (`message_start` … `message_stop`, `event: error` on a failure after the start). A
//! field Anthropic does not define is ignored, or with `http.unknown_fields = "refuse"` refused
//! as Anthropic does (400, "Extra inputs are not permitted", naming the field by its path); a
//! field or block Anthropic defines that the mesh cannot honour (`top_k`, images, …) is a 400
//! naming it, and what does not change the answer (`metadata`, `cache_control`, `thinking`) is
//! accepted. Server tools (web search, code execution: Anthropic runs them, no node does) are
//! not offered to the model and are named in the answer's `x-agentmesh-dropped-tools` header.
//! Every `anthropic-beta` feature is accepted: what a beta turns on arrives as fields, blocks or
//! tools, each read, ignored, dropped or refused as above.
//! `POST /v1/messages/count_tokens` answers an estimate ([`count_tokens`]); `GET /v1/models`
//! with an `anthropic-version` header answers Anthropic's list ([`models`]). The table is in
//! docs/src/protocol/http-dialects.md.
//!
//! The request's wire shape (the fields, and the reader that walks them with their paths) is in
//! `wire`, its translation and the answer's JSON in `translate`, the streamed answer in
//! `stream`. It only translates: placing, falling through, streaming, counting usage and
//! cancelling are the gateway's.

mod stream;
mod translate;
mod wire;

#[cfg(test)]
mod tests;

use std::{cell::RefCell, sync::Arc};

use axum::{
    Json,
    extract::{Extension, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

pub(super) use self::wire::VERSION_HEADER;
use self::{
    stream::Events,
    translate::{
        MessagesRequest, check_version, countable_text, message_id, message_json, models_list,
        read_conversation, read_messages,
    },
    wire::{Obj, body_json},
};
use super::{
    clients::{client_name, dropped_header, failover},
    door::FrontDoor,
    encode,
    error::{ApiError, ErrorKind},
};
use crate::gateway::DoorCaller;

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_version(&headers)?;
    let MessagesRequest {
        mut call,
        stream,
        unknown,
        dropped,
    } = read_messages(&body, door.clients.reading())?;
    call.failover = failover(&headers, stream)?;
    let client = client_name(caller.key_name(), &headers);
    door.clients.ignored(&client, "/v1/messages", &unknown);
    door.clients
        .dropped_tools(&client, "/v1/messages", &dropped);
    let asked = call.model.clone();
    let run = door.gateway.start(&caller, door.aliased(call)).await?;
    let id = message_id();
    if stream {
        let mut response = encode::stream(run, "text/event-stream", Events::new(id, asked));
        response.headers_mut().extend(dropped_header(&dropped));
        return Ok(response);
    }
    let answer = run.answer().await?;
    let mut response = Json(message_json(&id, &answer)?).into_response();
    response.headers_mut().extend(dropped_header(&dropped));
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: the request's tokens as `{"input_tokens": n}`, read like a
/// `/v1/messages` request (without `max_tokens`). The count is an estimate, made with
/// cl100k_base over the text of the system prompt, the messages and the tools: the serving
/// model's own tokenizer lives on the node that serves it, and Claude Code uses the count only
/// to judge how full the context is. The model must be one the fleet has (after
/// `http.model_aliases`) and the caller's key may use, as for a message; nothing is run or
/// charged.
pub(super) async fn count_tokens(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    check_version(&headers)?;
    let value = body_json(&body)?;
    let unknown = RefCell::new(door.clients.reading());
    let conversation = read_conversation(&Obj::at(String::new(), &value, &unknown)?)?;
    door.clients.ignored(
        &client_name(caller.key_name(), &headers),
        "/v1/messages/count_tokens",
        &unknown.borrow(),
    );
    let model = door.model_for(&conversation.model);
    door.gateway.check_model(&caller, &model)?;
    let text = countable_text(&conversation);
    let tokens = tokio::task::spawn_blocking(move || crate::http::cl100k::count(&text))
        .await
        .map_err(|e| e.to_string())
        .and_then(|counted| counted)
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                format!("count the tokens: {e}"),
            )
        })?;
    Ok(Json(json!({"input_tokens": tokens})))
}

/// `GET /v1/models` in Anthropic's shape (asked for with an `anthropic-version` header): every
/// model id of the fleet, as [`FrontDoor::fleet_models`] lists them.
pub(super) fn models(door: &FrontDoor) -> Value {
    models_list(&door.fleet_models())
}
