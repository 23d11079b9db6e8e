//! OpenAI's Responses API, translated to and from the gateway's [`Call`] and [`Event`]s; the
//! conversations that `previous_response_id` and `GET /v1/responses/{id}` read are the
//! gateway's (`gateway::Conversations`).
//!
//! `POST /v1/responses` takes the input as text or items (messages, `function_call` and
//! `function_call_output` items; earlier `reasoning` items are skipped), `instructions` (a
//! system message), function tools (a `namespace` tool's functions flattened to
//! `<namespace>__<name>`, and their calls given back with their namespace), `tool_choice`,
//! `text.format`, and the generation settings; it answers a Response object, or the API's
//! server-sent events (`response.created` … `response.completed`, each with its
//! `sequence_number`). Hosted tools (`web_search`, `file_search`, …) and other non-function
//! tools are not offered to the model and are named in the answer's
//! `x-agentmesh-dropped-tools` header. A field OpenAI defines that the mesh cannot honour is a
//! 400 naming it; one it does not define is ignored (or refused, with
//! `http.unknown_fields = "refuse"`); the table is in docs/protocol.md.
//!
//! With `store` (the default) the answer and the conversation up to it are kept by the gateway,
//! for the key that asked; one it could not keep answers `store: false`. This module must not
//! route, fall through, stream, count usage or store anything itself: that is the gateway's.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    Json,
    extract::{Extension, Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use mesh_domain::{
    BoxFuture, ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall,
    ToolSpec, Usage, keys::RESPONSE_ID_PREFIX,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    clients::{Unknown, client_name, dropped_header, dropped_name},
    door::FrontDoor,
    encode::{self, Encoder},
    error::{ApiError, Dialect},
    openai::{self, tool_choice_of},
};
use crate::gateway::{Call, Caller, Event, GatewayError, Keeper, unix_s};

/// Fields of a Responses request that are read (and so honoured or refused by value).
const READ: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "store",
    "previous_response_id",
    "metadata",
    "stream",
    "parallel_tool_calls",
    "include",
    "truncation",
    "top_logprobs",
    "background",
    "max_tool_calls",
];

/// Fields OpenAI defines that do not change the answer: accepted and not used.
/// `client_metadata` is Codex's (ids of its session and turn), sent on every request.
const IGNORED: &[&str] = &[
    "client_metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "reasoning",
    "stream_options",
];

/// Fields OpenAI defines that the mesh does not offer (refused unless null).
const UNSUPPORTED: &[&str] = &[
    "conversation",
    "prompt",
    "context_management",
    "moderation",
    "image",
    "access_programs",
    "background_options",
    "prompt_cache_options",
    "prompt_cache_retention",
];

/// The one `include` value accepted: encrypted reasoning, of which the mesh's models produce
/// none (Codex asks for it).
const INCLUDABLE: &[&str] = &["reasoning.encrypted_content"];

/// Most `metadata` pairs, and the longest key and value, as OpenAI bounds them.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY: usize = 64;
const METADATA_VALUE: usize = 512;

/// The part of a Responses request the mesh uses; items, tools and formats stay JSON until
/// they are translated, so each error can name the item at fault.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: String,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    text: Option<Map<String, Value>>,
    #[serde(default)]
    max_output_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    include: Option<Vec<String>>,
    #[serde(default)]
    truncation: Option<String>,
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    max_tool_calls: Option<u32>,
}

/// `input`: a text (one user message) or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// A `POST /v1/responses` body as the front door reads it, before the stored conversation it
/// continues is looked up.
#[derive(Debug)]
pub struct ResponsesCall {
    /// The model asked for.
    pub model: String,
    /// The system message from `instructions` (not carried to a continuation, as OpenAI does).
    pub instructions: Option<String>,
    /// This turn's input, as messages.
    pub input: Vec<Message>,
    /// The chat's tools, settings, format and tool choice (its messages are set once the
    /// conversation is known).
    pub chat: ChatRequest,
    /// The conversation this one continues.
    pub previous_response_id: Option<String>,
    /// Whether to keep the answer (default true).
    pub store: bool,
    /// Whether the answer is streamed.
    pub stream: bool,
    /// What the Response object echoes: tools, tool_choice, text, metadata and settings.
    echo: Echo,
    /// Tools of the request the model is not offered (hosted tools the fleet cannot run), by
    /// type and name.
    pub dropped: Vec<String>,
    /// The functions of `namespace` tools, offered flattened: flat name → (namespace, name).
    namespaces: Namespaces,
}

/// The functions of `namespace` tools, offered to the model under one flat name each: flat
/// name → (namespace, function name), so a call comes back to the client as its namespace's.
type Namespaces = BTreeMap<String, (String, String)>;

/// The flat name the model is offered for function `name` of namespace `namespace`.
fn flat_name(namespace: &str, name: &str) -> String {
    if namespace.ends_with("__") {
        format!("{namespace}{name}")
    } else {
        format!("{namespace}__{name}")
    }
}

/// The request's fields a Response object repeats.
#[derive(Debug, Clone)]
struct Echo {
    tools: Vec<Value>,
    tool_choice: Value,
    text: Value,
    metadata: Value,
    parallel_tool_calls: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    max_output_tokens: Option<u32>,
}

