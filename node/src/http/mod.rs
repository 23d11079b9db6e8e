//! The front door: every model in the fleet, reachable from any node, in the APIs its clients
//! speak.
//!
//! Each API is a dialect module that only translates: [`openai`] (chat completions, models),
//! [`embeddings`] (OpenAI's embeddings), [`responses`] (OpenAI's Responses API, with its
//! stored conversations), [`anthropic`] (Anthropic's Messages API), [`ollama`] (Ollama's chat,
//! generate, embed, tags, show, ps and version).
//! Every dialect goes through [`gateway`], the one path that checks a call, places it with the
//! mesh router (here when this node serves the model and ranks best, else the best peer through
//! `agentmesh.v1.Models/Chat` over the mesh's mTLS, with failover) and streams its events; and
//! every failure is one [`error::ApiError`], rendered in the shape of the API the path belongs
//! to by the `shape` middleware. With keys (`http.api_keys`, `[[http.keys]]`, or added with
//! `mesh-cli keys add`), `/v1/*` needs one (as `Authorization: Bearer <key>` or Anthropic's
//! `x-api-key`); the gateway admits each call against its key's policy (`api_keys`). [`mcp`]
//! serves the mesh itself as MCP tools at `/mcp` (tasks, the fleet, the memory, schedules),
//! behind the same keys, for a key with the `mcp` scope. Before any of it, on every route,
//! [`guard`] refuses what a web page can make a browser send (an `Origin` not allowed, a
//! rebinding `Host` on a door without keys, a `POST` that is not JSON). `GET /healthz` and
//! `GET /metrics` (Prometheus text) complete it. [`serve`] is the front door's own accept loop,
//! which bounds connections before they send a request (`[connections]`: a header timeout and
//! a cap).

mod anthropic;
mod cl100k;
pub mod clients;
mod door;
mod embeddings;
mod encode;
pub mod error;
pub mod guard;
mod mcp;
mod ollama;
mod openai;
mod responses;

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

use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};

pub(crate) use self::door::FrontDoor;
pub use self::{
    error::{ApiError, Dialect, ErrorKind},
    openai::read_chat_completion,
};
use crate::{
    config::ConnectionLimits,
    connections::{ACCEPT_BACKOFF, Cap, ConnectionCap, ConnectionSlot},
    gateway::Caller,
    metrics::{labels, metrics},
};

/// Largest request body.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// Where the MCP server is.
const MCP_PATH: &str = "/mcp";

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
        .route("/v1/models", get(openai::list_models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
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
        .route_layer(middleware::from_fn_with_state(door.clone(), authorize));
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
/// over [`MAX_BODY`] (refused by axum before any handler runs) becomes one too.
async fn shape(request: Request, next: Next) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    let mut response = next.run(request).await;
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

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::InvalidRequest,
        "no such endpoint; this node serves OpenAI's /v1/models, /v1/chat/completions, /v1/embeddings and /v1/responses, Anthropic's /v1/messages, Ollama's /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show, /api/ps and /api/version, MCP at /mcp, /healthz and /metrics (docs/protocol.md lists them)",
    )
}

/// Refuses, on every route, what a web page can make a browser send (see [`guard`]).
async fn guard(
    State(door): State<Arc<FrontDoor>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let keyed = door.keys.required().map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable,
            format!("cannot read the front door's keys: {e}"),
        )
    })?;
    door.guard
        .check(request.method(), request.headers(), keyed)
        .map_err(|blocked| {
            tracing::debug!(path = %request.uri().path(), %blocked, "front door: refused a request a web page could have sent");
            ApiError::from(blocked)
        })?;
    Ok(next.run(request).await)
}

