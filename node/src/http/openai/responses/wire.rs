//! OpenAI's Responses request as it comes over the wire: the fields the mesh reads, accepts and
//! ignores, or refuses, their bounds, and the serde struct of the part it uses. What they mean
//! for a chat is `translate`'s.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Fields of a Responses request that are read (and so honoured or refused by value).
pub(super) const READ: &[&str] = &[
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
pub(super) const IGNORED: &[&str] = &[
    "client_metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "reasoning",
    "stream_options",
];

/// Fields OpenAI defines that the mesh does not offer (refused unless null).
pub(super) const UNSUPPORTED: &[&str] = &[
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
pub(super) const INCLUDABLE: &[&str] = &["reasoning.encrypted_content"];

/// Most `metadata` pairs, and the longest key and value, as OpenAI bounds them.
pub(super) const METADATA_PAIRS: usize = 16;
pub(super) const METADATA_KEY: usize = 64;
pub(super) const METADATA_VALUE: usize = 512;

/// The part of a Responses request the mesh uses; items, tools and formats stay JSON until
/// they are translated, so each error can name the item at fault.
#[derive(Debug, Deserialize)]
pub(super) struct ResponsesRequest {
    pub(super) model: String,
    #[serde(default)]
    pub(super) input: Option<Input>,
    #[serde(default)]
    pub(super) instructions: Option<String>,
    #[serde(default)]
    pub(super) tools: Option<Vec<Value>>,
    #[serde(default)]
    pub(super) tool_choice: Option<Value>,
    #[serde(default)]
    pub(super) text: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) max_output_tokens: Option<u32>,
    #[serde(default)]
    pub(super) temperature: Option<f32>,
    #[serde(default)]
    pub(super) top_p: Option<f32>,
    #[serde(default)]
    pub(super) store: Option<bool>,
    #[serde(default)]
    pub(super) previous_response_id: Option<String>,
    #[serde(default)]
    pub(super) metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default)]
    pub(super) parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub(super) include: Option<Vec<String>>,
    #[serde(default)]
    pub(super) truncation: Option<String>,
    #[serde(default)]
    pub(super) top_logprobs: Option<u32>,
    #[serde(default)]
    pub(super) background: Option<bool>,
    #[serde(default)]
    pub(super) max_tool_calls: Option<u32>,
}

/// `input`: a text (one user message) or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Input {
    Text(String),
    Items(Vec<Value>),
}
