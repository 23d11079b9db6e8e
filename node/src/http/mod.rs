//! The front door: every model in the fleet, reachable from any node, in the APIs its clients
//! speak. It is an edge that translates; what a request does is the gateway's
//! (`crate::gateway`: the call, its key's charge, the stored conversations).
//!
//! One folder per API dialect, each keeping its wire shapes (`wire.rs`) apart from their
//! translation to and from the gateway's types (`translate.rs`) and its streamed answer
//! (`stream.rs`): [`openai`] (chat completions, models, embeddings, and the Responses API in
//! `openai/responses/`), [`anthropic`] (the Messages API), [`ollama`] (Ollama's chat, generate,
//! embed, tags, show, ps and version) and [`mcp`] (the mesh itself as MCP tools at `/mcp`).
//! The folders never name each other (`node/tests/layers.rs`); what they share is in the files
//! beside them: [`clients`] (unknown fields, model aliases, client names, dropped tools: the
//! shared translation), [`encode`] (an `Encoder` and `stream`, which writes a running call's
//! frames and cancels it when the client goes away), [`error`] (`ApiError`, the one failure,
//! with the one mapping of a `GatewayError` and each dialect's error shape, rendered by the
//! `shape` middleware), [`cl100k`] (the tokenizer) and [`door`] (`FrontDoor`, the state every
//! route reads, and the fleet's model list).
//!
//! Before any dialect, on every route, [`guard`] refuses what a web page can make a browser
//! send (an `Origin` not allowed, a rebinding `Host` on a door without keys, a `POST` that is
//! not JSON), and [`auth`] finds the caller's key (`http.api_keys`, `[[http.keys]]`, or added
//! with `mesh-cli keys add`; `/v1/*` needs one, as `Authorization: Bearer <key>` or Anthropic's
//! `x-api-key`, and `/mcp` a key with the `mcp` scope). `GET /healthz` and `GET /metrics`
//! (Prometheus text) complete it. [`serve`] is the front door's own accept loop, which bounds
//! connections before they send a request (`[connections]`: a header timeout and a cap).

mod anthropic;
mod auth;
mod cl100k;
pub(crate) mod clients;
mod door;
mod encode;
pub(crate) mod error;
pub(crate) mod guard;
mod mcp;
mod ollama;
mod openai;
mod serve;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};

use self::auth::MCP_PATH;
pub(crate) use self::door::FrontDoor;
pub(crate) use self::{
    error::{ApiError, Dialect, ErrorKind},
    serve::serve,
};
use crate::metrics::{labels, metrics};

/// Largest request body.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// How much of a body announced over [`MAX_BODY`] is read and dropped before the 413 is sent,
/// and for how long at most: a client still sending when the answer comes and the connection
/// closes sees a broken pipe instead of the 413 (nginx's "lingering close" for the same case).
/// Past either bound the connection is closed unread.
const DRAIN_AT_MOST: usize = 4 * MAX_BODY;
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// The paths counted by name in `agentmesh_http_requests_total` (any other is `other`).
const COUNTED_PATHS: &[&str] = &[
    "/v1/models",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/api/version",
    "/api/tags",
    "/api/ps",
    "/api/show",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/mcp",
    "/healthz",
    "/metrics",
];

/// The front door's routes: every dialect's API behind the key check, then the health and
/// metrics endpoints; errors shaped by the path's dialect.
pub(crate) fn router(door: Arc<FrontDoor>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/responses", post(openai::create))
        .route("/v1/responses/{id}", get(openai::retrieve))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route_service(MCP_PATH, mcp::service(door.clone(), MAX_BODY))
        .route_layer(middleware::from_fn_with_state(
            door.clone(),
            auth::authorize,
        ));
    Router::new()
        .merge(api)
        .route("/healthz", get(healthz))
        .route("/metrics", get(scrape))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(door.clone(), guard))
        .layer(middleware::from_fn(shape))
        .layer(middleware::from_fn(count))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(door)
}

async fn count(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let path = if COUNTED_PATHS.contains(&path.as_str()) {
        path.as_str()
    } else {
        "other"
    };
    metrics()
        .http_requests
        .get_or_create(&labels(&[
            ("path", path),
            ("status", response.status().as_str()),
        ]))
        .inc();
    response
}

/// Renders a failure in the shape of the API its path belongs to: handlers, the key check and
/// the fallback return an [`ApiError`] (which travels in the response's extensions), and a body
/// over [`MAX_BODY`] (refused here when its length is announced, after [`drain`], else by axum
/// before any handler runs) becomes one too.
async fn shape(request: Request, next: Next) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let mut response = match announced {
        Some(length) if length > MAX_BODY as u64 => {
            drain(request.into_body()).await;
            StatusCode::PAYLOAD_TOO_LARGE.into_response()
        }
        _ => next.run(request).await,
    };
    let error = match response.extensions_mut().remove::<ApiError>() {
        Some(error) => error,
        None if response.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::InvalidRequest,
            format!(
                "request body: larger than the front door's limit of {} MiB",
                MAX_BODY / (1024 * 1024)
            ),
        ),
        None => return response,
    };
    error.render(dialect)
}

/// Reads and drops `body` within [`DRAIN_AT_MOST`] and [`DRAIN_FOR`], so the client has sent it
/// when the 413 comes.
async fn drain(body: axum::body::Body) {
    use tokio_stream::StreamExt;
    let mut stream = body.into_data_stream();
    let mut read = 0;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_AT_MOST {
                break;
            }
        }
    })
    .await;
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::InvalidRequest,
        "no such endpoint; this node serves OpenAI's /v1/models, /v1/chat/completions, /v1/embeddings and /v1/responses, Anthropic's /v1/messages, Ollama's /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show, /api/ps and /api/version, MCP at /mcp, /healthz and /metrics (docs/src/protocol/http.md lists them)",
    )
}

/// Refuses, on every route, what a web page can make a browser send (see [`guard`]).
async fn guard(
    State(door): State<Arc<FrontDoor>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let keyed = door.keys.required().map_err(auth::keys_unavailable)?;
    door.guard
        .check(request.method(), request.headers(), keyed)
        .map_err(|blocked| {
            tracing::debug!(path = %request.uri().path(), %blocked, "front door: refused a request a web page could have sent");
            ApiError::from(blocked)
        })?;
    Ok(next.run(request).await)
}

/// `GET /v1/models`: the fleet's models in OpenAI's shape, or in Anthropic's when an
/// `anthropic-version` header says the client is Anthropic's.
async fn models(State(door): State<Arc<FrontDoor>>, headers: HeaderMap) -> Json<Value> {
    if headers.contains_key(anthropic::VERSION_HEADER) {
        Json(anthropic::models(&door))
    } else {
        Json(openai::models(&door))
    }
}

async fn healthz(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let info = door.caps.snapshot();
    Json(json!({
        "status": info.health.status.as_str(),
        "node": info.name,
        "reasons": info.health.reasons,
    }))
}

async fn scrape(State(door): State<Arc<FrontDoor>>) -> impl IntoResponse {
    let m = metrics();
    m.peers.clear();
    for peer in door.peers.snapshot() {
        m.peers
            .get_or_create(&labels(&[("state", peer.state.as_str())]))
            .inc();
    }
    for gauges in &door.gauges {
        gauges.refresh(m);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}
