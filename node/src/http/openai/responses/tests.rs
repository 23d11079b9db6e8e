use axum::http::StatusCode;
use mesh_domain::{ChatResponse, ResponseFormat, ToolCall, ToolChoice, Usage};
use serde_json::json;

use super::{stream::*, translate::*, *};
use crate::{
    api_keys::KeyGrant,
    config::UnknownFields,
    gateway::{Event, GatewayError, conversations::Conversations},
    http::{clients::Unknown, encode::Encoder},
};

/// Reads `body` with `http.unknown_fields = "refuse"`.
fn read(body: Value) -> Result<ResponsesCall, ApiError> {
    read_responses_call(
        body.to_string().as_bytes(),
        &mut Unknown::new(UnknownFields::Refuse),
    )
}

/// Every kind of input item becomes the chat message it means; tools, tool choice and
/// format are taken.
#[test]
fn input_items_become_chat_messages() {
    let call = read(json!({
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "use tools"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Oslo?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                  {"type": "function", "name": "time", "description": "now", "strict": true}],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
        "max_output_tokens": 50,
        "temperature": 0.5,
        "store": false,
        "metadata": {"who": "test"}
    }))
    .expect("valid");
    assert_eq!(call.instructions.as_deref(), Some("be brief"));
    assert!(!call.store);
    let roles: Vec<Role> = call.input.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool
        ]
    );
    assert_eq!(call.input[1].content, "weather in Oslo?");
    // The calls join the assistant's text before them.
    assert_eq!(call.input[2].content, "checking");
    let names: Vec<&str> = call.input[2]
        .tool_calls
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["weather", "time"]);
    assert_eq!(call.input[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(call.input[4].content, "noon");
    assert_eq!(call.chat.tools[1].description, "now");
    assert_eq!(call.chat.tools[1].parameters["type"], "object");
    assert_eq!(
        call.chat.tool_choice,
        Some(ToolChoice::Function("weather".into()))
    );
    assert!(matches!(
        call.chat.response_format,
        Some(ResponseFormat::JsonSchema { strict: true, .. })
    ));
    assert_eq!(call.chat.sampling.max_tokens, Some(50));
    // A text is one user message.
    let text = read(json!({"model": "m", "input": "hi"})).expect("valid");
    assert_eq!(text.input, [Message::text(Role::User, "hi")]);
    assert!(text.store && !text.stream);
}

/// Bad input is a 400 naming the field at fault.
#[test]
fn bad_input_names_the_field() {
    for (body, param) in [
        (json!({"model": "m"}), "input"),
        (json!({"model": "m", "input": []}), "input"),
        (
            json!({"model": "m", "input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"model": "m", "input": [{"role": "user"}]}),
            "input[0].content",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"model": "m", "input": ["x"]}), "input[0]"),
        (
            json!({"model": "m", "input": [{"type": "item_reference", "id": "r"}]}),
            "input[0].type",
        ),
        (
            json!({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"name": "f"}]}),
            "tools[0].type",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a__b"},
                {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]}]}),
            "tools",
        ),
        (
            json!({"model": "m", "input": "x", "client_data": {}}),
            "client_data",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "function"}]}),
            "tools[0].name",
        ),
        (
            json!({"model": "m", "input": "x", "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
            "text.format.name",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": "object"}}}),
            "text.format.schema",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"colour": "red"}}),
            "text.colour",
        ),
        (
            json!({"model": "m", "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": "m", "input": "x", "background": true}),
            "background",
        ),
        (
            json!({"model": "m", "input": "x", "include": ["message.output_text.logprobs"]}),
            "include[0]",
        ),
        (
            json!({"model": "m", "input": "x", "truncation": "auto"}),
            "truncation",
        ),
        (
            json!({"model": "m", "input": "x", "top_logprobs": 3}),
            "top_logprobs",
        ),
        (
            json!({"model": "m", "input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (
            json!({"model": "m", "input": "x", "metadata": {"k": 1}}),
            "metadata.k",
        ),
        (json!({"model": "m", "input": "x", "top_k": 40}), "top_k"),
    ] {
        let error = read(body.clone()).expect_err(param);
        assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            error.param.as_deref(),
            Some(param),
            "{body}: {}",
            error.message
        );
        // Named first, or in OpenAI's own words for an unknown argument.
        assert!(
            error.message.starts_with(param)
                || error.message == format!("Unrecognized request argument supplied: {param}"),
            "{body}: {}",
            error.message
        );
    }
    // Wrong types are a 400 too, naming the field in serde's words.
    let error = read(json!({"model": "m", "input": "x", "temperature": "hot"})).expect_err("type");
    assert_eq!(error.status, StatusCode::BAD_REQUEST);
    assert!(
        error.message.contains("temperature") || error.message.contains("f32"),
        "{}",
        error.message
    );
    // What does not change the answer is accepted.
    assert!(read(json!({"model": "m", "input": "x", "user": "u", "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"], "truncation": "disabled", "parallel_tool_calls": false})).is_ok());
}

