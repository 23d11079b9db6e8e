//! OpenAI's chat completions to and from the gateway's types: a request's fields checked and
//! turned into a [`Call`] ([`read_chat_completion`]), the pieces of OpenAI's answer JSON, and
//! what the other OpenAI endpoints of this folder share (the field check, `tool_choice`).

use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolChoice,
    ToolSpec, Usage,
};
use serde_json::{Map, Value, json};

use super::wire::{CHAT_FIELDS, Fields, OpenAiRequest, Stop};
use crate::{
    gateway::{Call, total_usage},
    http::{clients::Unknown, error::ApiError},
};

/// Refuses a field OpenAI defines that the mesh does not offer, naming it; notes a field the
/// mesh does not know in `unknown`, which ignores it or refuses it as OpenAI refuses an
/// unrecognized argument. Shared by every OpenAI endpoint.
pub(super) fn check_fields(
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
pub(super) fn check_unsupported_values(request: &OpenAiRequest) -> Result<(), ApiError> {
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
pub(super) fn sampling_of(request: &OpenAiRequest) -> Result<Sampling, ApiError> {
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
pub(super) fn content_text(content: Option<Value>) -> String {
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
pub(super) fn tool_choice_of(value: &Value) -> Result<ToolChoice, ApiError> {
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
pub(super) fn response_format_of(value: &Value) -> Result<ResponseFormat, ApiError> {
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

pub(super) fn to_call(request: OpenAiRequest) -> Result<(Call, bool), ApiError> {
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
pub(crate) struct ChatCompletion {
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
pub(crate) fn read_chat_completion(
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
pub(super) fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

pub(super) fn usage_json(usage: Usage) -> Value {
    json!({"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
           "total_tokens": usage.total()})
}

pub(super) fn finish_reason(response: &ChatResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

pub(super) fn completion_id() -> String {
    format!("chatcmpl-{}", uuid::Uuid::now_v7().simple())
}

/// One entry of `/v1/models`; `capabilities` (an agentmesh addition, which OpenAI's clients
/// keep as an extra field) says whether the model also makes embeddings.
pub(super) fn model_entry(id: &str, owner: &str, embeds: bool) -> Value {
    let capabilities: &[&str] = if embeds {
        &["chat", "embeddings"]
    } else {
        &["chat"]
    };
    json!({"id": id, "object": "model", "created": 0, "owned_by": owner,
           "capabilities": capabilities})
}

/// OpenAI's `chat.completion` object of the whole `answers` (one per choice) to call `id`,
/// made at `created`, for the model `asked`.
pub(super) fn completion_json(
    id: &str,
    created: u64,
    asked: &str,
    answers: &[ChatResponse],
) -> Value {
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
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": answers.first().map_or(asked, |a| a.model.as_str()),
        "choices": choices,
        "usage": usage_json(total_usage(answers)),
    })
}
