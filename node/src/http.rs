//! The OpenAI-compatible front door: every model in the fleet, reachable from any node.
//!
//! `GET /v1/models` lists every model the fleet serves (this node's and its peers', as they
//! advertise them) and a `role:<name>` alias per role. `POST /v1/chat/completions` (plain, or
//! `stream: true` as server-sent events; tools are passed to the model and its tool calls
//! returned) is placed by the mesh router like a task: on this node when it serves the model and
//! ranks best, else on the best peer through `agentmesh.v1.Models/Chat` over the mesh's mTLS.
//! `GET /healthz` and `GET /metrics` (Prometheus text) complete it. Errors use OpenAI's error
//! JSON; with `http.api_keys` set, `/v1/*` needs `Authorization: Bearer <key>`. [`serve`] is
//! the front door's own accept loop, which bounds connections before they send a request
//! (`[connections]`: a header timeout and a cap).

use std::{convert::Infallible, sync::Arc};

use axum::{
    Json, Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use mesh_domain::{
    ChatRequest, ChatResponse, HealthStatus, Message, PeerState, Role, Sampling, Target, ToolCall,
    ToolSpec, Usage,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::{StreamExt, wrappers::ReceiverStream};

use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};

use crate::{
    admission::AdmissionError,
    capabilities::Capabilities,
    chat::{ChatError, ChatService},
    config::ConnectionLimits,
    connections::{ACCEPT_BACKOFF, Cap, ConnectionCap, ConnectionSlot},
    llm::ModelError,
    memory::Memory,
    metrics::{labels, metrics},
    peers::PeerTable,
};

/// Largest request body.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// What the front door needs from the node.
#[derive(Debug)]
pub struct FrontDoor {
    /// Places and runs chats: here, or on peers.
    pub chat: Arc<ChatService>,
    /// This node's advertised info.
    pub caps: Arc<Capabilities>,
    /// Peers and what they serve.
    pub peers: Arc<PeerTable>,
    /// Accepted bearer keys (empty: open).
    pub api_keys: Vec<String>,
    /// For `/metrics`: replication lag per peer.
    pub memory: Arc<Memory>,
}

/// A front-door failure, as OpenAI's error JSON.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn from_admission(error: AdmissionError) -> Self {
        let message = error.to_string();
        match error {
            AdmissionError::UnknownModel(_) => Self {
                code: Some("model_not_found"),
                ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
            },
            AdmissionError::Nowhere(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "api_error", message)
            }
            AdmissionError::TierCap { .. } => {
                Self::new(StatusCode::FORBIDDEN, "permission_error", message)
            }
            AdmissionError::HopLimit { .. } => Self::bad_request(message),
            AdmissionError::CannotEmbed(_) => Self {
                code: Some("model_not_supported"),
                ..Self::bad_request(message)
            },
        }
    }

    fn from_chat(error: ChatError) -> Self {
        match error {
            ChatError::Model(error) => Self::from_model(&error),
            ChatError::NotLoaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                error.to_string(),
            ),
            ChatError::Peers(failed) => Self::new(StatusCode::BAD_GATEWAY, "api_error", failed),
        }
    }

    fn from_model(error: &ModelError) -> Self {
        let status = match error {
            ModelError::Refused { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST)
            }
            ModelError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        };
        Self::new(status, "api_error", error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.code,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// The front door's routes.
pub fn router(door: Arc<FrontDoor>) -> Router {
    let v1 = Router::new()
        .route("/models", get(list_models))
        .route("/chat/completions", post(chat_completions))
        .route_layer(middleware::from_fn_with_state(door.clone(), authorize));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(healthz))
        .route("/metrics", get(scrape))
        .fallback(not_found)
        .layer(middleware::from_fn(count))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(door)
}

async fn count(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let path = match path.as_str() {
        "/v1/models" | "/v1/chat/completions" | "/healthz" | "/metrics" => path,
        _ => "other".to_owned(),
    };
    metrics()
        .http_requests
        .get_or_create(&labels(&[
            ("path", &path),
            ("status", response.status().as_str()),
        ]))
        .inc();
    response
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint; this node serves /v1/models, /v1/chat/completions, /healthz and /metrics",
    )
}