/// Refuses settings the mesh cannot honour rather than ignoring them.
fn check_unsupported_values(request: &ResponsesRequest) -> Result<(), ApiError> {
    if request.background == Some(true) {
        return Err(ApiError::bad_field(
            "background",
            "background responses are not supported by agentmesh; leave it out or set it to false",
        ));
    }
    for (i, include) in request.include.iter().flatten().enumerate() {
        if !INCLUDABLE.contains(&include.as_str()) {
            return Err(ApiError::bad_field(
                &format!("include[{i}]"),
                format!("`{include}` is not supported by agentmesh; leave it out"),
            ));
        }
    }
    if request
        .truncation
        .as_deref()
        .is_some_and(|t| t != "disabled")
    {
        return Err(ApiError::bad_field(
            "truncation",
            "only `disabled` is supported by agentmesh (a conversation is never cut)",
        ));
    }
    if request.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::bad_field(
            "top_logprobs",
            "log probabilities are not supported by agentmesh; leave it out",
        ));
    }
    if request.max_tool_calls.is_some() {
        return Err(ApiError::bad_field(
            "max_tool_calls",
            "is not supported by agentmesh (it runs no built-in tools); leave it out",
        ));
    }
    if request.max_output_tokens == Some(0) {
        return Err(ApiError::bad_field(
            "max_output_tokens",
            "must be at least 1",
        ));
    }
    if let Some(metadata) = &request.metadata {
        if metadata.len() > METADATA_PAIRS {
            return Err(ApiError::bad_field(
                "metadata",
                format!("at most {METADATA_PAIRS} pairs"),
            ));
        }
        for (key, value) in metadata {
            let fits = value.as_str().is_some_and(|v| v.len() <= METADATA_VALUE);
            if key.len() > METADATA_KEY || !fits {
                return Err(ApiError::bad_field(
                    &format!("metadata.{key}"),
                    format!(
                        "keys are at most {METADATA_KEY} characters, values strings of at most {METADATA_VALUE}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A string field of an item, required.
fn string(item: &Map<String, Value>, field: &str, at: &str) -> Result<String, ApiError> {
    item.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_field(&format!("{at}.{field}"), "is required (a string)"))
}

/// The text of a message's `content` (a string, or `input_text` / `output_text` parts), or
/// of a `function_call_output`'s `output`.
fn text_of(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
                if !matches!(kind, "input_text" | "output_text") {
                    return Err(ApiError::bad_field(
                        &format!("{at}[{j}].type"),
                        format!(
                            "`{kind}` is not supported by agentmesh's models: only input_text and output_text parts"
                        ),
                    ));
                }
                let part_text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::bad_field(&format!("{at}[{j}].text"), "is required (a string)")
                })?;
                text.push_str(part_text);
            }
            Ok(text)
        }
        _ => Err(ApiError::bad_field(
            at,
            "is required: a string or a list of input_text parts",
        )),
    }
}

/// The input items as chat messages: a message item becomes a message of its role, a run of
/// `function_call` items one assistant message with those calls (joined to the assistant's
/// text just before them), a `function_call_output` a tool message.
fn messages_of(items: &[Value]) -> Result<Vec<Message>, ApiError> {
    let mut messages: Vec<Message> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Some(item) = item.as_object() else {
            return Err(ApiError::bad_field(
                &at,
                "must be an object (an input item)",
            ));
        };
        match item.get("type").and_then(Value::as_str) {
            None | Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => Role::User,
                    Some("system" | "developer") => Role::System,
                    Some("assistant") => Role::Assistant,
                    other => {
                        return Err(ApiError::bad_field(
                            &format!("{at}.role"),
                            format!(
                                "{} is not user, system, developer or assistant",
                                other.map_or("missing".to_owned(), |r| format!("`{r}`"))
                            ),
                        ));
                    }
                };
                let content = text_of(item.get("content"), &format!("{at}.content"))?;
                messages.push(Message::text(role, content));
            }
            Some("function_call") => {
                let name = string(item, "name", &at)?;
                let call = ToolCall {
                    id: string(item, "call_id", &at)?,
                    // The model called a namespace's function by its flat name.
                    name: match item.get("namespace").and_then(Value::as_str) {
                        Some(namespace) => flat_name(namespace, &name),
                        None => name,
                    },
                    arguments: string(item, "arguments", &at)?,
                };
                match messages.last_mut() {
                    Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
                    _ => messages.push(Message {
                        tool_calls: vec![call],
                        ..Message::text(Role::Assistant, "")
                    }),
                }
            }
            Some("function_call_output") => {
                let call_id = string(item, "call_id", &at)?;
                let output = text_of(item.get("output"), &format!("{at}.output"))?;
                messages.push(Message {
                    tool_call_id: Some(call_id),
                    ..Message::text(Role::Tool, output)
                });
            }
            // A previous model's reasoning (Codex sends it back, encrypted): no model of the
            // fleet can read it, as Anthropic's thinking blocks are dropped from earlier turns.
            Some("reasoning") => {}
            Some(other) => {
                return Err(ApiError::bad_field(
                    &format!("{at}.type"),
                    format!(
                        "`{other}` is not supported by agentmesh: message, function_call, function_call_output and reasoning items only"
                    ),
                ));
            }
        }
    }
    Ok(messages)
}

