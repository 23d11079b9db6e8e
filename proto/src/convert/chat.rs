//! Chats and embeddings on the wire (`agentmesh.v1.Models`): a `ChatRequest` (messages, tools,
//! sampling, the answer's format, the tool choice), a `ChatResponse`, and embeddings as
//! `repeated float`. What is JSON by nature (a tool's parameter schema, a response schema)
//! travels as JSON text and is parsed here; a bad value is `INVALID_ARGUMENT` naming the field
//! (under `request.` or `answer.`). Sizes are bounded by the service's message limit.

use mesh_domain::{
    ChatRequest, ChatResponse, EmbedResponse, Message, ResponseFormat, Role, Sampling, ToolCall,
    ToolChoice, ToolSpec, Usage,
};
use serde_json::Value;
use tonic::Status;

use crate::v1 as pb;

impl From<Role> for pb::ChatRole {
    fn from(role: Role) -> Self {
        match role {
            Role::System => Self::System,
            Role::User => Self::User,
            Role::Assistant => Self::Assistant,
            Role::Tool => Self::Tool,
        }
    }
}

fn role(field: &str, role: i32) -> Result<Role, Status> {
    match pb::ChatRole::try_from(role) {
        Ok(pb::ChatRole::System) => Ok(Role::System),
        Ok(pb::ChatRole::User) => Ok(Role::User),
        Ok(pb::ChatRole::Assistant) => Ok(Role::Assistant),
        Ok(pb::ChatRole::Tool) => Ok(Role::Tool),
        Ok(pb::ChatRole::Unspecified) | Err(_) => Err(Status::invalid_argument(format!(
            "{field}: {role} is not a role (system, user, assistant or tool)"
        ))),
    }
}

/// JSON text for `value`; empty for `null` (nothing given).
fn json_text(value: &Value) -> String {
    if value.is_null() {
        String::new()
    } else {
        value.to_string()
    }
}

/// The JSON value of `text`; `null` for an empty text.
fn json_value(field: &str, text: &str) -> Result<Value, Status> {
    if text.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(text)
        .map_err(|e| Status::invalid_argument(format!("{field}: not JSON ({e})")))
}

impl From<&ToolCall> for pb::ChatToolCall {
    fn from(call: &ToolCall) -> Self {
        Self {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        }
    }
}

impl From<pb::ChatToolCall> for ToolCall {
    fn from(call: pb::ChatToolCall) -> Self {
        Self {
            id: call.id,
            name: call.name,
            arguments: call.arguments,
        }
    }
}

impl From<&Message> for pb::ChatMessage {
    fn from(message: &Message) -> Self {
        Self {
            role: pb::ChatRole::from(message.role) as i32,
            content: message.content.clone(),
            tool_calls: message.tool_calls.iter().map(Into::into).collect(),
            tool_call_id: message.tool_call_id.clone(),
        }
    }
}

impl From<&Sampling> for pb::ChatSampling {
    fn from(sampling: &Sampling) -> Self {
        Self {
            max_tokens: sampling.max_tokens,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            stop: sampling.stop.clone(),
            seed: sampling.seed,
        }
    }
}

impl From<pb::ChatSampling> for Sampling {
    /// Unchecked: the receiver checks the values (`Sampling::check`) as it would a client's.
    fn from(sampling: pb::ChatSampling) -> Self {
        Self {
            max_tokens: sampling.max_tokens,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            stop: sampling.stop,
            seed: sampling.seed,
        }
    }
}

impl From<&ResponseFormat> for pb::ChatResponseFormat {
    fn from(format: &ResponseFormat) -> Self {
        use pb::chat_response_format::Kind;
        let kind = match format {
            ResponseFormat::Text => Kind::Text(true),
            ResponseFormat::JsonObject => Kind::JsonObject(true),
            ResponseFormat::JsonSchema {
                name,
                schema,
                strict,
            } => Kind::JsonSchema(pb::ChatJsonSchema {
                name: name.clone(),
                schema_json: json_text(schema),
                strict: *strict,
            }),
        };
        Self { kind: Some(kind) }
    }
}

fn response_format(format: pb::ChatResponseFormat) -> Result<Option<ResponseFormat>, Status> {
    use pb::chat_response_format::Kind;
    Ok(match format.kind {
        None => None,
        Some(Kind::Text(_)) => Some(ResponseFormat::Text),
        Some(Kind::JsonObject(_)) => Some(ResponseFormat::JsonObject),
        Some(Kind::JsonSchema(schema)) => Some(ResponseFormat::JsonSchema {
            schema: json_value(
                "request.response_format.json_schema.schema",
                &schema.schema_json,
            )?,
            name: schema.name,
            strict: schema.strict,
        }),
    })
}

