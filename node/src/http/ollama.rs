//! Ollama's API, translated to and from the gateway's [`Call`] and [`Event`]s, so that Ollama
//! clients (the `ollama` packages, Open WebUI, editors) see the whole fleet as one Ollama.
//!
//! `POST /api/chat` and `POST /api/generate` answer one JSON object, or (the default, as in
//! Ollama) NDJSON: one object per line, the last `done: true` with `done_reason`, the token
//! counts and the durations in nanoseconds. `POST /api/embed` (and the older
//! `/api/embeddings`) embed through the gateway's one embeddings path. `GET /api/tags` and
//! `GET /api/ps` list the fleet's models, `POST /api/show` describes one, `GET /api/version`
//! names the Ollama release whose API this follows ([`VERSION`]). Like Ollama's own decoder
//! this ignores fields it does not know; a known field of the wrong type, or a setting that
//! would change the answer and that the mesh cannot honour, is a 400 naming it. The field table
//! is in docs/protocol.md.

use std::{sync::Arc, time::Instant};

use axum::{
    Json,
    extract::{Extension, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use mesh_domain::{
    ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Message, ResponseFormat, Role,
    Sampling, ToolCall, ToolSpec,
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Map, Value, json};

use super::{
    door::FrontDoor,
    encode::{self, Encoder},
    error::{ApiError, Dialect, ErrorKind},
};
use crate::gateway::{Call, Caller, Event, GatewayError};

/// The Ollama release `GET /api/version` reports. Clients gate features on it (structured
/// output needs 0.5.0; Raycast asks for 0.6.4, Continue for 0.6.5), and this is the release
/// whose API the dialect follows, so it clears those checks without claiming newer features.
pub const VERSION: &str = "0.12.0";

/// Content type of a streamed answer.
const NDJSON: &str = "application/x-ndjson";

/// Options that change the answer and that the mesh's models cannot honour, each with the
/// value at which it changes nothing (accepted; `None`: refused whatever its value).
/// `repeat_last_n` and `penalize_newline` only scope `repeat_penalty`, and `mirostat_tau` and
/// `mirostat_eta` only tune `mirostat`: with those neutral they change nothing either.
const REFUSED_OPTIONS: &[(&str, Option<f64>)] = &[
    ("top_k", None),
    ("min_p", Some(0.0)),
    ("typical_p", Some(1.0)),
    ("tfs_z", Some(1.0)),
    ("repeat_penalty", Some(1.0)),
    ("presence_penalty", Some(0.0)),
    ("frequency_penalty", Some(0.0)),
    ("mirostat", Some(0.0)),
];

/// A request body read as `T`; a field of the wrong type is a 400 naming its path.
fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        match e.inner().classify() {
            serde_json::error::Category::Data if path != "." => {
                ApiError::bad_field(&path, e.inner())
            }
            _ => ApiError::bad_request(format!("request body: {}", e.inner())),
        }
    })
}

/// `POST /api/chat`'s body (fields not listed are ignored, as Ollama does: `keep_alive`, …).
#[derive(Debug, Default, Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: String,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    options: Option<Map<String, Value>>,
    /// Ollama streams unless told not to.
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    think: Option<Value>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    messages: Option<Vec<OllamaMessage>>,
    #[serde(default)]
    tools: Option<Vec<OllamaTool>>,
}

#[derive(Debug, Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    tool_calls: Option<Vec<OllamaToolCall>>,
    /// Which tool a `tool` message answers.
    #[serde(default)]
    tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OllamaToolCall {
    #[serde(default)]
    id: Option<String>,
    function: OllamaFunctionCall,
}

#[derive(Debug, Deserialize)]
struct OllamaFunctionCall {
    name: String,
    /// A JSON object in Ollama; JSON text is taken too.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct OllamaTool {
    function: OllamaFunction,
}

#[derive(Debug, Deserialize)]
struct OllamaFunction {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

/// `POST /api/generate`'s body.
#[derive(Debug, Default, Deserialize)]
struct GenerateBody {
    #[serde(default)]
    model: String,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    options: Option<Map<String, Value>>,
    /// Ollama streams unless told not to.
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    think: Option<Value>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    context: Option<Vec<Value>>,
    #[serde(default)]
    raw: Option<bool>,
    #[serde(default)]
    template: Option<String>,
}

/// `POST /api/show`'s body (`name` is the older spelling of `model`).
#[derive(Debug, Deserialize)]
struct ShowBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// A 400 for a field the mesh cannot honour.
fn unsupported(field: &str, why: &str) -> ApiError {
    ApiError::bad_field(field, format!("{why}; leave it out"))
}

/// An unknown model, in Ollama's words.
fn model_not_found(model: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::NotFound,
        format!("model \"{model}\" not found (GET /api/tags lists the fleet's models)"),
    )
    .with_code("model_not_found")
}

