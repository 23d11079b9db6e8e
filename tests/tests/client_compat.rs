//! How the front door meets clients it did not write (issue 27), over plain HTTP through a
//! laptop without models to a gpu whose model is the scripted fake: request fields the mesh
//! does not know are ignored by default and refused in each API's own words with
//! `http.unknown_fields = "refuse"`; Codex's tools reach the model as functions (a namespace's
//! flattened, its calls given back with their namespace) and hosted ones are dropped and named
//! in `x-agentmesh-dropped-tools`; `http.model_aliases` maps a name the fleet does not have,
//! and never past a key's models; Anthropic's `count_tokens` answers, for a key that may use
//! the model; and a model with `system_turns = "first"` gets Claude Code's mid-conversation
//! system messages folded into its first turn.

use std::{
    io::{Read, Write},
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// A laptop (with `laptop`'s options) and a gpu serving model `m` (roles `chat` and `coder`)
/// from the fake, with `gpu_model` appended to its `[[models]]` entry.
struct Mesh {
    _h: Harness,
    fake: FakeOpenAi,
    laptop: NodeProcess,
    _gpu: NodeProcess,
}

fn mesh(laptop: NodeOptions, gpu_model: &str) -> Mesh {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(laptop).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n{gpu_model}\n\
             [roles]\nchat = [\"m\"]\ncoder = [\"m\"]\n",
            fake.base_url()
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    Mesh {
        _h: h,
        fake,
        laptop,
        _gpu: gpu,
    }
}

/// The answer to one request: status, headers (names lowercased) and the body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `POST path` with `body` to `node`'s front door over HTTP/1.1.
fn post(node: &NodeProcess, path: &str, body: &Value) -> Answer {
    post_as(node, None, path, body)
}

/// [`post`] with `key` as `x-api-key`, when given.
fn post_as(node: &NodeProcess, key: Option<&str>, path: &str, body: &Value) -> Answer {
    let url = node.http_url().expect("front door");
    let host = url.trim_start_matches("http://");
    let body = body.to_string();
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    let key = key.map_or(String::new(), |key| format!("x-api-key: {key}\r\n"));
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         anthropic-version: 2023-06-01\r\n{key}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no body: {response}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

fn message(extra: Value) -> Value {
    let mut body = json!({"model": "m", "max_tokens": 32,
                          "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

/// Fields no API defines reach nothing and break nothing by default; with `refuse` they are a
/// 400 in the API's own words, while the fields the APIs define (Codex's `client_metadata`)
/// still pass.
#[test]
fn unknown_fields_are_ignored_by_default_and_refused_in_each_apis_words_when_asked() {
    let open = mesh(NodeOptions::new("laptop"), "");
    open.fake.otherwise(Scripted::text("fine"));
    let answer = post(
        &open.laptop,
        "/v1/chat/completions",
        &chat(json!({"frobnicate": 1, "client_metadata": {"a": "b"}})),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = post(
        &open.laptop,
        "/v1/messages",
        &message(json!({"frobnicate": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "sparkle": true}]}]})),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = post(
        &open.laptop,
        "/v1/responses",
        &json!({"model": "m", "input": "hi", "frobnicate": 1, "client_metadata": {"a": "b"}}),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(open.fake.requests().len(), 3);
    assert!(
        !open.fake.requests()[0].to_string().contains("frobnicate"),
        "an ignored field is not passed on"
    );

    let strict = mesh(
        NodeOptions::new("laptop").http("unknown_fields = \"refuse\""),
        "",
    );
    strict.fake.otherwise(Scripted::text("fine"));
    let refused = post(
        &strict.laptop,
        "/v1/chat/completions",
        &chat(json!({"frobnicate": 1})),
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        refused.json()["error"]["message"],
        "Unrecognized request argument supplied: frobnicate"
    );
    assert_eq!(refused.json()["error"]["param"], "frobnicate");
    let refused = post(
        &strict.laptop,
        "/v1/messages",
        &message(json!({"frobnicate": 1})),
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        refused.json(),
        json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "frobnicate: Extra inputs are not permitted"}})
    );
    let codex = post(
        &strict.laptop,
        "/v1/responses",
        &json!({"model": "m", "input": "hi", "client_metadata": {"a": "b"}}),
    );
    assert_eq!(codex.status, 200, "{}", codex.body);
    assert_eq!(
        strict.fake.requests().len(),
        1,
        "only the request it let in"
    );
}

/// Codex's tool list: a namespace's functions are offered flat and a call of one comes back
/// with its namespace; a hosted tool is left out and named in the answer's header.
#[test]
fn codex_tools_are_offered_as_functions_and_hosted_ones_are_named_in_a_header() {
    let mesh = mesh(NodeOptions::new("laptop"), "");
    mesh.fake.push([Scripted::tool(
        "multi_agent_v1__spawn_agent",
        r#"{"task": "look"}"#,
    )]);
    let answer = post(
        &mesh.laptop,
        "/v1/responses",
        &json!({
            "model": "role:coder",
            "input": "spawn one",
            "tools": [
                {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
                 "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
                {"type": "web_search", "external_web_access": false}
            ]
        }),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.header("x-agentmesh-dropped-tools"),
        Some("web_search"),
        "{:?}",
        answer.headers
    );
    let offered: Vec<String> = mesh.fake.requests()[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(offered, ["exec_command", "multi_agent_v1__spawn_agent"]);
    let call = &answer.json()["output"][0];
    assert_eq!(call["type"], "function_call", "{call}");
    assert_eq!(call["name"], "spawn_agent", "{call}");
    assert_eq!(call["namespace"], "multi_agent_v1", "{call}");
}

/// A name no model or role of the fleet has reaches the alias's target; one no alias covers is
/// still a 404. `count_tokens` answers for an aliased name and refuses an unknown one.
#[test]
fn model_aliases_reach_the_fleet_and_count_tokens_answers() {
    let mesh = mesh(
        NodeOptions::new("laptop").extra("[http.model_aliases]\n\"claude-*\" = \"role:coder\"\n"),
        "",
    );
    mesh.fake.otherwise(Scripted::text("aliased"));
    let answer = post(
        &mesh.laptop,
        "/v1/messages",
        &message(json!({"model": "claude-sonnet-4-5"})),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["content"][0]["text"], "aliased");
    let unknown = post(
        &mesh.laptop,
        "/v1/messages",
        &message(json!({"model": "gpt-9"})),
    );
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(unknown.json()["error"]["type"], "not_found_error");
    assert_eq!(mesh.fake.requests().len(), 1);

    let counted = post(
        &mesh.laptop,
        "/v1/messages/count_tokens",
        &json!({"model": "claude-sonnet-4-5", "system": "be brief",
                "messages": [{"role": "user", "content": "hello world"}]}),
    );
    assert_eq!(counted.status, 200, "{}", counted.body);
    let tokens = counted.json()["input_tokens"].as_u64().expect("a count");
    assert!((4..40).contains(&tokens), "{tokens}");
    let nowhere = post(
        &mesh.laptop,
        "/v1/messages/count_tokens",
        &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(nowhere.status, 404, "{}", nowhere.body);
    assert_eq!(mesh.fake.requests().len(), 1, "counting runs no model");
}

/// Claude Code's system messages in the middle of the conversation reach a model whose
/// template takes them where they stand, and are folded into the first turn for a model with
/// `system_turns = "first"`.
#[test]
fn system_turns_stay_in_place_unless_the_model_takes_them_first() {
    let body = json!({"model": "m", "max_tokens": 32, "system": "be brief", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "agent types: claude"},
        {"role": "user", "content": "go"}
    ]});
    let roles = |request: &Value| -> Vec<(String, String)> {
        request["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or_default().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let anywhere = mesh(NodeOptions::new("laptop"), "");
    anywhere.fake.otherwise(Scripted::text("ok"));
    let answer = post(&anywhere.laptop, "/v1/messages", &body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        roles(&anywhere.fake.requests()[0])[2],
        ("system".to_owned(), "agent types: claude".to_owned())
    );
    let first = mesh(NodeOptions::new("laptop"), "system_turns = \"first\"");
    first.fake.otherwise(Scripted::text("ok"));
    let answer = post(&first.laptop, "/v1/messages", &body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let turns = roles(&first.fake.requests()[0]);
    assert_eq!(
        turns,
        [
            (
                "system".to_owned(),
                "be brief\n\nagent types: claude".to_owned()
            ),
            ("user".to_owned(), "hi".to_owned()),
            ("user".to_owned(), "go".to_owned()),
        ]
    );
}

/// A key that may use `role:chat`, and the model name `claude-sonnet-4-5` (which no node
/// serves): an alias from that name to `role:coder` does not take it past its policy (the key
/// is checked against the alias's target, not the name asked), for a message and for
/// `count_tokens` alike; without a key, `count_tokens` is a 401 like every `/v1` path.
#[test]
fn an_alias_does_not_take_a_key_past_its_models_and_count_tokens_needs_a_key() {
    let key = "compat-team-key-5d2c8e4f6a1b0d9c";
    let hash: String = mesh_node::testing::key_sha256(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mesh = mesh(
        NodeOptions::new("laptop").extra(&format!(
            "[[http.keys]]\nname = \"team\"\nkey_sha256 = \"{hash}\"\nroles = [\"chat\"]\nmodels = [\"claude-sonnet-4-5\"]\n\n\
             [http.model_aliases]\n\"claude-haiku-*\" = \"role:chat\"\n\"claude-*\" = \"role:coder\"\n"
        )),
        "",
    );
    mesh.fake.otherwise(Scripted::text("allowed"));
    let haiku = post_as(
        &mesh.laptop,
        Some(key),
        "/v1/messages",
        &message(json!({"model": "claude-haiku-4-5"})),
    );
    assert_eq!(haiku.status, 200, "{}", haiku.body);
    let sonnet = post_as(
        &mesh.laptop,
        Some(key),
        "/v1/messages",
        &message(json!({"model": "claude-sonnet-4-5"})),
    );
    assert_eq!(sonnet.status, 403, "{}", sonnet.body);
    assert_eq!(sonnet.json()["error"]["type"], "permission_error");
    assert_eq!(mesh.fake.requests().len(), 1, "only the allowed chat ran");
    let count = json!({"model": "claude-sonnet-4-5",
                       "messages": [{"role": "user", "content": "hello"}]});
    let refused = post_as(&mesh.laptop, Some(key), "/v1/messages/count_tokens", &count);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.json()["error"]["type"], "permission_error");
    let anonymous = post(&mesh.laptop, "/v1/messages/count_tokens", &count);
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert_eq!(anonymous.json()["error"]["type"], "authentication_error");
    let counted = post_as(
        &mesh.laptop,
        Some(key),
        "/v1/messages/count_tokens",
        &json!({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hello"}]}),
    );
    assert_eq!(counted.status, 200, "{}", counted.body);
}
