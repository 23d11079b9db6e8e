//! Ollama's API at the front door, driven by the official `ollama` Python client
//! (tests/python/ollama_client.py): a node without models, with an API key, lists the fleet's
//! models and reaches its peer's model for chats and generations, whole and streamed as NDJSON,
//! with a tool call round trip; `format` and `options` reach the backend as the chat's
//! `response_format` and settings; an unknown model, a wrong key, bad input and an oversized
//! body are refused in Ollama's shape and reach no model. A named key's model list and budget
//! hold there too; embeddings go through `/api/embed`. And one chat through the embedded
//! SmolLM2 model.

use std::{process::Command, time::Duration};

use mesh_tests::{
    Harness, NodeOptions,
    fake_openai::{self, FakeOpenAi, Scripted},
    python3,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);
const KEY: &str = "ollama-test-key-0123";

fn run_python(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/ollama_client.py");
    let output = Command::new(python3())
        .arg(script)
        .args(args)
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `ollama`)");
    assert!(
        output.status.success(),
        "ollama_client.py failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The messages of a request the fake received.
fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().expect("messages")
}

#[test]
fn the_ollama_client_reaches_a_peers_model_through_a_node_without_models() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h
        .spawn(NodeOptions::new("laptop").http_keys(&[KEY]))
        .expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .extra(&fake.node_config("")),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    fake.push([
        Scripted::text("hello from the gpu"),
        Scripted::text("a streamed answer"),
        Scripted::text("generated"),
        Scripted::text("generated in pieces"),
        Scripted::tool("weather", r#"{"city": "Paris"}"#),
        Scripted::text("It is sunny"),
        Scripted::tool("weather", r#"{"city": "Paris"}"#),
        Scripted::text(r#"{"a": 1}"#),
        Scripted::text(r#"{"a": 1}"#),
    ]);
    let url = laptop.http_url().expect("front door");
    run_python(&[&url, KEY]);

    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        9,
        "each chat reached the model once, and nothing refused did: {requests:#?}"
    );
    // Streamed answers are streamed from the backend too.
    assert_eq!(requests[1]["stream"], true);
    // generate: the system prompt, then the prompt.
    let generate = messages(&requests[2]);
    assert_eq!(
        (&generate[0]["role"], &generate[1]["content"]),
        (&Value::from("system"), &Value::from("go"))
    );
    // The tool round trip: the tool's schema went out, and the result came back as a tool
    // message answering the assistant's call by its id.
    assert_eq!(requests[4]["tools"][0]["function"]["name"], "weather");
    let round_trip = messages(&requests[5]);
    let call_id = &round_trip[1]["tool_calls"][0]["id"];
    assert_eq!(
        round_trip[1]["tool_calls"][0]["function"]["name"],
        "weather"
    );
    assert_eq!(
        (&round_trip[2]["role"], &round_trip[2]["tool_call_id"]),
        (&Value::from("tool"), call_id)
    );
    // `format: "json"` and the options; then a JSON schema.
    let json = &requests[7];
    assert_eq!(json["response_format"]["type"], "json_object", "{json}");
    assert_eq!(
        (
            &json["max_tokens"],
            &json["temperature"],
            &json["stop"][0],
            &json["seed"]
        ),
        (
            &Value::from(7),
            &Value::from(0.25),
            &Value::from("END"),
            &Value::from(3)
        ),
        "{json}"
    );
    let schema = &requests[8]["response_format"];
    assert_eq!(schema["type"], "json_schema", "{schema}");
    assert_eq!(
        schema["json_schema"]["schema"]["properties"]["a"]["type"],
        "integer"
    );
}

/// A named key's policy holds on Ollama's API too, in Ollama's error shape: a model the key
/// may not use is a 403 naming it, and once its day budget is spent the next chat is a 429
/// naming the limit, with `Retry-After`.
#[test]
fn a_keys_model_list_and_budget_hold_on_ollamas_api() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let hash: String = mesh_node::testing::key_sha256(KEY)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keys = format!(
        "[[http.keys]]\nname = \"team\"\nkey_sha256 = \"{hash}\"\nmodels = [\"m\"]\nmax_tokens_per_day = 20\n"
    );
    let laptop = h
        .spawn(NodeOptions::new("laptop").extra(&keys))
        .expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .extra(&fake.node_config("")),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    fake.push([Scripted::text("spent").usage(10, 10)]);
    let script = r#"
import json, sys, httpx, ollama
base, key = sys.argv[1], sys.argv[2]
client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})
def refusal(call):
    try:
        call()
    except ollama.ResponseError as e:
        return {"status": e.status_code, "error": e.error}
    return None
role = refusal(lambda: client.chat(model="role:chat", messages=[{"role": "user", "content": "x"}]))
first = client.chat(model="m", messages=[{"role": "user", "content": "x"}])
spent = httpx.post(base + "/api/chat", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "m", "stream": False, "messages": [{"role": "user", "content": "x"}]})
print(json.dumps({"role": role, "first": first.message.content, "status": spent.status_code,
                  "body": spent.json(), "retry_after": spent.headers.get("retry-after")}))