/// A gateway refusal, with a model no node has worded as Ollama words it (naming `asked`).
fn unknown_as_not_found(error: GatewayError, asked: &str) -> ApiError {
    if error.is_unknown_model() {
        model_not_found(asked)
    } else {
        error.into()
    }
}

/// The model a client names: as given, or without Ollama's default tag `:latest` when the
/// fleet has the bare name (Ollama clients add it; mesh models have no tags).
fn resolve(model: &str, fleet: &std::collections::BTreeMap<String, String>) -> String {
    match model.strip_suffix(":latest") {
        Some(bare) if !fleet.contains_key(model) && fleet.contains_key(bare) => bare.to_owned(),
        _ => model.to_owned(),
    }
}

/// A number option's value, or a 400 naming it.
fn number(options: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match options.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(ApiError::bad_field(
            &format!("options.{name}"),
            format!("must be a number, not {other}"),
        )),
    }
}

/// An integer option's value, or a 400 naming it.
fn integer(options: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match options.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_i64().map(Some).ok_or_else(|| {
            ApiError::bad_field(
                &format!("options.{name}"),
                format!("must be an integer, not {value}"),
            )
        }),
    }
}

/// Ollama's `options` as the mesh's generation settings: `temperature`, `top_p`,
/// `num_predict`, `stop` and `seed` honoured, [`REFUSED_OPTIONS`] refused unless neutral, and
/// every other one ignored: those that only tune how a model is loaded or run (`num_ctx`,
/// `num_thread`, `num_gpu`, `num_batch`, `use_mmap`, …; the mesh's models are loaded by their
/// nodes' configuration) and unknown ones, which Ollama ignores too.
fn sampling_of(options: Option<&Map<String, Value>>) -> Result<Sampling, ApiError> {
    let Some(options) = options else {
        return Ok(Sampling::default());
    };
    for (name, neutral) in REFUSED_OPTIONS {
        if let Some(value) = number(options, name)?
            && neutral.is_none_or(|n| value != n)
        {
            return Err(ApiError::bad_field(
                &format!("options.{name}"),
                match neutral {
                    Some(n) => format!(
                        "is not supported by agentmesh's models (it changes the answer); leave it out or set it to {n}"
                    ),
                    None => "is not supported by agentmesh's models (it changes the answer); leave it out".to_owned(),
                },
            ));
        }
    }
    let stop = match options.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad_field("options.stop", "must be a list of strings"))?,
        Some(_) => {
            return Err(ApiError::bad_field(
                "options.stop",
                "must be a list of strings",
            ));
        }
    };
    let num_predict = match integer(options, "num_predict")? {
        // -1 (no limit) and -2 (fill the context) leave the limit to the model.
        None | Some(-2 | -1) => None,
        Some(n) => Some(u32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::bad_field(
                "options.num_predict",
                format!("{n} is not a token count (at least 1), -1 (no limit) or -2"),
            )
        })?),
    };
    let sampling = Sampling {
        max_tokens: num_predict,
        temperature: number(options, "temperature")?.map(|t| t as f32),
        top_p: number(options, "top_p")?.map(|p| p as f32),
        stop,
        // A negative seed asks Ollama for a random one: the same as none.
        seed: integer(options, "seed")?.and_then(|s| u64::try_from(s).ok()),
    };
    // The domain's check names OpenAI's fields; these are Ollama's options.
    sampling.check().map_err(|e| {
        let e = e
            .strip_prefix("max_tokens")
            .map_or(e.clone(), |rest| format!("num_predict{rest}"));
        let field = e.split(':').next().unwrap_or_default();
        ApiError {
            param: Some(format!("options.{field}")),
            ..ApiError::bad_request(format!("options.{e}"))
        }
    })?;
    Ok(sampling)
}

/// Ollama's `format`: `"json"` or a JSON schema (an empty string or null: free text).
fn format_of(format: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ResponseFormat::JsonObject)),
        Some(schema @ Value::Object(_)) => Ok(Some(ResponseFormat::JsonSchema {
            // OpenAI needs a name; Ollama has none.
            name: "format".to_owned(),
            schema: schema.clone(),
            // OpenAI's strict mode refuses schemas that do not forbid additional properties,
            // which Ollama clients do not write; the embedded engine enforces any schema.
            strict: false,
        })),
        Some(other) => Err(ApiError::bad_field(
            "format",
            format!("{other} is not \"json\" or a JSON schema object"),
        )),
    }
}

/// The fields `/api/chat` and `/api/generate` share that set how the answer is generated.
struct Settings<'a> {
    format: Option<&'a Value>,
    options: Option<&'a Map<String, Value>>,
    think: Option<&'a Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
}

