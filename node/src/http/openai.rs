//! OpenAI's chat completions and models list, translated to and from the gateway's [`Call`]
//! and [`Event`]s.
//!
//! `POST /v1/chat/completions` takes OpenAI's request (messages with text or text parts,
//! tools, `tool_choice`, `response_format`, `n`, the generation settings, `stream` and
//! `stream_options.include_usage`) and answers its JSON, or server-sent events of
//! `chat.completion.chunk`s. A field OpenAI defines that the mesh cannot honour (`logprobs`,
//! `audio`, a non-zero penalty, …) is a 400 naming it; a field OpenAI does not define is
//! ignored (or, with `http.unknown_fields = "refuse"`, refused in OpenAI's words); fields that
//! do not change the answer (`user`, `metadata`, `store`, …) are accepted. The table is in
//! docs/protocol.md. `GET /v1/models` lists every model of the fleet.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Extension, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use mesh_domain::{
    ChatRequest, ChatResponse, Message, PeerState, ResponseFormat, Role, Sampling, ToolCall,
    ToolChoice, ToolSpec, Usage,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    clients::{Unknown, client_name},
    door::FrontDoor,
    encode::{self, Encoder},
    error::ApiError,
};
use crate::gateway::{self, Call, Caller, Event, unix_s};

/// Fields of a chat-completions request that are read (and so honoured or refused by value).
const READ: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "n",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "modalities",
];

/// Fields OpenAI defines that do not change the answer: accepted and not used.
const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
];

/// Fields OpenAI defines that the mesh does not offer.
const UNSUPPORTED: &[&str] = &[
    "audio",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
];

/// The part of an OpenAI chat request the mesh uses.
#[derive(Debug, Deserialize)]
struct OpenAiRequest {
    model: String,
    messages: Vec<OpenAiMessage>,
    #[serde(default)]
    tools: Vec<OpenAiTool>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(default)]
    n: Option<u32>,
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
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    logit_bias: Option<Map<String, Value>>,
    #[serde(default)]
    modalities: Option<Vec<String>>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
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

/// The fields an OpenAI endpoint's request may carry, as the mesh treats them.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    /// Read (and so honoured, or refused by value).
    pub read: &'static [&'static str],
    /// Defined by OpenAI, not changing the answer: accepted and not used.
    pub ignored: &'static [&'static str],
    /// Defined by OpenAI, not offered by the mesh: refused unless `null`.
    pub unsupported: &'static [&'static str],
}

/// Chat completions' fields.
const CHAT_FIELDS: Fields = Fields {
    read: READ,
    ignored: IGNORED,
    unsupported: UNSUPPORTED,
};

/// Refuses a field OpenAI defines that the mesh does not offer, naming it; notes a field the
/// mesh does not know in `unknown`, which ignores it or refuses it as OpenAI refuses an
/// unrecognized argument. Shared by every OpenAI endpoint.
pub fn check_fields(
    object: &Map<String, Value>,
    fields: Fields,
    unknown: &mut Unknown,
) -> Result<(), ApiError> {
    for (field, value) in object {
        if fields.read.contains(&field.as_str()) || fields.ignored.contains(&field.as_str()) {
            continue;
        }
        if fields.unsupported.contains(&field.as_str()) {
            if value.is_null() {
                continue;
            }
            return Err(ApiError::bad_field(
                field,
                "is not supported by agentmesh; leave it out",
            ));
        }
        unknown.note(field.clone()).map_err(|field| ApiError {
            param: Some(field.clone()),
            ..ApiError::bad_request(format!("Unrecognized request argument supplied: {field}"))
        })?;
    }
    Ok(())
}

/// Refuses settings the mesh cannot honour rather than ignoring them.
fn check_unsupported_values(request: &OpenAiRequest) -> Result<(), ApiError> {
    for (field, value) in [
        ("frequency_penalty", request.frequency_penalty),
        ("presence_penalty", request.presence_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(ApiError::bad_field(
                field,
                "is not supported by agentmesh's models; leave it out or set it to 0",
            ));
        }
    }
    if request.logprobs == Some(true) || request.top_logprobs.is_some() {
        return Err(ApiError::bad_field(
            "logprobs",
            "log probabilities are not supported by agentmesh; leave it out",
        ));
    }
    if request.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::bad_field(
            "logit_bias",
            "is not supported by agentmesh; leave it out",
        ));
    }
    if let Some(modalities) = &request.modalities
        && modalities.iter().any(|m| m != "text")
    {
        return Err(ApiError::bad_field(
            "modalities",
            "only `text` is supported by agentmesh",
        ));
    }
    Ok(())
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

