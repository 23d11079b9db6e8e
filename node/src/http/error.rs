//! The front door's one error, and its three wire shapes.
//!
//! Every failure a front-door request can end in is an [`ApiError`]: an HTTP status, a neutral
//! [`ErrorKind`], a message that names what is wrong and how to fix it, and optionally the
//! request field at fault and when to retry. Each API dialect renders it in the shape its
//! clients parse ([`Dialect`]): OpenAI's `{"error": {message, type, param, code}}` (also used
//! by the Responses API), Anthropic's `{"type": "error", "error": {type, message}}` and
//! Ollama's `{"error": message}`. The official clients pick their exception class from the
//! status, so the status is the part that must be right everywhere.

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    admission::AdmissionError,
    api_keys::Refusal,
    chat::ChatError,
    gateway::{GatewayError, MeshDataError},
    llm::ModelError,
};

/// What went wrong, independent of any API's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// The request is malformed or asks for something that cannot be done (400, 404 for an
    /// unknown endpoint, 413 for an oversized one).
    InvalidRequest,
    /// No key, or an unknown one (401).
    Authentication,
    /// The key or certificate may not do this (403).
    Permission,
    /// The model (or stored response) does not exist anywhere in the fleet (404).
    NotFound,
    /// A key's budget or rate limit is used up (429).
    RateLimited,
    /// Nothing can serve it right now (503), or a model failed (502, 504).
    Unavailable,
}

/// A front-door failure, rendered in the shape of the API that was called.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub kind: ErrorKind,
    /// OpenAI's machine-readable `code` (`model_not_found`, `invalid_api_key`, …).
    pub code: Option<&'static str>,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
    /// Seconds until a limit resets (`Retry-After`).
    pub retry_after_s: Option<u64>,
}

/// Which API a request came in through, so its errors come back in that API's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// OpenAI chat completions, embeddings, models, and the Responses API.
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
    /// Ollama's API.
    Ollama,
}

impl Dialect {
    /// The dialect of a request path: `/v1/messages…` Anthropic, `/api/…` Ollama, else OpenAI.
    pub(crate) fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            Self::Anthropic
        } else if path.starts_with("/api/") {
            Self::Ollama
        } else {
            Self::OpenAi
        }
    }
}

impl ApiError {
    /// An error of `kind` with `status`.
    pub(crate) fn new(status: StatusCode, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// A 400 naming what is wrong with the request.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, message)
    }

    /// A 400 about `field`; the message starts with the field's name.
    pub(crate) fn bad_field(field: &str, problem: impl std::fmt::Display) -> Self {
        Self {
            param: Some(field.to_owned()),
            ..Self::bad_request(format!("{field}: {problem}"))
        }
    }

