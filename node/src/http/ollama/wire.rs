//! Ollama's request bodies as they come over the wire: serde structs of the fields the mesh
//! reads (Ollama's own decoder ignores the others, and so does this one), and [`read`], which
//! names a field of the wrong type by its path.

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Map, Value};

use crate::http::error::ApiError;

/// The Ollama release `GET /api/version` reports. Clients gate features on it (structured
/// output needs 0.5.0; Raycast asks for 0.6.4, Continue for 0.6.5), and this is the release
/// whose API the dialect follows, so it clears those checks without claiming newer features.
pub(super) const VERSION: &str = "0.12.0";

/// Content type of a streamed answer.
pub(super) const NDJSON: &str = "application/x-ndjson";

/// A request body read as `T`; a field of the wrong type is a 400 naming its path.
pub(super) fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        match e.inner().classify() {
            serde_json::error::Category::Data if path != "." => {
                ApiError::bad_field(&path, e.inner())
            }
            _ => ApiError::bad_request(format!("request body: {}", e.inner())),
        }
    })
}

/// `POST /api/chat`'s body (fields not listed are ignored, as Ollama does: `keep_alive`, …).
#[derive(Debug, Default, Deserialize)]
pub(super) struct ChatBody {
    #[serde(default)]
    pub(super) model: String,
    #[serde(default)]
    pub(super) format: Option<Value>,
    #[serde(default)]
    pub(super) options: Option<Map<String, Value>>,
    /// Ollama streams unless told not to.
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default)]
    pub(super) think: Option<Value>,
    #[serde(default)]
    pub(super) logprobs: Option<bool>,
    #[serde(default)]
    pub(super) top_logprobs: Option<u32>,
    #[serde(default)]
    pub(super) messages: Option<Vec<OllamaMessage>>,
    #[serde(default)]
    pub(super) tools: Option<Vec<OllamaTool>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct OllamaMessage {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Option<String>,
    #[serde(default)]
    pub(super) images: Option<Vec<Value>>,
    #[serde(default)]
    pub(super) tool_calls: Option<Vec<OllamaToolCall>>,
    /// Which tool a `tool` message answers.
    #[serde(default)]
    pub(super) tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct OllamaToolCall {
    #[serde(default)]
    pub(super) id: Option<String>,
    pub(super) function: OllamaFunctionCall,
}

#[derive(Debug, Deserialize)]
pub(super) struct OllamaFunctionCall {
    pub(super) name: String,
    /// A JSON object in Ollama; JSON text is taken too.
    #[serde(default)]
    pub(super) arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(super) struct OllamaTool {
    pub(super) function: OllamaFunction,
}

#[derive(Debug, Deserialize)]
pub(super) struct OllamaFunction {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: Option<String>,
    #[serde(default)]
    pub(super) parameters: Option<Value>,
}

/// `POST /api/generate`'s body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct GenerateBody {
    #[serde(default)]
    pub(super) model: String,
    #[serde(default)]
    pub(super) format: Option<Value>,
    #[serde(default)]
    pub(super) options: Option<Map<String, Value>>,
    /// Ollama streams unless told not to.
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default)]
    pub(super) think: Option<Value>,
    #[serde(default)]
    pub(super) logprobs: Option<bool>,
    #[serde(default)]
    pub(super) top_logprobs: Option<u32>,
    #[serde(default)]
    pub(super) prompt: Option<String>,
    #[serde(default)]
    pub(super) system: Option<String>,
    #[serde(default)]
    pub(super) suffix: Option<String>,
    #[serde(default)]
    pub(super) images: Option<Vec<Value>>,
    #[serde(default)]
    pub(super) context: Option<Vec<Value>>,
    #[serde(default)]
    pub(super) raw: Option<bool>,
    #[serde(default)]
    pub(super) template: Option<String>,
}

/// `POST /api/show`'s body (`name` is the older spelling of `model`).
#[derive(Debug, Deserialize)]
pub(super) struct ShowBody {
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) name: Option<String>,
}

/// `POST /api/embed`'s body (`/api/embeddings`, the older endpoint, sends one `prompt`).
#[derive(Debug, Default, Deserialize)]
pub(super) struct EmbedBody {
    #[serde(default)]
    pub(super) model: String,
    #[serde(default)]
    pub(super) input: Option<Value>,
    #[serde(default)]
    pub(super) prompt: Option<String>,
    #[serde(default)]
    pub(super) dimensions: Option<u64>,
}
