//! Anthropic's Messages API, translated to and from the gateway's [`Call`] and [`Event`]s.
//!
//! `POST /v1/messages` takes Anthropic's request (a system prompt, user, assistant and system
//! messages of text, `tool_use` and `tool_result` blocks, client tools, `tool_choice`, the
//! generation settings, `stream`) and answers Anthropic's `message` object, or its server-sent
//! events (`message_start` … `message_stop`, `event: error` on a failure after the start). A
//! field Anthropic does not define is ignored, or with `http.unknown_fields = "refuse"` refused
//! as Anthropic does (400, "Extra inputs are not permitted", naming the field by its path); a
//! field or block Anthropic defines that the mesh cannot honour (`top_k`, images, …) is a 400
//! naming it, and what does not change the answer (`metadata`, `cache_control`, `thinking`) is
//! accepted. Server tools (web search, code execution: Anthropic runs them, no node does) are
//! not offered to the model and are named in the answer's `x-agentmesh-dropped-tools` header.
//! Every `anthropic-beta` feature is accepted: what a beta turns on arrives as fields, blocks or
//! tools, each read, ignored, dropped or refused as above.
//! `POST /v1/messages/count_tokens` answers an estimate ([`count_tokens`]); `GET /v1/models`
//! with an `anthropic-version` header answers Anthropic's list ([`models_list`]). The table is
//! in docs/protocol.md. It only translates: placing, falling through, streaming, counting
//! usage and cancelling are the gateway's.

use std::{cell::RefCell, collections::BTreeMap, sync::Arc};

use axum::{
    Json,
    extract::{Extension, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolChoice,
    ToolSpec, Usage,
};
use serde_json::{Map, Value, json};

use super::{
    clients::{Unknown, client_name, dropped_header, dropped_name},
    door::FrontDoor,
    encode::{self, Encoder},
    error::{ApiError, Dialect, ErrorKind},
};
use crate::gateway::{Call, Caller, Event, GatewayError};

/// The header naming the API version a client speaks.
pub const VERSION_HEADER: &str = "anthropic-version";

/// Request fields read (and so honoured or refused by value). `temperature`, `top_p` and
/// `top_k` are gone from the newest API but older clients (and Claude Code) still send them.
const READ: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "stream",
    "thinking",
    "output_config",
    "context_management",
];

/// Fields Anthropic defines that do not change the answer: accepted and not used.
const IGNORED: &[&str] = &[
    "metadata",
    "service_tier",
    "cache_control",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
];

/// Fields Anthropic defines that the mesh does not offer.
const UNSUPPORTED: &[&str] = &["container", "mcp_servers", "diagnostics"];

/// Block types Anthropic defines that the mesh's models cannot read.
const UNSUPPORTED_BLOCKS: &[&str] = &[
    "image",
    "document",
    "search_result",
    "container_upload",
    "server_tool_use",
    "web_search_tool_result",
];

/// A JSON object of the request, with its path (`messages.0.content.1`) for the errors, and
/// the reading that notes its unknown fields.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
    unknown: &'a RefCell<Unknown>,
}

impl<'a> Obj<'a> {
    /// `value` at `path`, which must be an object.
    fn at(path: String, value: &'a Value, unknown: &'a RefCell<Unknown>) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { path, map, unknown }),
            _ => Err(ApiError::bad_field(&path, "Input should be an object")),
        }
    }

    /// The object `value` at `path`, read like this one.
    fn child(&self, path: String, value: &'a Value) -> Result<Self, ApiError> {
        Self::at(path, value, self.unknown)
    }

    /// The path of `field` in this object.
    fn path_of(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{field}", self.path)
        }
    }

    /// Notes every field not in `known`: ignored, or (with `http.unknown_fields = "refuse"`)
    /// refused in Anthropic's words.
    fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        let mut unknown = self.unknown.borrow_mut();
        for extra in self.map.keys().filter(|k| !known.contains(&k.as_str())) {
            unknown
                .note(self.path_of(extra))
                .map_err(|path| ApiError::bad_field(&path, "Extra inputs are not permitted"))?;
        }
        Ok(())
    }

    /// `field`, absent when missing or `null`.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn required(&self, field: &str) -> Result<&'a Value, ApiError> {
        self.get(field)
            .ok_or_else(|| ApiError::bad_field(&self.path_of(field), "Field required"))
    }

    fn wrong(&self, field: &str, what: &str) -> ApiError {
        ApiError::bad_field(&self.path_of(field), format!("Input should be {what}"))
    }

    fn str(&self, field: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong(field, "a valid string"))
            })
            .transpose()
    }

    fn required_str(&self, field: &str) -> Result<&'a str, ApiError> {
        self.required(field)?;
        Ok(self.str(field)?.unwrap_or_default())
    }

    fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.wrong(field, "a valid boolean"))
            })
            .transpose()
    }

    fn u32(&self, field: &str) -> Result<Option<u32>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.wrong(field, "a valid non-negative integer"))
            })
            .transpose()
    }

    fn f32(&self, field: &str) -> Result<Option<f32>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| self.wrong(field, "a valid number"))
            })
            .transpose()
    }

    fn array(&self, field: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| self.wrong(field, "a valid list"))
            })
            .transpose()
    }

    fn object(&self, field: &str) -> Result<Option<Obj<'a>>, ApiError> {
        self.get(field)
            .map(|v| self.child(self.path_of(field), v))
            .transpose()
    }
}