/// The tools a request offers, as the model is offered them.
#[derive(Debug, Default)]
struct Offered {
    /// Function tools, and the functions of namespace tools under their flat names.
    specs: Vec<ToolSpec>,
    /// Tools left out, by type (and name, when they have one): hosted tools the fleet cannot
    /// run, and client tools that are not functions.
    dropped: Vec<String>,
    /// Flat name → (namespace, function name).
    namespaces: Namespaces,
}

/// One function tool (`{"type": "function", "name", "description", "parameters"}`) at `at`.
fn function_of(tool: &Map<String, Value>, at: &str) -> Result<ToolSpec, ApiError> {
    Ok(ToolSpec {
        name: string(tool, "name", at)?,
        description: tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        parameters: tool
            .get("parameters")
            .filter(|p| !p.is_null())
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    })
}

/// The request's tools: `function` tools as they are; the function tools of a `namespace`
/// (Codex groups its sub-agent tools in one) flattened to `<namespace>__<name>`, its
/// description before theirs; any other type (`web_search`, `file_search`, `mcp`, `custom`, …:
/// hosted tools the fleet cannot run, or client tools that are not functions) dropped from what
/// the model is offered and listed, rather than refusing the request.
fn tools_of(tools: &[Value]) -> Result<Offered, ApiError> {
    let mut offered = Offered::default();
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(tool) = tool.as_object() else {
            return Err(ApiError::bad_field(&at, "must be an object (a tool)"));
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => offered.specs.push(function_of(tool, &at)?),
            Some("namespace") => {
                let namespace = string(tool, "name", &at)?;
                let about = tool
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let members = tool.get("tools").and_then(Value::as_array);
                for (j, member) in members.into_iter().flatten().enumerate() {
                    let at = format!("{at}.tools[{j}]");
                    let member = member
                        .as_object()
                        .ok_or_else(|| ApiError::bad_field(&at, "must be an object (a tool)"))?;
                    if member.get("type").and_then(Value::as_str) != Some("function") {
                        offered.dropped.push(dropped_of(member, Some(&namespace)));
                        continue;
                    }
                    let mut spec = function_of(member, &at)?;
                    let flat = flat_name(&namespace, &spec.name);
                    if !about.is_empty() {
                        spec.description = format!("{about}\n\n{}", spec.description);
                    }
                    offered
                        .namespaces
                        .insert(flat.clone(), (namespace.clone(), spec.name));
                    spec.name = flat;
                    offered.specs.push(spec);
                }
            }
            Some(_) => offered.dropped.push(dropped_of(tool, None)),
            None => {
                return Err(ApiError::bad_field(
                    &format!("{at}.type"),
                    "is required (`function`, or a tool type such as `web_search`)",
                ));
            }
        }
    }
    // A flattened name equal to a function's own would make its calls ambiguous.
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = offered.specs.iter().find(|t| !seen.insert(t.name.as_str())) {
        return Err(ApiError::bad_field(
            "tools",
            format!(
                "two tools are offered as `{}`; give each function its own name",
                twice.name
            ),
        ));
    }
    Ok(offered)
}

/// How a dropped tool of the request (of `namespace`, when it is one of a namespace's) is
/// named in the header and the log.
fn dropped_of(tool: &Map<String, Value>, namespace: Option<&str>) -> String {
    let kind = tool
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("untyped");
    let name = tool.get("name").and_then(Value::as_str);
    match (namespace, name) {
        (Some(namespace), Some(name)) => dropped_name(kind, Some(&flat_name(namespace, name))),
        (_, name) => dropped_name(kind, name),
    }
}

/// `text.format`: `{"type": "text" | "json_object"}` or Responses' flat
/// `{"type": "json_schema", "name", "schema", "strict"}`.
fn format_of(text: &Map<String, Value>) -> Result<Option<ResponseFormat>, ApiError> {
    for field in text.keys() {
        if !matches!(field.as_str(), "format" | "verbosity") {
            return Err(ApiError::bad_field(
                &format!("text.{field}"),
                "unrecognized (text takes format and verbosity)",
            ));
        }
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let field = "text.format";
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(Some(ResponseFormat::Text)),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let name = format
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_field("text.format.name", "is required with type json_schema")
                })?;
            let schema = format
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    ApiError::bad_field("text.format.schema", "must be a JSON schema object")
                })?;
            Ok(Some(ResponseFormat::JsonSchema {
                name: name.to_owned(),
                schema: schema.clone(),
                strict: format
                    .get("strict")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            }))
        }
        Some(other) => Err(ApiError::bad_field(
            field,
            format!("type `{other}` is not text, json_object or json_schema"),
        )),
        None => Err(ApiError::bad_field(field, "needs a `type`")),
    }
}

