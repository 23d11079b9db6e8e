//! OpenAI's embeddings (`POST /v1/embeddings`), translated to and from the gateway's
//! [`gateway::embed`].
//!
//! `input` is a string or a list of strings (a list of token ids, or of token-id lists, is a
//! 400 naming `input`: the mesh's models take text); `encoding_format` is `float` (the
//! default) or `base64` (each vector's little-endian f32 bytes, as OpenAI sends them, and what
//! the official Python client asks for by default); `dimensions` is accepted only when it
//! equals what the model makes (the mesh does not shorten vectors); `user` is accepted and not
//! used. Any other field is a 400 naming it.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Extension, State},
};
use base64::Engine as _;
use mesh_domain::{EmbedRequest, EmbedResponse};
use serde_json::{Map, Value, json};

use super::{
    door::FrontDoor,
    error::ApiError,
    gateway::{self, Caller},
    openai,
};

/// The fields of an embeddings request that are read.
const READ: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// How the vectors are written in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// An embeddings request, read and checked (everything but the bounds of the texts, which the
/// gateway checks for every dialect).
#[derive(Debug, PartialEq)]
struct Embeddings {
    /// The model asked for.
    model: String,
    /// The texts.
    request: EmbedRequest,
    /// How to write the vectors.
    encoding: Encoding,
    /// The dimension the client insists on, when it does.
    dimensions: Option<u64>,
}

/// Reads OpenAI's request JSON; errors name the field.
fn read(body: &[u8]) -> Result<Embeddings, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let Value::Object(object) = value else {
        return Err(ApiError::bad_request("request body: must be a JSON object"));
    };
    openai::check_fields(
        &object,
        openai::Fields {
            read: READ,
            ignored: &[],
            unsupported: &[],
        },
    )?;
    let model = match object.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => return Err(ApiError::bad_field("model", "name the model (a string)")),
    };
    let encoding = match object.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(f)) if f == "float" => Encoding::Float,
        Some(Value::String(f)) if f == "base64" => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::bad_field(
                "encoding_format",
                format!("{other} is not supported; use \"float\" or \"base64\""),
            ));
        }
    };
    let dimensions = match object.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err(ApiError::bad_field(
                    "dimensions",
                    format!("{value} is not a positive integer"),
                ));
            }
        },
    };
    Ok(Embeddings {
        model,
        request: EmbedRequest {
            inputs: inputs(&object)?,
        },
        encoding,
        dimensions,
    })
}

/// `input`: a string or a list of strings.
fn inputs(object: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    const TEXT_ONLY: &str = "only text is supported: a string or a list of strings (token-id arrays are not; send the text itself)";
    match object.get("input") {
        Some(Value::String(text)) => Ok(vec![text.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.clone()),
                Value::Number(_) | Value::Array(_) => Err(ApiError::bad_field("input", TEXT_ONLY)),
                other => Err(ApiError {
                    param: Some("input".into()),
                    ..ApiError::bad_request(format!("input[{i}]: {other} is not a string"))
                }),
            })
            .collect(),
        None => Err(ApiError::bad_field(
            "input",
            "is missing; give a string or a list of strings",
        )),
        Some(_) => Err(ApiError::bad_field("input", TEXT_ONLY)),
    }
}

/// One vector as `encoding` writes it.
fn encode(vector: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(vector),
        Encoding::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// OpenAI's answer: a list of embeddings in input order, the serving model, the usage.
fn answer(response: &EmbedResponse, encoding: Encoding) -> Value {
    let data: Vec<Value> = response
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": encode(v, encoding)}))
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": response.model,
        "usage": {"prompt_tokens": response.prompt_tokens, "total_tokens": response.prompt_tokens},
    })
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let asked = read(&body)?;
    let response = gateway::embed(&door, &caller, &asked.model, &asked.request).await?;
    let made = response.vectors.first().map_or(0, Vec::len) as u64;
    if let Some(wanted) = asked.dimensions
        && wanted != made
    {
        return Err(ApiError::bad_field(
            "dimensions",
            format!(
                "model `{}` makes {made}-dimensional vectors and the mesh does not shorten them; leave dimensions out or set it to {made}",
                response.model
            ),
        ));
    }
    Ok(Json(answer(&response, asked.encoding)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(body: Value) -> Result<Embeddings, String> {
        read(body.to_string().as_bytes()).map_err(|e| e.message)
    }

    #[test]
    fn a_string_or_a_list_of_strings_is_read_and_bad_input_names_the_field() {
        let one = read_json(json!({"model": "e", "input": "hi", "user": "u"})).expect("string");
        assert_eq!(one.request.inputs, ["hi"]);
        assert_eq!(one.encoding, Encoding::Float);
        let many = read_json(json!({"model": "e", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}))
            .expect("list");
        assert_eq!(many.request.inputs, ["a", "b"]);
        assert_eq!(many.encoding, Encoding::Base64);
        assert_eq!(many.dimensions, Some(8));
        let refused = [
            (
                json!({"model": "e", "input": [1, 2, 3]}),
                "input: only text",
            ),
            (
                json!({"model": "e", "input": [[1, 2], [3]]}),
                "input: only text",
            ),
            (json!({"model": "e", "input": 7}), "input: only text"),
            (
                json!({"model": "e", "input": ["a", null]}),
                "input[1]: null",
            ),
            (json!({"model": "e"}), "input: is missing"),
            (json!({"input": "x"}), "model:"),
            (
                json!({"model": "e", "input": "x", "encoding_format": "int8"}),
                "encoding_format: \"int8\"",
            ),
            (
                json!({"model": "e", "input": "x", "dimensions": 0}),
                "dimensions: 0",
            ),
            (
                json!({"model": "e", "input": "x", "dimensions": "8"}),
                "dimensions:",
            ),
            (
                json!({"model": "e", "input": "x", "truncate": true}),
                "truncate: unrecognized",
            ),
        ];
        for (body, start) in refused {
            let error = read_json(body.clone()).expect_err("refused");
            assert!(error.starts_with(start), "{body}: {error}");
        }
    }

    #[test]
    fn base64_is_the_little_endian_f32_bytes_as_openai_sends_them() {
        let vector = [1.0f32, -0.5, 0.25];
        // 1.0 = 0x3f800000, -0.5 = 0xbf000000, 0.25 = 0x3e800000, little-endian.
        let expected = base64::engine::general_purpose::STANDARD
            .encode([0, 0, 0x80, 0x3f, 0, 0, 0, 0xbf, 0, 0, 0x80, 0x3e]);
        assert_eq!(encode(&vector, Encoding::Base64), Value::String(expected));
        assert_eq!(encode(&vector, Encoding::Float), json!([1.0, -0.5, 0.25]));
        let response = EmbedResponse {
            model: "e".into(),
            vectors: vec![vector.to_vec(), vec![0.0; 3]],
            prompt_tokens: 4,
        };
        let answer = answer(&response, Encoding::Float);
        assert_eq!(answer["data"][1]["index"], 1);
        assert_eq!(answer["model"], "e");
        assert_eq!(answer["usage"]["total_tokens"], 4);
    }
}
