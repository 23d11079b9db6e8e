//! The `openai` backend: any OpenAI-compatible chat-completions server (Ollama, llama.cpp's
//! server, LM Studio, vLLM, Open WebUI), streamed, with tools, through async-openai; and, for a
//! model configured with `embeddings = true`, its `POST /embeddings` passed through (float
//! vectors, as the server makes them). Requests
//! and stream chunks are our own serde types (async-openai's "bring your own types" calls),
//! which keeps us tolerant of servers that leave out or add fields. The decode speed comes from
//! completed streamed calls.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use async_openai::{Client, config::OpenAIConfig, error::OpenAIError};
use mesh_domain::{
    BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Message, Role, ToolCall,
    Usage,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use crate::llm::model::{ChatModel, ModelError, SpeedGauge};

/// A model behind an OpenAI-compatible server.
pub struct OpenAiModel {
    name: String,
    model: String,
    client: Client<OpenAIConfig>,
    context_window: usize,
    timeout: Duration,
    /// Decode speed from completed streamed calls.
    speed: SpeedGauge,
    /// Whether the server's model makes embeddings (`embeddings = true`).
    embeddings: bool,
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
            embeddings: false,
        }
    }

    /// Says whether the server's model makes embeddings (`embeddings = true`).
    pub fn with_embeddings(mut self, embeddings: bool) -> Self {
        self.embeddings = embeddings;
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