/// Reads a Responses request body: JSON in OpenAI's shape, items, tools and settings checked (a
/// 400 naming the field otherwise); a top-level field the mesh does not know is noted in
/// `unknown`.
pub fn read_responses_call(body: &[u8], unknown: &mut Unknown) -> Result<ResponsesCall, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let Value::Object(object) = &value else {
        return Err(ApiError::bad_request("request body: must be a JSON object"));
    };
    openai::check_fields(
        object,
        openai::Fields {
            read: READ,
            ignored: IGNORED,
            unsupported: UNSUPPORTED,
        },
        unknown,
    )?;

    let request: ResponsesRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    check_unsupported_values(&request)?;
    let input = match &request.input {
        None => Vec::new(),
        Some(Input::Text(text)) => vec![Message::text(Role::User, text.clone())],
        Some(Input::Items(items)) => messages_of(items)?,
    };
    if input.is_empty() {
        return Err(ApiError::bad_field(
            "input",
            "is required: a text or at least one item",
        ));
    }
    let tools = request.tools.clone().unwrap_or_default();
    let text = request.text.clone().unwrap_or_default();
    let offered = tools_of(&tools)?;
    let chat = ChatRequest {
        messages: Vec::new(),
        tools: offered.specs,
        sampling: Sampling {
            max_tokens: request.max_output_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            ..Sampling::default()
        },
        response_format: format_of(&text)?,
        tool_choice: request
            .tool_choice
            .as_ref()
            .filter(|v| !v.is_null())
            .map(tool_choice_of)
            .transpose()?,
    };
    let echo = Echo {
        tools,
        tool_choice: request
            .tool_choice
            .clone()
            .filter(|v| !v.is_null())
            .unwrap_or_else(|| json!("auto")),
        text: json!({"format": text.get("format").filter(|f| !f.is_null()).cloned()
            .unwrap_or_else(|| json!({"type": "text"}))}),
        metadata: Value::Object(request.metadata.clone().unwrap_or_default()),
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        temperature: request.temperature,
        top_p: request.top_p,
        max_output_tokens: request.max_output_tokens,
    };
    Ok(ResponsesCall {
        model: request.model,
        instructions: request.instructions.filter(|i| !i.is_empty()),
        input,
        chat,
        previous_response_id: request.previous_response_id,
        store: request.store.unwrap_or(true),
        stream: request.stream.unwrap_or(false),
        echo,
        dropped: offered.dropped,
        namespaces: offered.namespaces,
    })
}

/// The Response object's fixed parts for one request.
struct Head {
    id: String,
    created_at: u64,
    /// The model asked for until one answered, then the one that served.
    model: String,
    instructions: Option<String>,
    previous_response_id: Option<String>,
    echo: Echo,
    /// The flattened functions of the request's namespace tools.
    namespaces: Namespaces,
}

impl Head {
    /// The namespace (when the function is one of a namespace's) and the name a call of the
    /// model is given back to the client with.
    fn called<'a>(&'a self, call: &'a ToolCall) -> (Option<&'a str>, &'a str) {
        match self.namespaces.get(&call.name) {
            Some((namespace, name)) => (Some(namespace), name),
            None => (None, &call.name),
        }
    }

    /// The id's unique part, shared by the ids of the answer's items.
    fn suffix(&self) -> &str {
        self.id.trim_start_matches(RESPONSE_ID_PREFIX)
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    fn call_item_id(&self, i: usize) -> String {
        format!("fc_{}_{i}", self.suffix())
    }

    /// The Response object with `status`, `output` and `usage`.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Usage>) -> Value {
        let echo = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": self.instructions,
            "max_output_tokens": echo.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": echo.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": false,
            "temperature": echo.temperature,
            "text": echo.text,
            "tool_choice": echo.tool_choice,
            "tools": echo.tools,
            "top_p": echo.top_p,
            "truncation": "disabled",
            "usage": usage.map(usage_json),
            "metadata": echo.metadata,
        })
    }

    /// A message item holding `text`.
    fn message_item(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(output_text).into_iter().collect();
        json!({"type": "message", "id": self.message_id(), "status": status,
               "role": "assistant", "content": content})
    }

    /// The `function_call` item of the answer's `i`th tool call.
    fn call_item(&self, i: usize, call: &ToolCall, status: &str, arguments: &str) -> Value {
        let (namespace, name) = self.called(call);
        let mut item = json!({"type": "function_call", "id": self.call_item_id(i),
            "call_id": call.id, "name": name, "arguments": arguments, "status": status});
        if let Some(namespace) = namespace {
            item["namespace"] = json!(namespace);
        }
        item
    }

    /// The output items of a complete answer: its text as a message (when `message`), then a
    /// `function_call` item per tool call.
    fn output(&self, answer: &ChatResponse, message: bool) -> Vec<Value> {
        let mut output = Vec::new();
        if message {
            output.push(self.message_item("completed", Some(&answer.content)));
        }
        for (i, call) in answer.tool_calls.iter().enumerate() {
            output.push(self.call_item(i, call, "completed", &call.arguments));
        }
        output
    }
}

/// Whether an answer's output has a message item: when the model wrote text, or called no
/// tool (an empty answer is an empty message).
fn has_message(answer: &ChatResponse) -> bool {
    !answer.content.is_empty() || answer.tool_calls.is_empty()
}

/// An `output_text` content part.
fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn usage_json(usage: Usage) -> Value {
    json!({"input_tokens": usage.prompt_tokens,
           "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": usage.completion_tokens,
           "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": usage.total()})
}

/// Tool calls with an id each: a backend that gave none gets one made from the response's id,
/// so a `function_call_output` can name it.
fn with_call_ids(mut answer: ChatResponse, suffix: &str) -> ChatResponse {
    for (i, call) in answer.tool_calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = format!("call_{suffix}_{i}");
        }
    }
    answer
}