fn head() -> Head {
    Head {
        id: "resp_0abc".into(),
        created_at: 1,
        model: "asked".into(),
        instructions: None,
        previous_response_id: None,
        echo: read(json!({"model": "asked", "input": "x"}))
            .expect("valid")
            .echo,
        namespaces: Namespaces::new(),
    }
}

/// Regression (issue 27): Codex sends `client_metadata` on every request, offers a
/// `namespace` tool (its sub-agents) and a hosted `web_search`, and sends its earlier
/// reasoning back; the mesh refused all of them with a 400. Now `client_metadata` is
/// accepted, the namespace's functions are offered flat, hosted tools are dropped and
/// named, and reasoning items are skipped.
#[test]
fn codex_requests_are_read_with_namespaces_flattened_and_hosted_tools_dropped() {
    let call = read(json!({
        "model": "role:coder",
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "be precise"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "spawned"}
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "strict": false, "parameters": {"type": "object"}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "strict": false, "parameters": {"type": "object"}},
                {"type": "custom", "name": "freeform"}
            ]},
            {"type": "web_search", "external_web_access": false},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "client_metadata": {"session_id": "s"}
    }))
    .expect("Codex's request is read");
    let names: Vec<&str> = call.chat.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["exec_command", "multi_agent_v1__spawn_agent"]);
    assert_eq!(call.chat.tools[1].description, "Sub-agents.\n\nSpawn one.");
    assert_eq!(
        call.dropped,
        [
            "custom:multi_agent_v1__freeform",
            "web_search",
            "custom:apply_patch"
        ]
    );
    assert_eq!(
        call.namespaces["multi_agent_v1__spawn_agent"],
        ("multi_agent_v1".to_owned(), "spawn_agent".to_owned())
    );
    let roles: Vec<Role> = call.input.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(
        call.input[2].tool_calls[0].name,
        "multi_agent_v1__spawn_agent"
    );
    // A call of the flattened function goes back to the client as its namespace's.
    let head = Head {
        namespaces: call.namespaces.clone(),
        ..head()
    };
    let item = head.call_item(
        0,
        &ToolCall {
            id: "c2".into(),
            name: "multi_agent_v1__spawn_agent".into(),
            arguments: "{}".into(),
        },
        "completed",
        "{}",
    );
    assert_eq!(item["name"], "spawn_agent");
    assert_eq!(item["namespace"], "multi_agent_v1");
    let plain = head.call_item(
        1,
        &ToolCall {
            id: "c3".into(),
            name: "exec_command".into(),
            arguments: "{}".into(),
        },
        "completed",
        "{}",
    );
    assert_eq!(plain["name"], "exec_command");
    assert!(plain.get("namespace").is_none(), "{plain}");
    let header = dropped_header(&call.dropped);
    assert_eq!(
        header[crate::http::clients::DROPPED_TOOLS_HEADER],
        "custom:multi_agent_v1__freeform, web_search, custom:apply_patch"
    );
    assert!(dropped_header(&[]).is_empty());
}

fn events() -> Events {
    Events {
        head: head(),
        keeper: None,
        seq: 0,
        message_open: false,
        answer: None,
        failed: false,
    }
}

/// The frames' data, parsed.
fn data(frames: Vec<String>) -> Vec<Value> {
    frames
        .iter()
        .map(|f| {
            let (event, data) = f.split_once('\n').expect("two lines");
            let value: Value =
                serde_json::from_str(data.trim_start_matches("data: ").trim_end()).expect("json");
            assert_eq!(
                event,
                format!("event: {}", value["type"].as_str().expect("type"))
            );
            value
        })
        .collect()
}

