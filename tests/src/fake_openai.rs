//! A scripted fake OpenAI-compatible server: `/v1/models` and `/v1/chat/completions` (plain and
//! streaming), answering from a queue of canned replies, tool calls included, and recording every
//! request it received; `/v1/embeddings` answers [`embedding`] of each text (deterministic, so
//! tests know the exact vectors). A reply can ignore `stream` (one JSON completion, as some
//! servers answer) or be garbage (a 200 that is no chat answer at all). It runs on its own
//! thread and runtime, so tests stay synchronous.
//! [`FakeOpenAi::in_flight`] counts the requests whose client is still there (a stalled or
//! trickling answer ends only when the client hangs up), so tests can see generation stop, and
//! [`FakeOpenAi::trickled`] how far trickling answers got.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};

/// What the fake answers one chat request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A text answer.
    Text(String),
    /// Tool calls: (name, raw arguments).
    Tools(Vec<(String, String)>),
    /// An HTTP error status.
    Status(u16),
    /// Never answer (until the client hangs up).
    Stall,
    /// Stream a piece of text every period, for ever (until the client hangs up): a slow
    /// generation. Without `stream`, the same as [`Reply::Stall`].
    Trickle(Duration),
    /// `200 OK` with an HTML page: no chat answer at all.
    Garbage,
    /// A task of `count` side-effecting steps, answered from the conversation so far (so a task
    /// resumed on another node's model goes on where it was): while the request holds fewer
    /// than `count` tool results, a `shell_exec` appending `<prompt>-<k>` to `file` (`k`: the
    /// results so far); then the text `done <prompt>`.
    Steps {
        count: usize,
        file: std::path::PathBuf,
    },
}

/// Holds the replies scripted [`Scripted::until`] it back until the test opens it: a model
/// that answers when the test says so, however long that takes.
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets every reply held at it (and every later one) through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }
}

/// A reply and the usage it reports.
#[derive(Debug, Clone)]
pub struct Scripted {
    reply: Reply,
    usage: (u64, u64),
    delay: std::time::Duration,
    /// Held back until this gate opens.
    gate: Option<Gate>,
    /// Answer one JSON completion even when the request asked for a stream.
    ignore_stream: bool,
    /// Report as usage all the request could cost: a token per byte of its messages' text,
    /// and its whole `max_tokens`.
    spend_all: bool,
}

impl Scripted {
    fn new(reply: Reply, usage: (u64, u64)) -> Self {
        Self {
            reply,
            usage,
            delay: std::time::Duration::ZERO,
            gate: None,
            ignore_stream: false,
            spend_all: false,
        }
    }

    /// A text answer.
    pub fn text(text: &str) -> Self {
        Self::new(Reply::Text(text.into()), (10, 5))
    }

    /// One tool call.
    pub fn tool(name: &str, arguments: &str) -> Self {
        Self::new(Reply::Tools(vec![(name.into(), arguments.into())]), (10, 5))
    }

    /// A task of `count` side-effecting steps, each appending a line to `file` (see
    /// [`Reply::Steps`]).
    pub fn steps(count: usize, file: &std::path::Path) -> Self {
        Self::new(
            Reply::Steps {
                count,
                file: file.to_owned(),
            },
            (10, 5),
        )
    }

    /// An HTTP error.
    pub fn status(code: u16) -> Self {
        Self::new(Reply::Status(code), (0, 0))
    }

    /// No answer at all.
    pub fn stall() -> Self {
        Self::new(Reply::Stall, (0, 0))
    }

    /// Streams `tick ` every `period` and never finishes (a generation that only stops when
    /// its client goes away).
    pub fn trickle(period: Duration) -> Self {
        Self::new(Reply::Trickle(period), (0, 0))
    }

    /// A `200 OK` HTML page instead of a chat answer.
    pub fn garbage() -> Self {
        Self::new(Reply::Garbage, (0, 0))
    }

    /// Answers one JSON completion even to a streamed request, as servers that ignore
    /// `stream` do.
    pub fn ignoring_stream(mut self) -> Self {
        self.ignore_stream = true;
        self
    }