/// Text of a message's `content`: a string, or the text parts of a list.
pub fn content_text(content: Option<Value>) -> String {
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

/// OpenAI's `tool_choice`: `"none"`, `"auto"`, `"required"` or
/// `{"type": "function", "function": {"name": …}}`.
pub fn tool_choice_of(value: &Value) -> Result<ToolChoice, ApiError> {
    match value {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::bad_field(
                "tool_choice",
                format!("`{other}` is not none, auto, required or a function"),
            )),
        },
        Value::Object(o) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .or_else(|| o.get("name"))
            .and_then(Value::as_str)
            .map(|name| ToolChoice::Function(name.to_owned()))
            .ok_or_else(|| {
                ApiError::bad_field(
                    "tool_choice",
                    "an object must be {\"type\": \"function\", \"function\": {\"name\": …}}",
                )
            }),
        _ => Err(ApiError::bad_field(
            "tool_choice",
            "must be a string or a function object",
        )),
    }
}

/// OpenAI's `response_format`: `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
pub fn response_format_of(value: &Value) -> Result<ResponseFormat, ApiError> {
    let field = "response_format";
    match value.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let spec = value.get("json_schema").ok_or_else(|| {
                ApiError::bad_field(
                    "response_format.json_schema",
                    "is required with type json_schema",
                )
            })?;
            Ok(ResponseFormat::JsonSchema {
                name: spec
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                schema: spec.get("schema").cloned().unwrap_or(Value::Null),
                strict: spec.get("strict").and_then(Value::as_bool).unwrap_or(false),
            })
        }
        Some(other) => Err(ApiError::bad_field(
            field,
            format!("type `{other}` is not text, json_object or json_schema"),
        )),
        None => Err(ApiError::bad_field(field, "needs a `type`")),
    }
}

fn to_call(request: OpenAiRequest) -> Result<(Call, bool), ApiError> {
    check_unsupported_values(&request)?;
    let sampling = sampling_of(&request)?;
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad_field(
                    &format!("messages[{i}].role"),
                    format!("`{other}` is not system, developer, user, assistant or tool"),
                ));
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
    let chat = ChatRequest {
        messages,
        tools,
        sampling,
        response_format: request
            .response_format
            .as_ref()
            .filter(|v| !v.is_null())
            .map(response_format_of)
            .transpose()?,
        tool_choice: request
            .tool_choice
            .as_ref()
            .filter(|v| !v.is_null())
            .map(tool_choice_of)
            .transpose()?,
    };
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let mut call = Call::new(request.model, chat);
    call.n = request.n.unwrap_or(1);
    call.check()?;
    Ok((call, include_usage && request.stream))
}

/// A `POST /v1/chat/completions` body as the front door reads it, before it is placed.
#[derive(Debug)]
pub struct ChatCompletion {
    /// The call to place and run.
    pub call: Call,
    /// Whether the answer is streamed (server-sent events).
    pub stream: bool,
    /// Whether a streamed answer ends with a usage chunk.
    pub include_usage: bool,
}

/// Reads a chat-completions request body: JSON in OpenAI's shape, messages, tools and settings
/// checked (a 400 naming the field otherwise); a top-level field the mesh does not know is
/// noted in `unknown` (nested ones are not read at all). Public for the fuzz target
/// `front_door`; the handler is its only other caller.
pub fn read_chat_completion(
    body: &[u8],
    unknown: &mut Unknown,
) -> Result<ChatCompletion, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let Value::Object(object) = &value else {
        return Err(ApiError::bad_request("request body: must be a JSON object"));
    };
    check_fields(object, CHAT_FIELDS, unknown)?;
    let request: OpenAiRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let stream = request.stream;
    let (call, include_usage) = to_call(request)?;
    Ok(ChatCompletion {
        call,
        stream,
        include_usage,
    })
}

/// OpenAI's `tool_calls` of an answer.
pub fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

fn usage_json(usage: Usage) -> Value {
    json!({"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
           "total_tokens": usage.total()})
}