impl From<&ToolChoice> for pb::ChatToolChoice {
    fn from(choice: &ToolChoice) -> Self {
        use pb::chat_tool_choice::Kind;
        let kind = match choice {
            ToolChoice::None => Kind::None(true),
            ToolChoice::Auto => Kind::Auto(true),
            ToolChoice::Required => Kind::Required(true),
            ToolChoice::Function(name) => Kind::Function(name.clone()),
        };
        Self { kind: Some(kind) }
    }
}

impl From<pb::ChatToolChoice> for Option<ToolChoice> {
    fn from(choice: pb::ChatToolChoice) -> Self {
        use pb::chat_tool_choice::Kind;
        Some(match choice.kind? {
            Kind::None(_) => ToolChoice::None,
            Kind::Auto(_) => ToolChoice::Auto,
            Kind::Required(_) => ToolChoice::Required,
            Kind::Function(name) => ToolChoice::Function(name),
        })
    }
}

impl From<&ChatRequest> for pb::ChatRequest {
    fn from(request: &ChatRequest) -> Self {
        Self {
            messages: request.messages.iter().map(Into::into).collect(),
            tools: request
                .tools
                .iter()
                .map(|tool| pb::ChatTool {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters_json: json_text(&tool.parameters),
                })
                .collect(),
            sampling: Some((&request.sampling).into()),
            response_format: request.response_format.as_ref().map(Into::into),
            tool_choice: request.tool_choice.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<pb::ChatRequest> for ChatRequest {
    type Error = Status;

    fn try_from(request: pb::ChatRequest) -> Result<Self, Status> {
        let messages = request
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, message)| {
                Ok(Message {
                    role: role(&format!("request.messages[{i}].role"), message.role)?,
                    content: message.content,
                    tool_calls: message.tool_calls.into_iter().map(Into::into).collect(),
                    tool_call_id: message.tool_call_id,
                })
            })
            .collect::<Result<_, Status>>()?;
        let tools = request
            .tools
            .into_iter()
            .enumerate()
            .map(|(i, tool)| {
                Ok(ToolSpec {
                    parameters: json_value(
                        &format!("request.tools[{i}].parameters"),
                        &tool.parameters_json,
                    )?,
                    name: tool.name,
                    description: tool.description,
                })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Self {
            messages,
            tools,
            sampling: request.sampling.map(Into::into).unwrap_or_default(),
            response_format: request
                .response_format
                .map(response_format)
                .transpose()?
                .flatten(),
            tool_choice: request.tool_choice.and_then(Into::into),
        })
    }
}

impl From<&ChatResponse> for pb::ChatAnswer {
    fn from(response: &ChatResponse) -> Self {
        Self {
            model: response.model.clone(),
            content: response.content.clone(),
            tool_calls: response.tool_calls.iter().map(Into::into).collect(),
            usage: response.usage.map(|usage| pb::ChatUsage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
            }),
        }
    }
}

impl From<pb::ChatAnswer> for ChatResponse {
    fn from(answer: pb::ChatAnswer) -> Self {
        Self {
            model: answer.model,
            content: answer.content,
            tool_calls: answer.tool_calls.into_iter().map(Into::into).collect(),
            usage: answer.usage.map(|usage| Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
            }),
        }
    }
}

impl From<&EmbedResponse> for pb::EmbedAnswer {
    fn from(response: &EmbedResponse) -> Self {
        Self {
            model: response.model.clone(),
            vectors: response
                .vectors
                .iter()
                .map(|values| pb::Embedding {
                    values: values.clone(),
                })
                .collect(),
            prompt_tokens: response.prompt_tokens,
        }
    }
}