async fn authorize(
    State(door): State<Arc<FrontDoor>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if door.api_keys.is_empty() {
        return Ok(next.run(request).await);
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    match presented {
        Some(key) if known_key(&door.api_keys, key) => Ok(next.run(request).await),
        _ => Err(ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or unknown API key: send `Authorization: Bearer <key>` with one of the node's http.api_keys",
            )
        }),
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case, RFC 9110).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `presented` is one of `keys`, in time that depends on neither (the SHA-256 digests
/// are compared in constant time, every key is compared).
fn known_key(keys: &[String], presented: &str) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let presented = Sha256::digest(presented.as_bytes());
    keys.iter()
        .map(|k| Sha256::digest(k.as_bytes()).ct_eq(&presented))
        .fold(subtle::Choice::from(0), |found, eq| found | eq)
        .into()
}

async fn healthz(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let info = door.caps.snapshot();
    Json(json!({
        "status": match info.health.status {
            HealthStatus::Healthy => "healthy",
            HealthStatus::Degraded => "degraded",
            HealthStatus::Unhealthy => "unhealthy",
        },
        "node": info.name,
        "reasons": info.health.reasons,
    }))
}

async fn scrape(State(door): State<Arc<FrontDoor>>) -> impl IntoResponse {
    let m = metrics();
    m.peers.clear();
    m.lag_records.clear();
    m.lag_seconds.clear();
    for peer in door.peers.snapshot() {
        m.peers
            .get_or_create(&labels(&[("state", peer.state.as_str())]))
            .inc();
        let (records, behind_ms) = door.memory.lag(&peer.info.id, peer.info.memory_seq);
        let peer_label = labels(&[("peer", &peer.info.name)]);
        m.lag_records
            .get_or_create(&peer_label)
            .set(i64::try_from(records).unwrap_or(i64::MAX));
        m.lag_seconds
            .get_or_create(&peer_label)
            .set(behind_ms as f64 / 1000.0);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

/// One entry of `/v1/models`.
fn model_entry(id: &str, owner: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": owner})
}

async fn list_models(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let own = door.caps.snapshot();
    let mut infos = vec![own];
    infos.extend(
        door.peers
            .snapshot()
            .into_iter()
            .filter(|p| p.state == PeerState::Up)
            .map(|p| p.info),
    );
    let mut seen = std::collections::BTreeMap::new();
    for info in &infos {
        for model in &info.models {
            seen.entry(model.name.clone())
                .or_insert_with(|| info.name.clone());
        }
        for (role, chain) in &info.role_chains {
            if !chain.is_empty() {
                seen.entry(format!("role:{role}"))
                    .or_insert_with(|| info.name.clone());
            }
        }
    }
    let data: Vec<Value> = seen
        .iter()
        .map(|(id, owner)| model_entry(id, owner))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The part of an OpenAI chat request the mesh uses.
#[derive(Debug, Deserialize)]
struct OpenAiRequest {
    model: String,
    messages: Vec<OpenAiMessage>,
    #[serde(default)]
    tools: Vec<OpenAiTool>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    /// The newer name of `max_tokens`.
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<u64>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The request's generation settings, checked like OpenAI checks them.
fn sampling_of(request: &OpenAiRequest) -> Result<Sampling, ApiError> {
    let sampling = Sampling {
        max_tokens: request.max_completion_tokens.or(request.max_tokens),
        temperature: request.temperature,
        top_p: request.top_p,
        stop: match &request.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(list)) => list.clone(),
        },
        seed: request.seed,
    };
    sampling.check().map_err(ApiError::bad_request)?;
    Ok(sampling)
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct OpenAiMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Vec<OpenAiToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OpenAiToolCall {
    id: String,
    function: OpenAiFunctionCall,
}

#[derive(Debug, Deserialize)]
struct OpenAiFunctionCall {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Debug, Deserialize)]
struct OpenAiTool {
    function: OpenAiFunction,
}

#[derive(Debug, Deserialize)]
struct OpenAiFunction {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Value,
}

/// Text of a message's `content`: a string, or the text parts of a list.
fn content_text(content: Option<Value>) -> String {
    match content {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn to_chat_request(request: OpenAiRequest) -> Result<(String, ChatRequest), ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::bad_request("messages: must not be empty"));
    }
    let sampling = sampling_of(&request)?;
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].role: `{other}` is not system, user, assistant or tool"
                )));
            }
        };
        messages.push(Message {
            role,
            content: content_text(m.content),
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.function.name,
                    arguments: c.function.arguments,
                })
                .collect(),
            tool_call_id: m.tool_call_id,
        });
    }
    let tools = request
        .tools
        .into_iter()
        .map(|t| ToolSpec {
            name: t.function.name,
            description: t.function.description,
            parameters: t.function.parameters,
        })
        .collect();
    Ok((
        request.model,
        ChatRequest {
            messages,
            tools,
            sampling,
            ..ChatRequest::default()
        },
    ))
}

