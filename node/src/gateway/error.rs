//! [`GatewayError`]: every way the gateway refuses or fails a front-door call, typed and without
//! an HTTP status. `http` maps it to each dialect's error shape once (`http::error`); the
//! gateway never picks a status, a code or a JSON shape.

use super::data::MeshDataError;
use crate::{admission::AdmissionError, api_keys::Refusal, chat::ChatError, memory::MemoryError};

/// Why the gateway did not give a call its answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum GatewayError {
    /// The request asks for something no call may (an empty conversation, `n` out of range, a
    /// `tool_choice` naming no tool, …); `param` names the field at fault, when one does.
    #[error("{message}")]
    Invalid {
        /// The request field at fault.
        param: Option<String>,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The caller's key may not make the call (a model, a scope, a limit), or its usage cannot
    /// be counted.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The caller's key may not use the model a request that runs nothing names (Anthropic's
    /// `count_tokens`, which is neither counted nor charged).
    #[error("key `{key}` may not use `{model}`; ask for a model or role the key allows")]
    ModelNotAllowed {
        /// The key's name.
        key: String,
        /// The model or role asked for.
        model: String,
    },
    /// Nothing can take the call: an unknown model, a fleet that cannot serve it now, or a tier
    /// this node does not allow a front-door caller.
    #[error(transparent)]
    Placement(#[from] AdmissionError),
    /// A placed chat or embedding produced no answer.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// The run stopped before every choice had its answer.
    #[error("the chat ended without an answer")]
    NoAnswer,
    /// No stored response `id` for this caller: unknown, expired, stored with another key, or
    /// not yet replicated here; all the same, so a key cannot learn of others' ids.
    #[error(
        "{}response with id `{id}` not found: it is unknown, expired, stored with another key, or not yet replicated to this node (a continuation on another node needs the first answer to have replicated, usually within a second)",
        param.as_ref().map_or(String::new(), |p| format!("{p}: "))
    )]
    NotStored {
        /// The response id asked for.
        id: String,
        /// The request field that named it (`previous_response_id`), if one did.
        param: Option<String>,
    },
    /// A data tool of the fleet (`/mcp`'s node list and memory tools) gave no answer.
    #[error(transparent)]
    Data(#[from] MeshDataError),
    /// The stored conversations cannot be read now.
    #[error("read stored response `{id}`: {error}")]
    Store {
        /// The response id asked for.
        id: String,
        /// What the memory said.
        error: MemoryError,
    },
}

impl GatewayError {
    /// A refusal of `field`; the message starts with the field's name.
    pub(crate) fn invalid_field(field: &str, problem: impl std::fmt::Display) -> Self {
        Self::Invalid {
            param: Some(field.to_owned()),
            message: format!("{field}: {problem}"),
        }
    }

    /// A refusal of the request as a whole (or of a field its message names).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid {
            param: None,
            message: message.into(),
        }
    }

    /// Whether the model asked for exists nowhere in the fleet (a dialect may word that in its
    /// own API's terms).
    pub(crate) fn is_unknown_model(&self) -> bool {
        matches!(self, Self::Placement(AdmissionError::UnknownModel(_)))
    }
}