async fn stream(events: &mut Events, script: Vec<Event>) -> Vec<Value> {
    let mut frames = events.start();
    for event in script {
        frames.extend(events.event(event));
    }
    frames.extend(events.close().await);
    data(frames)
}

/// A streamed text answer: the lifecycle, the message item and its part around the deltas,
/// numbered from 0 without gaps, the serving model and usage in the completed response.
#[tokio::test]
async fn a_streamed_answer_has_the_events_in_order() {
    let mut encoder = events();
    let answer = ChatResponse {
        model: "served".into(),
        content: "hello".into(),
        tool_calls: Vec::new(),
        usage: Some(Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
        }),
    };
    let values = stream(
        &mut encoder,
        vec![
            Event::Delta {
                choice: 0,
                text: "hel".into(),
            },
            Event::Delta {
                choice: 0,
                text: "lo".into(),
            },
            Event::Done {
                choice: 0,
                response: answer,
            },
        ],
    )
    .await;
    let kinds: Vec<&str> = values
        .iter()
        .map(|v| v["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, value) in values.iter().enumerate() {
        assert_eq!(value["sequence_number"], json!(i));
    }
    assert_eq!(values[6]["text"], "hello");
    let completed = &values[9]["response"];
    assert_eq!(completed["id"], values[0]["response"]["id"]);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["model"], "served");
    assert_eq!(completed["output"][0]["id"], values[2]["item"]["id"]);
    assert_eq!(completed["output"][0]["content"][0]["text"], "hello");
    assert_eq!(completed["usage"]["total_tokens"], 5);
    assert_eq!(completed["store"], false);
}

/// Tool calls come as whole function_call items after the message; a failure is `error`
/// and `response.failed`, and nothing completes after it.
#[tokio::test]
async fn tool_calls_and_failures_have_their_events() {
    let mut encoder = events();
    let answer = ChatResponse {
        model: "served".into(),
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: String::new(),
            name: "f".into(),
            arguments: "{}".into(),
        }],
        usage: None,
    };
    let values = stream(
        &mut encoder,
        vec![Event::Done {
            choice: 0,
            response: answer,
        }],
    )
    .await;
    let kinds: Vec<&str> = values
        .iter()
        .map(|v| v["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let call = &values[6]["response"]["output"][0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "f");
    // A backend without call ids gets one, the same in every event.
    assert_eq!(call["call_id"], "call_0abc_0");
    assert_eq!(values[2]["item"]["call_id"], "call_0abc_0");

    let mut encoder = events();
    // A 502, as a model's failure is.
    let error = GatewayError::Chat(crate::chat::ChatError::Peers("the model failed".into()));
    let values = stream(
        &mut encoder,
        vec![
            Event::Delta {
                choice: 0,
                text: "par".into(),
            },
            Event::Failed(error),
        ],
    )
    .await;
    let kinds: Vec<&str> = values
        .iter()
        .map(|v| v["type"].as_str().expect("type"))
        .collect();
    assert_eq!(kinds[kinds.len() - 2..], ["error", "response.failed"]);
    assert_eq!(
        values.last().expect("failed")["response"]["error"]["message"],
        "the model failed"
    );
}

/// A streamed answer is stored before `response.completed` is sent, so a continuation sent
/// as soon as the client reads it finds it; the stored conversation ends with the answer.
#[tokio::test]
async fn a_streamed_answer_is_stored_before_it_completes() {
    let (_dir, conversations) = Conversations::in_temp_memory();
    let mut encoder = events();
    let alice = DoorCaller {
        key: Some(KeyGrant::named("alice", "sk-alice-0123456789")),
    };
    encoder.keeper = Some(conversations.keeper(&alice, vec![Message::text(Role::User, "hi")]));
    let answer = ChatResponse {
        model: "served".into(),
        content: "hello".into(),
        ..ChatResponse::default()
    };
    let values = stream(
        &mut encoder,
        vec![Event::Done {
            choice: 0,
            response: answer,
        }],
    )
    .await;
    let completed = values.last().expect("completed");
    assert_eq!(completed["type"], "response.completed");
    assert_eq!(completed["response"]["store"], true);
    let stored = conversations
        .load(&alice, "resp_0abc", now_s(), None)
        .expect("stored by now");
    assert_eq!(stored.response["output"][0]["content"][0]["text"], "hello");
    assert_eq!(
        stored.messages,
        [
            Message::text(Role::User, "hi"),
            Message::text(Role::Assistant, "hello")
        ]
    );
}