/// A `POST /v1/messages` body as the front door reads it, before it is placed.
#[derive(Debug)]
pub struct MessagesRequest {
    /// The call to place and run.
    pub call: Call,
    /// Whether the answer is streamed (server-sent events).
    pub stream: bool,
    /// The fields it had that the mesh does not know (ignored).
    pub unknown: Unknown,
    /// Its server tools, not offered to the model (named in the answer's
    /// `x-agentmesh-dropped-tools` header).
    pub dropped: Vec<String>,
}

/// The parts of a request that `/v1/messages` and `/v1/messages/count_tokens` both read.
struct Conversation {
    model: String,
    messages: Vec<Message>,
    tools: Vec<ToolSpec>,
    /// Server tools of the request, not offered to the model.
    dropped: Vec<String>,
    tool_choice: Option<ToolChoice>,
}

/// The request body as a JSON object.
fn body_json(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request("request body: must be a JSON object"))
    }
}

/// The model, system prompt, messages, tools and tool choice of `top`, after its fields are
/// checked: an unknown one is noted (or refused), one Anthropic defines that the mesh cannot
/// honour is refused, naming it.
fn read_conversation(top: &Obj<'_>) -> Result<Conversation, ApiError> {
    let known: Vec<&str> = [READ, IGNORED, UNSUPPORTED].concat();
    top.only(&known)?;
    if let Some(field) = UNSUPPORTED.iter().find(|f| top.get(f).is_some()) {
        return Err(ApiError::bad_field(
            field,
            "is not supported by agentmesh; leave it out",
        ));
    }
    let model = top.required_str("model")?.to_owned();
    let mut messages = Vec::new();
    if let Some(system) = top.get("system") {
        let text = text_of(top.unknown, "system", system)?;
        if !text.is_empty() {
            messages.push(Message::text(Role::System, text));
        }
    }
    let list = top
        .array("messages")?
        .ok_or_else(|| ApiError::bad_field("messages", "Field required"))?;
    for (i, message) in list.iter().enumerate() {
        read_message(top.child(format!("messages.{i}"), message)?, &mut messages)?;
    }
    if let Some(thinking) = top.object("thinking")? {
        check_thinking(&thinking)?;
    }
    if let Some(management) = top.object("context_management")? {
        check_context_management(&management)?;
    }
    let mut tools = Vec::new();
    let mut dropped = Vec::new();
    for (i, tool) in top.array("tools")?.into_iter().flatten().enumerate() {
        match read_tool(top.child(format!("tools.{i}"), tool)?)? {
            Ok(spec) => tools.push(spec),
            Err(name) => dropped.push(name),
        }
    }
    let tool_choice = top
        .object("tool_choice")?
        .map(read_tool_choice)
        .transpose()?;
    Ok(Conversation {
        model,
        messages,
        tools,
        dropped,
        tool_choice,
    })
}

/// Reads a Messages request body: JSON in Anthropic's shape, messages, tools and settings
/// checked (a 400 naming the field by its path otherwise); fields the mesh does not know are
/// noted in `unknown`, which ignores or refuses them.
pub fn read_messages(body: &[u8], unknown: Unknown) -> Result<MessagesRequest, ApiError> {
    let value = body_json(body)?;
    let unknown = RefCell::new(unknown);
    let top = Obj::at(String::new(), &value, &unknown)?;
    let Conversation {
        model,
        messages,
        tools,
        dropped,
        tool_choice,
    } = read_conversation(&top)?;
    if top.get("top_k").is_some() {
        return Err(ApiError::bad_field(
            "top_k",
            "is not supported by agentmesh's models; leave it out (temperature and top_p are)",
        ));
    }
    let max_tokens = top
        .u32("max_tokens")?
        .ok_or_else(|| ApiError::bad_field("max_tokens", "Field required"))?;
    let sampling = Sampling {
        max_tokens: Some(max_tokens),
        temperature: top.f32("temperature")?,
        top_p: top.f32("top_p")?,
        stop: stop_sequences(&top)?,
        seed: None,
    };
    if let Some(t) = sampling.temperature
        && !(0.0..=1.0).contains(&t)
    {
        return Err(ApiError::bad_field(
            "temperature",
            format!("{t} is not between 0 and 1"),
        ));
    }
    let response_format = match top.object("output_config")? {
        Some(config) => read_output_config(&config)?,
        None => None,
    };
    let stream = top.bool("stream")?.unwrap_or(false);
    let call = Call::new(
        model,
        ChatRequest {
            messages,
            tools,
            sampling,
            response_format,
            tool_choice,
        },
    );
    call.check()?;
    drop(top);
    Ok(MessagesRequest {
        call,
        stream,
        unknown: unknown.into_inner(),
        dropped,
    })
}

