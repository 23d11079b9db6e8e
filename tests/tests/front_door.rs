//! The OpenAI-compatible front door, driven by the official `openai` Python client: a node
//! without models lists and reaches the model its peer serves (plain and streamed), an unknown
//! model is a 404, and with `http.api_keys` a missing, malformed or wrong key is a 401. Plus
//! `/healthz` and `/metrics` over plain HTTP, a streamed chat whose client hangs up stops
//! generating, on the node running it and across a hop, and a backend that ignores `stream` or
//! answers garbage is read as its completion or reported by name, never an empty answer, and a
//! client's `tool_choice` and `response_format` reach the backend in OpenAI's shapes.

use std::{process::Command, time::Duration};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    python3, wait_for,
};

const DEADLINE: Duration = Duration::from_secs(20);

fn gpu(h: &Harness, fake: &FakeOpenAi, peer: &NodeProcess) -> NodeProcess {
    h.spawn(
        NodeOptions::new("gpu")
            .peer(&peer.addr)
            .extra(&fake.node_config("")),
    )
    .expect("gpu")
}

/// A laptop without models and a gpu serving model `m` (role `chat`) from a fake backend, both up.
struct Mesh {
    h: Harness,
    fake: FakeOpenAi,
    laptop: NodeProcess,
    gpu: NodeProcess,
}

fn mesh() -> Mesh {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = gpu(&h, &fake, &laptop);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    Mesh {
        h,
        fake,
        laptop,
        gpu,
    }
}

fn python_client(url: &str, key: Option<&str>) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/front_door.py");
    let mut cmd = Command::new(python3());
    cmd.arg(script)
        .arg(url)
        .arg("hello from the gpu")
        .arg("a streamed answer");
    if let Some(key) = key {
        cmd.arg(key);
    }
    let output = cmd
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `openai`)");
    assert!(
        output.status.success(),
        "front_door.py failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a Python script (`python3 -c`) with arguments; its stdout, once it succeeded.
fn python(script: &str, args: &[&str]) -> String {
    let output = Command::new(python3())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `openai`)");
    assert!(
        output.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A GET with curl-free plain HTTP/1.1 over a TCP socket.
fn http_get(url: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    response
}

#[test]
fn the_openai_client_reaches_a_peers_model_through_a_node_without_models() {
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu,
    } = mesh();
    fake.push([
        Scripted::text("hello from the gpu"),
        Scripted::text("a streamed answer"),
    ]);
    let url = laptop.http_url().expect("front door");
    python_client(&url, None);
    assert_eq!(
        fake.requests().len(),
        2,
        "both chats reached the gpu's model"
    );

    let health = http_get(&url, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"node\":\"laptop\""), "{health}");
    let metrics = http_get(&url, "/metrics");
    assert!(
        metrics.contains(r#"agentmesh_routing_decisions_total{kind="chat",placement="remote"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"agentmesh_peers{state="up"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("agentmesh_replication_lag_records{peer=\"gpu\"}"),
        "{metrics}"
    );
    let gpu_metrics = http_get(&gpu.http_url().expect("gpu front door"), "/metrics");
    assert!(
        gpu_metrics.contains(r#"agentmesh_model_latency_seconds_count{model="m"} 2"#),
        "{gpu_metrics}"
    );
}

/// A request over plain HTTP/1.1 with an optional `Authorization` header and JSON body: the
/// status code and the JSON body of the answer.
fn http_call(
    url: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(value) = authorization {
        request.push_str(&format!("Authorization: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    socket.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    let (_, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no body: {response}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"));
    (status, body)
}

#[test]
fn with_api_keys_a_missing_malformed_or_wrong_key_is_refused_and_a_right_one_works() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let key = "test-key-0123456789";
    let laptop = h
        .spawn(NodeOptions::new("laptop").http_keys(&[key]))
        .expect("laptop");
    let gpu = gpu(&h, &fake, &laptop);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    fake.push([
        Scripted::text("let in"),
        Scripted::text("hello from the gpu"),
        Scripted::text("a streamed answer"),
    ]);
    let url = laptop.http_url().expect("front door");

    // No key, or a header that is not `Bearer <key>`: 401 `invalid_api_key` on both endpoints,
    // and no chat reaches the model.
    let chat = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    let right = format!("Bearer {key}");
    let endpoints = [
        ("GET", "/v1/models", ""),
        ("POST", "/v1/chat/completions", chat),
    ];
    let refused = [
        None,
        Some("Basic xyz"),
        Some("Bearer"),
        Some("Bearer "),
        Some(key),
        Some("Basic dGVzdC1rZXktMDEyMzQ1Njc4OQ=="),
    ];
    for (method, path, body) in endpoints {
        for authorization in refused {
            let (status, answer) = http_call(&url, method, path, authorization, body);
            assert_eq!(
                (status, &answer["error"]["code"]),
                (401, &serde_json::json!("invalid_api_key")),
                "{method} {path} with Authorization {authorization:?}: {answer}"
            );
        }
    }
    assert!(
        fake.requests().is_empty(),
        "a refused chat reached the model: {:?}",
        fake.requests()
    );

    // The control: the same requests with the right key are served.
    let (status, answer) = http_call(&url, "GET", "/v1/models", Some(&right), "");
    assert_eq!(status, 200, "{answer}");
    // The scheme is case-insensitive (RFC 9110).
    let lower = format!("bearer {key}");
    let (status, answer) = http_call(&url, "GET", "/v1/models", Some(&lower), "");
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = http_call(&url, "POST", "/v1/chat/completions", Some(&right), chat);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "let in");

    python_client(&url, Some(key));
}

/// A client's generation settings reach the model's server through a node without models, and a
/// bad one is a 400 that names it.
#[test]
fn generation_settings_pass_through_one_hop_and_bad_ones_are_refused() {
    // The whole mesh stays alive to the end of the test (its nodes stop on drop).
    let mesh = mesh();
    let (fake, url) = (&mesh.fake, mesh.laptop.http_url().expect("front door"));
    let script = r#"
import json, sys, urllib.request, urllib.error
url = sys.argv[1] + "/v1/chat/completions"
def post(extra):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
print(json.dumps([post({"max_tokens": 7, "temperature": 0.25, "top_p": 0.5,
                        "stop": ["END"], "seed": 42}),
                  post({"temperature": 3})]))
"#;
    let stdout = python(script, &[&url]);
    let answers: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(answers[0][0], 200, "{answers}");
    assert_eq!(answers[1][0], 400, "{answers}");
    let message = answers[1][1]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.starts_with("temperature"), "{message}");
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "the bad request never reached the model");
    let sent = &requests[0];
    assert_eq!(sent["max_tokens"], 7, "{sent}");
    assert_eq!(sent["temperature"], 0.25, "{sent}");
    assert_eq!(sent["top_p"], 0.5, "{sent}");
    assert_eq!(sent["stop"], serde_json::json!(["END"]), "{sent}");
    assert_eq!(sent["seed"], 42, "{sent}");
}