/// Lets a request with a known key through (any request when no keys are set, or from this
/// machine with `http.loopback_without_key`), with the [`Caller`] it found for the gateway;
/// `/mcp` only with a key that may use it ([`crate::api_keys::KeyGrant::may_use_mcp`]).
async fn authorize(
    State(door): State<Arc<FrontDoor>>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let unavailable = |e: crate::memory::MemoryError| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable,
            format!("cannot read the front door's keys: {e}"),
        )
    };
    if !door
        .keys
        .required_from(from_this_machine(&request))
        .map_err(unavailable)?
    {
        request.extensions_mut().insert(Caller::default());
        return Ok(next.run(request).await);
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    let grant = match presented {
        Some(key) => door.keys.authenticate(key).map_err(unavailable)?,
        None => None,
    };
    match grant {
        Some(grant) => {
            if request.uri().path() == MCP_PATH {
                grant.may_use_mcp().map_err(ApiError::from_refusal)?;
            }
            request
                .extensions_mut()
                .insert(Caller { key: Some(grant) });
            Ok(next.run(request).await)
        }
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Authentication,
            "missing or unknown API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`) with a key of the mesh (http.api_keys, [[http.keys]], or one made by `mesh-cli keys add`)",
        )
        .with_code("invalid_api_key")),
    }
}

/// Whether `request` comes from a program of this machine, as `http.loopback_without_key`
/// needs: its connection's peer address is loopback (`serve` records it), and it names a
/// loopback host and no other origin, so a web page that rebinds its own name to 127.0.0.1, or
/// a browser sending another site's request, does not pass.
fn from_this_machine(request: &Request) -> bool {
    let loopback_host = |host: &str| {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.to_canonical().is_loopback())
    };
    let header = |name: header::HeaderName| {
        request
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap_or_default())
    };
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .is_some_and(|peer| peer.0.ip().to_canonical().is_loopback());
    let host = header(header::HOST)
        .and_then(|host| host.parse::<axum::http::uri::Authority>().ok())
        .is_some_and(|authority| loopback_host(authority.host()));
    let origin = header(header::ORIGIN).is_none_or(|origin| {
        origin
            .parse::<axum::http::Uri>()
            .ok()
            .and_then(|uri| uri.host().map(loopback_host))
            .unwrap_or(false)
    });
    peer && host && origin
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case, RFC 9110).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
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
    // Every request knows where its connection came from (the key check's loopback exemption).
    let app = tower::ServiceExt::map_request(
        app,
        move |mut request: axum::http::Request<hyper::body::Incoming>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(remote));
            request
        },
    );
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

    /// `http.loopback_without_key` lets in programs of this machine only: a loopback peer
    /// naming a loopback host, and no other site's origin (a page that rebinds its name to
    /// 127.0.0.1 names its own host; a browser sends the other site's `Origin`).
    #[test]
    fn only_a_loopback_caller_naming_a_loopback_host_and_origin_is_from_this_machine() {
        let request = |peer: Option<&str>, host: Option<&str>, origin: Option<&str>| {
            let mut builder = axum::http::Request::builder().uri("/v1/models");
            if let Some(host) = host {
                builder = builder.header(header::HOST, host);
            }
            if let Some(origin) = origin {
                builder = builder.header(header::ORIGIN, origin);
            }
            let mut request = builder.body(axum::body::Body::empty()).expect("request");
            if let Some(peer) = peer {
                let peer: std::net::SocketAddr = peer.parse().expect("addr");
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
            }
            request
        };
        let local = Some("127.0.0.1:50000");
        for (peer, host, origin, expected) in [
            (local, Some("127.0.0.1:7780"), None, true),
            (
                local,
                Some("localhost:7780"),
                Some("http://localhost:3000"),
                true,
            ),
            (Some("[::1]:50000"), Some("[::1]:7780"), None, true),
            (local, Some("rebound.example:7780"), None, false),
            (
                local,
                Some("127.0.0.1:7780"),
                Some("https://evil.example"),
                false,
            ),
            (local, Some("127.0.0.1:7780"), Some("null"), false),
            (local, None, None, false),
            (Some("10.0.0.2:50000"), Some("127.0.0.1:7780"), None, false),
            (None, Some("127.0.0.1:7780"), None, false),
        ] {
            assert_eq!(
                from_this_machine(&request(peer, host, origin)),
                expected,
                "{peer:?} {host:?} {origin:?}"
            );
        }
    }

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
    fn the_bearer_token_is_read_in_any_case_of_the_scheme() {
        assert_eq!(bearer("Bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("BEARER  sk-one "), Some("sk-one"));
        assert_eq!(bearer("Basic sk-one"), None);
        assert_eq!(bearer("sk-one"), None);
    }
}
