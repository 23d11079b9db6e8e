//! Issue 26, item 3: the front door refuses what a web page can make a browser send. A page of
//! another site posting to the door (it carries an `Origin`), a page that rebound its own name
//! to 127.0.0.1 (its name in `Host`, on a door without keys) and a `text/plain` or form `POST`
//! (no CORS preflight) are refused on every model API (OpenAI's chat completions, responses
//! and embeddings, Anthropic's messages, Ollama's chat, generate and embed, and `/mcp`), and
//! the model is never called; reads (`/v1/models`, a stored response) are refused to a
//! rebinding page too. What clients send (JSON, a loopback `Host`, no `Origin`, or an origin
//! listed in `http.allowed_origins`) works, from the official Python clients as well.
//!
//! One node serving `m` (chats) and `e` (embeddings) from the scripted fake, whose request
//! counts say whether a model was called.

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    http_request, python_json,
};
use serde_json::{Value, json};

/// Request headers, as (name, value).
type Headers<'a> = Vec<(&'a str, &'a str)>;

/// The origin the node lists in `http.allowed_origins`.
const ALLOWED_ORIGIN: &str = "http://localhost:3000";

/// A POST of each model API: path and JSON body.
fn model_calls() -> Vec<(&'static str, Value)> {
    let messages = json!([{"role": "user", "content": "hi"}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": messages}),
        ),
        ("/v1/responses", json!({"model": "m", "input": "hi"})),
        ("/v1/embeddings", json!({"model": "e", "input": "hi"})),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16, "messages": messages}),
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": messages, "stream": false}),
        ),
        (
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "stream": false}),
        ),
        ("/api/embed", json!({"model": "e", "input": "hi"})),
        (
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "run_task", "arguments": {"prompt": "hi", "model": "m"}}}),
        ),
    ]
}

/// `method path` to `node`'s front door with `headers` (a `Host` among them, or none) and
/// `body`: the status and what came of the body.
fn send(
    node: &NodeProcess,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut headers = headers.to_vec();
    headers.push(("Accept", "application/json, text/event-stream"));
    let (status, _, body) = http_request(node, method, path, &headers, body);
    (status, body)
}

