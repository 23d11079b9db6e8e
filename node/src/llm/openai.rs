//! The `openai` backend: any OpenAI-compatible chat-completions server (Ollama, llama.cpp's
//! server, LM Studio, vLLM, Open WebUI), streamed, with tools, `tool_choice` and
//! `response_format` passed on; and, for a model configured with `embeddings = true`, its
//! `POST /embeddings` passed through (float vectors, as the server makes them). The chat call is
//! sent with reqwest, so the node sees what came back: a server-sent event stream is read chunk
//! by chunk, and a server that ignores `stream` and answers one JSON completion is read as that
//! completion. An answer that is neither (or a stream without a single choice) is a
//! [`ModelError::Protocol`] naming the backend, never an empty success. Chunks are our own
//! lenient serde types, tolerant of servers that leave out or add fields. The probe and the
//! embeddings go through async-openai. The decode speed comes from completed streamed calls.

use std::{
    collections::BTreeMap,
    fmt,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use async_openai::{Client, config::OpenAIConfig, error::OpenAIError};
use eventsource_stream::Eventsource as _;
use mesh_domain::{
    BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Message, ResponseFormat,
    Role, ToolCall, ToolChoice, Usage,
};
use reqwest::header::CONTENT_TYPE;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use crate::{
    config::SystemTurns,
    llm::model::{ChatModel, Deltas, ModelError, SpeedGauge},
};

/// Most bytes of an answer that is not a stream: a chat completion is far smaller.
const MAX_COMPLETION_BYTES: usize = 16 << 20;
/// Most bytes of a streamed answer: some 300 bytes of chunk per token, for far more tokens
/// than any context window holds. Bounds what a server that never ends an event can make the
/// node buffer.
const MAX_STREAM_BYTES: usize = 128 << 20;

/// A model behind an OpenAI-compatible server.
pub(crate) struct OpenAiModel {
    name: String,
    model: String,
    /// `{base_url}/chat/completions`, where chat calls go.
    chat_url: String,
    /// The server's base URL, as configured, for messages.
    base_url: String,
    /// Sent as a bearer token.
    api_key: String,
    /// Sends the chat calls; shared with `client`.
    http: reqwest::Client,
    client: Client<OpenAIConfig>,
    context_window: usize,
    timeout: Duration,
    /// Decode speed from completed streamed calls.
    speed: SpeedGauge,
    /// Whether the server's model makes embeddings (`embeddings = true`).
    embeddings: bool,
    /// Where the server's chat template takes system messages (`system_turns`).
    system_turns: SystemTurns,
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
    pub(crate) fn new(
        name: &str,
        base_url: &str,
        model: &str,
        api_key: &str,
        context_window: usize,
        timeout: Duration,
    ) -> Self {
        let base_url = base_url.trim_end_matches('/');
        let config = OpenAIConfig::new()
            .with_api_base(base_url)
            .with_api_key(api_key);
        let http = reqwest::Client::new();
        // async-openai retries 429/5xx/connect errors itself by default (with Retry-After
        // honoured unbounded); the chain's fall-through is our retry, so send each call once.
        let client = Client::with_config(config)
            .with_http_service(async_openai::middleware::ReqwestService::new(http.clone()));
        Self {
            name: name.to_owned(),
            model: model.to_owned(),
            chat_url: format!("{base_url}/chat/completions"),
            base_url: base_url.to_owned(),
            api_key: api_key.to_owned(),
            http,
            client,
            context_window,
            timeout,
            speed: SpeedGauge::default(),
            embeddings: false,
            system_turns: SystemTurns::Anywhere,
        }
    }

    /// Says whether the server's model makes embeddings (`embeddings = true`).
    pub(crate) fn with_embeddings(mut self, embeddings: bool) -> Self {
        self.embeddings = embeddings;
        self
    }

    /// Says where the server's chat template takes system messages (`system_turns`).
    pub(crate) fn with_system_turns(mut self, system_turns: SystemTurns) -> Self {
        self.system_turns = system_turns;
        self
    }

    /// `POST /embeddings` with every input at once; the vectors are put back in the inputs'
    /// order (the `index` of each item), and an answer with a different count is an error
    /// naming the model rather than a silently shorter list.
    async fn embed_remote(&self, request: &EmbedRequest) -> Result<EmbedResponse, ModelError> {
        let body = json!({
            "model": self.model,
            "input": request.inputs,
            "encoding_format": "float",
        });
        let answer: EmbeddingsAnswer = self
            .client
            .embeddings()
            .create_byot(body)
            .await
            .map_err(classify)?;
        embeddings_in_order(&self.name, answer, request.inputs.len())
    }

    fn request_body(&self, request: &ChatRequest) -> Value {
        let folded;
        let conversation = match self.system_turns {
            SystemTurns::Anywhere => &request.messages,
            SystemTurns::First => {
                folded = system_first(&request.messages);
                &folded
            }
        };
        let messages: Vec<Value> = conversation.iter().map(message_json).collect();
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
        if let Some(choice) = &request.tool_choice {
            body["tool_choice"] = tool_choice_json(choice);
        }
        if let Some(format) = &request.response_format {
            body["response_format"] = response_format_json(format);
        }
        body
    }

    /// A [`ModelError::Protocol`] saying which backend answered what the node cannot read.
    fn unreadable(&self, what: impl fmt::Display) -> ModelError {
        ModelError::Protocol(format!(
            "backend `{}` ({}) {what}",
            self.name, self.base_url
        ))
    }

    async fn stream_chat(
        &self,
        request: &ChatRequest,
        deltas: &Deltas,
    ) -> Result<ChatResponse, ModelError> {
        let response = self
            .http
            .post(&self.chat_url)
            .bearer_auth(&self.api_key)
            .json(&self.request_body(request))
            .send()
            .await
            .map_err(transport_error)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(status_error(status.as_u16(), error_message(&body)));
        }
        let is_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if is_stream {
            return self
                .read_stream(response.bytes_stream(), deltas, MAX_STREAM_BYTES)
                .await;
        }
        let body = read_bounded(response).await?;
        if looks_like_events(&body) {
            // A stream sent under another Content-Type.
            let body = tokio_stream::once(Ok::<_, std::convert::Infallible>(body));
            return self.read_stream(body, deltas, MAX_STREAM_BYTES).await;
        }
        // Some servers ignore `stream` and answer one completion.
        let chunk = completion_chunk(&body).map_err(|e| self.unreadable(e))?;
        let mut answer = Accumulator::default();
        for text in answer.push(chunk) {
            let _ = deltas.send(text).await;
        }
        answer.finish().map_err(|e| self.unreadable(e))
    }

    /// Reads a server-sent event stream of chat chunks up to `[DONE]` or its end, at most
    /// `max_bytes` of it.
    async fn read_stream<B: AsRef<[u8]>, E: fmt::Display>(
        &self,
        bytes: impl tokio_stream::Stream<Item = Result<B, E>> + Unpin,
        deltas: &Deltas,
        max_bytes: usize,
    ) -> Result<ChatResponse, ModelError> {
        // Read after the stream failed, to tell an oversized answer from a broken connection.
        let received = std::sync::atomic::AtomicUsize::new(0);
        let bytes = bytes.map(|piece| {
            let piece = piece.map_err(|e| e.to_string())?;
            let len = piece.as_ref().len();
            if received.fetch_add(len, Ordering::Relaxed) + len > max_bytes {
                return Err(format!("more than {max_bytes} bytes"));
            }
            Ok(piece)
        });
        let mut events = bytes.eventsource();
        let mut answer = Accumulator::default();
        // When the first and the last piece of the answer arrived: the decode time.
        let mut produced: Option<(Instant, Instant)> = None;
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| {
                if received.load(Ordering::Relaxed) > max_bytes {
                    self.unreadable(format!("streamed an answer of {e}"))
                } else {
                    ModelError::Unreachable(format!("stream broke: {e}"))
                }
            })?;
            if event.data == "[DONE]" {
                break;
            }
            let chunk: StreamChunk = serde_json::from_str(&event.data).map_err(|e| {
                self.unreadable(format!(
                    "sent a stream event that is not a chat chunk ({e}): {}",
                    excerpt(event.data.as_bytes())
                ))
            })?;
            if chunk.produces_output() {
                let now = Instant::now();
                produced = Some((produced.map_or(now, |(first, _)| first), now));
            }
            // Waiting for room here stops reading the backend's stream, so a slow reader slows
            // the backend too (through its connection's flow control).
            for text in answer.push(chunk) {
                let _ = deltas.send(text).await;
            }
        }
        let response = answer.finish().map_err(|e| self.unreadable(e))?;
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
        deltas: &'a Deltas,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.stream_chat(request, deltas))
                .await
                .map_err(|_| ModelError::Timeout(self.timeout))?
        })
    }

    fn speed(&self) -> Option<&SpeedGauge> {
        Some(&self.speed)
    }

    fn embeds(&self) -> bool {
        self.embeddings
    }

    fn embed<'a>(
        &'a self,
        request: &'a EmbedRequest,
    ) -> BoxFuture<'a, Result<EmbedResponse, ModelError>> {
        Box::pin(async move {
            if !self.embeddings {
                return Err(crate::llm::model::cannot_embed(&self.name));
            }
            tokio::time::timeout(self.timeout, self.embed_remote(request))
                .await
                .map_err(|_| ModelError::Timeout(self.timeout))?
        })
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