/// `stop_sequences`, within the bounds the models' backends take.
fn stop_sequences(top: &Obj<'_>) -> Result<Vec<String>, ApiError> {
    let Some(list) = top.array("stop_sequences")? else {
        return Ok(Vec::new());
    };
    let stops = list
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_str().map(str::to_owned).ok_or_else(|| {
                ApiError::bad_field(
                    &format!("stop_sequences.{i}"),
                    "Input should be a valid string",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if stops.len() > Sampling::MAX_STOPS || stops.iter().any(|s| s.len() > Sampling::MAX_STOP_LEN) {
        return Err(ApiError::bad_field(
            "stop_sequences",
            format!(
                "at most {} strings of at most {} bytes (the models' backends take no more)",
                Sampling::MAX_STOPS,
                Sampling::MAX_STOP_LEN
            ),
        ));
    }
    Ok(stops)
}

/// `thinking`: accepted, never producing thinking blocks (`budget_tokens` is an upper bound,
/// and the mesh's models answer without extended thinking).
fn check_thinking(thinking: &Obj<'_>) -> Result<(), ApiError> {
    thinking.only(&["type", "budget_tokens", "display"])?;
    match thinking.required_str("type")? {
        "enabled" | "disabled" | "adaptive" => Ok(()),
        other => Err(ApiError::bad_field(
            &thinking.path_of("type"),
            format!("`{other}` is not enabled, disabled or adaptive"),
        )),
    }
}

/// `context_management` (Claude Code sends it): its `clear_thinking_*` edits are what the
/// translation does anyway (thinking blocks are dropped); any other edit (clearing old tool
/// results past a size) would change the conversation and is refused, named.
fn check_context_management(management: &Obj<'_>) -> Result<(), ApiError> {
    management.only(&["edits"])?;
    for (i, edit) in management.array("edits")?.into_iter().flatten().enumerate() {
        let edit = management.child(management.path_of(&format!("edits.{i}")), edit)?;
        let kind = edit.required_str("type")?;
        if !kind.starts_with("clear_thinking_") {
            return Err(ApiError::bad_field(
                &edit.path_of("type"),
                format!(
                    "`{kind}` is not supported by agentmesh (only clear_thinking edits, which it always applies); leave it out"
                ),
            ));
        }
    }
    Ok(())
}

/// Text of a `system` prompt, a system message or a `tool_result`'s content: a string, or
/// text blocks.
fn text_of(unknown: &RefCell<Unknown>, path: &str, value: &Value) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (i, block) in blocks.iter().enumerate() {
                let block = Obj::at(format!("{path}.{i}"), block, unknown)?;
                match block_type(&block)? {
                    "text" => texts.push(text_block(&block)?),
                    other => return Err(unreadable_block(&block, other, "text")),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::bad_field(
            path,
            "Input should be a valid string or a list of text blocks",
        )),
    }
}

fn block_type<'a>(block: &Obj<'a>) -> Result<&'a str, ApiError> {
    block.required_str("type")
}

/// The text of a `text` block (its `cache_control` and `citations` do not change it).
fn text_block(block: &Obj<'_>) -> Result<String, ApiError> {
    block.only(&["type", "text", "cache_control", "citations"])?;
    Ok(block.required_str("text")?.to_owned())
}

/// A block of a type the mesh does not read where it stands.
fn unreadable_block(block: &Obj<'_>, kind: &str, readable: &str) -> ApiError {
    let problem = if UNSUPPORTED_BLOCKS.contains(&kind) {
        format!("`{kind}` blocks are not supported by agentmesh's models; send text")
    } else {
        format!("`{kind}` is not a block agentmesh reads here ({readable})")
    };
    ApiError::bad_field(&block.path_of("type"), problem)
}

/// One message into the conversation: a user message's `tool_result` blocks become tool
/// messages (first, as Anthropic requires them first and the chat interface wants them right
/// after the assistant's calls), its text one user message; an assistant message's text and
/// `tool_use` blocks one assistant message (its `thinking` blocks are dropped, as Anthropic
/// drops them from earlier turns). A `system` message (Claude Code sends them in the middle of
/// the conversation, `mid-conversation-system-2026-04-07`) is a system turn where it stands,
/// text only; whether a model takes a system turn there is its backend's to say
/// (`[[models]] system_turns`).
fn read_message(message: Obj<'_>, out: &mut Vec<Message>) -> Result<(), ApiError> {
    message.only(&["role", "content"])?;
    let role = match message.required_str("role")? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" => {
            let path = message.path_of("content");
            let text = text_of(message.unknown, &path, message.required("content")?)?;
            out.push(Message::text(Role::System, text));
            return Ok(());
        }
        _ => {
            return Err(ApiError::bad_field(
                &message.path_of("role"),
                "Input should be 'user', 'assistant' or 'system'",
            ));
        }
    };
    let content = message.required("content")?;
    let blocks = match content {
        Value::String(text) => {
            out.push(Message::text(role, text.clone()));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(message.wrong("content", "a valid string or a list of content blocks"));
        }
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let block = message.child(message.path_of(&format!("content.{j}")), block)?;
        match (role, block_type(&block)?) {
            (_, "text") => texts.push(text_block(&block)?),
            (Role::Assistant, "tool_use") => {
                block.only(&["type", "id", "name", "input", "cache_control"])?;
                let input = block.required("input")?;
                if !input.is_object() {
                    return Err(block.wrong("input", "a valid dictionary"));
                }
                calls.push(ToolCall {
                    id: block.required_str("id")?.to_owned(),
                    name: block.required_str("name")?.to_owned(),
                    arguments: input.to_string(),
                });
            }
            (Role::Assistant, "thinking" | "redacted_thinking") => {}
            (Role::User, "tool_result") => {
                block.only(&[
                    "type",
                    "tool_use_id",
                    "content",
                    "is_error",
                    "cache_control",
                ])?;
                let id = block.required_str("tool_use_id")?;
                let text = match block.get("content") {
                    Some(content) => text_of(block.unknown, &block.path_of("content"), content)?,
                    None => String::new(),
                };
                // The chat interface has no error flag: the model reads it in the text.
                let text = if block.bool("is_error")? == Some(true) {
                    format!("Error: {text}")
                } else {
                    text
                };
                out.push(Message::tool_result(id, text));
            }
            (Role::User, kind) => return Err(unreadable_block(&block, kind, "text, tool_result")),
            (_, kind) => return Err(unreadable_block(&block, kind, "text, tool_use, thinking")),
        }
    }
    if role == Role::User && texts.is_empty() && !blocks.is_empty() {
        // Only tool results: they are the turn.
        return Ok(());
    }
    out.push(Message {
        role,
        content: texts.join("\n"),
        tool_calls: calls,
        tool_call_id: None,
    });
    Ok(())
}