"#;
    let output = Command::new(python3())
        .arg("-c")
        .arg(script)
        .arg(laptop.http_url().expect("front door"))
        .arg(KEY)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    assert_eq!(report["role"]["status"], 403, "{report}");
    assert!(
        report["role"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("role:chat")),
        "{report}"
    );
    assert_eq!(report["first"], "spent", "{report}");
    assert_eq!(report["status"], 429, "{report}");
    let error = report["body"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("max_tokens_per_day"), "{report}");
    assert!(report["retry_after"].as_str().is_some(), "{report}");
    assert_eq!(
        fake.requests().len(),
        1,
        "only the admitted chat reached the model"
    );
}

/// `ollama.Client.embed` (and the older `embeddings`) through a node without models to a model
/// that makes embeddings: the backend's vectors, in input order; a model that only chats, an
/// unknown model and bad input get Ollama's error shape naming what is wrong.
#[test]
fn the_ollama_client_embeds_through_a_node_without_models() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"embedder\"\nbackend = \"openai\"\nbase_url = \"{url}\"\nmodel = \"text-embedding-fake\"\nembeddings = true\n\n\
             [[models]]\nname = \"chatty\"\nbackend = \"openai\"\nbase_url = \"{url}\"\nmodel = \"scripted\"\n",
            url = fake.base_url()
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let url = laptop.http_url().expect("front door");
    let script = r#"
import json, sys, httpx, ollama
client = ollama.Client(host=sys.argv[1])
many = client.embed(model="embedder", input=["first", "second"])
one = client.embeddings(model="embedder:latest", prompt="first")
def refusal(call):
    try:
        call()
    except ollama.ResponseError as e:
        return {"status": e.status_code, "error": e.error}
    return None
bad = httpx.post(sys.argv[1] + "/api/embed", json={"model": "embedder", "input": [1]})
assert "embedding" in client.show("embedder").capabilities
assert "embedding" not in client.show("chatty").capabilities
print(json.dumps({
    "model": many.model, "embeddings": many.embeddings,
    "one": one.embedding,
    "chat_only": refusal(lambda: client.embed(model="chatty", input="x")),
    "unknown": refusal(lambda: client.embed(model="nope", input="x")),
    "no_prompt": refusal(lambda: client.embeddings(model="embedder", prompt="")),
    "bad": {"status": bad.status_code, "body": bad.json()},
}))
"#;
    let output = Command::new(python3())
        .arg("-c")
        .arg(script)
        .arg(&url)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let vector = |v: &Value| -> Vec<f32> {
        v.as_array()
            .expect("a vector")
            .iter()
            .map(|x| x.as_f64().expect("a number") as f32)
            .collect()
    };
    assert_eq!(report["model"], "embedder");
    let embeddings = report["embeddings"].as_array().expect("embeddings");
    assert_eq!(vector(&embeddings[0]), fake_openai::embedding("first"));
    assert_eq!(vector(&embeddings[1]), fake_openai::embedding("second"));
    assert_eq!(vector(&report["one"]), fake_openai::embedding("first"));
    assert_eq!(fake.embedding_requests().len(), 2, "{report}");
    let refused = |name: &str, status: u64, words: &str| {
        let refusal = &report[name];
        assert_eq!(refusal["status"], status, "{name}: {refusal}");
        let message = refusal["error"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{name}: {message}");
    };
    refused("chat_only", 400, "chatty");
    refused("unknown", 404, "model \"nope\" not found");
    refused("no_prompt", 400, "prompt");
    assert_eq!(report["bad"]["status"], 400, "{report}");
    assert!(
        report["bad"]["body"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("input[0]")),
        "{report}"
    );
    assert_eq!(
        fake.embedding_requests().len(),
        2,
        "nothing refused reached the model"
    );
}

/// `ollama.Client.chat`, streamed, through a node without models to one serving SmolLM2: a few
/// tokens of real text and a last line with real counts.
#[test]
fn the_ollama_client_streams_a_chat_from_the_embedded_model() {
    let path = mesh_tests::embedded_model_path();
    let h = Harness::new().expect("harness");
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = {path:?}\nthreads = 1\n"
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let url = laptop.http_url().expect("front door");
    let script = r#"
import sys, ollama
parts = list(ollama.Client(host=sys.argv[1]).chat(
    model="smol", stream=True, options={"num_predict": 8, "temperature": 0},
    messages=[{"role": "user", "content": "What is the capital of France?"}]))
text = "".join(p.message.content or "" for p in parts)
last = parts[-1]
assert text.strip(), parts
assert last.done and last.done_reason in ("stop", "length"), last
assert 0 < last.eval_count <= 8 and last.prompt_eval_count > 0, last
assert last.model == "smol", last
print(text)
"#;
    let output = Command::new(python3())
        .arg("-c")
        .arg(script)
        .arg(&url)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