/// `POST /v1/responses`.
pub async fn create(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut unknown = door.clients.reading();
    let request = read_responses_call(&body, &mut unknown)?;
    let client = client_name(caller.key_name(), &headers);
    door.clients.ignored(&client, "/v1/responses", &unknown);
    door.clients
        .dropped_tools(&client, "/v1/responses", &request.dropped);
    let dropped = dropped_header(&request.dropped);
    let conversations = door.gateway.conversations();
    let mut conversation = match &request.previous_response_id {
        Some(previous) => {
            conversations
                .load(&caller, previous, unix_s(), Some("previous_response_id"))?
                .messages
        }
        None => Vec::new(),
    };
    conversation.extend(request.input);
    let mut chat = request.chat;
    chat.messages = request
        .instructions
        .iter()
        .map(|i| Message::text(Role::System, i.clone()))
        .chain(conversation.iter().cloned())
        .collect();
    let call = door.aliased(Call::new(request.model.clone(), chat));
    let run = door.gateway.start(&caller, call).await?;
    let head = Head {
        id: conversations.new_id(),
        created_at: unix_s(),
        model: request.model,
        instructions: request.instructions,
        previous_response_id: request.previous_response_id,
        echo: request.echo,
        namespaces: request.namespaces,
    };
    let keeper = request
        .store
        .then(|| conversations.keeper(&caller, conversation));
    if request.stream {
        let events = Events {
            head,
            keeper,
            seq: 0,
            message_open: false,
            answer: None,
            failed: false,
        };
        let mut response = encode::stream(run, "text/event-stream", events);
        response.headers_mut().extend(dropped);
        return Ok(response);
    }
    let answer = run.answer().await?;
    let mut head = head;
    let answer = with_call_ids(answer, head.suffix());
    head.model = answer.model.clone();
    let output = head.output(&answer, has_message(&answer));
    let mut response = head.object("completed", output, answer.usage);
    if let Some(keeper) = keeper {
        keep(keeper, &head.id, &answer, &mut response).await;
    }
    let mut response = Json(response).into_response();
    response.headers_mut().extend(dropped);
    Ok(response)
}

/// `GET /v1/responses/{id}`: a stored response, for the key that created it.
pub async fn retrieve(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = door
        .gateway
        .conversations()
        .load(&caller, &id, unix_s(), None)?;
    Ok(Json(stored.response))
}

/// Stores `response` (the Response object) with `keeper`, `store` set to whether it was kept.
async fn keep(keeper: Keeper, id: &str, answer: &ChatResponse, response: &mut Value) {
    response["store"] = json!(true);
    if !keeper.keep(id, answer, response).await {
        response["store"] = json!(false);
    }
}

/// A streamed response: the Responses API's server-sent events, each numbered.
struct Events {
    head: Head,
    /// Where the answer is kept before `response.completed` (none: `store: false`).
    keeper: Option<Keeper>,
    /// The next event's `sequence_number`.
    seq: u64,
    /// Whether the message item (output 0) and its text part were announced.
    message_open: bool,
    /// The complete answer, once it came.
    answer: Option<ChatResponse>,
    /// Whether `response.failed` was sent.
    failed: bool,
}