/// A tool of the request: a client tool (`name`, `description`, `input_schema`) as the model is
/// offered it, or, for a server tool (a `type` other than `custom`: web search, code
/// execution, …, which run on Anthropic's side and which no node runs), the name it is
/// dropped under.
fn read_tool(tool: Obj<'_>) -> Result<Result<ToolSpec, String>, ApiError> {
    if let Some(kind) = tool.str("type")?
        && kind != "custom"
    {
        return Ok(Err(dropped_name(kind, tool.str("name")?)));
    }
    tool.only(&[
        "type",
        "name",
        "description",
        "input_schema",
        "cache_control",
        "eager_input_streaming",
        "strict",
        "defer_loading",
    ])?;
    for field in ["strict", "defer_loading"] {
        if tool.bool(field)? == Some(true) {
            return Err(ApiError::bad_field(
                &tool.path_of(field),
                "is not supported by agentmesh; leave it out",
            ));
        }
    }
    let schema = tool.required("input_schema")?;
    if !schema.is_object() {
        return Err(tool.wrong("input_schema", "a JSON schema object"));
    }
    Ok(Ok(ToolSpec {
        name: tool.required_str("name")?.to_owned(),
        description: tool.str("description")?.unwrap_or_default().to_owned(),
        parameters: schema.clone(),
    }))
}

/// `tool_choice`: `auto`, `any` (some tool must be called), `tool` with a `name`, `none`.
fn read_tool_choice(choice: Obj<'_>) -> Result<ToolChoice, ApiError> {
    choice.only(&["type", "name", "disable_parallel_tool_use"])?;
    if choice.bool("disable_parallel_tool_use")? == Some(true) {
        return Err(ApiError::bad_field(
            &choice.path_of("disable_parallel_tool_use"),
            "is not supported by agentmesh's models (they may call several tools); leave it out",
        ));
    }
    match choice.required_str("type")? {
        "auto" => Ok(ToolChoice::Auto),
        "any" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        "tool" => Ok(ToolChoice::Function(
            choice.required_str("name")?.to_owned(),
        )),
        other => Err(ApiError::bad_field(
            &choice.path_of("type"),
            format!("`{other}` is not auto, any, tool or none"),
        )),
    }
}

/// `output_config`: its `format` (`{"type": "json_schema", "schema"}`) is the answer's JSON
/// schema; its `effort` only weighs thinking, which the mesh's models do not do.
fn read_output_config(config: &Obj<'_>) -> Result<Option<ResponseFormat>, ApiError> {
    config.only(&["effort", "format"])?;
    let Some(format) = config.object("format")? else {
        return Ok(None);
    };
    format.only(&["type", "schema"])?;
    match format.required_str("type")? {
        "json_schema" => {
            let schema = format.required("schema")?;
            if !schema.is_object() {
                return Err(format.wrong("schema", "a JSON schema object"));
            }
            Ok(Some(ResponseFormat::JsonSchema {
                name: "output".into(),
                schema: schema.clone(),
                strict: true,
            }))
        }
        other => Err(ApiError::bad_field(
            &format.path_of("type"),
            format!("`{other}` is not json_schema"),
        )),
    }
}

/// Refuses an `anthropic-version` header that is not a date (`2023-06-01`); a missing one is
/// accepted (the API is the same for every version the clients send).
pub fn check_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(VERSION_HEADER) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or_default();
    let is_date = text.len() == 10
        && text.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        });
    if is_date {
        Ok(())
    } else {
        Err(ApiError::bad_field(
            VERSION_HEADER,
            format!(
                "header value {:?} is not a version date such as `2023-06-01`",
                String::from_utf8_lossy(value.as_bytes())
            ),
        ))
    }
}

/// A tool call's `input`: its arguments as a JSON object (empty arguments: `{}`). Arguments
/// that are not one are the model's fault, named, rather than a block the client cannot read.
fn tool_input(model: &str, call: &ToolCall) -> Result<Value, ApiError> {
    if call.arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str(&call.arguments) {
        Ok(input @ Value::Object(_)) => Ok(input),
        _ => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorKind::Unavailable,
            format!(
                "model `{model}` called tool `{}` with arguments that are not a JSON object ({:.200}); retry, or use a model that writes valid tool calls",
                call.name, call.arguments
            ),
        )),
    }
}

/// A `tool_use` block's `id`: the model's, or a new one when it gave none.
fn tool_use_id(call: &ToolCall) -> String {
    if call.id.is_empty() {
        format!("toolu_{}", uuid::Uuid::now_v7().simple())
    } else {
        call.id.clone()
    }
}