fn finish_reason(response: &ChatResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn completion_id() -> String {
    format!("chatcmpl-{}", uuid::Uuid::now_v7().simple())
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut unknown = door.clients.reading();
    let ChatCompletion {
        call,
        stream,
        include_usage,
    } = read_chat_completion(&body, &mut unknown)?;
    door.clients.ignored(
        &client_name(caller.key_name(), &headers),
        "/v1/chat/completions",
        &unknown,
    );
    let asked = call.model.clone();
    let run = door.gateway.start(&caller, door.aliased(call)).await?;
    let id = completion_id();
    let created = unix_s();
    if stream {
        let encoder = Chunks {
            id,
            created,
            model: asked,
            include_usage,
            usage: Usage::default(),
            n: 0,
        };
        return Ok(encode::stream(run, "text/event-stream", encoder));
    }
    let answers = run.finish().await?;
    let choices: Vec<Value> = answers
        .iter()
        .enumerate()
        .map(|(i, response)| {
            // OpenAI's shape: `content` null only beside tool calls; `tool_calls` only when
            // there are.
            let mut message = json!({"role": "assistant", "content": response.content});
            if !response.tool_calls.is_empty() {
                if response.content.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = Value::Array(tool_calls_json(&response.tool_calls));
            }
            json!({"index": i, "message": message, "finish_reason": finish_reason(response),
                   "logprobs": null})
        })
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": answers.first().map_or(asked.as_str(), |a| a.model.as_str()),
        "choices": choices,
        "usage": usage_json(gateway::total_usage(&answers)),
    }))
    .into_response())
}

/// A streamed chat completion: `chat.completion.chunk` events, then `[DONE]`.
struct Chunks {
    id: String,
    created: u64,
    /// The model asked for until one answered, then the one that served.
    model: String,
    include_usage: bool,
    usage: Usage,
    /// Choices started (each gets its role chunk first).
    n: u32,
}

impl Chunks {
    fn chunk(&self, choice: u32, delta: Value, finish: Option<&str>) -> String {
        let value = json!({"id": self.id, "object": "chat.completion.chunk",
            "created": self.created, "model": self.model,
            "choices": [{"index": choice, "delta": delta, "finish_reason": finish}]});
        format!("data: {value}\n\n")
    }

    /// The role chunk of every choice up to `choice` not yet started.
    fn open(&mut self, choice: u32) -> Vec<String> {
        let mut frames = Vec::new();
        while self.n <= choice {
            frames.push(self.chunk(self.n, json!({"role": "assistant", "content": ""}), None));
            self.n += 1;
        }
        frames
    }
}

impl Encoder for Chunks {
    fn start(&mut self) -> Vec<String> {
        self.open(0)
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        match event {
            Event::Delta { choice, text } => {
                let mut frames = self.open(choice);
                frames.push(self.chunk(choice, json!({"content": text}), None));
                frames
            }
            Event::Done { choice, response } => {
                let mut frames = self.open(choice);
                self.model = response.model.clone();
                self.usage.add(response.usage.unwrap_or_default());
                if !response.tool_calls.is_empty() {
                    frames.push(self.chunk(
                        choice,
                        json!({"tool_calls": tool_calls_json(&response.tool_calls)}),
                        None,
                    ));
                }
                frames.push(self.chunk(choice, json!({}), Some(finish_reason(&response))));
                frames
            }
            Event::Failed(error) => {
                vec![format!(
                    "data: {}\n\n",
                    ApiError::from(error).body(super::error::Dialect::OpenAi)
                )]
            }
        }
    }

    fn end(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        if self.include_usage {
            let value = json!({"id": self.id, "object": "chat.completion.chunk",
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_json(self.usage)});
            frames.push(format!("data: {value}\n\n"));
        }
        frames.push("data: [DONE]\n\n".to_owned());
        frames
    }
}

/// One entry of `/v1/models`; `capabilities` (an agentmesh addition, which OpenAI's clients
/// keep as an extra field) says whether the model also makes embeddings.
fn model_entry(id: &str, owner: &str, embeds: bool) -> Value {
    let capabilities: &[&str] = if embeds {
        &["chat", "embeddings"]
    } else {
        &["chat"]
    };
    json!({"id": id, "object": "model", "created": 0, "owned_by": owner,
           "capabilities": capabilities})
}

