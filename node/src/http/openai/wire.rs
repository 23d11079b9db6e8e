//! OpenAI's chat-completions request as it comes over the wire: the fields the mesh reads,
//! those it accepts and ignores, those it refuses, and the serde structs of the part it uses.
//! What they mean for a chat is `translate`'s.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Fields of a chat-completions request that are read (and so honoured or refused by value).
pub(super) const READ: &[&str] = &[
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
pub(super) const IGNORED: &[&str] = &[
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
pub(super) const UNSUPPORTED: &[&str] = &[
    "audio",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
];

/// The part of an OpenAI chat request the mesh uses.
#[derive(Debug, Deserialize)]
pub(super) struct OpenAiRequest {
    pub(super) model: String,
    pub(super) messages: Vec<OpenAiMessage>,
    #[serde(default)]
    pub(super) tools: Vec<OpenAiTool>,
    #[serde(default)]
    pub(super) tool_choice: Option<Value>,
    #[serde(default)]
    pub(super) response_format: Option<Value>,
    #[serde(default)]
    pub(super) n: Option<u32>,
    #[serde(default)]
    pub(super) stream: bool,
    #[serde(default)]
    pub(super) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(super) max_tokens: Option<u32>,
    /// The newer name of `max_tokens`.
    #[serde(default)]
    pub(super) max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub(super) temperature: Option<f32>,
    #[serde(default)]
    pub(super) top_p: Option<f32>,
    #[serde(default)]
    pub(super) stop: Option<Stop>,
    #[serde(default)]
    pub(super) seed: Option<u64>,
    #[serde(default)]
    pub(super) frequency_penalty: Option<f32>,
    #[serde(default)]
    pub(super) presence_penalty: Option<f32>,
    #[serde(default)]
    pub(super) logprobs: Option<bool>,
    #[serde(default)]
    pub(super) top_logprobs: Option<u32>,
    #[serde(default)]
    pub(super) logit_bias: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) modalities: Option<Vec<String>>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct OpenAiMessage {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Option<Value>,
    #[serde(default)]
    pub(super) tool_calls: Vec<OpenAiToolCall>,
    #[serde(default)]
    pub(super) tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct OpenAiToolCall {
    pub(super) id: String,
    pub(super) function: OpenAiFunctionCall,
}

#[derive(Debug, Deserialize)]
pub(super) struct OpenAiFunctionCall {
    pub(super) name: String,
    #[serde(default)]
    pub(super) arguments: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct OpenAiTool {
    pub(super) function: OpenAiFunction,
}

#[derive(Debug, Deserialize)]
pub(super) struct OpenAiFunction {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: String,
    #[serde(default)]
    pub(super) parameters: Value,
}

/// The fields an OpenAI endpoint's request may carry, as the mesh treats them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fields {
    /// Read (and so honoured, or refused by value).
    pub read: &'static [&'static str],
    /// Defined by OpenAI, not changing the answer: accepted and not used.
    pub ignored: &'static [&'static str],
    /// Defined by OpenAI, not offered by the mesh: refused unless `null`.
    pub unsupported: &'static [&'static str],
}

/// Chat completions' fields.
pub(super) const CHAT_FIELDS: Fields = Fields {
    read: READ,
    ignored: IGNORED,
    unsupported: UNSUPPORTED,
};