    /// With OpenAI's `code`.
    pub(crate) fn with_code(self, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..self
        }
    }

    /// A request nobody can place.
    pub(crate) fn from_admission(error: AdmissionError) -> Self {
        let message = error.to_string();
        match error {
            AdmissionError::UnknownModel(_) => {
                Self::new(StatusCode::NOT_FOUND, ErrorKind::NotFound, message)
                    .with_code("model_not_found")
            }
            // Only a task asks for an evaluator; one started over HTTP maps like `Nowhere`.
            AdmissionError::Nowhere(_)
            | AdmissionError::NoEvaluator { .. }
            | AdmissionError::Draining { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                message,
            ),
            AdmissionError::TierCap { .. } => {
                Self::new(StatusCode::FORBIDDEN, ErrorKind::Permission, message)
            }
            AdmissionError::HopLimit { .. } => Self::bad_request(message),
            AdmissionError::CannotEmbed(_) => Self {
                param: Some("model".into()),
                ..Self::bad_request(message).with_code("model_not_supported")
            },
        }
    }

    /// A call its key may not make: a model it may not use or an endpoint its scopes do not
    /// cover (403), a limit reached or too little left of it (429, with `Retry-After`, the
    /// code naming the limit), or usage that cannot be counted (503).
    pub(crate) fn from_refusal(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::Model { .. } => {
                Self::new(StatusCode::FORBIDDEN, ErrorKind::Permission, message)
                    .with_code("model_not_allowed")
            }
            Refusal::Scope { .. } => {
                Self::new(StatusCode::FORBIDDEN, ErrorKind::Permission, message)
                    .with_code("scope_not_allowed")
            }
            Refusal::Limit {
                kind,
                retry_after_s,
                ..
            } => Self {
                retry_after_s: Some(retry_after_s),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorKind::RateLimited,
                    message,
                )
                .with_code(kind.as_str())
            },
            Refusal::Unavailable { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                message,
            ),
        }
    }

    /// A placed chat that produced no answer.
    pub(crate) fn from_chat(error: ChatError) -> Self {
        match error {
            ChatError::Model(error) => Self::from_model(&error),
            ChatError::NotLoaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
            ChatError::Peers(failed) => {
                Self::new(StatusCode::BAD_GATEWAY, ErrorKind::Unavailable, failed)
            }
        }
    }

    /// A model that failed here.
    pub(crate) fn from_model(error: &ModelError) -> Self {
        match error {
            ModelError::Refused { status, .. } => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST);
                let kind = match status.as_u16() {
                    401 => ErrorKind::Authentication,
                    403 => ErrorKind::Permission,
                    404 => ErrorKind::NotFound,
                    _ => ErrorKind::InvalidRequest,
                };
                Self::new(status, kind, error.to_string())
            }
            ModelError::Timeout(_) => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
            _ => Self::new(
                StatusCode::BAD_GATEWAY,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
        }
    }

    /// A gateway's refusal or failure: the one mapping of [`GatewayError`] to a status, a
    /// kind and OpenAI's code, which every dialect then renders in its shape.
    pub(crate) fn from_gateway(error: GatewayError) -> Self {
        match error {
            GatewayError::Invalid { param, message } => Self {
                param,
                ..Self::bad_request(message)
            },
            GatewayError::Refused(refusal) => Self::from_refusal(refusal),
            GatewayError::ModelNotAllowed { .. } => Self::new(
                StatusCode::FORBIDDEN,
                ErrorKind::Permission,
                error.to_string(),
            )
            .with_code("model_not_allowed"),
            GatewayError::Placement(error) => Self::from_admission(error),
            GatewayError::Chat(error) => Self::from_chat(error),
            GatewayError::NoAnswer => Self::new(
                StatusCode::BAD_GATEWAY,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
            GatewayError::NotStored { ref param, .. } => Self {
                param: param.clone(),
                ..Self::new(
                    StatusCode::NOT_FOUND,
                    ErrorKind::NotFound,
                    error.to_string(),
                )
                .with_code(if param.is_some() {
                    "previous_response_not_found"
                } else {
                    "response_not_found"
                })
            },
            GatewayError::Data(MeshDataError::NoKey { .. }) => Self::new(
                StatusCode::NOT_FOUND,
                ErrorKind::NotFound,
                error.to_string(),
            ),
            GatewayError::Data(MeshDataError::Memory(_)) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
            GatewayError::Store { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unavailable,
                error.to_string(),
            ),
        }
    }

    /// The error's JSON body in `dialect`'s shape.
    pub(crate) fn body(&self, dialect: Dialect) -> Value {
        match dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message,
                "type": match self.kind {
                    ErrorKind::InvalidRequest | ErrorKind::NotFound => "invalid_request_error",
                    // OpenAI answers an unknown key with `invalid_request_error`, code
                    // `invalid_api_key`; its clients key on the status.
                    ErrorKind::Authentication => "invalid_request_error",
                    ErrorKind::Permission => "permission_error",
                    ErrorKind::RateLimited => "rate_limit_error",
                    ErrorKind::Unavailable => "api_error",
                },
                "param": self.param,
                "code": self.code,
            }}),
            Dialect::Anthropic => json!({"type": "error", "error": {
                "type": match self.kind {
                    ErrorKind::InvalidRequest => "invalid_request_error",
                    ErrorKind::Authentication => "authentication_error",
                    ErrorKind::Permission => "permission_error",
                    ErrorKind::NotFound => "not_found_error",
                    ErrorKind::RateLimited => "rate_limit_error",
                    ErrorKind::Unavailable if self.status == StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
                    ErrorKind::Unavailable => "api_error",
                },
                "message": self.message,
            }}),
            Dialect::Ollama => json!({"error": self.message}),
        }
    }

    /// The whole response in `dialect`'s shape (status, `Retry-After`, JSON body).
    pub(crate) fn render(self, dialect: Dialect) -> Response {
        let mut response = (self.status, Json(self.body(dialect))).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<GatewayError> for ApiError {
    fn from(error: GatewayError) -> Self {
        Self::from_gateway(error)
    }
}

/// As OpenAI's error JSON, carrying the error itself in the response's extensions so the front
/// door's `shape` middleware can render it in the dialect of the path it answers.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.clone().render(Dialect::OpenAi);
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each dialect's shape carries the message, and the kind in that API's own words.
    #[test]
    fn each_dialect_has_its_shape() {
        let error = ApiError {
            retry_after_s: Some(30),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorKind::RateLimited,
                "key `team`: 100 requests per minute used; resets in 30 s",
            )
        };
        let openai = error.body(Dialect::OpenAi);
        assert_eq!(openai["error"]["type"], "rate_limit_error");
        assert_eq!(openai["error"]["message"], error.message.as_str());
        let anthropic = error.body(Dialect::Anthropic);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "rate_limit_error");
        assert_eq!(error.body(Dialect::Ollama)["error"], error.message.as_str());
        let response = error.render(Dialect::Anthropic);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "30");
    }

    #[test]
    fn paths_pick_their_dialect() {
        assert_eq!(Dialect::of_path("/v1/messages"), Dialect::Anthropic);
        assert_eq!(
            Dialect::of_path("/v1/messages/count_tokens"),
            Dialect::Anthropic
        );
        assert_eq!(Dialect::of_path("/api/chat"), Dialect::Ollama);
        assert_eq!(Dialect::of_path("/v1/responses"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/v1/chat/completions"), Dialect::OpenAi);
    }
}
