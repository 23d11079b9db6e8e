use mesh_domain::{ChatResponse, ResponseFormat, Role, Sampling, Target, ToolCall, Usage};

use super::{translate::*, *};
use crate::{
    gateway::{Event, GatewayError},
    http::encode::Encoder,
};

fn chat(body: Value) -> Result<Read, ApiError> {
    read_chat(body.to_string().as_bytes())
}

fn generate(body: Value) -> Result<Read, ApiError> {
    read_generate(body.to_string().as_bytes())
}

fn field_of(result: Result<Read, ApiError>) -> String {
    result.expect_err("refused").param.unwrap_or_default()
}

#[test]
fn chats_become_calls_with_tool_calls_paired_by_name() {
    let read = chat(json!({
        "model": "role:chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "time", "arguments": {}}},
                {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_name": "weather", "content": "sunny"},
            {"role": "tool", "content": "noon"}
        ],
        "tools": [{"type": "function", "function": {"name": "weather",
                   "parameters": {"type": "object"}}}],
        "format": "json",
        "options": {"temperature": 0.5, "num_predict": 9, "stop": ["END"], "seed": 3,
                    "num_ctx": 4096, "not_an_option": true},
        "keep_alive": "5m",
        "an_unknown_field": 1
    }))
    .expect("valid");
    assert!(read.stream, "Ollama streams by default");
    assert_eq!(read.kind, Kind::Chat);
    assert_eq!(read.call.target, Target::Role("chat".into()));
    let chat = &read.call.chat;
    let calls = &chat.messages[2].tool_calls;
    assert_eq!(
        (calls[0].id.as_str(), calls[0].arguments.as_str()),
        ("call_2_0", "{}")
    );
    assert_eq!(calls[1].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("call_2_1"));
    assert_eq!(chat.messages[4].tool_call_id.as_deref(), Some("call_2_0"));
    assert_eq!(chat.tools[0].name, "weather");
    assert_eq!(chat.response_format, Some(ResponseFormat::JsonObject));
    assert_eq!(
        chat.sampling,
        Sampling {
            max_tokens: Some(9),
            temperature: Some(0.5),
            top_p: None,
            stop: vec!["END".into()],
            seed: Some(3),
        }
    );
}

#[test]
fn a_schema_format_becomes_a_json_schema_response_format() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let read = chat(
        json!({"model": "m", "stream": false, "format": schema.clone(),
                           "messages": [{"role": "user", "content": "x"}]}),
    )
    .expect("valid");
    assert!(!read.stream);
    assert!(matches!(
        read.call.chat.response_format,
        Some(ResponseFormat::JsonSchema { schema: s, .. }) if s == schema
    ));
}

#[test]
fn generate_takes_system_and_prompt_and_refuses_what_it_cannot_honour() {
    let read = generate(json!({"model": "m", "system": "s", "prompt": "p"})).expect("valid");
    assert_eq!(read.kind, Kind::Generate);
    let roles: Vec<Role> = read.call.chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::User]);
    // Empty or false values of the refused fields change nothing and are accepted.
    assert!(
        generate(
            json!({"model": "m", "prompt": "p", "raw": false, "images": [],
                        "suffix": "", "context": [], "template": ""})
        )
        .is_ok()
    );
    for (bad, field) in [
        (json!({"raw": true}), "raw"),
        (json!({"images": ["aGk="]}), "images"),
        (json!({"suffix": "}"}), "suffix"),
        (json!({"context": [1, 2]}), "context"),
        (json!({"template": "{{ .Prompt }}"}), "template"),
        (json!({"think": true}), "think"),
        (json!({"prompt": 7}), "prompt"),
    ] {
        let mut body = json!({"model": "m", "prompt": "p"});
        for (k, v) in bad.as_object().expect("object") {
            body[k] = v.clone();
        }
        assert_eq!(field_of(generate(body)), field, "{bad}");
    }
}

fn options(options: Value) -> Result<Sampling, ApiError> {
    sampling_of(options.as_object())
}

/// The per-option decisions of docs/src/protocol/http-dialects.md: performance options accepted
/// and unused, answer-changing ones refused unless neutral, wrong types named.
#[test]
fn options_are_honoured_ignored_or_refused_by_name() {
    assert_eq!(
        options(
            json!({"num_ctx": 8192, "num_thread": 2, "num_gpu": 1, "use_mmap": true,
                       "repeat_penalty": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
                       "repeat_last_n": 64, "num_predict": -1, "seed": -1})
        )
        .expect("neutral"),
        Sampling::default()
    );
    for (bad, field) in [
        (json!({"top_k": 40}), "options.top_k"),
        (json!({"repeat_penalty": 1.1}), "options.repeat_penalty"),
        (json!({"mirostat": 2}), "options.mirostat"),
        (json!({"min_p": 0.05}), "options.min_p"),
        (json!({"temperature": "hot"}), "options.temperature"),
        (json!({"temperature": 3.0}), "options.temperature"),
        (json!({"num_predict": 0}), "options.num_predict"),
        (json!({"num_predict": 1.5}), "options.num_predict"),
        (json!({"stop": [1]}), "options.stop"),
        (json!({"top_p": 0.0}), "options.top_p"),
    ] {
        let error = options(bad.clone()).expect_err("refused");
        assert_eq!(
            error.param.as_deref(),
            Some(field),
            "{bad}: {}",
            error.message
        );
        assert!(error.message.starts_with(field), "{bad}: {}", error.message);
    }
}

