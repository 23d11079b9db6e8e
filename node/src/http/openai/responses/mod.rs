//! OpenAI's Responses API, translated to and from the gateway's `Call` and `Event`s; the
//! conversations that `previous_response_id` and `GET /v1/responses/{id}` read are the
//! gateway's (`gateway::Conversations`).
//!
//! `POST /v1/responses` takes the input as text or items (messages, `function_call` and
//! `function_call_output` items; earlier `reasoning` items are skipped), `instructions` (a
//! system message), function tools (a `namespace` tool's functions flattened to
//! `<namespace>__<name>`, and their calls given back with their namespace), `tool_choice`,
//! `text.format`, and the generation settings; it answers a Response object, or the API's
//! server-sent events (`response.created` … `response.completed`, each with its
//! `sequence_number`). Hosted tools (`web_search`, `file_search`, …) and other non-function
//! tools are not offered to the model and are named in the answer's
//! `x-agentmesh-dropped-tools` header. A field OpenAI defines that the mesh cannot honour is a
//! 400 naming it; one it does not define is ignored (or refused, with
//! `http.unknown_fields = "refuse"`); the table is in docs/src/protocol/http.md.
//!
//! With `store` (the default) the answer and the conversation up to it are kept by the gateway,
//! for the key that asked; one it could not keep answers `store: false`. The request's wire
//! shape is in `wire`, its translation and the Response object in `translate`, the streamed
//! events in `stream`. This module must not route, fall through, stream, count usage or store
//! anything itself: that is the gateway's.

mod stream;
mod translate;
mod wire;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::{
    Json,
    extract::{Extension, Path, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use mesh_domain::{Message, Role, time::now_s};
use serde_json::Value;

use self::{
    stream::Events,
    translate::{Head, has_message, keep, read_responses_call, with_call_ids},
};
use crate::{
    gateway::{Call, DoorCaller},
    http::{
        clients::{client_name, dropped_header, failover},
        door::FrontDoor,
        encode,
        error::ApiError,
    },
};

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut unknown = door.clients.reading();
    let request = read_responses_call(&body, &mut unknown)?;
    let client = client_name(caller.key_name(), &headers);
    door.clients.ignored(&client, "/v1/responses", &unknown);
    door.clients
        .dropped_tools(&client, "/v1/responses", &request.dropped);
    let dropped = dropped_header(&request.dropped);
    let conversations = door.gateway.conversations();
    let mut conversation = match &request.previous_response_id {
        Some(previous) => {
            conversations
                .load(&caller, previous, now_s(), Some("previous_response_id"))?
                .messages
        }
        None => Vec::new(),
    };
    conversation.extend(request.input);
    let mut chat = request.chat;
    chat.messages = request
        .instructions
        .iter()
        .map(|i| Message::text(Role::System, i.clone()))
        .chain(conversation.iter().cloned())
        .collect();
    let mut call = door.aliased(Call::new(request.model.clone(), chat));
    call.failover = failover(&headers, request.stream)?;
    let run = door.gateway.start(&caller, call).await?;
    let head = Head {
        id: conversations.new_id(),
        created_at: now_s(),
        model: request.model,
        instructions: request.instructions,
        previous_response_id: request.previous_response_id,
        echo: request.echo,
        namespaces: request.namespaces,
    };
    let keeper = request
        .store
        .then(|| conversations.keeper(&caller, conversation));
    if request.stream {
        let events = Events {
            head,
            keeper,
            seq: 0,
            message_open: false,
            answer: None,
            failed: false,
        };
        let mut response = encode::stream(run, "text/event-stream", events);
        response.headers_mut().extend(dropped);
        return Ok(response);
    }
    let answer = run.answer().await?;
    let mut head = head;
    let answer = with_call_ids(answer, head.suffix());
    head.model = answer.model.clone();
    let output = head.output(&answer, has_message(&answer));
    let mut response = head.object("completed", output, answer.usage);
    if let Some(keeper) = keeper {
        keep(keeper, &head.id, &answer, &mut response).await;
    }
    let mut response = Json(response).into_response();
    response.headers_mut().extend(dropped);
    Ok(response)
}

/// `GET /v1/responses/{id}`: a stored response, for the key that created it.
pub(crate) async fn retrieve(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = door
        .gateway
        .conversations()
        .load(&caller, &id, now_s(), None)?;
    Ok(Json(stored.response))
}