impl Settings<'_> {
    /// Refuses what changes the answer and cannot be honoured; the settings and format.
    fn read(self) -> Result<(Sampling, Option<ResponseFormat>), ApiError> {
        let thinking = match self.think {
            None | Some(Value::Null | Value::Bool(false)) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        };
        if thinking {
            return Err(unsupported(
                "think",
                "agentmesh's models do not return their thinking apart from the answer",
            ));
        }
        if self.logprobs == Some(true) || self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(unsupported(
                "logprobs",
                "log probabilities are not supported by agentmesh",
            ));
        }
        Ok((sampling_of(self.options)?, format_of(self.format)?))
    }
}

/// Ollama's chat messages as the mesh's. Ollama's tool calls carry no ids (newer servers add
/// one); the mesh's backends pair a tool result with its call by id, so a call without one gets
/// `call_<message>_<call>`, and a `tool` message answers the first open call of its
/// `tool_name` (or the first open one).
fn messages_of(messages: Vec<OllamaMessage>) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let field = |name: &str| format!("messages[{i}].{name}");
        if m.images.as_ref().is_some_and(|images| !images.is_empty()) {
            return Err(unsupported(
                &field("images"),
                "images are not supported by agentmesh's models",
            ));
        }
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad_field(
                    &field("role"),
                    format!("`{other}` is not system, user, assistant or tool"),
                ));
            }
        };
        let mut tool_calls = Vec::new();
        for (j, call) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let arguments = match call.function.arguments {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(Value::String(text)) => text,
                Some(object @ Value::Object(_)) => object.to_string(),
                Some(other) => {
                    return Err(ApiError::bad_field(
                        &field(&format!("tool_calls[{j}].function.arguments")),
                        format!("must be a JSON object, not {other}"),
                    ));
                }
            };
            tool_calls.push(ToolCall {
                id: call.id.unwrap_or_else(|| format!("call_{i}_{j}")),
                name: call.function.name,
                arguments,
            });
        }
        if !tool_calls.is_empty() {
            open = tool_calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone()))
                .collect();
        }
        let tool_call_id = (role == Role::Tool)
            .then(|| {
                let at = match &m.tool_name {
                    Some(name) => open.iter().position(|(_, n)| n == name),
                    None => (!open.is_empty()).then_some(0),
                };
                at.map(|at| open.remove(at).0)
            })
            .flatten();
        out.push(Message {
            role,
            content: m.content.unwrap_or_default(),
            tool_calls,
            tool_call_id,
        });
    }
    Ok(out)
}

/// Which endpoint an answer is for: its text goes in `message.content` or in `response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
}

/// A chat or generate request, read and checked, before it is placed.
#[derive(Debug)]
struct Read {
    kind: Kind,
    call: Call,
    stream: bool,
}

/// Reads `/api/chat`'s body.
fn read_chat(body: &[u8]) -> Result<Read, ApiError> {
    let body: ChatBody = read(body)?;
    let (sampling, response_format) = Settings {
        format: body.format.as_ref(),
        options: body.options.as_ref(),
        think: body.think.as_ref(),
        logprobs: body.logprobs,
        top_logprobs: body.top_logprobs,
    }
    .read()?;
    let tools = body
        .tools
        .unwrap_or_default()
        .into_iter()
        .map(|t| ToolSpec {
            name: t.function.name,
            description: t.function.description.unwrap_or_default(),
            parameters: t
                .function
                .parameters
                .unwrap_or_else(|| json!({"type": "object"})),
        })
        .collect();
    let chat = ChatRequest {
        messages: messages_of(body.messages.unwrap_or_default())?,
        tools,
        sampling,
        response_format,
        tool_choice: None,
    };
    Ok(Read {
        kind: Kind::Chat,
        stream: body.stream.unwrap_or(true),
        call: Call::new(body.model, chat),
    })
}

/// Reads `/api/generate`'s body: `system` and `prompt` become a chat of at most two messages.
fn read_generate(body: &[u8]) -> Result<Read, ApiError> {
    let body: GenerateBody = read(body)?;
    if body.raw == Some(true) {
        return Err(unsupported(
            "raw",
            "agentmesh applies each model's own chat template",
        ));
    }
    if body.template.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(unsupported(
            "template",
            "agentmesh applies each model's own chat template",
        ));
    }
    if body.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(unsupported(
            "images",
            "images are not supported by agentmesh's models",
        ));
    }
    if body.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported(
            "suffix",
            "fill-in-the-middle is not supported by agentmesh",
        ));
    }
    if body.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(unsupported(
            "context",
            "agentmesh returns no token context to continue from; send the conversation to /api/chat instead",
        ));
    }
    let (sampling, response_format) = Settings {
        format: body.format.as_ref(),
        options: body.options.as_ref(),
        think: body.think.as_ref(),
        logprobs: body.logprobs,
        top_logprobs: body.top_logprobs,
    }
    .read()?;
    let mut messages = Vec::new();
    if let Some(system) = body.system.filter(|s| !s.is_empty()) {
        messages.push(Message::text(Role::System, system));
    }
    if let Some(prompt) = body.prompt.filter(|p| !p.is_empty()) {
        messages.push(Message::text(Role::User, prompt));
    }
    let chat = ChatRequest {
        messages,
        sampling,
        response_format,
        ..ChatRequest::default()
    };
    Ok(Read {
        kind: Kind::Generate,
        stream: body.stream.unwrap_or(true),
        call: Call::new(body.model, chat),
    })
}