/// Many concurrent chats through one hop all succeed, and the laptop never logs h2's
/// "locally-reset streams reached limit": the release front-door bench hit that (and one failed
/// request) while the client dropped each `Models.Chat` stream before its end. This test did
/// not reproduce it in a debug build without the fix, so it guards the outcome, not the
/// mechanism.
#[test]
fn many_chats_through_one_hop_all_succeed_without_resetting_streams() {
    const CHATS: usize = 1_100;
    // The whole mesh stays alive to the end of the test (its nodes stop on drop).
    let mesh = mesh();
    let (fake, url) = (&mesh.fake, mesh.laptop.http_url().expect("front door"));
    let script = r#"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
def chat(i):
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=20).read()
        return 0
    except Exception as e:
        print(f"chat {i}: {e}", file=sys.stderr)
        return 1
# Concurrent, as clients are: the reset happens when the answer and the end of its stream
# arrive apart.
with ThreadPoolExecutor(8) as pool:
    failed = sum(pool.map(chat, range(n)))
print(failed)
sys.exit(1 if failed else 0)
"#;
    let failed = python(script, &[&url, &CHATS.to_string()]);
    assert_eq!(failed.trim(), "0", "failed chats");
    assert_eq!(fake.requests().len(), CHATS);
    let log = mesh.laptop.log_text();
    assert!(
        !log.contains("locally-reset streams"),
        "the laptop reset its streams to gpu:\n{log}"
    );
}

