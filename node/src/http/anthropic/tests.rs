use std::collections::BTreeMap;

use axum::http::HeaderValue;
use mesh_domain::{ChatResponse, Role, Sampling, ToolCall, ToolChoice, Usage};

use super::{translate::*, *};
use crate::{
    config::UnknownFields,
    gateway::{Event, GatewayError},
    http::{clients::Unknown, encode::Encoder},
};

/// Reads `body` with `http.unknown_fields = "refuse"`, as Anthropic itself reads.
fn read(body: Value) -> Result<MessagesRequest, ApiError> {
    read_messages(
        body.to_string().as_bytes(),
        Unknown::new(UnknownFields::Refuse),
    )
}

/// A valid request with `extra` fields set (a `null` removes one).
fn with(extra: Value) -> Value {
    let mut body = json!({"model": "m", "max_tokens": 64,
                          "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().expect("object") {
        if v.is_null() {
            body.as_object_mut().expect("object").remove(k);
        } else {
            body[k] = v.clone();
        }
    }
    body
}

#[test]
fn messages_and_blocks_become_the_chat_interface() {
    let read = read(json!({
        "model": "role:chat",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": true},
                {"type": "text", "text": "thanks"}
            ]}
        ],
        "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "weather"},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "stream": true,
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    }))
    .expect("valid");
    assert!(read.stream);
    let chat = &read.call.chat;
    let roles: Vec<Role> = chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    assert_eq!(chat.messages[0].content, "be brief");
    assert_eq!(chat.messages[1].content, "weather\nin Paris?");
    assert_eq!(chat.messages[2].content, "Let me look.");
    assert_eq!(chat.messages[2].tool_calls[0].id, "toolu_1");
    assert_eq!(
        serde_json::from_str::<Value>(&chat.messages[2].tool_calls[0].arguments).expect("json"),
        json!({"city": "Paris"})
    );
    assert_eq!(chat.messages[3].content, "sunny");
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(chat.messages[4].content, "Error: no such city");
    assert_eq!(chat.messages[5].content, "thanks");
    assert_eq!(chat.tools[0].parameters, json!({"type": "object"}));
    assert_eq!(
        chat.tool_choice,
        Some(ToolChoice::Function("weather".into()))
    );
    assert_eq!(
        chat.sampling,
        Sampling {
            max_tokens: Some(100),
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            seed: None,
        }
    );
    for (choice, expected) in [
        ("auto", ToolChoice::Auto),
        ("any", ToolChoice::Required),
        ("none", ToolChoice::None),
    ] {
        let chosen = self::read(with(json!({"tool_choice": {"type": choice},
                        "tools": [{"name": "f", "input_schema": {"type": "object"}}]})))
        .expect(choice);
        assert_eq!(chosen.call.chat.tool_choice, Some(expected));
    }
}

/// Each kind of bad input is a 400 whose message starts with the field's path.
#[test]
fn bad_input_names_the_field() {
    let cases = [
        (json!({"max_tokens": null}), "max_tokens: Field required"),
        (json!({"max_tokens": "ten"}), "max_tokens: Input should be"),
        (json!({"model": 7}), "model: Input should be a valid string"),
        (
            json!({"messages": "hi"}),
            "messages: Input should be a valid list",
        ),
        (json!({"messages": []}), "messages: must not be empty"),
        (
            json!({"frobnicate": true}),
            "frobnicate: Extra inputs are not permitted",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "name": "n"}]}),
            "messages.0.name: Extra inputs are not permitted",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages.0.role: Input should be 'user', 'assistant' or 'system'",
        ),
        (
            json!({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]}),
            "messages.0.content.0.type: `image` blocks are not supported",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages.0.content.0.type: `image` blocks are not supported",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]}),
            "messages.0.content.0.content.0.type: `document` blocks are not supported",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
            "messages.0.content.0.type: `tool_use` is not a block agentmesh reads here",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}),
            "messages.0.content.0.input: Input should be a valid dictionary",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}),
            "messages.0.content.0.extra: Extra inputs are not permitted",
        ),
        (json!({"top_k": 40}), "top_k: is not supported"),
        (
            json!({"temperature": 1.5}),
            "temperature: 1.5 is not between 0 and 1",
        ),
        (
            json!({"stop_sequences": [1]}),
            "stop_sequences.0: Input should be",
        ),
        (
            json!({"stop_sequences": ["a", "b", "c", "d", "e"]}),
            "stop_sequences: at most 4",
        ),
        (json!({"container": "c"}), "container: is not supported"),
        (
            json!({"tools": [{"name": "f"}]}),
            "tools.0.input_schema: Field required",
        ),
        (
            json!({"tool_choice": {"type": "sometimes"}}),
            "tool_choice.type: `sometimes` is not auto, any, tool or none",
        ),
        (
            json!({"tool_choice": {"type": "tool", "name": "g"}}),
            "tool_choice: names the function `g`",
        ),
        (
            json!({"tool_choice": {"type": "any"}}),
            "tool_choice: `required` needs at least one tool",
        ),
        (
            json!({"thinking": {"type": "maybe"}}),
            "thinking.type: `maybe` is not enabled, disabled or adaptive",
        ),
        (
            json!({"stream": "yes"}),
            "stream: Input should be a valid boolean",
        ),
    ];
    for (edit, expected) in cases {
        let error = read(with(edit.clone())).expect_err(&edit.to_string());
        assert_eq!(error.status, StatusCode::BAD_REQUEST, "{edit}");
        assert!(
            error.message.starts_with(expected),
            "{edit}: {} (wanted {expected})",
            error.message
        );
    }
    for body in [&b"not json"[..], b"[1]"] {
        let error =
            read_messages(body, Unknown::new(UnknownFields::Ignore)).expect_err("not an object");
        assert!(
            error.message.starts_with("request body"),
            "{}",
            error.message
        );
    }
}