/// What the front door was asked for: `role:<name>` or a model name.
fn target_of(model: &str) -> Target {
    match model.parse() {
        Ok(target @ (Target::Role(_) | Target::Model(_))) => target,
        // Personas run tasks, not chats: such a name, like an empty one, is a model nobody has.
        _ => Target::Model(model.to_owned()),
    }
}

fn completion_id() -> String {
    format!("chatcmpl-{}", uuid::Uuid::now_v7().simple())
}

fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

fn usage_json(usage: Option<Usage>) -> Value {
    let u = usage.unwrap_or_default();
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total()})
}

fn finish_reason(response: &ChatResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

/// A `POST /v1/chat/completions` body as the front door reads it, before it is placed.
#[derive(Debug)]
pub struct ChatCompletion {
    /// The `model` asked for, as given (answers name it).
    pub model: String,
    /// Where it points: a model, a role (`role:NAME`) or a persona.
    pub target: Target,
    /// The chat to run.
    pub chat: ChatRequest,
    /// Whether the answer is streamed (server-sent events).
    pub stream: bool,
    /// Whether a streamed answer ends with a usage chunk.
    pub include_usage: bool,
}

/// Reads a chat-completions request body: JSON in OpenAI's shape, messages, tools and
/// generation settings checked (a 400 naming the field otherwise). Public for the fuzz target
/// `front_door`; the handler is its only other caller.
pub fn read_chat_completion(body: &[u8]) -> Result<ChatCompletion, ApiError> {
    let request: OpenAiRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let stream = request.stream;
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let (model, chat) = to_chat_request(request)?;
    let target = target_of(&model);
    Ok(ChatCompletion {
        model,
        target,
        chat,
        stream,
        include_usage,
    })
}

async fn chat_completions(
    State(door): State<Arc<FrontDoor>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let ChatCompletion {
        model,
        target,
        chat,
        stream,
        include_usage,
    } = read_chat_completion(&body)?;
    // Placed before anything is sent, so a bad model answers with a status code.
    let placement = door.chat.place(&target).map_err(ApiError::from_admission)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = completion_id();
    let created = unix_s();
    if !stream {
        let response = door
            .chat
            .run(placement, &target, &chat, &tx)
            .await
            .map_err(ApiError::from_chat)?;
        // OpenAI's shape: `content` null only beside tool calls; `tool_calls` only when there are.
        let mut message = json!({"role": "assistant", "content": response.content});
        if !response.tool_calls.is_empty() {
            if response.content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = Value::Array(tool_calls_json(&response.tool_calls));
        }
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(&response)}],
            "usage": usage_json(response.usage),
        }))
        .into_response());
    }

    let (events_tx, events_rx) = mpsc::channel::<Result<String, Infallible>>(64);
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |delta: Value, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        }
    };
    tokio::spawn(async move {
        let send = |value: Value| {
            let events_tx = events_tx.clone();
            async move {
                let _ = events_tx.send(Ok(format!("data: {value}\n\n"))).await;
            }
        };
        send(chunk(json!({"role": "assistant", "content": ""}), None)).await;
        let run = async {
            door.chat
                .run(placement, &target, &chat, &tx)
                .await
                .map_err(ApiError::from_chat)
        };
        tokio::pin!(run);
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                Some(text) = rx.recv() => send(chunk(json!({"content": text}), None)).await,
                // The client went away (its body stream was dropped): dropping `run` stops the
                // generation here, or resets the `Models.Chat` stream so the peer stops too.
                () = events_tx.closed() => {
                    tracing::info!(%model, "front door: the client went away; chat cancelled");
                    return;
                }
            }
        };
        while let Ok(text) = rx.try_recv() {
            send(chunk(json!({"content": text}), None)).await;
        }
        match result {
            Ok(response) => {
                if !response.tool_calls.is_empty() {
                    send(chunk(
                        json!({"tool_calls": tool_calls_json(&response.tool_calls)}),
                        None,
                    ))
                    .await;
                }
                send(chunk(json!({}), Some(finish_reason(&response)))).await;
                if include_usage {
                    send(json!({"id": id, "object": "chat.completion.chunk", "created": created,
                                "model": model, "choices": [], "usage": usage_json(response.usage)}))
                    .await;
                }
            }
            Err(error) => {
                send(json!({"error": {"message": error.message, "type": error.kind, "param": null, "code": error.code}})).await;
            }
        }
        let _ = events_tx.send(Ok("data: [DONE]\n\n".to_owned())).await;
    });
    let body =
        Body::from_stream(ReceiverStream::new(events_rx).map(|r| r.map(axum::body::Bytes::from)));
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response())
}

