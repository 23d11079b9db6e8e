//! OpenAI's embeddings (`POST /v1/embeddings`), translated to and from the gateway's
//! embeddings path (`gateway::Gateway::embed`).
//!
//! `input` is a string, a list of strings, or token ids of OpenAI's cl100k_base (one list of
//! ids, or a list of such lists, as langchain's `OpenAIEmbeddings` sends by default): ids are
//! decoded to their text, which the serving model embeds (it tokenizes the text its own way).
//! `encoding_format` is `float` (the default) or `base64` (each vector's little-endian f32
//! bytes, as OpenAI sends them, and what the official Python client asks for by default);
//! `dimensions` is accepted only when it equals what the model makes (the mesh does not shorten
//! vectors); `user` is accepted and not used. Any other field is ignored, or with
//! `http.unknown_fields = "refuse"` a 400 naming it.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Extension, State},
    http::{HeaderMap, StatusCode},
};
use base64::Engine as _;
use mesh_domain::{EmbedRequest, EmbedResponse};
use serde_json::{Map, Value, json};

use super::{translate::check_fields, wire::Fields};
use crate::{
    gateway::DoorCaller,
    http::{
        cl100k,
        clients::{Unknown, client_name},
        door::FrontDoor,
        error::{ApiError, ErrorKind},
    },
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

/// Most cl100k token ids in one input, as OpenAI bounds an input.
const MAX_INPUT_IDS: usize = 8192;
/// Most cl100k token ids in one request, as OpenAI bounds a request.
const MAX_REQUEST_IDS: usize = 300_000;

/// What `input` holds.
#[derive(Debug, PartialEq)]
enum Inputs {
    /// Texts.
    Texts(Vec<String>),
    /// Lists of cl100k_base token ids, one list per input.
    Tokens(Vec<Vec<u32>>),
}

/// An embeddings request, read and checked (everything but the bounds of the texts, which the
/// gateway checks for every dialect).
#[derive(Debug, PartialEq)]
struct Embeddings {
    /// The model asked for.
    model: String,
    inputs: Inputs,
    /// How to write the vectors.
    encoding: Encoding,
    /// The dimension the client insists on, when it does.
    dimensions: Option<u64>,
}

/// Reads OpenAI's request JSON; errors name the field, fields the mesh does not know are noted
/// in `unknown`.
fn read(body: &[u8], unknown: &mut Unknown) -> Result<Embeddings, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    let Value::Object(object) = value else {
        return Err(ApiError::bad_request("request body: must be a JSON object"));
    };
    check_fields(
        &object,
        Fields {
            read: READ,
            ignored: &[],
            unsupported: &[],
        },
        unknown,
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
        inputs: inputs(&object)?,
        encoding,
        dimensions,
    })
}

/// A 400 about `input`, at `at` (`input[2]`, `input[0][7]`).
fn bad_input(at: &str, problem: impl std::fmt::Display) -> ApiError {
    ApiError {
        param: Some("input".into()),
        ..ApiError::bad_request(format!("{at}: {problem}"))
    }
}

/// `input`: a string, a list of strings, a list of token ids, or a list of lists of them.
fn inputs(object: &Map<String, Value>) -> Result<Inputs, ApiError> {
    const SHAPES: &str = "give a string, a list of strings, or cl100k_base token ids (a list of integers, or a list of such lists)";
    let items = match object.get("input") {
        Some(Value::String(text)) => return Ok(Inputs::Texts(vec![text.clone()])),
        Some(Value::Array(items)) => items,
        None => {
            return Err(ApiError::bad_field(
                "input",
                format!("is missing; {SHAPES}"),
            ));
        }
        Some(other) => return Err(bad_input("input", format!("{other} is not text; {SHAPES}"))),
    };
    match items.first() {
        Some(Value::Number(_)) => Ok(Inputs::Tokens(vec![token_ids("input", items)?])),
        Some(Value::Array(_)) => {
            let mut lists = Vec::with_capacity(items.len());
            let mut total = 0;
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let Value::Array(ids) = item else {
                    return Err(bad_input(
                        &at,
                        format!("{item} is not a list of token ids; {SHAPES}"),
                    ));
                };
                total += ids.len();
                if total > MAX_REQUEST_IDS {
                    return Err(bad_input(
                        "input",
                        format!("more than {MAX_REQUEST_IDS} token ids in one request; split it"),
                    ));
                }
                lists.push(token_ids(&at, ids)?);
            }
            Ok(Inputs::Tokens(lists))
        }
        _ => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(bad_input(
                    &format!("input[{i}]"),
                    format!("{other} is not a string (a list of texts holds only texts)"),
                )),
            })
            .collect::<Result<_, _>>()
            .map(Inputs::Texts),
    }
}

/// One input's token ids: integers a cl100k_base id can be, at most [`MAX_INPUT_IDS`].
fn token_ids(at: &str, ids: &[Value]) -> Result<Vec<u32>, ApiError> {
    if ids.is_empty() {
        return Err(bad_input(at, "the list of token ids is empty"));
    }
    if ids.len() > MAX_INPUT_IDS {
        return Err(bad_input(
            at,
            format!(
                "{} token ids, at most {MAX_INPUT_IDS} per input; split it",
                ids.len()
            ),
        ));
    }
    ids.iter()
        .enumerate()
        .map(|(j, id)| {
            id.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| bad_input(&format!("{at}[{j}]"), format!("{id} is not a token id")))
        })
        .collect()
}

