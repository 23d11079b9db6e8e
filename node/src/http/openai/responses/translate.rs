//! The Responses API to and from the gateway's types: a request's input items, tools and
//! settings read into a chat ([`read_responses_call`]), and the Response object an answer is
//! given back in ([`Head`]).

use std::collections::BTreeMap;

use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolCall, ToolSpec, Usage,
    keys::RESPONSE_ID_PREFIX,
};
use serde_json::{Map, Value, json};

use super::{
    super::{
        translate::{check_fields, tool_choice_of},
        wire::Fields,
    },
    wire::{
        IGNORED, INCLUDABLE, Input, METADATA_KEY, METADATA_PAIRS, METADATA_VALUE, READ,
        ResponsesRequest, UNSUPPORTED,
    },
};
use crate::{
    gateway::Keeper,
    http::{
        clients::{Unknown, dropped_name},
        error::ApiError,
    },
};

/// A `POST /v1/responses` body as the front door reads it, before the stored conversation it
/// continues is looked up.
#[derive(Debug)]
pub(super) struct ResponsesCall {
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
    pub(super) echo: Echo,
    /// Tools of the request the model is not offered (hosted tools the fleet cannot run), by
    /// type and name.
    pub dropped: Vec<String>,
    /// The functions of `namespace` tools, offered flattened: flat name → (namespace, name).
    pub(super) namespaces: Namespaces,
}

/// The functions of `namespace` tools, offered to the model under one flat name each: flat
/// name → (namespace, function name), so a call comes back to the client as its namespace's.
pub(super) type Namespaces = BTreeMap<String, (String, String)>;

/// The flat name the model is offered for function `name` of namespace `namespace`.
pub(super) fn flat_name(namespace: &str, name: &str) -> String {
    if namespace.ends_with("__") {
        format!("{namespace}{name}")
    } else {
        format!("{namespace}__{name}")
    }
}

/// The request's fields a Response object repeats.
#[derive(Debug, Clone)]
pub(super) struct Echo {
    pub(super) tools: Vec<Value>,
    pub(super) tool_choice: Value,
    pub(super) text: Value,
    pub(super) metadata: Value,
    pub(super) parallel_tool_calls: bool,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) max_output_tokens: Option<u32>,
}

/// Refuses settings the mesh cannot honour rather than ignoring them.
pub(super) fn check_unsupported_values(request: &ResponsesRequest) -> Result<(), ApiError> {
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
pub(super) fn string(item: &Map<String, Value>, field: &str, at: &str) -> Result<String, ApiError> {
    item.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_field(&format!("{at}.{field}"), "is required (a string)"))
}

/// The text of a message's `content` (a string, or `input_text` / `output_text` parts), or
/// of a `function_call_output`'s `output`.
pub(super) fn text_of(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
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
pub(super) fn messages_of(items: &[Value]) -> Result<Vec<Message>, ApiError> {
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
pub(super) struct Offered {
    /// Function tools, and the functions of namespace tools under their flat names.
    pub(super) specs: Vec<ToolSpec>,
    /// Tools left out, by type (and name, when they have one): hosted tools the fleet cannot
    /// run, and client tools that are not functions.
    pub(super) dropped: Vec<String>,
    /// Flat name → (namespace, function name).
    pub(super) namespaces: Namespaces,
}

/// One function tool (`{"type": "function", "name", "description", "parameters"}`) at `at`.
pub(super) fn function_of(tool: &Map<String, Value>, at: &str) -> Result<ToolSpec, ApiError> {
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
pub(super) fn tools_of(tools: &[Value]) -> Result<Offered, ApiError> {
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
pub(super) fn dropped_of(tool: &Map<String, Value>, namespace: Option<&str>) -> String {
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
pub(super) fn format_of(text: &Map<String, Value>) -> Result<Option<ResponseFormat>, ApiError> {
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
pub(super) fn read_responses_call(
    body: &[u8],
    unknown: &mut Unknown,
) -> Result<ResponsesCall, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let Value::Object(object) = &value else {
        return Err(ApiError::bad_request("request body: must be a JSON object"));
    };
    check_fields(
        object,
        Fields {
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
pub(super) struct Head {
    pub(super) id: String,
    pub(super) created_at: u64,
    /// The model asked for until one answered, then the one that served.
    pub(super) model: String,
    pub(super) instructions: Option<String>,
    pub(super) previous_response_id: Option<String>,
    pub(super) echo: Echo,
    /// The flattened functions of the request's namespace tools.
    pub(super) namespaces: Namespaces,
}

impl Head {
    /// The namespace (when the function is one of a namespace's) and the name a call of the
    /// model is given back to the client with.
    pub(super) fn called<'a>(&'a self, call: &'a ToolCall) -> (Option<&'a str>, &'a str) {
        match self.namespaces.get(&call.name) {
            Some((namespace, name)) => (Some(namespace), name),
            None => (None, &call.name),
        }
    }

    /// The id's unique part, shared by the ids of the answer's items.
    pub(super) fn suffix(&self) -> &str {
        self.id.trim_start_matches(RESPONSE_ID_PREFIX)
    }

    pub(super) fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    pub(super) fn call_item_id(&self, i: usize) -> String {
        format!("fc_{}_{i}", self.suffix())
    }

    /// The Response object with `status`, `output` and `usage`.
    pub(super) fn object(&self, status: &str, output: Vec<Value>, usage: Option<Usage>) -> Value {
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
    pub(super) fn message_item(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(output_text).into_iter().collect();
        json!({"type": "message", "id": self.message_id(), "status": status,
               "role": "assistant", "content": content})
    }

    /// The `function_call` item of the answer's `i`th tool call.
    pub(super) fn call_item(
        &self,
        i: usize,
        call: &ToolCall,
        status: &str,
        arguments: &str,
    ) -> Value {
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
    pub(super) fn output(&self, answer: &ChatResponse, message: bool) -> Vec<Value> {
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
pub(super) fn has_message(answer: &ChatResponse) -> bool {
    !answer.content.is_empty() || answer.tool_calls.is_empty()
}

/// An `output_text` content part.
pub(super) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

pub(super) fn usage_json(usage: Usage) -> Value {
    json!({"input_tokens": usage.prompt_tokens,
           "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": usage.completion_tokens,
           "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": usage.total()})
}

/// Tool calls with an id each: a backend that gave none gets one made from the response's id,
/// so a `function_call_output` can name it.
pub(super) fn with_call_ids(mut answer: ChatResponse, suffix: &str) -> ChatResponse {
    for (i, call) in answer.tool_calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = format!("call_{suffix}_{i}");
        }
    }
    answer
}

/// Stores `response` (the Response object) with `keeper`, `store` set to whether it was kept.
pub(super) async fn keep(keeper: Keeper, id: &str, answer: &ChatResponse, response: &mut Value) {
    response["store"] = json!(true);
    if !keeper.keep(id, answer, response).await {
        response["store"] = json!(false);
    }
}