/// How long in-flight front-door requests may finish once the node is leaving.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the front door (`app`: [`router`]) on `listener` until `stop`; in-flight requests
/// then get [`SHUTDOWN_GRACE`] to finish.
///
/// The accept loop is the node's own rather than `axum::serve`'s, for the bounds `axum::serve`
/// does not offer: at most `connections.http_max_connections` open connections (one over is
/// closed as soon as it is accepted), and a connection that has not sent a complete request's
/// headers within `connections.header_timeout_s` of opening, or of its last response (an idle
/// keep-alive connection), is closed (hyper's header read timeout). It speaks HTTP/1.1 only,
/// as OpenAI clients do; the version sniffing of HTTP/2 would wait for bytes without a timeout.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: tokio_util::sync::CancellationToken,
) {
    let cap = ConnectionCap::new("http", Cap::Connections, limits.http_max_connections);
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    // Over the cap the socket is dropped here, which closes it.
                    if let Some(slot) = cap.admit() {
                        // Streamed chunks go out at once, not after a delayed ACK.
                        let _ = tcp.set_nodelay(true);
                        connections.spawn(connection(
                            builder.clone(),
                            tcp,
                            remote,
                            app.clone(),
                            slot,
                            stop.clone(),
                        ));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept a front-door connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reaps finished connections, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stop.cancelled() => break,
        }
    }
    // No new connections; each open one finishes its request in flight and closes.
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        tracing::warn!("front-door requests did not finish within the grace period; closing them");
        connections.shutdown().await;
    }
}