/// The texts of `inputs`: token ids decoded with cl100k_base (off the async runtime: the first
/// use loads the tokenizer).
async fn texts(inputs: Inputs) -> Result<Vec<String>, ApiError> {
    let lists = match inputs {
        Inputs::Texts(texts) => return Ok(texts),
        Inputs::Tokens(lists) => lists,
    };
    let decoded = tokio::task::spawn_blocking(move || {
        lists
            .iter()
            .enumerate()
            .map(|(i, ids)| {
                cl100k::decode(ids).map_err(|e| match e {
                    cl100k::DecodeError::UnknownId(_) => bad_input(&format!("input[{i}]"), e),
                    cl100k::DecodeError::Unavailable(_) => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        ErrorKind::Unavailable,
                        format!("decode the token ids of input[{i}]: {e}"),
                    ),
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    decoded.unwrap_or_else(|e| {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable,
            format!("decode the token ids: {e}"),
        ))
    })
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
pub(crate) async fn embeddings(
    State(door): State<Arc<FrontDoor>>,
    Extension(caller): Extension<DoorCaller>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut unknown = door.clients.reading();
    let asked = read(&body, &mut unknown)?;
    door.clients.ignored(
        &client_name(caller.key_name(), &headers),
        "/v1/embeddings",
        &unknown,
    );
    let request = EmbedRequest {
        inputs: texts(asked.inputs).await?,
    };
    let model = door.model_for(&asked.model);
    let response = door.gateway.embed(&caller, &model, &request).await?;
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
    use crate::config::UnknownFields;

    /// Reads `body` with `http.unknown_fields = "refuse"`.
    fn read_json(body: Value) -> Result<Embeddings, String> {
        read(
            body.to_string().as_bytes(),
            &mut Unknown::new(UnknownFields::Refuse),
        )
        .map_err(|e| e.message)
    }

    #[test]
    fn texts_and_token_ids_are_read_and_bad_input_names_the_field() {
        let one = read_json(json!({"model": "e", "input": "hi", "user": "u"})).expect("string");
        assert_eq!(one.inputs, Inputs::Texts(vec!["hi".into()]));
        assert_eq!(one.encoding, Encoding::Float);
        let many = read_json(json!({"model": "e", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}))
            .expect("list");
        assert_eq!(many.inputs, Inputs::Texts(vec!["a".into(), "b".into()]));
        assert_eq!(many.encoding, Encoding::Base64);
        assert_eq!(many.dimensions, Some(8));
        let ids = read_json(json!({"model": "e", "input": [15339, 1917]})).expect("ids");
        assert_eq!(ids.inputs, Inputs::Tokens(vec![vec![15339, 1917]]));
        let lists = read_json(json!({"model": "e", "input": [[15339], [1917, 0]]})).expect("lists");
        assert_eq!(
            lists.inputs,
            Inputs::Tokens(vec![vec![15339], vec![1917, 0]])
        );
        let too_long = vec![1u32; MAX_INPUT_IDS + 1];
        let refused = [
            (
                json!({"model": "e", "input": [1, "a"]}),
                "input[1]: \"a\" is not a token id",
            ),
            (
                json!({"model": "e", "input": [1, -2]}),
                "input[1]: -2 is not a token id",
            ),
            (
                json!({"model": "e", "input": [[1], 2]}),
                "input[1]: 2 is not a list",
            ),
            (
                json!({"model": "e", "input": [[1], [1.5]]}),
                "input[1][0]: 1.5 is not a token id",
            ),
            (
                json!({"model": "e", "input": [[]]}),
                "input[0]: the list of token ids is empty",
            ),
            (
                json!({"model": "e", "input": too_long}),
                "input: 8193 token ids, at most 8192",
            ),
            (json!({"model": "e", "input": 7}), "input: 7 is not text"),
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
                "Unrecognized request argument supplied: truncate",
            ),
        ];
        for (body, start) in refused {
            let error = read_json(body.clone()).expect_err("refused");
            assert!(error.starts_with(start), "{body}: {error}");
        }
        let lists = vec![vec![1u32; 5000]; 61];
        let error = read_json(json!({"model": "e", "input": lists})).expect_err("too many ids");
        assert!(error.contains("more than 300000 token ids"), "{error}");
    }

    /// Regression (issue 27): langchain's `OpenAIEmbeddings` sends cl100k token ids by default
    /// and the mesh answered 400; they are decoded to the text they stand for.
    #[tokio::test]
    async fn token_ids_decode_to_their_text_and_unknown_ids_are_named() {
        let decoded = texts(Inputs::Tokens(vec![vec![15339, 1917], vec![15339]]))
            .await
            .expect("decoded");
        assert_eq!(decoded, ["hello world", "hello"]);
        let error = texts(Inputs::Tokens(vec![vec![15339], vec![4_000_000]]))
            .await
            .expect_err("not an id");
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(
            error
                .message
                .starts_with("input[1]: 4000000 is not a token id"),
            "{}",
            error.message
        );
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
