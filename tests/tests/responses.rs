//! OpenAI's Responses API through the front door, driven by the official `openai` Python client
//! (`tests/python/responses.py`): a node without models reaches its peer's model plainly,
//! streamed and through a function-call round trip; a conversation started on one node
//! continues on another once it has replicated; bad input gets OpenAI's error naming the field;
//! with `http.api_keys` a caller without the key is refused; and one short answer from the
//! embedded SmolLM2 model.

use std::{process::Command, time::Duration};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    python3, wait_for,
};
use serde_json::Value;

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
    /// Owns the nodes' directories: bound for as long as the test runs.
    h: Harness,
    fake: FakeOpenAi,
    laptop: NodeProcess,
    gpu: NodeProcess,
}

fn mesh(laptop: NodeOptions) -> Mesh {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(laptop).expect("laptop");
    let gpu = gpu(&h, &fake, &laptop);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    Mesh {
        h,
        fake,
        laptop,
        gpu,
    }
}

/// Runs `responses.py URL SCENARIO ARGS…`; its stdout (trimmed), once it succeeded.
fn client(url: &str, scenario: &str, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/responses.py");
    let output = Command::new(python3())
        .arg(script)
        .arg(url)
        .arg(scenario)
        .args(args)
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `openai`)");
    assert!(
        output.status.success(),
        "responses.py {scenario} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A request over plain HTTP/1.1: the status code and the JSON body of the answer.
fn http(url: &str, method: &str, path: &str, authorization: Option<&str>) -> (u16, Value) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    let body = if method == "POST" {
        r#"{"model": "m", "input": "hi"}"#
    } else {
        ""
    };
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

/// The messages the fake backend was sent in its `i`th request, as (role, content).
fn messages(fake: &FakeOpenAi, i: usize) -> Vec<Value> {
    fake.requests()[i]["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn the_openai_client_creates_streams_and_round_trips_a_function_call() {
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu,
    } = mesh(NodeOptions::new("laptop"));
    fake.push([
        Scripted::text("hello from the gpu"),
        Scripted::text("a streamed answer"),
        Scripted::text("raw events"),
        Scripted::tool("get_weather", r#"{"city":"Oslo"}"#),
        Scripted::text("It rains in Oslo."),
    ]);
    let call_id = client(&laptop.http_url().expect("front door"), "round-trip", &[]);
    assert_eq!(
        fake.requests().len(),
        5,
        "every turn reached the gpu's model"
    );
    // `instructions` is the system message, first.
    let first = messages(&fake, 0);
    assert_eq!(first[0]["role"], "system");
    assert_eq!(first[0]["content"], "be brief");
    assert_eq!(first[1]["content"], "say hello");
    // The continuation sends the first turn (its question and the model's call) and the
    // client's function output after it, as chat messages.
    let round = messages(&fake, 4);
    assert_eq!(round.len(), 3, "{round:?}");
    assert_eq!(round[0]["role"], "user");
    assert_eq!(round[0]["content"], "weather in Oslo?");
    assert_eq!(round[1]["role"], "assistant");
    assert_eq!(round[1]["tool_calls"][0]["id"], call_id.as_str());
    assert_eq!(round[1]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(round[2]["role"], "tool");
    assert_eq!(round[2]["tool_call_id"], call_id.as_str());
    assert_eq!(round[2]["content"], "rain");
    assert_eq!(
        fake.requests()[4]["tools"][0]["function"]["name"],
        "get_weather"
    );
    let metrics = gpu.metrics().expect("metrics");
    assert!(
        metrics.contains(r#"agentmesh_model_latency_seconds_count{model="m"} 5"#),
        "{metrics}"
    );
}

/// A response stored by the laptop is read on the gpu once it replicated, and the gpu
/// continues the conversation with the first turn's messages.
#[test]
fn a_conversation_continues_on_another_node_once_replicated() {
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu,
    } = mesh(NodeOptions::new("laptop"));
    fake.push([Scripted::text("noted"), Scripted::text("the code is 42")]);
    let id = client(&laptop.http_url().expect("front door"), "first", &[]);
    let gpu_url = gpu.http_url().expect("gpu front door");
    let path = format!("/v1/responses/{id}");
    let stored = wait_for("the response to replicate to the gpu", DEADLINE, || {
        let (status, body) = http(&gpu_url, "GET", &path, None);
        (status == 200).then_some(body)
    })
    .expect("replicated");
    assert_eq!(stored["output"][0]["content"][0]["text"], "noted");
    let answer = client(&gpu_url, "continue", &[&id]);
    assert_eq!(answer, "the code is 42");
    let second = messages(&fake, 1);
    let contents: Vec<&str> = second
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        contents,
        ["remember: the code is 42", "noted", "what is the code?"]
    );
}

/// Bad input, an unknown `previous_response_id` and an unknown id are refused in OpenAI's
/// shape naming what is wrong, and none reaches the model.
#[test]
fn bad_input_is_refused_in_openais_shape() {
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu: _gpu,
    } = mesh(NodeOptions::new("laptop"));
    client(&laptop.http_url().expect("front door"), "bad", &[]);
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
}

/// With `http.api_keys`, creating and reading responses needs the key: without it both are a
/// 401 in OpenAI's shape, and no chat reaches the model.
#[test]
fn without_the_key_responses_are_refused() {
    let key = "test-key-0123456789";
    let Mesh {
        h: _h,
        fake,
        laptop,
        gpu: _gpu,
    } = mesh(NodeOptions::new("laptop").http_keys(&[key]));
    let url = laptop.http_url().expect("front door");
    for (method, path) in [("POST", "/v1/responses"), ("GET", "/v1/responses/resp_1")] {
        for authorization in [None, Some("Bearer wrong-key-0000")] {
            let (status, body) = http(&url, method, path, authorization);
            assert_eq!(status, 401, "{method} {path} {authorization:?}: {body}");
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
        }
    }
    assert!(fake.requests().is_empty());
    fake.push([Scripted::text("let in")]);
    let (status, body) = http(
        &url,
        "POST",
        "/v1/responses",
        Some(&format!("Bearer {key}")),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"][0]["content"][0]["text"], "let in");
}

/// End to end with the real SmolLM2 model on a peer: a short answer through a node without
/// models, stored and read back.
#[test]
fn the_embedded_model_answers_through_the_responses_api() {
    let path = mesh_tests::embedded_model_path();
    let h = Harness::new().expect("harness");
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = {path:?}\nthreads = 1\n"
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], Duration::from_secs(60))
        .expect("mesh");
    let answer = client(&laptop.http_url().expect("front door"), "embedded", &[]);
    assert!(!answer.is_empty());
}