impl Events {
    /// One event: `value` (which has its `type`) with the next sequence number.
    fn frame(&mut self, mut value: Value) -> String {
        value["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = value["type"].as_str().unwrap_or_default().to_owned();
        format!("event: {kind}\ndata: {value}\n\n")
    }

    /// Announces the message item and its `output_text` part, once.
    fn open_message(&mut self, frames: &mut Vec<String>) {
        if self.message_open {
            return;
        }
        self.message_open = true;
        let item = self.head.message_item("in_progress", None);
        let item_id = self.head.message_id();
        frames.push(self.frame(json!({"type": "response.output_item.added",
            "output_index": 0, "item": item})));
        frames.push(self.frame(json!({"type": "response.content_part.added",
            "item_id": item_id, "output_index": 0, "content_index": 0, "part": output_text("")})));
    }

    fn delta(&mut self, text: &str) -> String {
        let item_id = self.head.message_id();
        self.frame(
            json!({"type": "response.output_text.delta", "item_id": item_id,
            "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}),
        )
    }

    /// The events that close the message and announce each tool call whole.
    fn done(&mut self, answer: ChatResponse) -> Vec<String> {
        let answer = with_call_ids(answer, self.head.suffix());
        self.head.model = answer.model.clone();
        let mut frames = Vec::new();
        if has_message(&answer) && !self.message_open {
            // A backend that streamed no deltas: the text comes as one.
            self.open_message(&mut frames);
            if !answer.content.is_empty() {
                frames.push(self.delta(&answer.content));
            }
        }
        let mut index = 0;
        if self.message_open {
            let item_id = self.head.message_id();
            let part = output_text(&answer.content);
            let item = self.head.message_item("completed", Some(&answer.content));
            frames.push(self.frame(json!({"type": "response.output_text.done",
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "text": answer.content, "logprobs": []})));
            frames.push(self.frame(json!({"type": "response.content_part.done",
                "item_id": item_id, "output_index": 0, "content_index": 0, "part": part})));
            frames.push(self.frame(json!({"type": "response.output_item.done",
                "output_index": 0, "item": item})));
            index = 1;
        }
        for (i, call) in answer.tool_calls.iter().enumerate() {
            let output_index = index + i;
            let item_id = self.head.call_item_id(i);
            let added = self.head.call_item(i, call, "in_progress", "");
            let item = self.head.call_item(i, call, "completed", &call.arguments);
            frames.push(self.frame(json!({"type": "response.output_item.added",
                "output_index": output_index, "item": added})));
            frames.push(
                self.frame(json!({"type": "response.function_call_arguments.delta",
                "item_id": item_id, "output_index": output_index, "delta": call.arguments})),
            );
            let name = self.head.called(call).1.to_owned();
            frames.push(
                self.frame(json!({"type": "response.function_call_arguments.done",
                "item_id": item_id, "output_index": output_index, "name": name,
                "arguments": call.arguments})),
            );
            frames.push(self.frame(json!({"type": "response.output_item.done",
                "output_index": output_index, "item": item})));
        }
        self.answer = Some(answer);
        frames
    }

    /// `error`, then `response.failed` carrying it.
    fn failed(&mut self, error: &ApiError) -> Vec<String> {
        self.failed = true;
        let body = error.body(Dialect::OpenAi);
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or(match error.status {
                StatusCode::GATEWAY_TIMEOUT => "timeout",
                _ => "server_error",
            })
            .to_owned();
        let mut response = self.head.object("failed", Vec::new(), None);
        response["error"] = json!({"code": code, "message": error.message});
        vec![
            self.frame(
                json!({"type": "error", "code": code, "message": error.message,
                "param": error.param}),
            ),
            self.frame(json!({"type": "response.failed", "response": response})),
        ]
    }
}

impl Encoder for Events {
    fn start(&mut self) -> Vec<String> {
        let response = self.head.object("in_progress", Vec::new(), None);
        vec![
            self.frame(json!({"type": "response.created", "response": response})),
            self.frame(json!({"type": "response.in_progress", "response": response})),
        ]
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        if self.failed || self.answer.is_some() {
            return Vec::new();
        }
        match event {
            Event::Delta { text, .. } => {
                let mut frames = Vec::new();
                self.open_message(&mut frames);
                frames.push(self.delta(&text));
                frames
            }
            Event::Done { response, .. } => self.done(response),
            Event::Failed(error) => self.failed(&error.into()),
        }
    }

    fn end(&mut self) -> Vec<String> {
        if self.failed || self.answer.is_some() {
            return Vec::new();
        }
        self.failed(&GatewayError::NoAnswer.into())
    }

    fn close(&mut self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            let Some(answer) = self.answer.take() else {
                return self.end();
            };
            // The message item is in the output when its events were sent.
            let output = self.head.output(&answer, self.message_open);
            let mut response = self.head.object("completed", output, answer.usage);
            if let Some(keeper) = self.keeper.take() {
                keep(keeper, &self.head.id, &answer, &mut response).await;
            }
            vec![self.frame(json!({"type": "response.completed", "response": response}))]
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::ToolChoice;

    use super::*;
    use crate::{api_keys::KeyGrant, config::UnknownFields, gateway::conversations::Conversations};

    /// Reads `body` with `http.unknown_fields = "refuse"`.
    fn read(body: Value) -> Result<ResponsesCall, ApiError> {
        read_responses_call(
            body.to_string().as_bytes(),
            &mut Unknown::new(UnknownFields::Refuse),
        )
    }

    /// Every kind of input item becomes the chat message it means; tools, tool choice and
    /// format are taken.
    #[test]
    fn input_items_become_chat_messages() {
        let call = read(json!({
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "developer", "content": "use tools"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Oslo?"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                      {"type": "function", "name": "time", "description": "now", "strict": true}],
            "tool_choice": {"type": "function", "name": "weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
            "max_output_tokens": 50,
            "temperature": 0.5,
            "store": false,
            "metadata": {"who": "test"}
        }))
        .expect("valid");
        assert_eq!(call.instructions.as_deref(), Some("be brief"));
        assert!(!call.store);
        let roles: Vec<Role> = call.input.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(call.input[1].content, "weather in Oslo?");
        // The calls join the assistant's text before them.
        assert_eq!(call.input[2].content, "checking");
        let names: Vec<&str> = call.input[2]
            .tool_calls
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["weather", "time"]);
        assert_eq!(call.input[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(call.input[4].content, "noon");
        assert_eq!(call.chat.tools[1].description, "now");
        assert_eq!(call.chat.tools[1].parameters["type"], "object");
        assert_eq!(
            call.chat.tool_choice,
            Some(ToolChoice::Function("weather".into()))
        );
        assert!(matches!(
            call.chat.response_format,
            Some(ResponseFormat::JsonSchema { strict: true, .. })
        ));
        assert_eq!(call.chat.sampling.max_tokens, Some(50));
        // A text is one user message.
        let text = read(json!({"model": "m", "input": "hi"})).expect("valid");
        assert_eq!(text.input, [Message::text(Role::User, "hi")]);
        assert!(text.store && !text.stream);
    }

    /// Bad input is a 400 naming the field at fault.
    #[test]
    fn bad_input_names_the_field() {
        for (body, param) in [
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": []}), "input"),
            (
                json!({"model": "m", "input": [{"role": "robot", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"model": "m", "input": [{"role": "user"}]}),
                "input[0].content",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (json!({"model": "m", "input": ["x"]}), "input[0]"),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "r"}]}),
                "input[0].type",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
                "input[0].call_id",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"name": "f"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a__b"},
                    {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]}]}),
                "tools",
            ),
            (
                json!({"model": "m", "input": "x", "client_data": {}}),
                "client_data",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function"}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
                "text.format.name",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": "object"}}}),
                "text.format.schema",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"colour": "red"}}),
                "text.colour",
            ),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"model": "m", "input": "x", "background": true}),
                "background",
            ),
            (
                json!({"model": "m", "input": "x", "include": ["message.output_text.logprobs"]}),
                "include[0]",
            ),
            (
                json!({"model": "m", "input": "x", "truncation": "auto"}),
                "truncation",
            ),
            (
                json!({"model": "m", "input": "x", "top_logprobs": 3}),
                "top_logprobs",
            ),
            (
                json!({"model": "m", "input": "x", "conversation": "conv_1"}),
                "conversation",
            ),
            (
                json!({"model": "m", "input": "x", "metadata": {"k": 1}}),
                "metadata.k",
            ),
            (json!({"model": "m", "input": "x", "top_k": 40}), "top_k"),
        ] {
            let error = read(body.clone()).expect_err(param);
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(
                error.param.as_deref(),
                Some(param),
                "{body}: {}",
                error.message
            );
            // Named first, or in OpenAI's own words for an unknown argument.
            assert!(
                error.message.starts_with(param)
                    || error.message == format!("Unrecognized request argument supplied: {param}"),
                "{body}: {}",
                error.message
            );
        }
        // Wrong types are a 400 too, naming the field in serde's words.
        let error =
            read(json!({"model": "m", "input": "x", "temperature": "hot"})).expect_err("type");
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(
            error.message.contains("temperature") || error.message.contains("f32"),
            "{}",
            error.message
        );
        // What does not change the answer is accepted.
        assert!(read(json!({"model": "m", "input": "x", "user": "u", "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"], "truncation": "disabled", "parallel_tool_calls": false})).is_ok());
    }

    fn head() -> Head {
        Head {
            id: "resp_0abc".into(),
            created_at: 1,
            model: "asked".into(),
            instructions: None,
            previous_response_id: None,
            echo: read(json!({"model": "asked", "input": "x"}))
                .expect("valid")
                .echo,
            namespaces: Namespaces::new(),
        }
    }

    /// Regression (issue 27): Codex sends `client_metadata` on every request, offers a
    /// `namespace` tool (its sub-agents) and a hosted `web_search`, and sends its earlier
    /// reasoning back; the mesh refused all of them with a 400. Now `client_metadata` is
    /// accepted, the namespace's functions are offered flat, hosted tools are dropped and
    /// named, and reasoning items are skipped.
    #[test]
    fn codex_requests_are_read_with_namespaces_flattened_and_hosted_tools_dropped() {
        let call = read(json!({
            "model": "role:coder",
            "input": [
                {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "be precise"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "spawned"}
            ],
            "tools": [
                {"type": "function", "name": "exec_command", "strict": false, "parameters": {"type": "object"}},
                {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
                    {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "strict": false, "parameters": {"type": "object"}},
                    {"type": "custom", "name": "freeform"}
                ]},
                {"type": "web_search", "external_web_access": false},
                {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "reasoning": {"summary": "auto"},
            "store": false,
            "stream": true,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k",
            "client_metadata": {"session_id": "s"}
        }))
        .expect("Codex's request is read");
        let names: Vec<&str> = call.chat.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["exec_command", "multi_agent_v1__spawn_agent"]);
        assert_eq!(call.chat.tools[1].description, "Sub-agents.\n\nSpawn one.");
        assert_eq!(
            call.dropped,
            [
                "custom:multi_agent_v1__freeform",
                "web_search",
                "custom:apply_patch"
            ]
        );
        assert_eq!(
            call.namespaces["multi_agent_v1__spawn_agent"],
            ("multi_agent_v1".to_owned(), "spawn_agent".to_owned())
        );
        let roles: Vec<Role> = call.input.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(
            call.input[2].tool_calls[0].name,
            "multi_agent_v1__spawn_agent"
        );
        // A call of the flattened function goes back to the client as its namespace's.
        let head = Head {
            namespaces: call.namespaces.clone(),
            ..head()
        };
        let item = head.call_item(
            0,
            &ToolCall {
                id: "c2".into(),
                name: "multi_agent_v1__spawn_agent".into(),
                arguments: "{}".into(),
            },
            "completed",
            "{}",
        );
        assert_eq!(item["name"], "spawn_agent");
        assert_eq!(item["namespace"], "multi_agent_v1");
        let plain = head.call_item(
            1,
            &ToolCall {
                id: "c3".into(),
                name: "exec_command".into(),
                arguments: "{}".into(),
            },
            "completed",
            "{}",
        );
        assert_eq!(plain["name"], "exec_command");
        assert!(plain.get("namespace").is_none(), "{plain}");
        let header = dropped_header(&call.dropped);
        assert_eq!(
            header[super::super::clients::DROPPED_TOOLS_HEADER],
            "custom:multi_agent_v1__freeform, web_search, custom:apply_patch"
        );
        assert!(dropped_header(&[]).is_empty());
    }

    fn events() -> Events {
        Events {
            head: head(),
            keeper: None,
            seq: 0,
            message_open: false,
            answer: None,
            failed: false,
        }
    }

    /// The frames' data, parsed.
    fn data(frames: Vec<String>) -> Vec<Value> {
        frames
            .iter()
            .map(|f| {
                let (event, data) = f.split_once('\n').expect("two lines");
                let value: Value =
                    serde_json::from_str(data.trim_start_matches("data: ").trim_end())
                        .expect("json");
                assert_eq!(
                    event,
                    format!("event: {}", value["type"].as_str().expect("type"))
                );
                value
            })
            .collect()
    }

    async fn stream(events: &mut Events, script: Vec<Event>) -> Vec<Value> {
        let mut frames = events.start();
        for event in script {
            frames.extend(events.event(event));
        }
        frames.extend(events.close().await);
        data(frames)
    }

    /// A streamed text answer: the lifecycle, the message item and its part around the deltas,
    /// numbered from 0 without gaps, the serving model and usage in the completed response.
    #[tokio::test]
    async fn a_streamed_answer_has_the_events_in_order() {
        let mut encoder = events();
        let answer = ChatResponse {
            model: "served".into(),
            content: "hello".into(),
            tool_calls: Vec::new(),
            usage: Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
            }),
        };
        let values = stream(
            &mut encoder,
            vec![
                Event::Delta {
                    choice: 0,
                    text: "hel".into(),
                },
                Event::Delta {
                    choice: 0,
                    text: "lo".into(),
                },
                Event::Done {
                    choice: 0,
                    response: answer,
                },
            ],
        )
        .await;
        let kinds: Vec<&str> = values
            .iter()
            .map(|v| v["type"].as_str().expect("type"))
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, value) in values.iter().enumerate() {
            assert_eq!(value["sequence_number"], json!(i));
        }
        assert_eq!(values[6]["text"], "hello");
        let completed = &values[9]["response"];
        assert_eq!(completed["id"], values[0]["response"]["id"]);
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["model"], "served");
        assert_eq!(completed["output"][0]["id"], values[2]["item"]["id"]);
        assert_eq!(completed["output"][0]["content"][0]["text"], "hello");
        assert_eq!(completed["usage"]["total_tokens"], 5);
        assert_eq!(completed["store"], false);
    }

    /// Tool calls come as whole function_call items after the message; a failure is `error`
    /// and `response.failed`, and nothing completes after it.
    #[tokio::test]
    async fn tool_calls_and_failures_have_their_events() {
        let mut encoder = events();
        let answer = ChatResponse {
            model: "served".into(),
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: String::new(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
            usage: None,
        };
        let values = stream(
            &mut encoder,
            vec![Event::Done {
                choice: 0,
                response: answer,
            }],
        )
        .await;
        let kinds: Vec<&str> = values
            .iter()
            .map(|v| v["type"].as_str().expect("type"))
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let call = &values[6]["response"]["output"][0];
        assert_eq!(call["type"], "function_call");
        assert_eq!(call["name"], "f");
        // A backend without call ids gets one, the same in every event.
        assert_eq!(call["call_id"], "call_0abc_0");
        assert_eq!(values[2]["item"]["call_id"], "call_0abc_0");

        let mut encoder = events();
        // A 502, as a model's failure is.
        let error = GatewayError::Chat(crate::chat::ChatError::Peers("the model failed".into()));
        let values = stream(
            &mut encoder,
            vec![
                Event::Delta {
                    choice: 0,
                    text: "par".into(),
                },
                Event::Failed(error),
            ],
        )
        .await;
        let kinds: Vec<&str> = values
            .iter()
            .map(|v| v["type"].as_str().expect("type"))
            .collect();
        assert_eq!(kinds[kinds.len() - 2..], ["error", "response.failed"]);
        assert_eq!(
            values.last().expect("failed")["response"]["error"]["message"],
            "the model failed"
        );
    }

    /// A streamed answer is stored before `response.completed` is sent, so a continuation sent
    /// as soon as the client reads it finds it; the stored conversation ends with the answer.
    #[tokio::test]
    async fn a_streamed_answer_is_stored_before_it_completes() {
        let (_dir, memory) = crate::memory::test_support::open_memory(
            &crate::memory::test_support::id("responses"),
            crate::memory::MemoryOptions::default(),
        );
        let conversations = Conversations::new(memory);
        let mut encoder = events();
        let alice = Caller {
            key: Some(KeyGrant::named("alice", "sk-alice-0123456789")),
        };
        encoder.keeper = Some(conversations.keeper(&alice, vec![Message::text(Role::User, "hi")]));
        let answer = ChatResponse {
            model: "served".into(),
            content: "hello".into(),
            ..ChatResponse::default()
        };
        let values = stream(
            &mut encoder,
            vec![Event::Done {
                choice: 0,
                response: answer,
            }],
        )
        .await;
        let completed = values.last().expect("completed");
        assert_eq!(completed["type"], "response.completed");
        assert_eq!(completed["response"]["store"], true);
        let stored = conversations
            .load(&alice, "resp_0abc", unix_s(), None)
            .expect("stored by now");
        assert_eq!(stored.response["output"][0]["content"][0]["text"], "hello");
        assert_eq!(
            stored.messages,
            [
                Message::text(Role::User, "hi"),
                Message::text(Role::Assistant, "hello")
            ]
        );
    }
}