/// Now, as Ollama writes `created_at`.
fn created_at() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Nanoseconds since `since`.
fn nanos_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Ollama's tool calls of an answer: arguments as a JSON object, as its clients parse them.
fn tool_calls_json(response: &ChatResponse) -> Result<Vec<Value>, ApiError> {
    response
        .tool_calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let arguments = match call.arguments.trim() {
                "" => Value::Object(Map::new()),
                text => serde_json::from_str::<Value>(text)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::BAD_GATEWAY,
                            ErrorKind::Unavailable,
                            format!(
                                "model `{}` called `{}` with arguments that are not a JSON object: {text}",
                                response.model, call.name
                            ),
                        )
                    })?,
            };
            Ok(json!({"id": call.id,
                      "function": {"index": index, "name": call.name, "arguments": arguments}}))
        })
        .collect()
}

/// Times an answer for the durations Ollama reports.
#[derive(Debug, Clone, Copy)]
struct Clock {
    started: Instant,
    /// When the first text arrived (streamed answers only).
    first: Option<Instant>,
}

impl Clock {
    fn start() -> Self {
        Self {
            started: Instant::now(),
            first: None,
        }
    }
}

/// The fields of the last object (`done: true`): the reason, counts and durations. A whole
/// answer has no first-token time, so all of its time is `eval_duration`.
fn done_fields(response: &ChatResponse, max_tokens: Option<u32>, clock: Clock) -> Value {
    let usage = response.usage.unwrap_or_default();
    let length = max_tokens.is_some_and(|max| usage.completion_tokens >= u64::from(max));
    let total = nanos_since(clock.started);
    let prompt = clock.first.map_or(0, |first| {
        u64::try_from((first - clock.started).as_nanos()).unwrap_or(0)
    });
    json!({
        "done": true,
        "done_reason": if length { "length" } else { "stop" },
        "total_duration": total,
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": prompt,
        "eval_count": usage.completion_tokens,
        "eval_duration": total.saturating_sub(prompt),
    })
}

/// One object of an answer: `model`, `created_at`, the text in `kind`'s place, and `extra`.
fn object(kind: Kind, model: &str, text: &str, extra: Value) -> Value {
    let mut value = json!({"model": model, "created_at": created_at()});
    match kind {
        Kind::Chat => value["message"] = json!({"role": "assistant", "content": text}),
        Kind::Generate => value["response"] = json!(text),
    }
    if let (Value::Object(value), Value::Object(extra)) = (&mut value, extra) {
        value.extend(extra);
    }
    value
}

/// The answer to a request with nothing to say (no messages, or an empty prompt): Ollama loads
/// the model and answers `done_reason: "load"`; mesh models are loaded, so only the name is
/// checked.
fn load_answer(kind: Kind, model: &str) -> Response {
    Json(object(
        kind,
        model,
        "",
        json!({"done": true, "done_reason": "load"}),
    ))
    .into_response()
}

/// A streamed answer: one JSON object per line.
struct Lines {
    kind: Kind,
    /// The model asked for until one answered, then the one that served.
    model: String,
    max_tokens: Option<u32>,
    clock: Clock,
}

fn line(value: &Value) -> String {
    format!("{value}\n")
}

impl Encoder for Lines {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        match event {
            Event::Delta { text, .. } => {
                self.clock.first.get_or_insert_with(Instant::now);
                vec![line(&object(
                    self.kind,
                    &self.model,
                    &text,
                    json!({"done": false}),
                ))]
            }
            Event::Done { response, .. } => {
                self.model = response.model.clone();
                let mut lines = Vec::new();
                if !response.tool_calls.is_empty() {
                    // As Ollama streams them: in an object of their own before the last.
                    match tool_calls_json(&response) {
                        Ok(calls) => {
                            let mut value =
                                object(self.kind, &self.model, "", json!({"done": false}));
                            value["message"]["tool_calls"] = Value::Array(calls);
                            lines.push(line(&value));
                        }
                        Err(error) => return vec![line(&error.body(Dialect::Ollama))],
                    }
                }
                let done = done_fields(&response, self.max_tokens, self.clock);
                lines.push(line(&object(self.kind, &self.model, "", done)));
                lines
            }
            Event::Failed(error) => vec![line(&ApiError::from(error).body(Dialect::Ollama))],
        }
    }

    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// Places and runs a chat or generate request, whole or streamed.