/// `GET /v1/models`: every model the fleet serves (this node's and its up peers'), and a
/// `role:<name>` alias per role; `owned_by` names the first node seen serving it, and
/// `capabilities` includes `embeddings` when some node's model of that name makes them. With an
/// `anthropic-version` header (Anthropic's client), the same list in Anthropic's shape.
pub async fn list_models(State(door): State<Arc<FrontDoor>>, headers: HeaderMap) -> Json<Value> {
    if headers.contains_key(super::anthropic::VERSION_HEADER) {
        return Json(super::anthropic::models_list(&door.fleet_models()));
    }
    let embedders = door.fleet_embedders();
    let data: Vec<Value> = door
        .fleet_models()
        .iter()
        .map(|(id, owner)| model_entry(id, owner, embedders.contains(id)))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

impl FrontDoor {
    /// The models some node of the fleet (this one or an up peer) makes embeddings with.
    pub fn fleet_embedders(&self) -> std::collections::BTreeSet<String> {
        let own = self.caps.snapshot();
        let peers = self.peers.snapshot();
        std::iter::once(&own)
            .chain(
                peers
                    .iter()
                    .filter(|p| p.state == PeerState::Up)
                    .map(|p| &p.info),
            )
            .flat_map(|info| info.models.iter())
            .filter(|m| m.embeds)
            .map(|m| m.name.clone())
            .collect()
    }

    /// Every model id the fleet serves (models and `role:<name>` aliases), each with the first
    /// node seen serving it (this node first, then up peers).
    pub fn fleet_models(&self) -> std::collections::BTreeMap<String, String> {
        let own = self.caps.snapshot();
        let mut infos = vec![own];
        infos.extend(
            self.peers
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
        seen
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::Target;

    use super::*;
    use crate::config::UnknownFields;

    /// Reads `body` with `http.unknown_fields = "refuse"`.
    fn read(body: Value) -> Result<ChatCompletion, ApiError> {
        read_chat_completion(
            body.to_string().as_bytes(),
            &mut Unknown::new(UnknownFields::Refuse),
        )
    }

    #[test]
    fn openai_messages_become_chat_requests_and_bad_roles_name_the_field() {
        let read = read(json!({
            "model": "role:chat",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
            "n": 2,
            "temperature": 0.2,
            "user": "someone"
        }))
        .expect("valid");
        let (call, chat) = (&read.call, &read.call.chat);
        assert_eq!(call.model, "role:chat");
        assert_eq!(call.target, Target::Role("chat".into()));
        assert_eq!(call.n, 2);
        assert_eq!(chat.messages[1].content, "hi there");
        assert_eq!(chat.messages[2].tool_calls[0].name, "f");
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(chat.tools[0].name, "f");
        assert_eq!(chat.tool_choice, Some(ToolChoice::Function("f".into())));
        assert!(matches!(
            chat.response_format,
            Some(ResponseFormat::JsonSchema { .. })
        ));
        let error =
            self::read(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}))
                .expect_err("bad role");
        assert_eq!(error.param.as_deref(), Some("messages[0].role"));
    }

    fn sampling(extra: Value) -> Result<Sampling, String> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        read(body)
            .map(|c| c.call.chat.sampling)
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
            (json!({"n": 0}), "n"),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format",
            ),
            (json!({"presence_penalty": 0.5}), "presence_penalty"),
            (json!({"logprobs": true}), "logprobs"),
            (json!({"audio": {"voice": "x"}}), "audio"),
        ] {
            let error = sampling(bad.clone()).expect_err("invalid");
            assert!(error.starts_with(field), "{bad}: {error}");
        }
        // Fields that do not change the answer are accepted.
        assert!(sampling(json!({"user": "u", "store": false, "presence_penalty": 0})).is_ok());
    }

    /// A field OpenAI does not define is ignored and noted by default, and refused in OpenAI's
    /// words with `refuse`; one it defines that the mesh does not offer is refused either way.
    #[test]
    fn unknown_fields_are_ignored_and_noted_unless_refused() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                          "top_k": 40, "client_metadata": {"a": "b"}});
        let error = read(body.clone()).expect_err("refused");
        assert_eq!(
            error.message,
            "Unrecognized request argument supplied: top_k"
        );
        assert_eq!(error.param.as_deref(), Some("top_k"));
        let mut unknown = Unknown::new(UnknownFields::Ignore);
        read_chat_completion(body.to_string().as_bytes(), &mut unknown).expect("ignored");
        let mut noted = unknown.found().to_vec();
        noted.sort();
        assert_eq!(noted, ["client_metadata", "top_k"]);
        let mut unknown = Unknown::new(UnknownFields::Ignore);
        let error = read_chat_completion(
            br#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "audio": {}}"#,
            &mut unknown,
        )
        .expect_err("audio is OpenAI's and not offered");
        assert_eq!(error.param.as_deref(), Some("audio"));
    }
}