impl From<pb::EmbedAnswer> for EmbedResponse {
    fn from(answer: pb::EmbedAnswer) -> Self {
        Self {
            model: answer.model,
            vectors: answer.vectors.into_iter().map(|v| v.values).collect(),
            prompt_tokens: answer.prompt_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use serde_json::json;

    use super::*;

    /// A request using every field.
    fn full_request() -> ChatRequest {
        ChatRequest {
            messages: vec![
                Message::text(Role::System, "be brief"),
                Message::text(Role::User, "weather?"),
                Message {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "weather".into(),
                        arguments: r#"{"city": "Paris"}"#.into(),
                    }],
                    tool_call_id: None,
                },
                Message {
                    role: Role::Tool,
                    content: "sunny".into(),
                    tool_calls: Vec::new(),
                    tool_call_id: Some("c1".into()),
                },
            ],
            tools: vec![
                ToolSpec {
                    name: "weather".into(),
                    description: "The weather in a city.".into(),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
                },
                ToolSpec {
                    name: "bare".into(),
                    description: String::new(),
                    parameters: Value::Null,
                },
            ],
            sampling: Sampling {
                max_tokens: Some(64),
                temperature: Some(0.5),
                top_p: Some(0.9),
                stop: vec!["END".into()],
                seed: Some(7),
            },
            response_format: Some(ResponseFormat::JsonSchema {
                name: "s".into(),
                schema: json!({"type": "object"}),
                strict: true,
            }),
            tool_choice: Some(ToolChoice::Function("weather".into())),
        }
    }

    fn round_trip(request: &ChatRequest) -> ChatRequest {
        let bytes = pb::ChatRequest::from(request).encode_to_vec();
        let decoded = pb::ChatRequest::decode(bytes.as_slice()).expect("decodes");
        ChatRequest::try_from(decoded).expect("converts")
    }

    #[test]
    fn chat_requests_round_trip_through_the_wire() {
        let full = full_request();
        assert_eq!(round_trip(&full), full);
        assert_eq!(round_trip(&ChatRequest::default()), ChatRequest::default());
        let formats = [
            None,
            Some(ResponseFormat::Text),
            Some(ResponseFormat::JsonObject),
        ];
        let choices = [
            None,
            Some(ToolChoice::None),
            Some(ToolChoice::Auto),
            Some(ToolChoice::Required),
        ];
        for (response_format, tool_choice) in formats.into_iter().zip(choices) {
            let request = ChatRequest {
                response_format,
                tool_choice,
                ..full_request()
            };
            assert_eq!(round_trip(&request), request);
        }
    }

    #[test]
    fn answers_and_embeddings_round_trip_through_the_wire() {
        for usage in [
            None,
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            }),
        ] {
            let response = ChatResponse {
                model: "m".into(),
                content: "hi".into(),
                tool_calls: vec![ToolCall {
                    id: "a".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                }],
                usage,
            };
            let bytes = pb::ChatAnswer::from(&response).encode_to_vec();
            let decoded = pb::ChatAnswer::decode(bytes.as_slice()).expect("decodes");
            assert_eq!(ChatResponse::from(decoded), response);
        }
        let embeddings = EmbedResponse {
            model: "e".into(),
            vectors: vec![vec![0.6, -0.8], vec![1.0, 0.0]],
            prompt_tokens: 5,
        };
        let answer = pb::EmbedAnswer::from(&embeddings);
        // 4 bytes a float, where JSON took about 12.
        assert!(
            answer.encoded_len() < 4 * 4 + 32,
            "{}",
            answer.encoded_len()
        );
        let decoded = pb::EmbedAnswer::decode(answer.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(EmbedResponse::from(decoded), embeddings);
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let mut wire = pb::ChatRequest::from(&full_request());
        wire.messages[1].role = 0;
        let error = ChatRequest::try_from(wire).expect_err("no role");
        assert!(
            error.message().starts_with("request.messages[1].role:"),
            "{}",
            error.message()
        );
        let mut wire = pb::ChatRequest::from(&full_request());
        wire.messages[0].role = 99;
        assert!(ChatRequest::try_from(wire).is_err(), "an unknown role");
        let mut wire = pb::ChatRequest::from(&full_request());
        wire.tools[0].parameters_json = "{not json".into();
        let error = ChatRequest::try_from(wire).expect_err("bad schema");
        assert!(
            error
                .message()
                .starts_with("request.tools[0].parameters: not JSON"),
            "{}",
            error.message()
        );
        let mut wire = pb::ChatRequest::from(&full_request());
        if let Some(pb::chat_response_format::Kind::JsonSchema(schema)) = wire
            .response_format
            .as_mut()
            .and_then(|format| format.kind.as_mut())
        {
            schema.schema_json = "[".into();
        }
        let error = ChatRequest::try_from(wire).expect_err("bad schema");
        assert!(
            error
                .message()
                .starts_with("request.response_format.json_schema.schema: not JSON"),
            "{}",
            error.message()
        );
    }
}