/// Regression (issue 27): Claude Code sends `role: "system"` messages inside `messages`
/// for a model name it does not know (`mid-conversation-system-2026-04-07`), and the mesh
/// answered every turn with a 400 on `messages.1.role`. They are system turns where they
/// stand.
#[test]
fn system_messages_in_the_conversation_are_system_turns_where_they_stand() {
    let read = read(json!({
        "model": "role:coder", "max_tokens": 32,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Available agent types: claude"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": [{"type": "text", "text": "a reminder", "cache_control": {"type": "ephemeral"}}]},
            {"role": "user", "content": "again"}
        ]
    }))
    .expect("valid");
    let turns: Vec<(Role, &str)> = read
        .call
        .chat
        .messages
        .iter()
        .map(|m| (m.role, m.content.as_str()))
        .collect();
    assert_eq!(
        turns,
        [
            (Role::System, "be brief"),
            (Role::User, "hi"),
            (Role::System, "Available agent types: claude"),
            (Role::Assistant, "hello"),
            (Role::System, "a reminder"),
            (Role::User, "again"),
        ]
    );
}

/// By default a field Anthropic's API does not define, at any depth, is ignored and noted
/// by its path; with `refuse` the same request is a 400 naming the first.
#[test]
fn unknown_fields_are_ignored_and_noted_unless_refused() {
    let body = with(json!({
        "frobnicate": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "sparkle": 1}], "name": "n"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "future_flag": true}]
    }));
    let lenient = read_messages(
        body.to_string().as_bytes(),
        Unknown::new(UnknownFields::Ignore),
    )
    .expect("ignored");
    let mut noted = lenient.unknown.found().to_vec();
    noted.sort();
    assert_eq!(
        noted,
        [
            "frobnicate",
            "messages.0.content.0.sparkle",
            "messages.0.name",
            "tools.0.future_flag"
        ]
    );
    assert_eq!(lenient.call.chat.messages[0].content, "hi");
    let refused = read(body).expect_err("refused");
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        refused.message, "frobnicate: Extra inputs are not permitted",
        "Anthropic's own words"
    );
    // A field Anthropic defines that the mesh cannot honour is refused either way.
    let error = read_messages(
        with(json!({"top_k": 5})).to_string().as_bytes(),
        Unknown::new(UnknownFields::Ignore),
    )
    .expect_err("top_k");
    assert!(error.message.starts_with("top_k:"), "{}", error.message);
}

/// A server tool (it runs on Anthropic's side; no node runs it) is not offered to the
/// model and is named for the `x-agentmesh-dropped-tools` header, rather than a 400.
#[test]
fn server_tools_are_dropped_and_named() {
    let read = read(with(json!({"tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"name": "f", "input_schema": {"type": "object"}},
        {"type": "code_execution_20250825", "name": "code_execution"}
    ]})))
    .expect("valid");
    assert_eq!(read.call.chat.tools.len(), 1);
    assert_eq!(read.call.chat.tools[0].name, "f");
    assert_eq!(
        read.dropped,
        [
            "web_search_20250305:web_search",
            "code_execution_20250825:code_execution"
        ]
    );
}

#[test]
fn count_tokens_counts_the_text_of_every_part_once() {
    let value = json!({
        "model": "m",
        "system": "be brief",
        "messages": [{"role": "user", "content": "hello world"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}],
        "tools": [{"name": "f", "description": "does f", "input_schema": {"type": "object"}}]
    });
    let unknown = RefCell::new(Unknown::new(UnknownFields::Refuse));
    let conversation =
        read_conversation(&Obj::at(String::new(), &value, &unknown).expect("object"))
            .expect("valid without max_tokens");
    assert_eq!(
        countable_text(&conversation),
        "system\nbe brief\nuser\nhello world\nassistant\n\nf {\"a\":1}\nf\ndoes f\n{\"type\":\"object\"}\n"
    );
}

#[test]
fn the_version_header_must_be_a_date_and_may_be_missing() {
    let mut headers = HeaderMap::new();
    assert!(check_version(&headers).is_ok());
    headers.insert(VERSION_HEADER, HeaderValue::from_static("2023-06-01"));
    assert!(check_version(&headers).is_ok());
    for bad in ["2023-6-1", "latest", "2023-06-01x", "20230601"] {
        headers.insert(VERSION_HEADER, HeaderValue::from_static(bad));
        let error = check_version(&headers).expect_err(bad);
        assert!(
            error.message.starts_with(VERSION_HEADER),
            "{}",
            error.message
        );
    }
}