async fn answer(door: Arc<FrontDoor>, caller: Caller, read: Read) -> Result<Response, ApiError> {
    let Read {
        kind,
        mut call,
        stream,
    } = read;
    if call.model.is_empty() {
        return Err(ApiError::bad_field(
            "model",
            "is required (GET /api/tags lists the fleet's models)",
        ));
    }
    let fleet = door.fleet_models();
    call = Call::new(resolve(&call.model, &fleet), call.chat);
    if call.chat.messages.is_empty() {
        if !fleet.contains_key(&call.model) {
            return Err(model_not_found(&call.model));
        }
        return Ok(load_answer(kind, &call.model));
    }
    let asked = call.model.clone();
    let max_tokens = call.chat.sampling.max_tokens;
    let clock = Clock::start();
    let run = door
        .gateway
        .start(&caller, call)
        .await
        .map_err(|e| unknown_as_not_found(e, &asked))?;
    if stream {
        let encoder = Lines {
            kind,
            model: asked,
            max_tokens,
            clock,
        };
        return Ok(encode::stream(run, NDJSON, encoder));
    }
    let response = run.answer().await?;
    let mut value = object(
        kind,
        &response.model,
        &response.content,
        done_fields(&response, max_tokens, clock),
    );
    if !response.tool_calls.is_empty() {
        value["message"]["tool_calls"] = Value::Array(tool_calls_json(&response)?);
    }
    Ok(Json(value).into_response())
}

/// `POST /api/chat`.
pub async fn chat(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    answer(door, caller, read_chat(&body)?).await
}

/// `POST /api/generate`.
pub async fn generate(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    answer(door, caller, read_generate(&body)?).await
}

/// `POST /api/embed`'s body (`/api/embeddings`, the older endpoint, sends one `prompt`).
#[derive(Debug, Default, Deserialize)]
struct EmbedBody {
    #[serde(default)]
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    dimensions: Option<u64>,
}

/// `input`: one text or a list of texts.
fn embed_inputs(input: Option<Value>) -> Result<Vec<String>, ApiError> {
    const TEXT: &str = "must be a string or a list of strings";
    match input {
        Some(Value::String(text)) => Ok(vec![text]),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text),
                other => Err(ApiError::bad_field(
                    &format!("input[{i}]"),
                    format!("{other} is not a string"),
                )),
            })
            .collect(),
        None | Some(Value::Null) => Err(ApiError::bad_field(
            "input",
            format!("is required: it {TEXT}"),
        )),
        Some(other) => Err(ApiError::bad_field("input", format!("{TEXT}, not {other}"))),
    }
}

/// Embeds the texts through the gateway; a `dimensions` other than the model's is a 400.
async fn embed_texts(
    door: &FrontDoor,
    caller: &Caller,
    body: EmbedBody,
    inputs: Vec<String>,
    started: Instant,
) -> Result<(EmbedResponse, Value), ApiError> {
    if body.model.is_empty() {
        return Err(ApiError::bad_field(
            "model",
            "is required (GET /api/tags lists the fleet's models)",
        ));
    }
    let model = resolve(&body.model, &door.fleet_models());
    let response = door
        .gateway
        .embed(caller, &model, &EmbedRequest { inputs })
        .await
        .map_err(|e| unknown_as_not_found(e, &body.model))?;
    let made = response.vectors.first().map_or(0, Vec::len) as u64;
    if let Some(wanted) = body.dimensions
        && wanted != made
    {
        return Err(ApiError::bad_field(
            "dimensions",
            format!(
                "model `{}` makes {made}-dimensional vectors and the mesh does not shorten them; leave dimensions out or set it to {made}",
                response.model
            ),
        ));
    }
    let timing = json!({"total_duration": nanos_since(started), "load_duration": 0,
                        "prompt_eval_count": response.prompt_tokens});
    Ok((response, timing))
}

/// `POST /api/embed`: `{"model", "embeddings": [[…]], …}`, one vector per input.
pub async fn embed(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let mut body: EmbedBody = read(&body)?;
    let inputs = embed_inputs(body.input.take())?;
    let (response, mut value) = embed_texts(&door, &caller, body, inputs, started).await?;
    value["model"] = json!(response.model);
    value["embeddings"] = json!(response.vectors);
    Ok(Json(value))
}