fn stop_reason(response: &ChatResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn usage_json(usage: Usage) -> Value {
    json!({"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens})
}

/// The answer's content blocks: its text, then a `tool_use` block per call.
fn content_blocks(response: &ChatResponse) -> Result<Vec<Value>, ApiError> {
    let mut blocks = Vec::new();
    if !response.content.is_empty() {
        blocks.push(json!({"type": "text", "text": response.content}));
    }
    for call in &response.tool_calls {
        blocks.push(
            json!({"type": "tool_use", "id": tool_use_id(call), "name": call.name,
                           "input": tool_input(&response.model, call)?}),
        );
    }
    Ok(blocks)
}

/// Anthropic's `message` object of a whole answer.
fn message_json(id: &str, response: &ChatResponse) -> Result<Value, ApiError> {
    Ok(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": content_blocks(response)?,
        "stop_reason": stop_reason(response),
        "stop_sequence": null,
        "usage": usage_json(response.usage.unwrap_or_default()),
    }))
}

fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

/// `POST /v1/messages`.
pub async fn messages(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_version(&headers)?;
    let MessagesRequest {
        call,
        stream,
        unknown,
        dropped,
    } = read_messages(&body, door.clients.reading())?;
    let client = client_name(caller.key_name(), &headers);
    door.clients.ignored(&client, "/v1/messages", &unknown);
    door.clients
        .dropped_tools(&client, "/v1/messages", &dropped);
    let asked = call.model.clone();
    let run = door.gateway.start(&caller, door.aliased(call)).await?;
    let id = message_id();
    if stream {
        let mut response = encode::stream(run, "text/event-stream", Events::new(id, asked));
        response.headers_mut().extend(dropped_header(&dropped));
        return Ok(response);
    }
    let answer = run.answer().await?;
    let mut response = Json(message_json(&id, &answer)?).into_response();
    response.headers_mut().extend(dropped_header(&dropped));
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: the request's tokens as `{"input_tokens": n}`, read like a
/// `/v1/messages` request (without `max_tokens`). The count is an estimate, made with
/// cl100k_base over the text of the system prompt, the messages and the tools: the serving
/// model's own tokenizer lives on the node that serves it, and Claude Code uses the count only
/// to judge how full the context is. The model must be one the fleet has (after
/// `http.model_aliases`) and the caller's key may use, as for a message; nothing is run or
/// charged.
pub async fn count_tokens(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    check_version(&headers)?;
    let value = body_json(&body)?;
    let unknown = RefCell::new(door.clients.reading());
    let conversation = read_conversation(&Obj::at(String::new(), &value, &unknown)?)?;
    door.clients.ignored(
        &client_name(caller.key_name(), &headers),
        "/v1/messages/count_tokens",
        &unknown.borrow(),
    );
    let model = door.model_for(&conversation.model);
    door.gateway.check_model(&caller, &model)?;
    let text = countable_text(&conversation);
    let tokens = tokio::task::spawn_blocking(move || super::cl100k::count(&text))
        .await
        .map_err(|e| e.to_string())
        .and_then(|counted| counted)
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                format!("count the tokens: {e}"),
            )
        })?;
    Ok(Json(json!({"input_tokens": tokens})))
}

/// What `count_tokens` counts: each message's role, text and tool calls, and each tool's name,
/// description and schema, a line apiece (the line ends stand for the turn markers a chat
/// template adds).
fn countable_text(conversation: &Conversation) -> String {
    let mut text = String::new();
    for message in &conversation.messages {
        text.push_str(match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        });
        text.push('\n');
        text.push_str(&message.content);
        text.push('\n');
        for call in &message.tool_calls {
            text.push_str(&call.name);
            text.push(' ');
            text.push_str(&call.arguments);
            text.push('\n');
        }
    }
    for tool in &conversation.tools {
        text.push_str(&tool.name);
        text.push('\n');
        text.push_str(&tool.description);
        text.push('\n');
        text.push_str(&tool.parameters.to_string());
        text.push('\n');
    }
    text
}

/// Anthropic's `GET /v1/models` answer (asked for with an `anthropic-version` header): every
/// model id of the fleet, as [`FrontDoor::fleet_models`] lists them.
pub fn models_list(models: &BTreeMap<String, String>) -> Value {
    let data: Vec<Value> = models
        .keys()
        .map(|id| {
            json!({"type": "model", "id": id, "display_name": id,
                   "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active"})
        })
        .collect();
    json!({
        "data": data,
        "has_more": false,
        "first_id": models.keys().next(),
        "last_id": models.keys().next_back(),
    })
}

/// One server-sent event in Anthropic's framing.
fn frame(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn error_frame(error: &ApiError) -> String {
    frame("error", &error.body(Dialect::Anthropic))
}

/// A streamed message: `message_start`, `ping`, the text block's start and deltas, its stop,
/// a `tool_use` block per call (its input in one `input_json_delta`), `message_delta` with
/// the stop reason and usage, `message_stop`; or `error` once a failure comes.
struct Events {
    id: String,
    /// The model asked for (the serving one is known only at the end, after `message_start`).
    model: String,
    /// Blocks started so far (the index of the next).
    blocks: u32,
    /// Whether the text block is open (the last started block).
    text_open: bool,
    /// Whether the message is over (stopped, or failed).
    over: bool,
}

impl Events {
    fn new(id: String, model: String) -> Self {
        Self {
            id,
            model,
            blocks: 0,
            text_open: false,
            over: false,
        }
    }

    /// Stops the text block, if one is open.
    fn close_text(&mut self) -> Vec<String> {
        if !self.text_open {
            return Vec::new();
        }
        self.text_open = false;
        self.blocks += 1;
        vec![frame(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.blocks - 1}),
        )]
    }

    fn done(&mut self, response: &ChatResponse) -> Vec<String> {
        // Every input is checked before any block is sent: a bad one is an error, not a
        // broken block.
        let inputs = match response
            .tool_calls
            .iter()
            .map(|call| tool_input(&response.model, call))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(inputs) => inputs,
            Err(error) => {
                self.over = true;
                return vec![error_frame(&error)];
            }
        };
        let mut frames = self.close_text();
        for (call, input) in response.tool_calls.iter().zip(inputs) {
            let index = self.blocks;
            frames.push(frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block":
                        {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}}}),
            ));
            frames.push(frame(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta":
                        {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ));
            frames.push(frame(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
            self.blocks += 1;
        }
        frames.push(frame(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(response), "stop_sequence": null},
                    "usage": usage_json(response.usage.unwrap_or_default())}),
        ));
        frames.push(frame("message_stop", &json!({"type": "message_stop"})));
        self.over = true;
        frames
    }
}

