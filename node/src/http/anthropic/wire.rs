//! Anthropic's Messages request as it comes over the wire: the version header, the fields and
//! blocks the mesh reads, accepts or refuses, and [`Obj`], the reader that walks the request's
//! JSON with each value's path (`messages.0.content.1`) for the errors. What the request means
//! for a chat is `translate`'s.

use std::cell::RefCell;

use serde_json::{Map, Value};

use crate::http::{clients::Unknown, error::ApiError};

/// The header naming the API version a client speaks.
pub(crate) const VERSION_HEADER: &str = "anthropic-version";

/// Request fields read (and so honoured or refused by value). `temperature`, `top_p` and
/// `top_k` are gone from the newest API but older clients (and Claude Code) still send them.
pub(super) const READ: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "stream",
    "thinking",
    "output_config",
    "context_management",
];

/// Fields Anthropic defines that do not change the answer: accepted and not used.
pub(super) const IGNORED: &[&str] = &[
    "metadata",
    "service_tier",
    "cache_control",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
];

/// Fields Anthropic defines that the mesh does not offer.
pub(super) const UNSUPPORTED: &[&str] = &["container", "mcp_servers", "diagnostics"];

/// Block types Anthropic defines that the mesh's models cannot read.
pub(super) const UNSUPPORTED_BLOCKS: &[&str] = &[
    "image",
    "document",
    "search_result",
    "container_upload",
    "server_tool_use",
    "web_search_tool_result",
];

/// A JSON object of the request, with its path (`messages.0.content.1`) for the errors, and
/// the reading that notes its unknown fields.
pub(super) struct Obj<'a> {
    pub(super) path: String,
    pub(super) map: &'a Map<String, Value>,
    pub(super) unknown: &'a RefCell<Unknown>,
}

impl<'a> Obj<'a> {
    /// `value` at `path`, which must be an object.
    pub(super) fn at(
        path: String,
        value: &'a Value,
        unknown: &'a RefCell<Unknown>,
    ) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { path, map, unknown }),
            _ => Err(ApiError::bad_field(&path, "Input should be an object")),
        }
    }

    /// The object `value` at `path`, read like this one.
    pub(super) fn child(&self, path: String, value: &'a Value) -> Result<Self, ApiError> {
        Self::at(path, value, self.unknown)
    }

    /// The path of `field` in this object.
    pub(super) fn path_of(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{field}", self.path)
        }
    }

    /// Notes every field not in `known`: ignored, or (with `http.unknown_fields = "refuse"`)
    /// refused in Anthropic's words.
    pub(super) fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        let mut unknown = self.unknown.borrow_mut();
        for extra in self.map.keys().filter(|k| !known.contains(&k.as_str())) {
            unknown
                .note(self.path_of(extra))
                .map_err(|path| ApiError::bad_field(&path, "Extra inputs are not permitted"))?;
        }
        Ok(())
    }

    /// `field`, absent when missing or `null`.
    pub(super) fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub(super) fn required(&self, field: &str) -> Result<&'a Value, ApiError> {
        self.get(field)
            .ok_or_else(|| ApiError::bad_field(&self.path_of(field), "Field required"))
    }

    pub(super) fn wrong(&self, field: &str, what: &str) -> ApiError {
        ApiError::bad_field(&self.path_of(field), format!("Input should be {what}"))
    }

    pub(super) fn str(&self, field: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong(field, "a valid string"))
            })
            .transpose()
    }

    pub(super) fn required_str(&self, field: &str) -> Result<&'a str, ApiError> {
        self.required(field)?;
        Ok(self.str(field)?.unwrap_or_default())
    }

    pub(super) fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.wrong(field, "a valid boolean"))
            })
            .transpose()
    }

    pub(super) fn u32(&self, field: &str) -> Result<Option<u32>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.wrong(field, "a valid non-negative integer"))
            })
            .transpose()
    }

    pub(super) fn f32(&self, field: &str) -> Result<Option<f32>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| self.wrong(field, "a valid number"))
            })
            .transpose()
    }

    pub(super) fn array(&self, field: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| self.wrong(field, "a valid list"))
            })
            .transpose()
    }

    pub(super) fn object(&self, field: &str) -> Result<Option<Obj<'a>>, ApiError> {
        self.get(field)
            .map(|v| self.child(self.path_of(field), v))
            .transpose()
    }
}

/// The request body as a JSON object.
pub(super) fn body_json(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request("request body: must be a JSON object"))
    }
}
