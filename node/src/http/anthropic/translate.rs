//! Anthropic's Messages API to and from the gateway's types: a request read into a `Call`
//! ([`read_messages`]; the conversation alone for `count_tokens`), and an answer as Anthropic's
//! `message` object and content blocks.

use std::{cell::RefCell, collections::BTreeMap};

use axum::http::{HeaderMap, StatusCode};
use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolChoice,
    ToolSpec, Usage,
};
use serde_json::{Value, json};

use super::wire::{IGNORED, Obj, READ, UNSUPPORTED, UNSUPPORTED_BLOCKS, VERSION_HEADER, body_json};
use crate::{
    gateway::Call,
    http::{
        clients::{Unknown, dropped_name},
        error::{ApiError, ErrorKind},
    },
};

/// A `POST /v1/messages` body as the front door reads it, before it is placed.
#[derive(Debug)]
pub(super) struct MessagesRequest {
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
pub(super) struct Conversation {
    pub(super) model: String,
    pub(super) messages: Vec<Message>,
    pub(super) tools: Vec<ToolSpec>,
    /// Server tools of the request, not offered to the model.
    pub(super) dropped: Vec<String>,
    pub(super) tool_choice: Option<ToolChoice>,
}

/// The model, system prompt, messages, tools and tool choice of `top`, after its fields are
/// checked: an unknown one is noted (or refused), one Anthropic defines that the mesh cannot
/// honour is refused, naming it.
pub(super) fn read_conversation(top: &Obj<'_>) -> Result<Conversation, ApiError> {
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
pub(super) fn read_messages(body: &[u8], unknown: Unknown) -> Result<MessagesRequest, ApiError> {
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
pub(super) fn stop_sequences(top: &Obj<'_>) -> Result<Vec<String>, ApiError> {
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
pub(super) fn check_thinking(thinking: &Obj<'_>) -> Result<(), ApiError> {
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
pub(super) fn check_context_management(management: &Obj<'_>) -> Result<(), ApiError> {
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
pub(super) fn text_of(
    unknown: &RefCell<Unknown>,
    path: &str,
    value: &Value,
) -> Result<String, ApiError> {
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

pub(super) fn block_type<'a>(block: &Obj<'a>) -> Result<&'a str, ApiError> {
    block.required_str("type")
}

/// The text of a `text` block (its `cache_control` and `citations` do not change it).
pub(super) fn text_block(block: &Obj<'_>) -> Result<String, ApiError> {
    block.only(&["type", "text", "cache_control", "citations"])?;
    Ok(block.required_str("text")?.to_owned())
}

/// A block of a type the mesh does not read where it stands.
pub(super) fn unreadable_block(block: &Obj<'_>, kind: &str, readable: &str) -> ApiError {
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
pub(super) fn read_message(message: Obj<'_>, out: &mut Vec<Message>) -> Result<(), ApiError> {
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
pub(super) fn read_tool(tool: Obj<'_>) -> Result<Result<ToolSpec, String>, ApiError> {
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
pub(super) fn read_tool_choice(choice: Obj<'_>) -> Result<ToolChoice, ApiError> {
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
pub(super) fn read_output_config(config: &Obj<'_>) -> Result<Option<ResponseFormat>, ApiError> {
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
pub(super) fn check_version(headers: &HeaderMap) -> Result<(), ApiError> {
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
pub(super) fn tool_input(model: &str, call: &ToolCall) -> Result<Value, ApiError> {
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
pub(super) fn tool_use_id(call: &ToolCall) -> String {
    if call.id.is_empty() {
        format!("toolu_{}", uuid::Uuid::now_v7().simple())
    } else {
        call.id.clone()
    }
}

pub(super) fn stop_reason(response: &ChatResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

pub(super) fn usage_json(usage: Usage) -> Value {
    json!({"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens})
}

/// The answer's content blocks: its text, then a `tool_use` block per call.
pub(super) fn content_blocks(response: &ChatResponse) -> Result<Vec<Value>, ApiError> {
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
pub(super) fn message_json(id: &str, response: &ChatResponse) -> Result<Value, ApiError> {
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

pub(super) fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

/// What `count_tokens` counts: each message's role, text and tool calls, and each tool's name,
/// description and schema, a line apiece (the line ends stand for the turn markers a chat
/// template adds).
pub(super) fn countable_text(conversation: &Conversation) -> String {
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
pub(super) fn models_list(models: &BTreeMap<String, String>) -> Value {
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