fn answer(content: &str, calls: &[(&str, &str)]) -> ChatResponse {
    ChatResponse {
        model: "served".into(),
        content: content.into(),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (name, arguments))| ToolCall {
                id: format!("call_{i}"),
                name: (*name).into(),
                arguments: (*arguments).into(),
            })
            .collect(),
        usage: Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 3,
        }),
    }
}

#[test]
fn answers_become_messages_and_broken_tool_arguments_name_the_model() {
    let message = message_json(
        "msg_1",
        &answer("Looking.", &[("weather", r#"{"city": "Paris"}"#)]),
    )
    .expect("valid");
    assert_eq!(message["model"], "served");
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Looking."},
               {"type": "tool_use", "id": "call_0", "name": "weather", "input": {"city": "Paris"}}])
    );
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 12, "output_tokens": 3})
    );
    let plain = message_json("msg_2", &answer("Hi.", &[("f", "")])).expect("valid");
    assert_eq!(plain["content"][1]["input"], json!({}));
    let text = message_json("msg_3", &answer("Hi.", &[])).expect("valid");
    assert_eq!(text["stop_reason"], "end_turn");
    for broken in ["{\"city\": ", "[1, 2]", "\"Paris\""] {
        let error = message_json("msg_4", &answer("", &[("weather", broken)])).expect_err(broken);
        assert_eq!(error.status, StatusCode::BAD_GATEWAY);
        assert!(
            error
                .message
                .starts_with("model `served` called tool `weather`"),
            "{}",
            error.message
        );
    }
}

/// The event names of `frames`, and their data.
fn parse_frames(frames: &[String]) -> Vec<(String, Value)> {
    frames
        .iter()
        .map(|f| {
            let (event, data) = f
                .strip_prefix("event: ")
                .and_then(|f| f.split_once("\ndata: "))
                .expect("an event frame");
            assert!(data.ends_with("\n\n"), "{f:?}");
            (event.to_owned(), serde_json::from_str(data).expect("json"))
        })
        .collect()
}

#[test]
fn a_stream_sends_anthropics_events_in_order() {
    let mut encoder = Events::new("msg_1".into(), "m".into());
    let mut frames = encoder.start();
    for text in ["Hel", "lo"] {
        frames.extend(encoder.event(Event::Delta {
            choice: 0,
            text: text.into(),
        }));
    }
    frames.extend(encoder.event(Event::Done {
        choice: 0,
        response: answer("Hello", &[("f", r#"{"a": 1}"#)]),
    }));
    frames.extend(encoder.end());
    let events = parse_frames(&frames);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (event, data) in &events {
        assert_eq!(data["type"], event.as_str(), "{data}");
    }
    assert_eq!(events[0].1["message"]["id"], "msg_1");
    assert_eq!(
        events[3].1["delta"],
        json!({"type": "text_delta", "text": "Hel"})
    );
    assert_eq!(events[6].1["index"], 1);
    assert_eq!(events[6].1["content_block"]["name"], "f");
    assert_eq!(
        events[7].1["delta"],
        json!({"type": "input_json_delta", "partial_json": r#"{"a":1}"#})
    );
    assert_eq!(events[9].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[9].1["usage"]["output_tokens"], 3);

    // A failure after the start is one `error` event, and nothing after it.
    let mut encoder = Events::new("msg_2".into(), "m".into());
    let mut frames = encoder.start();
    // A 502, as peers that failed are.
    frames.extend(encoder.event(Event::Failed(GatewayError::Chat(
        crate::chat::ChatError::Peers("node gpu: gone".into()),
    ))));
    frames.extend(encoder.end());
    let events = parse_frames(&frames);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].0, "error");
    assert_eq!(
        events[2].1,
        json!({"type": "error", "error": {"type": "api_error", "message": "node gpu: gone"}})
    );

    // Broken tool arguments are an error, not a tool_use block; a run that ends without
    // an answer is one too.
    let mut encoder = Events::new("msg_3".into(), "m".into());
    let frames = encoder.event(Event::Done {
        choice: 0,
        response: answer("", &[("f", "{broken")]),
    });
    let events = parse_frames(&frames);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "error");
    let mut encoder = Events::new("msg_4".into(), "m".into());
    assert_eq!(parse_frames(&encoder.end())[0].0, "error");
}

#[test]
fn the_models_list_has_anthropics_shape() {
    let models = BTreeMap::from([
        ("a".to_owned(), "gpu".to_owned()),
        ("role:chat".to_owned(), "gpu".to_owned()),
    ]);
    let list = models_list(&models);
    assert_eq!(list["data"][1]["id"], "role:chat");
    assert_eq!(list["data"][0]["type"], "model");
    assert_eq!(
        (&list["first_id"], &list["last_id"]),
        (&json!("a"), &json!("role:chat"))
    );
    assert_eq!(list["has_more"], false);
}