/// `POST /api/embeddings` (Ollama's older endpoint): one `prompt`, `{"embedding": […]}`.
pub async fn embeddings(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let mut body: EmbedBody = read(&body)?;
    let prompt = body
        .prompt
        .take()
        .ok_or_else(|| ApiError::bad_field("prompt", "is required: the text to embed"))?;
    let (response, _) = embed_texts(&door, &caller, body, vec![prompt], started)
        .await
        .map_err(|e| match e.param.as_deref() {
            // The gateway names OpenAI's `input`; this endpoint's text is `prompt`.
            Some("input") => ApiError::bad_field("prompt", e.message.replacen("input[0]: ", "", 1)),
            _ => e,
        })?;
    let vector = response.vectors.into_iter().next().unwrap_or_default();
    Ok(Json(json!({"embedding": vector})))
}

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({"version": VERSION}))
}

/// Ollama's `details` of a model: the mesh knows none of them (its models may be remote
/// servers), so every one is empty.
fn details() -> Value {
    json!({"parent_model": "", "format": "", "family": "", "families": null,
           "parameter_size": "", "quantization_level": ""})
}

/// A stable stand-in for Ollama's manifest digest: the SHA-256 of the model's name.
fn digest(name: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(name.as_bytes()))
}

/// Mesh models have no file of their own here: no size, no modification time.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// One model of `/api/tags` (or, with `expires_at` and `size_vram`, of `/api/ps`).
fn model_entry(name: &str) -> Value {
    json!({"name": name, "model": name, "modified_at": EPOCH, "size": 0,
           "digest": digest(name), "details": details()})
}

/// `GET /api/tags`: every model of the fleet (models and `role:<name>` aliases).
pub async fn tags(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let models: Vec<Value> = door.fleet_models().keys().map(|m| model_entry(m)).collect();
    Json(json!({"models": models}))
}

/// `GET /api/ps`: the models running, which in the mesh are all of them (a node loads its
/// models when it starts and keeps them).
pub async fn ps(State(door): State<Arc<FrontDoor>>) -> Json<Value> {
    let models: Vec<Value> = door
        .fleet_models()
        .keys()
        .map(|m| {
            let mut entry = model_entry(m);
            entry["expires_at"] = json!(EPOCH);
            entry["size_vram"] = json!(0);
            entry
        })
        .collect();
    Json(json!({"models": models}))
}

/// `POST /api/show`: what Ollama says of a model, as far as the mesh knows it; clients read
/// `capabilities` to offer tools (and embeddings).
pub async fn show(
    State(door): State<Arc<FrontDoor>>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: ShowBody = read(&body)?;
    let asked = body
        .model
        .or(body.name)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_field("model", "is required"))?;
    let fleet = door.fleet_models();
    let model = resolve(&asked, &fleet);
    if !fleet.contains_key(&model) {
        return Err(model_not_found(&asked));
    }
    // Every fleet model chats (tools are passed through); Ollama names embedding models so.
    let mut capabilities = vec!["completion", "tools"];
    if door.fleet_embedders().contains(&model) {
        capabilities.push("embedding");
    }
    Ok(Json(json!({
        "modelfile": "", "parameters": "", "template": "", "license": "",
        "details": details(), "model_info": {}, "modified_at": EPOCH,
        "capabilities": capabilities,
    })))
}

#[cfg(test)]
mod tests {
    use mesh_domain::{Target, Usage};

    use super::*;

    fn chat(body: Value) -> Result<Read, ApiError> {
        read_chat(body.to_string().as_bytes())
    }

    fn generate(body: Value) -> Result<Read, ApiError> {
        read_generate(body.to_string().as_bytes())
    }

    fn field_of(result: Result<Read, ApiError>) -> String {
        result.expect_err("refused").param.unwrap_or_default()
    }

