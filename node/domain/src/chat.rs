//! Conversations with a model: messages, tool calls and the tools offered, generation
//! settings, requests and answers, token usage. The agent loop, the front door and the model
//! backends all speak these; the front door and `Models/Chat` carry them as JSON.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the model (a system prompt).
    System,
    /// The task or an intervention.
    User,
    Assistant,
    /// A tool result.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    pub content: String,
    /// Tool calls the assistant made (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Which call this answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.to_owned()),
        }
    }
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as the model wrote them: JSON text, possibly malformed.
    pub arguments: String,
}

/// Cap on what one tool call returns to the model (and on `shell_exec` output), wherever the
/// tool runs.
pub const MAX_TOOL_OUTPUT: usize = 64 * 1024;

/// `text` cut to [`MAX_TOOL_OUTPUT`] bytes (at a character boundary), marked `[truncated]`
/// when it was cut.
pub fn cap_tool_output(text: String) -> String {
    if text.len() <= MAX_TOOL_OUTPUT {
        return text;
    }
    format!(
        "{}\n[truncated]",
        crate::text::truncate(&text, MAX_TOOL_OUTPUT)
    )
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON schema of its arguments.
    #[serde(default)]
    pub parameters: Value,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt + completion.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// Adds another call's usage.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// Tokens a chat template adds around each message and each tool (role markers, separators),
/// as the estimates below count them.
const FRAMING_TOKENS: u64 = 16;

/// Bytes of what a model reads of `messages` and `tools`: texts, tool calls, tool names,
/// descriptions and schemas.
fn prompt_bytes(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let messages: usize = messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    let tools: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    (messages + tools) as u64
}

/// A guess of the tokens of `messages` and `tools` as a prompt: four bytes a token, plus the
/// framing of each message and tool. What a call that reported no usage is counted as, and
/// what the agent loop fits into a context window.
pub fn estimate_prompt_tokens(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    prompt_bytes(messages, tools).div_ceil(4)
        + (messages.len() + tools.len()) as u64 * FRAMING_TOKENS / 4
}

/// At most how many tokens `messages` and `tools` make as a prompt: the tokenizers of the
/// models this mesh runs (byte-level BPE, SentencePiece with byte fallback) make no token of
/// less than one byte of text, so the bytes bound the text's tokens, plus the framing of each
/// message and tool. What a front door reserves of a key's budget for a prompt before a model
/// has counted it: an over-estimate, released when the model reports what it counted.
pub fn prompt_token_bound(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    prompt_bytes(messages, tools) + (messages.len() + tools.len()) as u64 * FRAMING_TOKENS
}

/// A guess of the tokens of `bytes` bytes of generated text (four bytes a token).
pub fn estimate_text_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// What is sent to a model: by the agent loop, by the front door, and between nodes (as JSON
/// inside `agentmesh.v1.Models/Chat`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// How to generate, when a client of the front door said so.
    #[serde(default)]
    pub sampling: Sampling,
    /// The shape the answer must have (`response_format`); `None`: free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Whether, and which, tool the model must call; `None` leaves it to the model (`auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

impl ChatRequest {
    /// The estimate of what a call of this request that did not finish spent: its prompt (the
    /// server read it) and the `streamed` bytes of text it passed on.
    pub fn estimate_cut_off(&self, streamed: usize) -> Usage {
        Usage {
            prompt_tokens: estimate_prompt_tokens(&self.messages, &self.tools),
            completion_tokens: estimate_text_tokens(streamed),
        }
    }
}

/// The shape an answer must have, as OpenAI's `response_format` says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON that validates against `schema`.
    JsonSchema {
        /// The schema's name (OpenAI requires one; it is only echoed).
        name: String,
        /// The JSON schema.
        schema: Value,
        /// OpenAI's strict mode (schemas are always enforced here where they are enforced).
        #[serde(default)]
        strict: bool,
    },
}

/// Which tool the model must call, as OpenAI's `tool_choice` says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// No tool: answer in text.
    None,
    /// The model decides (the default).
    Auto,
    /// Some tool must be called.
    Required,
    /// This function must be called.
    Function(String),
}

/// Generation settings a client asked for; unset ones leave the model's own defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature (0 to 2; an embedded model decodes greedily unless it is above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling: the probability mass to draw from (above 0, at most 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Strings that end the answer (not part of it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Seed of the draw, for repeatable answers where the backend supports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl Sampling {
    /// Most stop strings (OpenAI's limit), and their longest length in bytes.
    pub const MAX_STOPS: usize = 4;
    /// See [`Sampling::MAX_STOPS`].
    pub const MAX_STOP_LEN: usize = 256;

    /// Checks the ranges OpenAI allows; the error starts with the field's name.
    pub fn check(&self) -> Result<(), String> {
        if self.max_tokens == Some(0) {
            return Err("max_tokens: must be at least 1".into());
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(format!("temperature: {t} is not between 0 and 2"));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(format!("top_p: {p} is not above 0 and at most 1"));
        }
        if self.stop.len() > Self::MAX_STOPS
            || self.stop.iter().any(|s| s.len() > Self::MAX_STOP_LEN)
        {
            return Err(format!(
                "stop: at most {} strings of at most {} bytes",
                Self::MAX_STOPS,
                Self::MAX_STOP_LEN
            ));
        }
        Ok(())
    }
}

/// A model's complete answer to one request; between nodes it travels as the last chunk of a
/// `agentmesh.v1.Models/Chat` stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The configured name of the model that answered (set by the chain that called it).
    pub model: String,
    /// Text (also streamed as deltas while it was generated).
    pub content: String,
    /// Tool calls, in order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Usage as the server reported it; `None` when it did not.
    #[serde(default)]
    pub usage: Option<Usage>,
}

impl ChatResponse {
    /// Usage as the server reported it, or when it reported none, estimated from `request` and
    /// this answer ([`estimate_prompt_tokens`], [`estimate_text_tokens`]).
    pub fn usage_or_estimate(&self, request: &ChatRequest) -> Usage {
        self.usage.unwrap_or_else(|| Usage {
            prompt_tokens: estimate_prompt_tokens(&request.messages, &request.tools),
            completion_tokens: estimate_text_tokens(
                self.content.len()
                    + self
                        .tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>(),
            ),
        })
    }
}
