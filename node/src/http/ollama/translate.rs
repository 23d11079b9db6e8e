//! Ollama's API to and from the gateway's types: request bodies read into a `Call` (messages,
//! options, format), and answers as Ollama's JSON objects with their counts and durations.

use std::time::Instant;

use axum::http::StatusCode;
use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolSpec,
};
use serde_json::{Map, Value, json};

use super::wire::{ChatBody, GenerateBody, OllamaMessage, read};
use crate::{
    gateway::{Call, GatewayError},
    http::error::{ApiError, ErrorKind},
};

/// Options that change the answer and that the mesh's models cannot honour, each with the
/// value at which it changes nothing (accepted; `None`: refused whatever its value).
/// `repeat_last_n` and `penalize_newline` only scope `repeat_penalty`, and `mirostat_tau` and
/// `mirostat_eta` only tune `mirostat`: with those neutral they change nothing either.
pub(super) const REFUSED_OPTIONS: &[(&str, Option<f64>)] = &[
    ("top_k", None),
    ("min_p", Some(0.0)),
    ("typical_p", Some(1.0)),
    ("tfs_z", Some(1.0)),
    ("repeat_penalty", Some(1.0)),
    ("presence_penalty", Some(0.0)),
    ("frequency_penalty", Some(0.0)),
    ("mirostat", Some(0.0)),
];

/// A 400 for a field the mesh cannot honour.
pub(super) fn unsupported(field: &str, why: &str) -> ApiError {
    ApiError::bad_field(field, format!("{why}; leave it out"))
}

/// An unknown model, in Ollama's words.
pub(super) fn model_not_found(model: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::NotFound,
        format!("model \"{model}\" not found (GET /api/tags lists the fleet's models)"),
    )
    .with_code("model_not_found")
}

/// A gateway refusal, with a model no node has worded as Ollama words it (naming `asked`).
pub(super) fn unknown_as_not_found(error: GatewayError, asked: &str) -> ApiError {
    if error.is_unknown_model() {
        model_not_found(asked)
    } else {
        error.into()
    }
}

/// The model a client names: as given, or without Ollama's default tag `:latest` when the
/// fleet has the bare name (Ollama clients add it; mesh models have no tags).
pub(super) fn resolve(model: &str, fleet: &std::collections::BTreeMap<String, String>) -> String {
    match model.strip_suffix(":latest") {
        Some(bare) if !fleet.contains_key(model) && fleet.contains_key(bare) => bare.to_owned(),
        _ => model.to_owned(),
    }
}

/// A number option's value, or a 400 naming it.
pub(super) fn number(options: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
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
pub(super) fn integer(options: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
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
pub(super) fn sampling_of(options: Option<&Map<String, Value>>) -> Result<Sampling, ApiError> {
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
pub(super) fn format_of(format: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
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
pub(super) struct Settings<'a> {
    pub(super) format: Option<&'a Value>,
    pub(super) options: Option<&'a Map<String, Value>>,
    pub(super) think: Option<&'a Value>,
    pub(super) logprobs: Option<bool>,
    pub(super) top_logprobs: Option<u32>,
}

impl Settings<'_> {
    /// Refuses what changes the answer and cannot be honoured; the settings and format.
    pub(super) fn read(self) -> Result<(Sampling, Option<ResponseFormat>), ApiError> {
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
pub(super) fn messages_of(messages: Vec<OllamaMessage>) -> Result<Vec<Message>, ApiError> {
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
pub(super) enum Kind {
    Chat,
    Generate,
}

/// A chat or generate request, read and checked, before it is placed.
#[derive(Debug)]
pub(super) struct Read {
    pub(super) kind: Kind,
    pub(super) call: Call,
    pub(super) stream: bool,
}

/// Reads `/api/chat`'s body.
pub(super) fn read_chat(body: &[u8]) -> Result<Read, ApiError> {
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
pub(super) fn read_generate(body: &[u8]) -> Result<Read, ApiError> {
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
pub(super) fn created_at() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Nanoseconds since `since`.
pub(super) fn nanos_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Ollama's tool calls of an answer: arguments as a JSON object, as its clients parse them.
pub(super) fn tool_calls_json(response: &ChatResponse) -> Result<Vec<Value>, ApiError> {
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
pub(super) struct Clock {
    pub(super) started: Instant,
    /// When the first text arrived (streamed answers only).
    pub(super) first: Option<Instant>,
}

impl Clock {
    pub(super) fn start() -> Self {
        Self {
            started: Instant::now(),
            first: None,
        }
    }
}

/// The fields of the last object (`done: true`): the reason, counts and durations. A whole
/// answer has no first-token time, so all of its time is `eval_duration`.
pub(super) fn done_fields(response: &ChatResponse, max_tokens: Option<u32>, clock: Clock) -> Value {
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
pub(super) fn object(kind: Kind, model: &str, text: &str, extra: Value) -> Value {
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

/// `input`: one text or a list of texts.
pub(super) fn embed_inputs(input: Option<Value>) -> Result<Vec<String>, ApiError> {
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

/// Ollama's `details` of a model: the mesh knows none of them (its models may be remote
/// servers), so every one is empty.
pub(super) fn details() -> Value {
    json!({"parent_model": "", "format": "", "family": "", "families": null,
           "parameter_size": "", "quantization_level": ""})
}

/// A stable stand-in for Ollama's manifest digest: the SHA-256 of the model's name.
pub(super) fn digest(name: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(name.as_bytes()))
}

/// Mesh models have no file of their own here: no size, no modification time.
pub(super) const EPOCH: &str = "1970-01-01T00:00:00Z";

/// One model of `/api/tags` (or, with `expires_at` and `size_vram`, of `/api/ps`).
pub(super) fn model_entry(name: &str) -> Value {
    json!({"name": name, "model": name, "modified_at": EPOCH, "size": 0,
           "digest": digest(name), "details": details()})
}