/// Serves one front-door connection until it closes, or until `stop` (then it finishes the
/// request in flight and closes).
async fn connection(
    builder: Arc<auto::Builder<TokioExecutor>>,
    tcp: tokio::net::TcpStream,
    remote: std::net::SocketAddr,
    app: Router,
    slot: ConnectionSlot,
    stop: tokio_util::sync::CancellationToken,
) {
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        let timed_out = e
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout);
        if timed_out {
            metrics()
                .connections_timed_out
                .get_or_create(&labels(&[("listener", "http"), ("phase", "headers")]))
                .inc();
            tracing::debug!(%remote, "front-door connection sent no request headers in time: closed");
        } else {
            tracing::debug!(%remote, error = %e, "front-door connection ended with an error");
        }
    }
    drop(slot);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::connections::test_support::closed_within;

    /// A front door answering `GET /ping` with `pong`, served with `limits`.
    async fn pong_door(limits: ConnectionLimits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let app = Router::new().route("/ping", get(|| async { "pong" }));
        tokio::spawn(serve(listener, app, limits, stop.clone()));
        (addr, stop)
    }

    /// Sends one keep-alive `GET /ping` and reads its answer.
    async fn ping(tcp: &mut TcpStream) -> std::io::Result<()> {
        tcp.write_all(b"GET /ping HTTP/1.1\r\nhost: door\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        while !answer.ends_with(b"pong") {
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(())
    }

    /// An idle keep-alive connection (and one that never sends a byte) is closed once the
    /// header timeout passes, not before: without hyper's header read timeout both stay open.
    #[tokio::test]
    async fn idle_and_silent_connections_are_closed_after_the_header_timeout() {
        let header_timeout = Duration::from_millis(400);
        let (addr, stop) = pong_door(ConnectionLimits {
            header_timeout,
            ..ConnectionLimits::default()
        })
        .await;
        let mut keep_alive = TcpStream::connect(addr).await.expect("connect");
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        ping(&mut keep_alive).await.expect("first request");
        ping(&mut keep_alive)
            .await
            .expect("a second request on the same connection");
        let idle_since = Instant::now();
        assert!(
            closed_within(&mut keep_alive, Duration::from_secs(5)).await,
            "an idle keep-alive connection stayed open"
        );
        assert!(
            idle_since.elapsed() >= header_timeout - Duration::from_millis(50),
            "closed after {:?}, before the header timeout",
            idle_since.elapsed()
        );
        assert!(
            closed_within(&mut silent, Duration::from_secs(5)).await,
            "a connection that never sent a byte stayed open"
        );
        stop.cancel();
    }

    /// Past `http_max_connections` a new connection is closed at once and counted; once one
    /// closes, the next is served. Without the cap the third connection is served.
    #[tokio::test]
    async fn past_the_cap_a_front_door_connection_is_closed_at_once_and_counted() {
        let (addr, stop) = pong_door(ConnectionLimits {
            http_max_connections: 2,
            ..ConnectionLimits::default()
        })
        .await;
        let refused = || {
            metrics()
                .connections_refused
                .get_or_create(&labels(&[
                    ("listener", "http"),
                    ("reason", "max_connections"),
                ]))
                .get()
        };
        let before = refused();
        let mut first = TcpStream::connect(addr).await.expect("connect");
        let mut second = TcpStream::connect(addr).await.expect("connect");
        // Answered: both hold their slots.
        ping(&mut first).await.expect("first served");
        ping(&mut second).await.expect("second served");
        let mut third = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut third, Duration::from_secs(2)).await,
            "the connection past the cap was served"
        );
        assert!(refused() > before, "the refusal was not counted");
        ping(&mut first).await.expect("the first is still served");
        drop(second);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut next = TcpStream::connect(addr).await.expect("connect");
            if ping(&mut next).await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a closed connection never gave its slot back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll again until the deadline
        }
        stop.cancel();
    }

    #[test]
    fn only_a_configured_key_is_known() {
        let keys = vec!["sk-one".to_owned(), "sk-two".to_owned()];
        assert!(known_key(&keys, "sk-one"));
        assert!(known_key(&keys, "sk-two"));
        for wrong in ["", "sk-on", "sk-one ", "sk-onex", "SK-ONE"] {
            assert!(!known_key(&keys, wrong), "{wrong:?}");
        }
        assert!(!known_key(&[], "sk-one"));
        assert_eq!(bearer("Bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("BEARER  sk-one "), Some("sk-one"));
        assert_eq!(bearer("Basic sk-one"), None);
        assert_eq!(bearer("sk-one"), None);
    }

    #[test]
    fn openai_messages_become_chat_requests_and_bad_roles_name_the_field() {
        let request: OpenAiRequest = serde_json::from_value(json!({
            "model": "role:chat",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "temperature": 0.2
        }))
        .expect("parse");
        let (model, chat) = to_chat_request(request).expect("convert");
        assert_eq!(model, "role:chat");
        assert_eq!(target_of(&model), Target::Role("chat".into()));
        assert_eq!(target_of("qwen"), Target::Model("qwen".into()));
        assert_eq!(chat.messages[1].content, "hi there");
        assert_eq!(chat.messages[2].tool_calls[0].name, "f");
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(chat.tools[0].name, "f");
        let bad: OpenAiRequest = serde_json::from_value(json!({
            "model": "m", "messages": [{"role": "robot", "content": "x"}]
        }))
        .expect("parse");
        let error = to_chat_request(bad).expect_err("bad role");
        assert!(
            error.message.contains("messages[0].role"),
            "{}",
            error.message
        );
    }

    fn sampling(extra: Value) -> Result<Sampling, String> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let request: OpenAiRequest = serde_json::from_value(body).map_err(|e| e.to_string())?;
        to_chat_request(request)
            .map(|(_, chat)| chat.sampling)
            .map_err(|e| e.message)
    }

    #[test]
    fn generation_settings_are_taken_and_bad_ones_name_the_field() {
        assert_eq!(sampling(json!({})), Ok(Sampling::default()));
        let taken = sampling(json!({"max_tokens": 7, "temperature": 0.25, "top_p": 0.5,
                                    "stop": "END", "seed": 42}))
        .expect("valid");
        assert_eq!(
            taken,
            Sampling {
                max_tokens: Some(7),
                temperature: Some(0.25),
                top_p: Some(0.5),
                stop: vec!["END".into()],
                seed: Some(42),
            }
        );
        // The newer name wins; a list of stops is taken as is.
        let newer =
            sampling(json!({"max_tokens": 7, "max_completion_tokens": 9, "stop": ["a", "b"]}))
                .expect("valid");
        assert_eq!((newer.max_tokens, newer.stop.len()), (Some(9), 2));
        for (bad, field) in [
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"stop": ["1", "2", "3", "4", "5"]}), "stop"),
        ] {
            let error = sampling(bad.clone()).expect_err("invalid");
            assert!(error.starts_with(field), "{bad}: {error}");
        }
    }
}