#[test]
fn cross_site_and_rebinding_requests_reach_no_model_while_clients_still_do() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    fake.otherwise(Scripted::text("ok").usage(3, 4));
    let node = h
        .spawn(
            NodeOptions::new("gpu")
                .http(&format!("allowed_origins = [\"{ALLOWED_ORIGIN}\"]"))
                .extra(&fake.node_config(&format!(
                    "[[models]]\nname = \"e\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"text-embedding-fake\"\nembeddings = true\n",
                    fake.base_url()
                ))),
        )
        .expect("node");
    let url = node.http_url().expect("front door");
    let own = url.trim_start_matches("http://").to_owned();
    let port = own.rsplit(':').next().expect("a port").to_owned();
    let rebound = format!("evil.example:{port}");
    const JSON: (&str, &str) = ("Content-Type", "application/json");
    const PLAIN: (&str, &str) = ("Content-Type", "text/plain");
    const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");
    const EVIL: (&str, &str) = ("Origin", "https://evil.example");

    for (path, body) in model_calls() {
        let body = body.to_string();
        let attacks: [(&str, Headers<'_>, u16); 6] = [
            ("a cross-site fetch", vec![("Host", &own), EVIL, JSON], 403),
            (
                "a cross-site simple POST",
                vec![("Host", &own), EVIL, PLAIN],
                403,
            ),
            ("a cross-site form", vec![("Host", &own), EVIL, FORM], 403),
            ("a rebinding page", vec![("Host", &rebound), JSON], 403),
            (
                "a rebinding simple POST",
                vec![("Host", &rebound), PLAIN],
                403,
            ),
            ("a text/plain POST", vec![("Host", &own), PLAIN], 415),
        ];
        for (what, headers, expected) in attacks {
            let (status, answer) = send(&node, "POST", path, &headers, &body);
            assert_eq!(status, expected, "{what} to {path}: {answer}");
        }
    }
    assert!(
        fake.requests().is_empty() && fake.embedding_requests().is_empty(),
        "a refused request reached the model: {:?} {:?}",
        fake.requests(),
        fake.embedding_requests()
    );
    let tasks = h.cli(&node, &["tasks", "--json"]).expect("mesh-cli");
    let tasks: Value = serde_json::from_slice(&tasks.stdout).expect("JSON");
    assert_eq!(tasks["tasks"], json!([]), "a refused /mcp call ran a task");

    // Each refusal in its API's shape, saying what to do.
    let (_, openai) = send(
        &node,
        "POST",
        "/v1/chat/completions",
        &[("Host", &own), EVIL, JSON],
        "{}",
    );
    let openai: Value = serde_json::from_str(&openai).expect("JSON");
    assert_eq!(openai["error"]["code"], "origin_not_allowed", "{openai}");
    assert!(
        openai["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("http.allowed_origins")),
        "{openai}"
    );
    let (_, anthropic) = send(
        &node,
        "POST",
        "/v1/messages",
        &[("Host", &rebound), JSON],
        "{}",
    );
    let anthropic: Value = serde_json::from_str(&anthropic).expect("JSON");
    assert_eq!(
        anthropic["error"]["type"], "permission_error",
        "{anthropic}"
    );
    assert!(
        anthropic["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("http.allowed_hosts")),
        "{anthropic}"
    );
    let (_, ollama) = send(&node, "POST", "/api/chat", &[("Host", &own), PLAIN], "{}");
    let ollama: Value = serde_json::from_str(&ollama).expect("JSON");
    assert!(
        ollama["error"]
            .as_str()
            .is_some_and(|m| m.contains("application/json")),
        "{ollama}"
    );

    // What clients send works: JSON to a loopback name, no Origin or an allowed one.
    for (path, body) in model_calls() {
        let body = if path == "/mcp" {
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
        } else {
            body
        };
        let (status, answer) = send(
            &node,
            "POST",
            path,
            &[("Host", &own), JSON],
            &body.to_string(),
        );
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for headers in [
        vec![
            ("Host", "localhost"),
            ("Content-Type", "application/json; charset=utf-8"),
        ],
        vec![("Host", &own), ("Origin", ALLOWED_ORIGIN), JSON],
    ] {
        let (status, answer) = send(&node, "POST", "/v1/chat/completions", &headers, &chat);
        assert_eq!(status, 200, "{headers:?}: {answer}");
    }
    // 5 chats above (chat completions, responses, messages, Ollama's chat and generate) and
    // the 2 just now; 2 embeddings.
    assert_eq!(fake.requests().len(), 7, "{:?}", fake.requests());
    assert_eq!(fake.embedding_requests().len(), 2);

    // A rebinding page cannot read either: the models, a stored response.
    let (status, stored) = send(
        &node,
        "POST",
        "/v1/responses",
        &[("Host", &own), JSON],
        &json!({"model": "m", "input": "remember this"}).to_string(),
    );
    assert_eq!(status, 200, "{stored}");
    let id = serde_json::from_str::<Value>(&stored).expect("JSON")["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let stored_path = format!("/v1/responses/{id}");
    assert_eq!(
        send(&node, "GET", &stored_path, &[("Host", &own)], "").0,
        200
    );
    for path in ["/v1/models", "/api/tags", stored_path.as_str(), "/metrics"] {
        let (status, answer) = send(&node, "GET", path, &[("Host", &rebound)], "");
        assert_eq!(status, 403, "{path}: {answer}");
    }

    // The official Python clients: each gets its answer through the guarded door.
    let script = r#"
import json, sys, anthropic, ollama, openai
base = sys.argv[1]
chat = openai.OpenAI(base_url=base + "/v1", api_key="none").chat.completions.create(
    model="m", messages=[{"role": "user", "content": "hi"}])
message = anthropic.Anthropic(base_url=base, api_key="none").messages.create(
    model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
local = ollama.Client(host=base).chat(model="m", messages=[{"role": "user", "content": "hi"}])
print(json.dumps({"openai": chat.choices[0].message.content,
                  "anthropic": message.content[0].text,
                  "ollama": local.message.content}))
"#;
    let report = python_json(script, &[&url]);
    assert_eq!(
        report,
        json!({"openai": "ok", "anthropic": "ok", "ollama": "ok"})
    );
}

/// A door with keys takes any `Host` (a rebinding page has no key), but still refuses an
/// `Origin` it does not list and a `POST` that is not JSON; `http.allowed_hosts` lets a door
/// without keys answer a name of its own (a container's, a proxy's).
#[test]
fn a_keyed_door_takes_any_host_and_allowed_hosts_extend_an_open_one() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    fake.otherwise(Scripted::text("ok"));
    let key = "sk-cross-site-0123456789abcdef";
    let keyed = h
        .spawn(
            NodeOptions::new("keyed")
                .http_keys(&[key])
                .extra(&fake.node_config("")),
        )
        .expect("keyed");
    let open = h
        .spawn(
            NodeOptions::new("open")
                .http("allowed_hosts = [\"mesh-node\"]")
                .extra(&fake.node_config("")),
        )
        .expect("open");
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let bearer = format!("Bearer {key}");
    let json = ("Content-Type", "application/json");
    for (host, extra, expected) in [
        ("gpu-box.lan:7780", vec![json], 200),
        (
            "gpu-box.lan:7780",
            vec![json, ("Origin", "https://evil.example")],
            403,
        ),
        (
            "gpu-box.lan:7780",
            vec![("Content-Type", "text/plain")],
            415,
        ),
    ] {
        let mut headers = vec![("Host", host), ("Authorization", bearer.as_str())];
        headers.extend(extra);
        let (status, answer) = send(&keyed, "POST", "/v1/chat/completions", &headers, &chat);
        assert_eq!(status, expected, "{headers:?}: {answer}");
    }
    for (host, expected) in [
        ("mesh-node:7780", 200),
        ("mesh-node", 200),
        ("other-node:7780", 403),
    ] {
        let (status, answer) = send(
            &open,
            "POST",
            "/v1/chat/completions",
            &[("Host", host), json],
            &chat,
        );
        assert_eq!(status, expected, "{host}: {answer}");
    }
    assert_eq!(fake.requests().len(), 3, "only the allowed requests");
}