    /// Answers only after `delay` (a model that takes its time).
    pub fn after(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Answers only once `gate` is open (the request counts as in flight meanwhile).
    pub fn until(mut self, gate: &Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    /// Reports this usage.
    pub fn usage(mut self, prompt: u64, completion: u64) -> Self {
        self.usage = (prompt, completion);
        self
    }

    /// Reports as usage the most the request could cost: a prompt token per byte of its
    /// messages' text and every token of its `max_tokens` (a model that writes to the limit).
    pub fn spending_all(mut self) -> Self {
        self.spend_all = true;
        self
    }
}

#[derive(Debug, Default)]
struct Script {
    replies: VecDeque<Scripted>,
    /// The answer once the scripted replies are used up.
    otherwise: Option<Scripted>,
    /// The answer to a request whose conversation ends with an assistant message (asking to
    /// continue that text), before any queued reply.
    continuation: Option<Scripted>,
    requests: Vec<Value>,
    /// Every `/v1/embeddings` request (the JSON bodies).
    embedding_requests: Vec<Value>,
    /// Requests being answered whose client has not gone away.
    in_flight: Arc<AtomicUsize>,
    /// Pieces of text trickled so far, over every request.
    trickled: Arc<AtomicUsize>,
}

/// Counts one request as in flight until dropped (with the handler, or with its body stream
/// when the client hangs up).
#[derive(Debug)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The running fake server.
#[derive(Debug)]
pub struct FakeOpenAi {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeOpenAi {
    /// Config of a node whose model `m`, serving role `chat`, is this fake; `extra` follows.
    pub fn node_config(&self, extra: &str) -> String {
        format!(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nchat = [\"m\"]\n\n{extra}",
            self.base_url()
        )
    }

    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start() -> Self {
        Self::start_in_netns(None)
    }

    /// Starts on the loopback of network namespace `ns` (as `ip netns add` made it), so that
    /// nodes and clients inside it, and nothing outside, reach it.
    pub fn start_in(ns: &crate::Netns) -> Self {
        Self::start_in_netns(Some(format!("/run/netns/{}", ns.name())))
    }

    fn start_in_netns(netns: Option<String>) -> Self {
        let script = Arc::new(Mutex::new(Script::default()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = script.clone();
        let thread = std::thread::spawn(move || {
            // A network namespace is per thread: this one moves before it opens its socket.
            if let Some(path) = netns {
                let file = std::fs::File::open(&path).expect("open the namespace");
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&file),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .expect("enter the namespace (needs root)");
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fake server runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind fake server");
                addr_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("report addr");
                let app = Router::new()
                    .route("/v1/models", get(models))
                    .route("/v1/chat/completions", post(chat))
                    .route("/v1/embeddings", post(embeddings))
                    .with_state(state);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("fake server");
            });
        });
        let addr = addr_rx.recv().expect("fake server started");
        Self {
            addr,
            script,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues replies, answered in order.
    pub fn push(&self, replies: impl IntoIterator<Item = Scripted>) {
        self.script
            .lock()
            .expect("script lock")
            .replies
            .extend(replies);
    }

    /// Answers with `reply` once the queued replies are used up (instead of a fixed text).
    pub fn otherwise(&self, reply: Scripted) {
        self.script.lock().expect("script lock").otherwise = Some(reply);
    }

    /// Answers `reply` to every request whose conversation ends with an assistant message (a
    /// request to continue that text, as a node taking over a chat sends), before any queued
    /// reply.
    pub fn continuing(&self, reply: Scripted) {
        self.script.lock().expect("script lock").continuation = Some(reply);
    }

    /// Chat requests still being answered: a stalled or trickling one counts until its client
    /// hangs up.
    pub fn in_flight(&self) -> usize {
        self.script
            .lock()
            .expect("script lock")
            .in_flight
            .load(Ordering::SeqCst)
    }

    /// Pieces of text ([`Reply::Trickle`]'s `tick `) sent so far, over every request: how far a
    /// slow generation got.
    pub fn trickled(&self) -> usize {
        self.script
            .lock()
            .expect("script lock")
            .trickled
            .load(Ordering::SeqCst)
    }

    /// Every chat request received so far (the JSON bodies).
    pub fn requests(&self) -> Vec<Value> {
        self.script.lock().expect("script lock").requests.clone()
    }

    /// The messages of chat request `n` (from 0), as one JSON string; empty when there is none.
    pub fn request_text(&self, n: usize) -> String {
        self.requests()
            .get(n)
            .map(|r| r["messages"].to_string())
            .unwrap_or_default()
    }

    /// Every embeddings request received so far (the JSON bodies).
    pub fn embedding_requests(&self) -> Vec<Value> {
        self.script
            .lock()
            .expect("script lock")
            .embedding_requests
            .clone()
    }
}

/// Dimensions of the fake's embeddings.
pub const EMBEDDING_DIMENSIONS: usize = 8;

/// The fake's embedding of `text`: each component an FNV-1a hash of the component's index and
/// the text, mapped to [-1, 1). Deterministic and different for different texts; deliberately
/// not unit length, so a test can tell the node passed the server's vector through untouched.
pub fn embedding(text: &str) -> Vec<f32> {
    (0..EMBEDDING_DIMENSIONS)
        .map(|i| {
            let mut hash: u32 = 0x811c_9dc5;
            for byte in std::iter::once(i as u8).chain(text.bytes()) {
                hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
            }
            (hash % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Stalled requests keep the server busy until their clients go away; do not join.
        drop(self.thread.take());
    }
}

async fn models() -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "agentmesh-tests"}],
    }))
}

/// `/v1/embeddings`: [`embedding`] of each text of `input` (a string or a list of strings),
/// one token per whitespace-separated word; anything else is a 400 as OpenAI words it.
async fn embeddings(State(script): State<Arc<Mutex<Script>>>, Json(body): Json<Value>) -> Response {
    script
        .lock()
        .expect("script lock")
        .embedding_requests
        .push(body.clone());
    let texts: Option<Vec<String>> = match &body["input"] {
        Value::String(text) => Some(vec![text.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    };
    let Some(texts) = texts else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "input: not text", "type": "invalid_request_error"}})),
        )
            .into_response();
    };
    let tokens: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
    Json(json!({
        "object": "list",
        "model": body["model"],
        "data": texts.iter().enumerate().map(|(i, text)| json!({
            "object": "embedding", "index": i, "embedding": embedding(text),
        })).collect::<Vec<_>>(),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

async fn chat(State(script): State<Arc<Mutex<Script>>>, Json(body): Json<Value>) -> Response {
    let (next, in_flight, trickled) = {
        let mut script = script.lock().expect("script lock");
        script.requests.push(body.clone());
        let in_flight = InFlight::new(&script.in_flight);
        let trickled = script.trickled.clone();
        let otherwise = script.otherwise.clone();
        let continues = body["messages"]
            .as_array()
            .and_then(|messages| messages.last())
            .is_some_and(|last| last["role"] == "assistant");
        let continuation = script.continuation.clone().filter(|_| continues);
        let next = continuation
            .or_else(|| script.replies.pop_front())
            .or(otherwise)
            .unwrap_or_else(|| Scripted::text("(the fake model has no more scripted replies)"));
        (next, in_flight, trickled)
    };
    tokio::time::sleep(next.delay).await;
    if let Some(gate) = &next.gate {
        gate.passed().await;
    }
    let stream = body["stream"].as_bool().unwrap_or(false) && !next.ignore_stream;
    let model = body["model"].as_str().unwrap_or("fake").to_owned();
    let (prompt, completion) = if next.spend_all {
        let prompt: usize = body["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| m["content"].as_str().map_or(0, str::len))
                    .sum()
            })
            .unwrap_or(0);
        (prompt as u64, body["max_tokens"].as_u64().unwrap_or(0))
    } else {
        next.usage
    };
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    let reply = match next.reply {
        Reply::Steps { count, file } => step(&body, count, &file),
        reply => reply,
    };
    match reply {
        // Made into text or tool calls just above.
        Reply::Steps { .. } => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Reply::Stall | Reply::Trickle(_) if !stream => {
            let _in_flight = in_flight;
            std::future::pending().await
        }
        Reply::Stall => {
            let _in_flight = in_flight;
            std::future::pending().await
        }
        Reply::Trickle(period) => {
            let first = chunk(&model, json!({"role": "assistant", "content": ""}), None);
            let ticks = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(period)),
                move |_| {
                    // Moved in: dropped with the body once the client is gone.
                    let _held = &in_flight;
                    trickled.fetch_add(1, Ordering::SeqCst);
                    let piece = chunk("fake", json!({"content": "tick "}), None);
                    Ok::<_, std::convert::Infallible>(format!("data: {piece}\n\n"))
                },
            );
            let body = tokio_stream::StreamExt::chain(
                tokio_stream::once(Ok(format!("data: {first}\n\n"))),
                ticks,
            );
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
        Reply::Garbage => (
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>It works!</body></html>",
        )
            .into_response(),
        Reply::Status(code) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(json!({"error": {"message": format!("scripted status {code}"), "type": "server_error", "param": null, "code": null}})),
        )
            .into_response(),
        Reply::Text(text) if stream => {
            let mid = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
            let chunks = vec![
                chunk(&model, json!({"role": "assistant", "content": &text[..mid]}), None),
                chunk(&model, json!({"content": &text[mid..]}), None),
                chunk(&model, json!({}), Some("stop")),
                json!({"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [], "usage": usage}),
            ];
            sse(chunks)
        }
        Reply::Text(text) => Json(json!({
            "id": "fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }))
        .into_response(),
        Reply::Tools(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, arguments))| {
                    json!({"index": i, "id": format!("call_{i}"), "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            if stream {
                sse(vec![
                    chunk(&model, json!({"role": "assistant", "tool_calls": calls}), None),
                    chunk(&model, json!({}), Some("tool_calls")),
                    json!({"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [], "usage": usage}),
                ])
            } else {
                Json(json!({
                    "id": "fake", "object": "chat.completion", "created": 0, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
                    "usage": usage,
                }))
                .into_response()
            }
        }
    }
}

/// The next step of a [`Reply::Steps`] task, from the conversation in `body`.
fn step(body: &Value, count: usize, file: &std::path::Path) -> Reply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let done = messages.iter().filter(|m| m["role"] == "tool").count();
    let prompt: String = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("task")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    if done >= count {
        return Reply::Text(format!("done {prompt}"));
    }
    let command = format!("echo {prompt}-{done} >> {}", file.display());
    Reply::Tools(vec![(
        "shell_exec".into(),
        json!({ "command": command }).to_string(),
    )])
}

fn chunk(model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "fake", "object": "chat.completion.chunk", "created": 0, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

fn sse(chunks: Vec<Value>) -> Response {
    let mut body = String::new();
    for chunk in chunks {
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}