/// When the node ranked best fails a chat before answering anything, the front door tries the
/// next node that serves the model.
#[test]
fn a_chat_that_fails_on_the_best_node_before_answering_goes_to_the_next() {
    let h = Harness::new().expect("harness");
    let (broken, working) = (FakeOpenAi::start(), FakeOpenAi::start());
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let model = |fake: &FakeOpenAi| {
        format!(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n",
            fake.base_url()
        )
    };
    // The declared GPU ranks `big` first.
    let big = h
        .spawn(NodeOptions::new("big").peer(&laptop.addr).extra(&format!(
            "[[resources.gpus]]\nname = \"RTX 4090\"\nvram_mb = 24576\n\n{}",
            model(&broken)
        )))
        .expect("big");
    let small = h
        .spawn(
            NodeOptions::new("small")
                .peer(&laptop.addr)
                .extra(&model(&working)),
        )
        .expect("small");
    h.wait_all_up(&[&laptop, &big, &small], DEADLINE)
        .expect("mesh");
    broken.push([Scripted::status(500)]);
    working.push([Scripted::text("answered by small")]);
    let url = laptop.http_url().expect("front door");
    let script = r#"
import json, sys, urllib.request
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=body,
                             headers={"content-type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=20))["choices"][0]["message"]["content"])
"#;
    let stdout = python(script, &[&url]);
    assert_eq!(stdout.trim(), "answered by small");
    assert_eq!(broken.requests().len(), 1, "big was tried first");
    assert_eq!(working.requests().len(), 1);
    assert!(
        laptop.log_text().contains("trying the next node"),
        "{}",
        laptop.log_text()
    );
}

/// Issue 16, point 8: a streamed chat whose client went away kept its model generating (the
/// front door's task ran the chat to its end, and the node serving `Models.Chat` for a peer
/// noticed the reset stream only at its next delta). Now the generation stops soon after the
/// client hangs up: on the node running the model, and when the chat came across a hop.
#[test]
fn a_streamed_chat_whose_client_hangs_up_stops_generating_here_and_across_a_hop() {
    use std::io::{Read, Write};
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu,
    } = mesh();
    let cases = [
        (&gpu, "on the node running it", "trickling"),
        (&gpu, "on the node running it", "silent"),
        (&laptop, "across a hop", "trickling"),
        (&laptop, "across a hop", "silent"),
    ];
    for (node, place, model) in cases {
        let how = format!("{place} ({model} model)");
        fake.push([if model == "silent" {
            Scripted::stall()
        } else {
            Scripted::trickle(Duration::from_millis(50))
        }]);
        let url = node.http_url().expect("front door");
        let host = url.trim_start_matches("http://");
        let body = r#"{"model": "m", "stream": true, "messages": [{"role": "user", "content": "go on for ever"}]}"#;
        let mut socket = std::net::TcpStream::connect(host).expect("connect");
        socket
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        write!(
            socket,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        // The stream is open once its first chunk arrives (a silent model sends no more).
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        let until = if model == "silent" { "data:" } else { "tick" };
        while !seen.contains(until) {
            let n = socket.read(&mut buf).expect("read the stream");
            assert!(n > 0, "the stream ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        wait_for(&format!("the model to start {how}"), DEADLINE, || {
            (fake.in_flight() == 1).then_some(())
        })
        .expect("the model is generating");
        drop(socket);
        wait_for(
            &format!("the model to stop generating {how}"),
            Duration::from_secs(5),
            || (fake.in_flight() == 0).then_some(()),
        )
        .expect("generation stops when the client goes away");
    }
}

/// Regression: a backend that ignores `stream` and answers one JSON completion (a fixed-answer
/// server did) gave an empty answer with zero usage, silently. Now it is read as that
/// completion (text, tool calls, usage), for plain and streamed clients, through a hop; and a
/// backend whose answer cannot be read at all is an error naming it, not an empty success.
#[test]
fn a_backend_ignoring_stream_is_read_and_one_answering_garbage_is_named() {
    let mesh = mesh();
    let (fake, url) = (&mesh.fake, mesh.laptop.http_url().expect("front door"));
    fake.push([
        Scripted::text("a plain answer")
            .usage(7, 3)
            .ignoring_stream(),
        Scripted::text("streamed anyway").ignoring_stream(),
        Scripted::tool("lookup", r#"{"q": "x"}"#).ignoring_stream(),
        Scripted::garbage(),
    ]);
    let script = r#"
import json, sys
from openai import OpenAI, APIStatusError
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
out = {}
r = client.chat.completions.create(**ask)
out["plain"] = [r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens]
chunks = client.chat.completions.create(stream=True, **ask)
out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
r = client.chat.completions.create(tools=[tool], **ask)
out["tools"] = [[c.function.name, c.function.arguments] for c in r.choices[0].message.tool_calls]
try:
    r = client.chat.completions.create(**ask)
    out["garbage"] = [200, r.choices[0].message.content]
except APIStatusError as e:
    out["garbage"] = [e.status_code, e.message]
print(json.dumps(out))
"#;
    let out: serde_json::Value = serde_json::from_str(&python(script, &[&url])).expect("json");
    assert_eq!(
        out["plain"],
        serde_json::json!(["a plain answer", 7, 3]),
        "{out}"
    );
    assert_eq!(out["stream"], "streamed anyway", "{out}");
    assert_eq!(
        out["tools"],
        serde_json::json!([["lookup", r#"{"q": "x"}"#]]),
        "{out}"
    );
    assert_eq!(out["garbage"][0], 502, "{out}");
    let message = out["garbage"][1].as_str().unwrap_or_default();
    assert!(
        message.contains("backend `m`")
            && message.contains(&fake.base_url())
            && message.contains("It works!"),
        "the error names the backend and shows what it sent: {message}"
    );
    assert_eq!(fake.requests().len(), 4, "every chat reached the backend");
}

/// What chat completions honour beyond plain chats, through a node without models and the
/// official client: `n` answers (each a separate run of the model, usage summed), the serving
/// model named in the answer (a `role:` request says which model served), `usage` in the last
/// chunk of a stream; and what they refuse with a 400 naming the field rather than ignore: a
/// `tool_choice` naming a function not offered, a field OpenAI does not define, a setting the
/// mesh cannot honour. A body over the limit is a 413 in OpenAI's shape.
#[test]
fn chat_completions_honour_n_and_usage_and_refuse_what_they_cannot_honour() {
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu: _gpu,
    } = mesh();
    fake.push([
        Scripted::text("first").usage(3, 4),
        Scripted::text("second").usage(3, 6),
        Scripted::text("streamed").usage(2, 1),
    ]);
    let url = laptop.http_url().expect("front door");
    let out = python(
        r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k", max_retries=0)
two = client.chat.completions.create(
    model="role:chat", n=2, messages=[{"role": "user", "content": "twice"}])
assert sorted(c.message.content for c in two.choices) == ["first", "second"], two
assert sorted(c.index for c in two.choices) == [0, 1], two
assert two.model == "m", two.model
assert (two.usage.prompt_tokens, two.usage.completion_tokens) == (6, 10), two.usage
chunks = list(client.chat.completions.create(
    model="role:chat", stream=True, stream_options={"include_usage": True},
    messages=[{"role": "user", "content": "stream"}]))
assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "streamed"
last = chunks[-1]
assert last.choices == [] and last.usage.completion_tokens == 1, last
assert last.model == "m", last
tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
refusals = [
    ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"n": 9}, "n"),
    ({"extra_body": {"audio": {"voice": "alloy"}}}, "audio"),
    ({"presence_penalty": 1.0}, "presence_penalty"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": "object"}}},
     "response_format.json_schema.schema"),
]
for extra, field in refusals:
    try:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], **extra)
        raise AssertionError(f"{field} was not refused")
    except openai.BadRequestError as e:
        assert e.status_code == 400, e
        assert e.body["param"] == field and e.body["message"].startswith(field), (field, e.body)
import urllib.request, urllib.error
# 12 MiB: more than loopback's socket buffers hold, so the 413 is read only if the node reads
# the body it refuses instead of closing on a client still sending (a broken pipe here).
big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (12 << 20)}]})
try:
    urllib.request.urlopen(urllib.request.Request(
        sys.argv[1] + "/v1/chat/completions", data=big.encode(),
        headers={"Content-Type": "application/json"}))
    raise AssertionError("an oversized body was taken")
