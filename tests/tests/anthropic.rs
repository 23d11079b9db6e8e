//! Anthropic's Messages API on the front door, driven by the official `anthropic` Python client
//! (tests/python/anthropic_client.py): through a node without models to a peer whose model is
//! the scripted fake, a plain message, a stream, one tool round trip, a streamed tool call,
//! broken tool arguments as an error naming the model, an unknown field ignored,
//! `count_tokens`, and bad input in Anthropic's error shape; with `http.api_keys`, a wrong `x-api-key` is Anthropic's
//! `authentication_error`; and one short end-to-end run on the embedded SmolLM2 model.

use std::{path::Path, process::Command, time::Duration};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    python3,
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(20);

/// A node serving model `m` (role `chat`) from `fake`, peered with `peer`.
fn gpu(h: &Harness, fake: &FakeOpenAi, peer: &NodeProcess) -> NodeProcess {
    h.spawn(
        NodeOptions::new("gpu")
            .peer(&peer.addr)
            .extra(&fake.node_config("")),
    )
    .expect("gpu")
}

/// Runs anthropic_client.py in `mode` against `url`; fails the test with its output unless it
/// passed.
fn client(mode: &str, url: &str, args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/anthropic_client.py");
    let output = Command::new(python3())
        .arg(script)
        .arg(mode)
        .arg(url)
        .args(args)
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `anthropic`)");
    assert!(
        output.status.success(),
        "anthropic_client.py {mode} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_anthropic_client_reaches_a_peers_model_with_tools_and_bad_input_is_refused_in_its_shape() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = gpu(&h, &fake, &laptop);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    fake.push([
        Scripted::text("plain answer"),
        Scripted::text("streamed answer"),
        Scripted::tool("weather", r#"{"city": "Paris"}"#),
        Scripted::text("sunny in Paris"),
        Scripted::tool("weather", r#"{"city": "Oslo"}"#),
        Scripted::tool("weather", "{\"city\": "),
        Scripted::tool("weather", "{\"city\": "),
        Scripted::text("ignored field"),
    ]);
    client("fake", &laptop.http_url().expect("front door"), &[]);

    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        8,
        "the eight chats reached the gpu's model, no refused one did: {requests:#?}"
    );
    // The system prompt and max_tokens reached the model.
    assert_eq!(
        requests[0]["messages"][0],
        json!({"role": "system", "content": "be brief"})
    );
    assert_eq!(requests[0]["max_tokens"], 64, "{}", requests[0]);
    assert_eq!(requests[1]["stream"], true, "{}", requests[1]);
    // The tool was offered in the chat interface's shape...
    assert_eq!(
        requests[2]["tools"][0]["function"]["name"], "weather",
        "{}",
        requests[2]
    );
    assert_eq!(
        requests[2]["tools"][0]["function"]["parameters"]["required"],
        json!(["city"])
    );
    // ...and the round trip came back as the assistant's call and the tool's answer to it.
    let messages = requests[3]["messages"].as_array().expect("messages");
    let call = &messages[1]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "weather", "{messages:#?}");
    let arguments: serde_json::Value = serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .expect("arguments text"),
    )
    .expect("arguments JSON");
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(messages[2]["role"], "tool", "{messages:#?}");
    assert_eq!(messages[2]["tool_call_id"], call["id"], "{messages:#?}");
    assert_eq!(messages[2]["content"], "sunny", "{messages:#?}");
}

#[test]
fn with_api_keys_a_wrong_x_api_key_is_an_anthropic_authentication_error() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let key = "test-key-0123456789";
    let laptop = h
        .spawn(NodeOptions::new("laptop").http_keys(&[key]))
        .expect("laptop");
    let gpu = gpu(&h, &fake, &laptop);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    fake.push([Scripted::text("let in")]);
    client("key", &laptop.http_url().expect("front door"), &[key]);
    assert_eq!(
        fake.requests().len(),
        1,
        "only the chat with the right key reached the model"
    );
}

fn embedded_toml(path: &Path) -> String {
    format!("[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = {path:?}\nthreads = 1\n")
}

#[test]
fn the_anthropic_client_talks_to_the_embedded_model_through_a_node_without_models() {
    let path = mesh_tests::embedded_model_path();
    let h = Harness::new().expect("harness");
    let gpu = h
        .spawn(NodeOptions::new("gpu").extra(&embedded_toml(&path)))
        .expect("gpu");
    let laptop = h
        .spawn(NodeOptions::new("laptop").peer(&gpu.addr))
        .expect("laptop");
    h.wait_all_up(&[&laptop, &gpu], Duration::from_secs(60))
        .expect("both up");
    client("embedded", &laptop.http_url().expect("front door"), &[]);
}
