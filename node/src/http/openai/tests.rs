use mesh_domain::{ResponseFormat, Sampling, Target, ToolChoice};

use super::{translate::*, *};
use crate::{config::UnknownFields, http::clients::Unknown};

/// Reads `body` with `http.unknown_fields = "refuse"`.
fn read(body: Value) -> Result<ChatCompletion, ApiError> {
    read_chat_completion(
        body.to_string().as_bytes(),
        &mut Unknown::new(UnknownFields::Refuse),
    )
}

#[test]
fn openai_messages_become_chat_requests_and_bad_roles_name_the_field() {
    let read = read(json!({
        "model": "role:chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "n": 2,
        "temperature": 0.2,
        "user": "someone"
    }))
    .expect("valid");
    let (call, chat) = (&read.call, &read.call.chat);
    assert_eq!(call.model, "role:chat");
    assert_eq!(call.target, Target::Role("chat".into()));
    assert_eq!(call.n, 2);
    assert_eq!(chat.messages[1].content, "hi there");
    assert_eq!(chat.messages[2].tool_calls[0].name, "f");
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(chat.tools[0].name, "f");
    assert_eq!(chat.tool_choice, Some(ToolChoice::Function("f".into())));
    assert!(matches!(
        chat.response_format,
        Some(ResponseFormat::JsonSchema { .. })
    ));
    let error = self::read(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}))
        .expect_err("bad role");
    assert_eq!(error.param.as_deref(), Some("messages[0].role"));
}

fn sampling(extra: Value) -> Result<Sampling, String> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    read(body)
        .map(|c| c.call.chat.sampling)
        .map_err(|e| e.message)
}

#[test]
fn generation_settings_are_taken_and_bad_ones_name_the_field() {
    assert_eq!(sampling(json!({})), Ok(Sampling::default()));
    let taken = sampling(json!({"max_tokens": 7, "temperature": 0.25, "top_p": 0.5,
                                "stop": "END", "seed": 42}))
    .expect("valid");
    assert_eq!(
        taken,
        Sampling {
            max_tokens: Some(7),
            temperature: Some(0.25),
            top_p: Some(0.5),
            stop: vec!["END".into()],
            seed: Some(42),
        }
    );
    // The newer name wins; a list of stops is taken as is.
    let newer = sampling(json!({"max_tokens": 7, "max_completion_tokens": 9, "stop": ["a", "b"]}))
        .expect("valid");
    assert_eq!((newer.max_tokens, newer.stop.len()), (Some(9), 2));
    for (bad, field) in [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"stop": ["1", "2", "3", "4", "5"]}), "stop"),
        (json!({"n": 0}), "n"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"audio": {"voice": "x"}}), "audio"),
    ] {
        let error = sampling(bad.clone()).expect_err("invalid");
        assert!(error.starts_with(field), "{bad}: {error}");
    }
    // Fields that do not change the answer are accepted.
    assert!(sampling(json!({"user": "u", "store": false, "presence_penalty": 0})).is_ok());
}

/// A field OpenAI does not define is ignored and noted by default, and refused in OpenAI's
/// words with `refuse`; one it defines that the mesh does not offer is refused either way.
#[test]
fn unknown_fields_are_ignored_and_noted_unless_refused() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "top_k": 40, "client_metadata": {"a": "b"}});
    let error = read(body.clone()).expect_err("refused");
    assert_eq!(
        error.message,
        "Unrecognized request argument supplied: top_k"
    );
    assert_eq!(error.param.as_deref(), Some("top_k"));
    let mut unknown = Unknown::new(UnknownFields::Ignore);
    read_chat_completion(body.to_string().as_bytes(), &mut unknown).expect("ignored");
    let mut noted = unknown.found().to_vec();
    noted.sort();
    assert_eq!(noted, ["client_metadata", "top_k"]);
    let mut unknown = Unknown::new(UnknownFields::Ignore);
    let error = read_chat_completion(
        br#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "audio": {}}"#,
        &mut unknown,
    )
    .expect_err("audio is OpenAI's and not offered");
    assert_eq!(error.param.as_deref(), Some("audio"));
}