except urllib.error.HTTPError as e:
    assert e.code == 413, e.code
    error = json.loads(e.read())["error"]
    assert error["type"] == "invalid_request_error" and "limit" in error["message"], error
print("ok")
"#,
        &[&url],
    );
    assert_eq!(out.trim(), "ok");
    assert_eq!(
        fake.requests().len(),
        3,
        "the two choices and the stream reached the model; no refused request did"
    );
}

/// A client's `tool_choice` and `response_format` reach an `openai` backend through a node
/// without models, in OpenAI's own shapes, for the server to enforce.
#[test]
fn tool_choice_and_response_format_reach_the_backend_through_a_hop() {
    let mesh = mesh();
    let (fake, url) = (&mesh.fake, mesh.laptop.http_url().expect("front door"));
    fake.push([
        Scripted::tool("lookup", "{}"),
        Scripted::text(r#"{"a": 1}"#),
    ]);
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k", max_retries=0)
ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
r = client.chat.completions.create(
    tools=[tool], tool_choice={"type": "function", "function": {"name": "lookup"}}, **ask)
assert r.choices[0].message.tool_calls[0].function.name == "lookup", r
schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
r = client.chat.completions.create(
    response_format={"type": "json_schema",
                     "json_schema": {"name": "thing", "schema": schema, "strict": True}},
    **ask)
assert r.choices[0].message.content == '{"a": 1}', r
print("ok")
"#;
    assert_eq!(python(script, &[&url]).trim(), "ok");
    let sent = fake.requests();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent[0]["tool_choice"],
        serde_json::json!({"type": "function", "function": {"name": "lookup"}}),
        "{}",
        sent[0]
    );
    assert!(sent[0].get("response_format").is_none(), "{}", sent[0]);
    assert_eq!(
        sent[1]["response_format"],
        serde_json::json!({"type": "json_schema", "json_schema": {
            "name": "thing",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            "strict": true,
        }}),
        "{}",
        sent[1]
    );
    assert!(sent[1].get("tool_choice").is_none(), "{}", sent[1]);
}