/// `tool_choice` as OpenAI's API spells it.
fn tool_choice_json(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::None => json!("none"),
        ToolChoice::Auto => json!("auto"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

/// `response_format` as OpenAI's API spells it.
fn response_format_json(format: &ResponseFormat) -> Value {
    match format {
        ResponseFormat::Text => json!({"type": "text"}),
        ResponseFormat::JsonObject => json!({"type": "json_object"}),
        ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        } => json!({
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict},
        }),
    }
}

/// Whether a body labelled as something else is a server-sent event stream.
fn looks_like_events(body: &[u8]) -> bool {
    let start = body.trim_ascii_start();
    [&b"data:"[..], b"event:", b":"]
        .iter()
        .any(|field| start.starts_with(field))
}

/// Reads an answer that is not a stream, up to [`MAX_COMPLETION_BYTES`].
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    while let Some(piece) = response.chunk().await.map_err(transport_error)? {
        if body.len() + piece.len() > MAX_COMPLETION_BYTES {
            return Err(ModelError::Protocol(format!(
                "the answer is larger than {MAX_COMPLETION_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body)
}

/// A complete (not streamed) chat completion, as one chunk: its choices' `message`s read as
/// deltas, its tool calls numbered by position (a completion's calls carry no `index`).
fn completion_chunk(body: &[u8]) -> Result<StreamChunk, String> {
    let completion: Completion = serde_json::from_slice(body).map_err(|e| {
        format!(
            "answered neither an event stream nor a JSON chat completion ({e}): {}",
            excerpt(body)
        )
    })?;
    Ok(StreamChunk {
        choices: completion
            .choices
            .into_iter()
            .map(|choice| {
                let mut delta = choice.message;
                for (i, call) in delta.tool_calls.iter_mut().enumerate() {
                    call.index = i;
                }
                ChunkChoice { delta }
            })
            .collect(),
        usage: completion.usage,
    })
}

/// The start of a body, for an error message.
fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}

/// The message of an error answer: OpenAI's `{"error": {"message": …}}`, a bare
/// `{"error": "…"}`, or the body's text.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    match error {
        Some(Value::String(message)) => message.clone(),
        Some(error) => match error.get("message").and_then(Value::as_str) {
            Some(message) => message.to_owned(),
            None => error.to_string(),
        },
        None => excerpt(body),
    }
}

fn transport_error(error: reqwest::Error) -> ModelError {
    if error.is_timeout() {
        ModelError::Unreachable(format!("timed out: {}", error_chain(&error)))
    } else {
        ModelError::Unreachable(error_chain(&error))
    }
}

/// `messages` with every system message folded, in order, into one leading system turn (for a
/// chat template that refuses a system turn after the first); the rest keep their order.
fn system_first(messages: &[Message]) -> Vec<Message> {
    let (system, rest): (Vec<&Message>, Vec<&Message>) =
        messages.iter().partition(|m| m.role == Role::System);
    let mut folded = Vec::with_capacity(rest.len() + 1);
    if !system.is_empty() {
        let text: Vec<&str> = system.iter().map(|m| m.content.as_str()).collect();
        folded.push(Message::text(Role::System, text.join("\n\n")));
    }
    folded.extend(rest.into_iter().cloned());
    folded
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

/// A complete chat completion, leniently: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Completion {
    choices: Vec<CompletionChoice>,
    usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletionChoice {
    /// The same fields as a stream's delta.
    message: ChunkDelta,
}

/// A server's `/embeddings` answer, leniently: only what is used.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EmbeddingsAnswer {
    data: Vec<EmbeddingItem>,
    usage: Option<EmbeddingsUsage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EmbeddingsUsage {
    prompt_tokens: u64,
}

/// The vectors of `answer` in input order; `Protocol` when they are not exactly one per input.
fn embeddings_in_order(
    model: &str,
    answer: EmbeddingsAnswer,
    inputs: usize,
) -> Result<EmbedResponse, ModelError> {
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for item in answer.data {
        match vectors.get_mut(item.index) {
            Some(slot @ None) => *slot = Some(item.embedding),
            _ => {
                return Err(ModelError::Protocol(format!(
                    "model `{model}` answered embedding index {} for {inputs} inputs",
                    item.index
                )));
            }
        }
    }
    let vectors = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.filter(|v| !v.is_empty()).ok_or_else(|| {
                ModelError::Protocol(format!("model `{model}` sent no embedding for input {i}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EmbedResponse {
        model: model.to_owned(),
        vectors,
        prompt_tokens: answer.usage.map_or(0, |u| u.prompt_tokens),
    })
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
    /// Whether any chunk had a choice: an answer without one said nothing at all.
    answered: bool,
}

impl Accumulator {
    /// Adds `chunk`; returns its text, to pass on as deltas.
    fn push(&mut self, chunk: StreamChunk) -> Vec<String> {
        let mut texts = Vec::new();
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        self.answered |= !chunk.choices.is_empty();
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                self.content.push_str(&text);
                texts.push(text);
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
        texts
    }

    /// The response; an error (what the backend did) when no chunk had a choice.
    fn finish(self) -> Result<ChatResponse, String> {
        if !self.answered {
            return Err(match self.usage {
                Some(_) => "answered with usage but no choice".to_owned(),
                None => "answered with no choice (an empty stream or completion)".to_owned(),
            });
        }
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
        Ok(ChatResponse {
            model: String::new(),
            content: self.content,
            tool_calls,
            usage: self.usage,
        })
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
        let mut acc = Accumulator::default();
        let first = acc.push(chunk(json!({"choices": [{"delta": {"content": "Hel"}}]})));
        acc.push(chunk(json!({"choices": [{"delta": {"content": "lo"}}]})));
        acc.push(chunk(json!({"choices": [{"delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"name": "file_read", "arguments": "{\"pa"}}
        ]}}]})));
        acc.push(chunk(json!({"choices": [{"delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "th\": \"a\"}"}}
        ]}}]})));
        acc.push(chunk(
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        ));
        let response = acc.finish().expect("answered");
        assert_eq!(response.content, "Hello");
        assert_eq!(first, ["Hel"], "the text is passed on as a delta");
        assert_eq!(response.tool_calls.len(), 1);
        assert_eq!(response.tool_calls[0].name, "file_read");
        assert_eq!(response.tool_calls[0].arguments, r#"{"path": "a"}"#);
        assert_eq!(response.usage.map(|u| u.total()), Some(10));
    }

    /// System turns where the conversation has them, unless the model's template takes them
    /// only first (`system_turns = "first"`): then one leading system turn holds them all, in
    /// order, and the rest of the conversation keeps its order.
    #[test]
    fn system_turns_are_folded_first_only_for_a_model_that_says_so() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let model = OpenAiModel::new(
            "m",
            "http://127.0.0.1:1/v1/",
            "fake",
            "",
            4096,
            Duration::from_secs(1),
        );
        let request = ChatRequest {
            messages: vec![
                Message::text(Role::System, "be brief"),
                Message::text(Role::User, "hi"),
                Message::text(Role::System, "agents: claude"),
                Message::text(Role::Assistant, "hello"),
                Message::text(Role::User, "again"),
            ],
            ..ChatRequest::default()
        };
        let roles = |body: &Value| -> Vec<(String, String)> {
            body["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap_or_default().to_owned(),
                        m["content"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        };
        let kept = roles(&model.request_body(&request));
        assert_eq!(kept[2], ("system".to_owned(), "agents: claude".to_owned()));
        let model = model.with_system_turns(SystemTurns::First);
        let folded = roles(&model.request_body(&request));
        let expected: Vec<(String, String)> = [
            ("system", "be brief\n\nagents: claude"),
            ("user", "hi"),
            ("assistant", "hello"),
            ("user", "again"),
        ]
        .iter()
        .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
        .collect();
        assert_eq!(folded, expected);
        assert!(system_first(&[Message::text(Role::User, "x")])[0].role == Role::User);
    }

    #[test]
    fn tool_choice_and_response_format_reach_the_server_in_openai_shapes() {
        // As `main` does: the HTTP client's TLS needs the process's crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let model = OpenAiModel::new(
            "m",
            "http://127.0.0.1:1/v1/",
            "fake",
            "",
            4096,
            Duration::from_secs(1),
        );
        let mut request = ChatRequest::default();
        let body = model.request_body(&request);
        assert!(body.get("tool_choice").is_none() && body.get("response_format").is_none());
        let cases = [
            (ToolChoice::None, json!("none")),
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::Required, json!("required")),
            (
                ToolChoice::Function("f".into()),
                json!({"type": "function", "function": {"name": "f"}}),
            ),
        ];
        for (choice, expected) in cases {
            request.tool_choice = Some(choice);
            assert_eq!(model.request_body(&request)["tool_choice"], expected);
        }
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (ResponseFormat::Text, json!({"type": "text"})),
            (ResponseFormat::JsonObject, json!({"type": "json_object"})),
            (
                ResponseFormat::JsonSchema {
                    name: "s".into(),
                    schema: schema.clone(),
                    strict: true,
                },
                json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": true}}),
            ),
        ];
        for (format, expected) in cases {
            request.response_format = Some(format);
            assert_eq!(model.request_body(&request)["response_format"], expected);
        }
        assert_eq!(model.chat_url, "http://127.0.0.1:1/v1/chat/completions");
    }

    /// Regression: a backend that ignored `stream` and answered one JSON completion gave an
    /// empty answer with no usage, silently.
    #[test]
    fn a_plain_completion_is_read_as_the_answer() {
        let body = json!({
            "id": "x", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Hi",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "[]"}},
                ],
            }}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        });
        let chunk = completion_chunk(body.to_string().as_bytes()).expect("a completion");
        let mut acc = Accumulator::default();
        let deltas = acc.push(chunk);
        let response = acc.finish().expect("answered");
        assert_eq!(response.content, "Hi");
        assert_eq!(deltas, ["Hi"], "the text as one delta");
        let calls: Vec<_> = response
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("a", "f", "{}"), ("b", "g", "[]")]);
        assert_eq!(
            response.usage,
            Some(Usage {
                prompt_tokens: 4,
                completion_tokens: 2
            })
        );
    }

    #[test]
    fn answers_the_node_cannot_read_are_errors() {
        let garbage = completion_chunk(b"<html>hello</html>").expect_err("not JSON");
        assert!(garbage.contains("neither an event stream nor a JSON chat completion"));
        assert!(garbage.contains("<html>hello"), "{garbage}");
        // JSON, but no choice: nothing was answered.
        let chunk = completion_chunk(br#"{"object": "error"}"#).expect("lenient");
        let mut acc = Accumulator::default();
        acc.push(chunk);
        assert!(acc.finish().is_err());
        // An empty stream.
        assert!(Accumulator::default().finish().is_err());
        assert!(looks_like_events(b"\ndata: {}\n\n"));
        assert!(looks_like_events(b": keepalive\n\n"));
        assert!(!looks_like_events(br#"{"choices": []}"#));
    }

    /// A stream is read whole up to its limit; past it (here: one event that never ends) the
    /// answer is an error naming the backend, not a broken connection to fall through on.
    #[tokio::test]
    async fn a_stream_past_its_limit_is_an_error_naming_the_backend() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let model = OpenAiModel::new(
            "m",
            "http://127.0.0.1:1/v1",
            "fake",
            "",
            4096,
            Duration::from_secs(1),
        );
        let (tx, _rx) = crate::llm::delta_channel();
        let events = |pieces: Vec<String>| {
            tokio_stream::iter(pieces.into_iter().map(Ok::<_, std::convert::Infallible>))
        };
        let chunk = r#"data: {"choices": [{"delta": {"content": "hi"}}]}"#;
        let answer = model
            .read_stream(events(vec![format!("{chunk}\n\n")]), &tx, 100)
            .await
            .expect("within the limit");
        assert_eq!(answer.content, "hi");
        let endless = vec![format!("data: {}", "x".repeat(60)), "x".repeat(60)];
        let error = model
            .read_stream(events(endless), &tx, 100)
            .await
            .expect_err("past the limit");
        let ModelError::Protocol(message) = error else {
            panic!("{error:?}");
        };
        assert!(
            message.contains("backend `m` (http://127.0.0.1:1/v1)") && message.contains("100"),
            "{message}"
        );
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            error_message(br#"{"error": {"message": "bad model", "type": "x"}}"#),
            "bad model"
        );
        assert_eq!(error_message(br#"{"error": "overloaded"}"#), "overloaded");
        assert_eq!(error_message(b"Bad Gateway"), "Bad Gateway");
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
    fn embeddings_come_back_in_input_order_and_a_missing_one_is_an_error() {
        let answer =
            |value: Value| -> EmbeddingsAnswer { serde_json::from_value(value).expect("answer") };
        let ordered = embeddings_in_order(
            "e",
            answer(json!({"data": [
                {"index": 1, "embedding": [0.0, 1.0]},
                {"index": 0, "embedding": [1.0, 0.0]},
            ], "usage": {"prompt_tokens": 3}})),
            2,
        )
        .expect("ordered");
        assert_eq!(ordered.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(ordered.prompt_tokens, 3);
        let short = embeddings_in_order(
            "e",
            answer(json!({"data": [{"index": 0, "embedding": [1.0]}]})),
            2,
        )
        .expect_err("one missing");
        assert!(short.to_string().contains("input 1"), "{short}");
        let twice = embeddings_in_order(
            "e",
            answer(json!({"data": [
                {"index": 0, "embedding": [1.0]},
                {"index": 0, "embedding": [1.0]},
            ]})),
            2,
        )
        .expect_err("index twice");
        assert!(twice.to_string().contains("model `e`"), "{twice}");
    }

    #[test]
    fn status_codes_sort_into_server_errors_and_refusals() {
        assert!(matches!(
            status_error(429, String::new()),
            ModelError::Server { .. }
        ));
        assert!(matches!(
            status_error(503, String::new()),
            ModelError::Server { .. }
        ));
        assert!(matches!(
            status_error(400, String::new()),
            ModelError::Refused { .. }
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