    #[test]
    fn chats_become_calls_with_tool_calls_paired_by_name() {
        let read = chat(json!({
            "model": "role:chat",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "time", "arguments": {}}},
                    {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_name": "weather", "content": "sunny"},
                {"role": "tool", "content": "noon"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather",
                       "parameters": {"type": "object"}}}],
            "format": "json",
            "options": {"temperature": 0.5, "num_predict": 9, "stop": ["END"], "seed": 3,
                        "num_ctx": 4096, "not_an_option": true},
            "keep_alive": "5m",
            "an_unknown_field": 1
        }))
        .expect("valid");
        assert!(read.stream, "Ollama streams by default");
        assert_eq!(read.kind, Kind::Chat);
        assert_eq!(read.call.target, Target::Role("chat".into()));
        let chat = &read.call.chat;
        let calls = &chat.messages[2].tool_calls;
        assert_eq!(
            (calls[0].id.as_str(), calls[0].arguments.as_str()),
            ("call_2_0", "{}")
        );
        assert_eq!(calls[1].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("call_2_1"));
        assert_eq!(chat.messages[4].tool_call_id.as_deref(), Some("call_2_0"));
        assert_eq!(chat.tools[0].name, "weather");
        assert_eq!(chat.response_format, Some(ResponseFormat::JsonObject));
        assert_eq!(
            chat.sampling,
            Sampling {
                max_tokens: Some(9),
                temperature: Some(0.5),
                top_p: None,
                stop: vec!["END".into()],
                seed: Some(3),
            }
        );
    }

    #[test]
    fn a_schema_format_becomes_a_json_schema_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let read = chat(
            json!({"model": "m", "stream": false, "format": schema.clone(),
                               "messages": [{"role": "user", "content": "x"}]}),
        )
        .expect("valid");
        assert!(!read.stream);
        assert!(matches!(
            read.call.chat.response_format,
            Some(ResponseFormat::JsonSchema { schema: s, .. }) if s == schema
        ));
    }

    #[test]
    fn generate_takes_system_and_prompt_and_refuses_what_it_cannot_honour() {
        let read = generate(json!({"model": "m", "system": "s", "prompt": "p"})).expect("valid");
        assert_eq!(read.kind, Kind::Generate);
        let roles: Vec<Role> = read.call.chat.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User]);
        // Empty or false values of the refused fields change nothing and are accepted.
        assert!(
            generate(
                json!({"model": "m", "prompt": "p", "raw": false, "images": [],
                            "suffix": "", "context": [], "template": ""})
            )
            .is_ok()
        );
        for (bad, field) in [
            (json!({"raw": true}), "raw"),
            (json!({"images": ["aGk="]}), "images"),
            (json!({"suffix": "}"}), "suffix"),
            (json!({"context": [1, 2]}), "context"),
            (json!({"template": "{{ .Prompt }}"}), "template"),
            (json!({"think": true}), "think"),
            (json!({"prompt": 7}), "prompt"),
        ] {
            let mut body = json!({"model": "m", "prompt": "p"});
            for (k, v) in bad.as_object().expect("object") {
                body[k] = v.clone();
            }
            assert_eq!(field_of(generate(body)), field, "{bad}");
        }
    }

    fn options(options: Value) -> Result<Sampling, ApiError> {
        sampling_of(options.as_object())
    }

    /// The per-option decisions of docs/protocol.md: performance options accepted and unused,
    /// answer-changing ones refused unless neutral, wrong types named.
    #[test]
    fn options_are_honoured_ignored_or_refused_by_name() {
        assert_eq!(
            options(
                json!({"num_ctx": 8192, "num_thread": 2, "num_gpu": 1, "use_mmap": true,
                           "repeat_penalty": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
                           "repeat_last_n": 64, "num_predict": -1, "seed": -1})
            )
            .expect("neutral"),
            Sampling::default()
        );
        for (bad, field) in [
            (json!({"top_k": 40}), "options.top_k"),
            (json!({"repeat_penalty": 1.1}), "options.repeat_penalty"),
            (json!({"mirostat": 2}), "options.mirostat"),
            (json!({"min_p": 0.05}), "options.min_p"),
            (json!({"temperature": "hot"}), "options.temperature"),
            (json!({"temperature": 3.0}), "options.temperature"),
            (json!({"num_predict": 0}), "options.num_predict"),
            (json!({"num_predict": 1.5}), "options.num_predict"),
            (json!({"stop": [1]}), "options.stop"),
            (json!({"top_p": 0.0}), "options.top_p"),
        ] {
            let error = options(bad.clone()).expect_err("refused");
            assert_eq!(
                error.param.as_deref(),
                Some(field),
                "{bad}: {}",
                error.message
            );
            assert!(error.message.starts_with(field), "{bad}: {}", error.message);
        }
    }

    #[test]
    fn wrong_types_and_bad_values_name_the_field() {
        for (body, field) in [
            (json!({"model": "m", "messages": "hi"}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": 1}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
                "messages[0].images",
            ),
            (
                json!({"model": "m", "messages": [], "stream": "yes"}),
                "stream",
            ),
            (
                json!({"model": "m", "messages": [], "format": "yaml"}),
                "format",
            ),
            (
                json!({"model": "m", "messages": [], "options": []}),
                "options",
            ),
            (
                json!({"model": "m", "messages": [], "logprobs": true}),
                "logprobs",
            ),
            (json!({"model": 7, "messages": []}), "model"),
        ] {
            assert_eq!(field_of(chat(body.clone())), field, "{body}");
        }
        let error = read_chat(b"{not json").expect_err("not JSON");
        assert!(
            error.message.starts_with("request body:"),
            "{}",
            error.message
        );
    }

    fn answer(content: &str, calls: &[(&str, &str)], completion: u64) -> ChatResponse {
        ChatResponse {
            model: "served".into(),
            content: content.into(),
            tool_calls: calls
                .iter()
                .map(|(name, arguments)| ToolCall {
                    id: format!("id-{name}"),
                    name: (*name).into(),
                    arguments: (*arguments).into(),
                })
                .collect(),
            usage: Some(Usage {
                prompt_tokens: 4,
                completion_tokens: completion,
            }),
        }
    }

    fn parse_lines(lines: &[String]) -> Vec<Value> {
        lines
            .iter()
            .map(|l| {
                assert!(
                    l.ends_with('\n') && !l[..l.len() - 1].contains('\n'),
                    "{l:?}"
                );
                serde_json::from_str(l).expect("each line is JSON")
            })
            .collect()
    }

    /// NDJSON framing: a line per delta, the tool calls in a line of their own, and a last
    /// line `done: true` with the serving model, the counts and the durations.
    #[test]
    fn streamed_answers_are_one_json_object_per_line_ending_done() {
        let mut lines = Lines {
            kind: Kind::Chat,
            model: "asked".into(),
            max_tokens: Some(3),
            clock: Clock::start(),
        };
        assert!(lines.start().is_empty());
        let first = parse_lines(&lines.event(Event::Delta {
            choice: 0,
            text: "he".into(),
        }));
        assert_eq!(first[0]["message"]["content"], "he");
        assert_eq!(
            (first[0]["model"].as_str(), first[0]["done"].as_bool()),
            (Some("asked"), Some(false))
        );
        let last = parse_lines(&lines.event(Event::Done {
            choice: 0,
            response: answer("he", &[("weather", r#"{"city": "Paris"}"#)], 3),
        }));
        assert_eq!(last.len(), 2);
        assert_eq!(
            last[0]["message"]["tool_calls"][0]["function"]["arguments"]["city"],
            "Paris"
        );
        assert_eq!(last[0]["done"], false);
        let done = &last[1];
        assert_eq!(
            (done["done"].as_bool(), done["done_reason"].as_str()),
            (Some(true), Some("length"))
        );
        assert_eq!(
            (
                done["prompt_eval_count"].as_u64(),
                done["eval_count"].as_u64()
            ),
            (Some(4), Some(3))
        );
        assert_eq!(done["model"], "served");
        assert!(done["total_duration"].as_u64() >= done["eval_duration"].as_u64());
        assert!(lines.end().is_empty());

        let mut generate = Lines {
            kind: Kind::Generate,
            model: "asked".into(),
            max_tokens: None,
            clock: Clock::start(),
        };
        let piece = parse_lines(&generate.event(Event::Delta {
            choice: 0,
            text: "x".into(),
        }));
        assert_eq!(piece[0]["response"], "x");
        let done = parse_lines(&generate.event(Event::Done {
            choice: 0,
            response: answer("x", &[], 1),
        }));
        assert_eq!(done[0]["done_reason"], "stop");
        let failed = parse_lines(&generate.event(Event::Failed(GatewayError::invalid("broken"))));
        assert_eq!(failed[0], json!({"error": "broken"}));
    }

    #[test]
    fn tool_call_arguments_that_are_not_an_object_are_an_error_naming_the_model() {
        assert!(tool_calls_json(&answer("", &[("f", "")], 1)).is_ok());
        let error = tool_calls_json(&answer("", &[("f", "[1]")], 1)).expect_err("not an object");
        assert!(
            error.message.contains("`served`") && error.message.contains("`f`"),
            "{}",
            error.message
        );
    }

    #[test]
    fn latest_tags_resolve_to_untagged_fleet_models() {
        let fleet: std::collections::BTreeMap<String, String> = [
            ("m".to_owned(), "gpu".to_owned()),
            ("t:latest".to_owned(), "gpu".to_owned()),
        ]
        .into();
        assert_eq!(resolve("m:latest", &fleet), "m");
        assert_eq!(resolve("t:latest", &fleet), "t:latest");
        assert_eq!(resolve("x:latest", &fleet), "x:latest");
        assert_eq!(resolve("m", &fleet), "m");
    }

    #[test]
    fn embed_input_is_a_text_or_a_list_of_texts_and_bad_input_names_the_field() {
        assert_eq!(embed_inputs(Some(json!("a"))).expect("text"), ["a"]);
        assert_eq!(
            embed_inputs(Some(json!(["a", "b"]))).expect("list"),
            ["a", "b"]
        );
        for (input, field) in [
            (None, "input"),
            (Some(json!(7)), "input"),
            (Some(json!(["a", 1])), "input[1]"),
        ] {
            let error = embed_inputs(input).expect_err("refused");
            assert_eq!(error.param.as_deref(), Some(field), "{}", error.message);
        }
    }
}