impl Encoder for Events {
    fn start(&mut self) -> Vec<String> {
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "content": [], "model": self.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}});
        vec![
            frame(
                "message_start",
                &json!({"type": "message_start", "message": message}),
            ),
            frame("ping", &json!({"type": "ping"})),
        ]
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        if self.over {
            return Vec::new();
        }
        match event {
            Event::Delta { text, .. } => {
                let mut frames = Vec::new();
                if !self.text_open {
                    self.text_open = true;
                    frames.push(frame(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": self.blocks,
                                "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                frames.push(frame(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": self.blocks,
                            "delta": {"type": "text_delta", "text": text}}),
                ));
                frames
            }
            Event::Done { response, .. } => self.done(&response),
            Event::Failed(error) => {
                self.over = true;
                vec![error_frame(&error.into())]
            }
        }
    }

    fn end(&mut self) -> Vec<String> {
        if self.over {
            return Vec::new();
        }
        vec![error_frame(&GatewayError::NoAnswer.into())]
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::config::UnknownFields;

    /// Reads `body` with `http.unknown_fields = "refuse"`, as Anthropic itself reads.
    fn read(body: Value) -> Result<MessagesRequest, ApiError> {
        read_messages(
            body.to_string().as_bytes(),
            Unknown::new(UnknownFields::Refuse),
        )
    }

    /// A valid request with `extra` fields set (a `null` removes one).
    fn with(extra: Value) -> Value {
        let mut body = json!({"model": "m", "max_tokens": 64,
                              "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            if v.is_null() {
                body.as_object_mut().expect("object").remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    }

    #[test]
    fn messages_and_blocks_become_the_chat_interface() {
        let read = read(json!({
            "model": "role:chat",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": "in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": true},
                    {"type": "text", "text": "thanks"}
                ]}
            ],
            "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
            "stream": true,
            "metadata": {"user_id": "u"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
        }))
        .expect("valid");
        assert!(read.stream);
        let chat = &read.call.chat;
        let roles: Vec<Role> = chat.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::User
            ]
        );
        assert_eq!(chat.messages[0].content, "be brief");
        assert_eq!(chat.messages[1].content, "weather\nin Paris?");
        assert_eq!(chat.messages[2].content, "Let me look.");
        assert_eq!(chat.messages[2].tool_calls[0].id, "toolu_1");
        assert_eq!(
            serde_json::from_str::<Value>(&chat.messages[2].tool_calls[0].arguments).expect("json"),
            json!({"city": "Paris"})
        );
        assert_eq!(chat.messages[3].content, "sunny");
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(chat.messages[4].content, "Error: no such city");
        assert_eq!(chat.messages[5].content, "thanks");
        assert_eq!(chat.tools[0].parameters, json!({"type": "object"}));
        assert_eq!(
            chat.tool_choice,
            Some(ToolChoice::Function("weather".into()))
        );
        assert_eq!(
            chat.sampling,
            Sampling {
                max_tokens: Some(100),
                temperature: Some(0.5),
                top_p: Some(0.9),
                stop: vec!["END".into()],
                seed: None,
            }
        );
        for (choice, expected) in [
            ("auto", ToolChoice::Auto),
            ("any", ToolChoice::Required),
            ("none", ToolChoice::None),
        ] {
            let chosen = self::read(with(json!({"tool_choice": {"type": choice},
                            "tools": [{"name": "f", "input_schema": {"type": "object"}}]})))
            .expect(choice);
            assert_eq!(chosen.call.chat.tool_choice, Some(expected));
        }
    }

    /// Each kind of bad input is a 400 whose message starts with the field's path.
    #[test]
    fn bad_input_names_the_field() {
        let cases = [
            (json!({"max_tokens": null}), "max_tokens: Field required"),
            (json!({"max_tokens": "ten"}), "max_tokens: Input should be"),
            (json!({"model": 7}), "model: Input should be a valid string"),
            (
                json!({"messages": "hi"}),
                "messages: Input should be a valid list",
            ),
            (json!({"messages": []}), "messages: must not be empty"),
            (
                json!({"frobnicate": true}),
                "frobnicate: Extra inputs are not permitted",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "name": "n"}]}),
                "messages.0.name: Extra inputs are not permitted",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages.0.role: Input should be 'user', 'assistant' or 'system'",
            ),
            (
                json!({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]}),
                "messages.0.content.0.type: `image` blocks are not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages.0.content.0.type: `image` blocks are not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]}),
                "messages.0.content.0.content.0.type: `document` blocks are not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
                "messages.0.content.0.type: `tool_use` is not a block agentmesh reads here",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}),
                "messages.0.content.0.input: Input should be a valid dictionary",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}),
                "messages.0.content.0.extra: Extra inputs are not permitted",
            ),
            (json!({"top_k": 40}), "top_k: is not supported"),
            (
                json!({"temperature": 1.5}),
                "temperature: 1.5 is not between 0 and 1",
            ),
            (
                json!({"stop_sequences": [1]}),
                "stop_sequences.0: Input should be",
            ),
            (
                json!({"stop_sequences": ["a", "b", "c", "d", "e"]}),
                "stop_sequences: at most 4",
            ),
            (json!({"container": "c"}), "container: is not supported"),
            (
                json!({"tools": [{"name": "f"}]}),
                "tools.0.input_schema: Field required",
            ),
            (
                json!({"tool_choice": {"type": "sometimes"}}),
                "tool_choice.type: `sometimes` is not auto, any, tool or none",
            ),
            (
                json!({"tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice: names the function `g`",
            ),
            (
                json!({"tool_choice": {"type": "any"}}),
                "tool_choice: `required` needs at least one tool",
            ),
            (
                json!({"thinking": {"type": "maybe"}}),
                "thinking.type: `maybe` is not enabled, disabled or adaptive",
            ),
            (
                json!({"stream": "yes"}),
                "stream: Input should be a valid boolean",
            ),
        ];
        for (edit, expected) in cases {
            let error = read(with(edit.clone())).expect_err(&edit.to_string());
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{edit}");
            assert!(
                error.message.starts_with(expected),
                "{edit}: {} (wanted {expected})",
                error.message
            );
        }
        for body in [&b"not json"[..], b"[1]"] {
            let error = read_messages(body, Unknown::new(UnknownFields::Ignore))
                .expect_err("not an object");
            assert!(
                error.message.starts_with("request body"),
                "{}",
                error.message
            );
        }
    }

    /// Regression (issue 27): Claude Code sends `role: "system"` messages inside `messages`
    /// for a model name it does not know (`mid-conversation-system-2026-04-07`), and the mesh
    /// answered every turn with a 400 on `messages.1.role`. They are system turns where they
    /// stand.
    #[test]
    fn system_messages_in_the_conversation_are_system_turns_where_they_stand() {
        let read = read(json!({
            "model": "role:coder", "max_tokens": 32,
            "system": "be brief",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "Available agent types: claude"},
                {"role": "assistant", "content": "hello"},
                {"role": "system", "content": [{"type": "text", "text": "a reminder", "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "again"}
            ]
        }))
        .expect("valid");
        let turns: Vec<(Role, &str)> = read
            .call
            .chat
            .messages
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect();
        assert_eq!(
            turns,
            [
                (Role::System, "be brief"),
                (Role::User, "hi"),
                (Role::System, "Available agent types: claude"),
                (Role::Assistant, "hello"),
                (Role::System, "a reminder"),
                (Role::User, "again"),
            ]
        );
    }

    /// By default a field Anthropic's API does not define, at any depth, is ignored and noted
    /// by its path; with `refuse` the same request is a 400 naming the first.
    #[test]
    fn unknown_fields_are_ignored_and_noted_unless_refused() {
        let body = with(json!({
            "frobnicate": true,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "sparkle": 1}], "name": "n"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "future_flag": true}]
        }));
        let lenient = read_messages(
            body.to_string().as_bytes(),
            Unknown::new(UnknownFields::Ignore),
        )
        .expect("ignored");
        let mut noted = lenient.unknown.found().to_vec();
        noted.sort();
        assert_eq!(
            noted,
            [
                "frobnicate",
                "messages.0.content.0.sparkle",
                "messages.0.name",
                "tools.0.future_flag"
            ]
        );
        assert_eq!(lenient.call.chat.messages[0].content, "hi");
        let refused = read(body).expect_err("refused");
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            refused.message, "frobnicate: Extra inputs are not permitted",
            "Anthropic's own words"
        );
        // A field Anthropic defines that the mesh cannot honour is refused either way.
        let error = read_messages(
            with(json!({"top_k": 5})).to_string().as_bytes(),
            Unknown::new(UnknownFields::Ignore),
        )
        .expect_err("top_k");
        assert!(error.message.starts_with("top_k:"), "{}", error.message);
    }

    /// A server tool (it runs on Anthropic's side; no node runs it) is not offered to the
    /// model and is named for the `x-agentmesh-dropped-tools` header, rather than a 400.
    #[test]
    fn server_tools_are_dropped_and_named() {
        let read = read(with(json!({"tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"name": "f", "input_schema": {"type": "object"}},
            {"type": "code_execution_20250825", "name": "code_execution"}
        ]})))
        .expect("valid");
        assert_eq!(read.call.chat.tools.len(), 1);
        assert_eq!(read.call.chat.tools[0].name, "f");
        assert_eq!(
            read.dropped,
            [
                "web_search_20250305:web_search",
                "code_execution_20250825:code_execution"
            ]
        );
    }

    #[test]
    fn count_tokens_counts_the_text_of_every_part_once() {
        let value = json!({
            "model": "m",
            "system": "be brief",
            "messages": [{"role": "user", "content": "hello world"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}],
            "tools": [{"name": "f", "description": "does f", "input_schema": {"type": "object"}}]
        });
        let unknown = RefCell::new(Unknown::new(UnknownFields::Refuse));
        let conversation =
            read_conversation(&Obj::at(String::new(), &value, &unknown).expect("object"))
                .expect("valid without max_tokens");
        assert_eq!(
            countable_text(&conversation),
            "system\nbe brief\nuser\nhello world\nassistant\n\nf {\"a\":1}\nf\ndoes f\n{\"type\":\"object\"}\n"
        );
    }

    #[test]
    fn the_version_header_must_be_a_date_and_may_be_missing() {
        let mut headers = HeaderMap::new();
        assert!(check_version(&headers).is_ok());
        headers.insert(VERSION_HEADER, HeaderValue::from_static("2023-06-01"));
        assert!(check_version(&headers).is_ok());
        for bad in ["2023-6-1", "latest", "2023-06-01x", "20230601"] {
            headers.insert(VERSION_HEADER, HeaderValue::from_static(bad));
            let error = check_version(&headers).expect_err(bad);
            assert!(
                error.message.starts_with(VERSION_HEADER),
                "{}",
                error.message
            );
        }
    }

    fn answer(content: &str, calls: &[(&str, &str)]) -> ChatResponse {
        ChatResponse {
            model: "served".into(),
            content: content.into(),
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (name, arguments))| ToolCall {
                    id: format!("call_{i}"),
                    name: (*name).into(),
                    arguments: (*arguments).into(),
                })
                .collect(),
            usage: Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 3,
            }),
        }
    }

    #[test]
    fn answers_become_messages_and_broken_tool_arguments_name_the_model() {
        let message = message_json(
            "msg_1",
            &answer("Looking.", &[("weather", r#"{"city": "Paris"}"#)]),
        )
        .expect("valid");
        assert_eq!(message["model"], "served");
        assert_eq!(message["stop_reason"], "tool_use");
        assert_eq!(
            message["content"],
            json!([{"type": "text", "text": "Looking."},
                   {"type": "tool_use", "id": "call_0", "name": "weather", "input": {"city": "Paris"}}])
        );
        assert_eq!(
            message["usage"],
            json!({"input_tokens": 12, "output_tokens": 3})
        );
        let plain = message_json("msg_2", &answer("Hi.", &[("f", "")])).expect("valid");
        assert_eq!(plain["content"][1]["input"], json!({}));
        let text = message_json("msg_3", &answer("Hi.", &[])).expect("valid");
        assert_eq!(text["stop_reason"], "end_turn");
        for broken in ["{\"city\": ", "[1, 2]", "\"Paris\""] {
            let error =
                message_json("msg_4", &answer("", &[("weather", broken)])).expect_err(broken);
            assert_eq!(error.status, StatusCode::BAD_GATEWAY);
            assert!(
                error
                    .message
                    .starts_with("model `served` called tool `weather`"),
                "{}",
                error.message
            );
        }
    }

    /// The event names of `frames`, and their data.
    fn parse_frames(frames: &[String]) -> Vec<(String, Value)> {
        frames
            .iter()
            .map(|f| {
                let (event, data) = f
                    .strip_prefix("event: ")
                    .and_then(|f| f.split_once("\ndata: "))
                    .expect("an event frame");
                assert!(data.ends_with("\n\n"), "{f:?}");
                (event.to_owned(), serde_json::from_str(data).expect("json"))
            })
            .collect()
    }

    #[test]
    fn a_stream_sends_anthropics_events_in_order() {
        let mut encoder = Events::new("msg_1".into(), "m".into());
        let mut frames = encoder.start();
        for text in ["Hel", "lo"] {
            frames.extend(encoder.event(Event::Delta {
                choice: 0,
                text: text.into(),
            }));
        }
        frames.extend(encoder.event(Event::Done {
            choice: 0,
            response: answer("Hello", &[("f", r#"{"a": 1}"#)]),
        }));
        frames.extend(encoder.end());
        let events = parse_frames(&frames);
        let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (event, data) in &events {
            assert_eq!(data["type"], event.as_str(), "{data}");
        }
        assert_eq!(events[0].1["message"]["id"], "msg_1");
        assert_eq!(
            events[3].1["delta"],
            json!({"type": "text_delta", "text": "Hel"})
        );
        assert_eq!(events[6].1["index"], 1);
        assert_eq!(events[6].1["content_block"]["name"], "f");
        assert_eq!(
            events[7].1["delta"],
            json!({"type": "input_json_delta", "partial_json": r#"{"a":1}"#})
        );
        assert_eq!(events[9].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[9].1["usage"]["output_tokens"], 3);

        // A failure after the start is one `error` event, and nothing after it.
        let mut encoder = Events::new("msg_2".into(), "m".into());
        let mut frames = encoder.start();
        // A 502, as peers that failed are.
        frames.extend(encoder.event(Event::Failed(GatewayError::Chat(
            crate::chat::ChatError::Peers("node gpu: gone".into()),
        ))));
        frames.extend(encoder.end());
        let events = parse_frames(&frames);
        assert_eq!(events.len(), 3);
        assert_eq!(events[2].0, "error");
        assert_eq!(
            events[2].1,
            json!({"type": "error", "error": {"type": "api_error", "message": "node gpu: gone"}})
        );

        // Broken tool arguments are an error, not a tool_use block; a run that ends without
        // an answer is one too.
        let mut encoder = Events::new("msg_3".into(), "m".into());
        let frames = encoder.event(Event::Done {
            choice: 0,
            response: answer("", &[("f", "{broken")]),
        });
        let events = parse_frames(&frames);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, "error");
        let mut encoder = Events::new("msg_4".into(), "m".into());
        assert_eq!(parse_frames(&encoder.end())[0].0, "error");
    }

    #[test]
    fn the_models_list_has_anthropics_shape() {
        let models = BTreeMap::from([
            ("a".to_owned(), "gpu".to_owned()),
            ("role:chat".to_owned(), "gpu".to_owned()),
        ]);
        let list = models_list(&models);
        assert_eq!(list["data"][1]["id"], "role:chat");
        assert_eq!(list["data"][0]["type"], "model");
        assert_eq!(
            (&list["first_id"], &list["last_id"]),
            (&json!("a"), &json!("role:chat"))
        );
        assert_eq!(list["has_more"], false);
    }
}