#[test]
fn wrong_types_and_bad_values_name_the_field() {
    for (body, field) in [
        (json!({"model": "m", "messages": "hi"}), "messages"),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": 1}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
            "messages[0].images",
        ),
        (
            json!({"model": "m", "messages": [], "stream": "yes"}),
            "stream",
        ),
        (
            json!({"model": "m", "messages": [], "format": "yaml"}),
            "format",
        ),
        (
            json!({"model": "m", "messages": [], "options": []}),
            "options",
        ),
        (
            json!({"model": "m", "messages": [], "logprobs": true}),
            "logprobs",
        ),
        (json!({"model": 7, "messages": []}), "model"),
    ] {
        assert_eq!(field_of(chat(body.clone())), field, "{body}");
    }
    let error = read_chat(b"{not json").expect_err("not JSON");
    assert!(
        error.message.starts_with("request body:"),
        "{}",
        error.message
    );
}

fn answer(content: &str, calls: &[(&str, &str)], completion: u64) -> ChatResponse {
    ChatResponse {
        model: "served".into(),
        content: content.into(),
        tool_calls: calls
            .iter()
            .map(|(name, arguments)| ToolCall {
                id: format!("id-{name}"),
                name: (*name).into(),
                arguments: (*arguments).into(),
            })
            .collect(),
        usage: Some(Usage {
            prompt_tokens: 4,
            completion_tokens: completion,
        }),
    }
}

fn parse_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| {
            assert!(
                l.ends_with('\n') && !l[..l.len() - 1].contains('\n'),
                "{l:?}"
            );
            serde_json::from_str(l).expect("each line is JSON")
        })
        .collect()
}

/// NDJSON framing: a line per delta, the tool calls in a line of their own, and a last
/// line `done: true` with the serving model, the counts and the durations.
#[test]
fn streamed_answers_are_one_json_object_per_line_ending_done() {
    let mut lines = Lines {
        kind: Kind::Chat,
        model: "asked".into(),
        max_tokens: Some(3),
        clock: Clock::start(),
    };
    assert!(lines.start().is_empty());
    let first = parse_lines(&lines.event(Event::Delta {
        choice: 0,
        text: "he".into(),
    }));
    assert_eq!(first[0]["message"]["content"], "he");
    assert_eq!(
        (first[0]["model"].as_str(), first[0]["done"].as_bool()),
        (Some("asked"), Some(false))
    );
    let last = parse_lines(&lines.event(Event::Done {
        choice: 0,
        response: answer("he", &[("weather", r#"{"city": "Paris"}"#)], 3),
    }));
    assert_eq!(last.len(), 2);
    assert_eq!(
        last[0]["message"]["tool_calls"][0]["function"]["arguments"]["city"],
        "Paris"
    );
    assert_eq!(last[0]["done"], false);
    let done = &last[1];
    assert_eq!(
        (done["done"].as_bool(), done["done_reason"].as_str()),
        (Some(true), Some("length"))
    );
    assert_eq!(
        (
            done["prompt_eval_count"].as_u64(),
            done["eval_count"].as_u64()
        ),
        (Some(4), Some(3))
    );
    assert_eq!(done["model"], "served");
    assert!(done["total_duration"].as_u64() >= done["eval_duration"].as_u64());
    assert!(lines.end().is_empty());

    let mut generate = Lines {
        kind: Kind::Generate,
        model: "asked".into(),
        max_tokens: None,
        clock: Clock::start(),
    };
    let piece = parse_lines(&generate.event(Event::Delta {
        choice: 0,
        text: "x".into(),
    }));
    assert_eq!(piece[0]["response"], "x");
    let done = parse_lines(&generate.event(Event::Done {
        choice: 0,
        response: answer("x", &[], 1),
    }));
    assert_eq!(done[0]["done_reason"], "stop");
    let failed = parse_lines(&generate.event(Event::Failed(GatewayError::invalid("broken"))));
    assert_eq!(failed[0], json!({"error": "broken"}));
}

#[test]
fn tool_call_arguments_that_are_not_an_object_are_an_error_naming_the_model() {
    assert!(tool_calls_json(&answer("", &[("f", "")], 1)).is_ok());
    let error = tool_calls_json(&answer("", &[("f", "[1]")], 1)).expect_err("not an object");
    assert!(
        error.message.contains("`served`") && error.message.contains("`f`"),
        "{}",
        error.message
    );
}

#[test]
fn latest_tags_resolve_to_untagged_fleet_models() {
    let fleet: std::collections::BTreeMap<String, String> = [
        ("m".to_owned(), "gpu".to_owned()),
        ("t:latest".to_owned(), "gpu".to_owned()),
    ]
    .into();
    assert_eq!(resolve("m:latest", &fleet), "m");
    assert_eq!(resolve("t:latest", &fleet), "t:latest");
    assert_eq!(resolve("x:latest", &fleet), "x:latest");
    assert_eq!(resolve("m", &fleet), "m");
}

#[test]
fn embed_input_is_a_text_or_a_list_of_texts_and_bad_input_names_the_field() {
    assert_eq!(embed_inputs(Some(json!("a"))).expect("text"), ["a"]);
    assert_eq!(
        embed_inputs(Some(json!(["a", "b"]))).expect("list"),
        ["a", "b"]
    );
    for (input, field) in [
        (None, "input"),
        (Some(json!(7)), "input"),
        (Some(json!(["a", 1])), "input[1]"),
    ] {
        let error = embed_inputs(input).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some(field), "{}", error.message);
    }
}
