//! Embeddings through the front door (`POST /v1/embeddings`), driven by the official `openai`
//! Python client through a node without models to the node whose model makes them: a fake
//! OpenAI backend (exact vectors, passed through) with the client's default base64 and with
//! floats, string and list input, and cl100k token ids (decoded to their text); a chat-only
//! model, an unknown one, an id that is no token, a wrong `dimensions`, an empty list and an
//! unknown `encoding_format` each get a clear OpenAI error;
//! `/v1/models` says which models embed. And one end to end with the embedded SmolLM2 model
//! (`embeddings = true`): one unit-length vector per text, the same text the same vector,
//! different texts different ones, and chats on the same model still answered.

use std::{process::Command, time::Duration};

use base64::Engine as _;
use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{self, FakeOpenAi},
    python3,
};
use serde_json::Value;

/// Generous: CI runs this on two cores shared with other test binaries.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `tests/python/embeddings.py` against `url`; its JSON report.
fn python_embeddings(url: &str, model: &str, chat_only: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/embeddings.py");
    let output = Command::new(python3())
        .args([script, url, model, chat_only])
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `openai`)");
    assert!(
        output.status.success(),
        "embeddings.py failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("embeddings.py prints JSON")
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .expect("a vector")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// The refusal `name` in the report: its status, and its message checked to contain `words`.
fn refused(report: &Value, name: &str, status: u64, words: &[&str]) {
    let refusal = &report[name];
    assert_eq!(refusal["status"], status, "{name}: {refusal}");
    let message = refusal["message"].as_str().unwrap_or_default();
    for word in words {
        assert!(message.contains(word), "{name}: {message}");
    }
}

/// A laptop without models; a gpu whose `embedder` makes embeddings (fake backend) and whose
/// `chatty` only chats.
fn fake_mesh(h: &Harness, fake: &FakeOpenAi) -> (NodeProcess, NodeProcess) {
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"embedder\"\nbackend = \"openai\"\nbase_url = \"{url}\"\nmodel = \"text-embedding-fake\"\nembeddings = true\n\n\
             [[models]]\nname = \"chatty\"\nbackend = \"openai\"\nbase_url = \"{url}\"\nmodel = \"scripted\"\n",
            url = fake.base_url()
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    (laptop, gpu)
}

#[test]
fn the_openai_client_embeds_through_a_node_without_models_and_a_chat_model_is_named() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let (laptop, _gpu) = fake_mesh(&h, &fake);
    let report = python_embeddings(
        &laptop.http_url().expect("front door"),
        "embedder",
        "chatty",
    );

    // The server's vectors, passed through exactly, whichever encoding the client asked for.
    assert_eq!(
        floats(&report["one"]),
        fake_openai::embedding("hello world")
    );
    assert_eq!(report["one_model"], "embedder");
    assert_eq!(report["one_usage"], 2);
    let list: Vec<Vec<f32>> = report["list"]
        .as_array()
        .expect("list")
        .iter()
        .map(floats)
        .collect();
    assert_eq!(
        list,
        [
            fake_openai::embedding("the first text"),
            fake_openai::embedding("a second, different one"),
        ]
    );
    assert_eq!(report["list_usage"], serde_json::json!([7, 7]));
    // base64: the little-endian f32 bytes, as OpenAI encodes them.
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(report["base64"].as_str().expect("a base64 string"))
        .expect("valid base64");
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, fake_openai::embedding("hello world"));
    assert_eq!(
        floats(&report["same_dimensions"]),
        fake_openai::embedding("hello world")
    );

    assert_eq!(
        report["models"]["embedder"],
        serde_json::json!(["chat", "embeddings"])
    );
    assert_eq!(report["models"]["chatty"], serde_json::json!(["chat"]));

    refused(
        &report,
        "chat_only",
        400,
        &["model `chatty` does not support embeddings"],
    );
    assert_eq!(report["chat_only"]["body"]["param"], "model");
    refused(&report, "unknown", 404, &["no-such-model"]);
    assert_eq!(report["unknown"]["body"]["code"], "model_not_found");
    // Regression (issue 27): token ids (langchain's default) were a 400; they are decoded to
    // their text, which the model embeds.
    assert_eq!(
        floats(&report["tokens"]),
        fake_openai::embedding("hello world")
    );
    refused(
        &report,
        "bad_token",
        400,
        &["input[0]", "4000000 is not a token id"],
    );
    refused(
        &report,
        "dimensions",
        400,
        &["dimensions", &fake_openai::EMBEDDING_DIMENSIONS.to_string()],
    );
    refused(&report, "empty", 400, &["input"]);
    refused(&report, "format", 400, &["encoding_format", "int8"]);

    // Every text reached the backend as a list of strings, asked for as floats (the token ids
    // as the text they stand for). Of the refused requests only the wrong `dimensions` left
    // the front door: what a model makes is known from its answer.
    let sent = fake.embedding_requests();
    assert_eq!(sent.len(), 6, "{sent:?}");
    assert_eq!(sent[4]["input"], serde_json::json!(["hello world"]));
    for request in &sent {
        assert_eq!(request["model"], "text-embedding-fake");
        assert_eq!(request["encoding_format"], "float");
        assert!(request["input"].is_array(), "{request}");
    }
}

/// Cosine-free checks need only the dot product: the vectors are unit length.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn the_embedded_model_embeds_unit_vectors_through_a_hop_and_still_chats() {
    let path = mesh_tests::embedded_model_path();
    let h = Harness::new().expect("harness");
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = {path:?}\nthreads = 1\n\
             context_window = 512\nembeddings = true\n\n[roles]\nchat = [\"smol\"]\n"
        )))
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let url = laptop.http_url().expect("front door");
    let script = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=60)
texts = ["The cat sat on the mat.", "Quarterly revenue grew by twelve percent.", "The cat sat on the mat."]
vectors = [d.embedding for d in client.embeddings.create(model="smol", input=texts, encoding_format="float").data]
again = client.embeddings.create(model="smol", input=texts[0]).data[0].embedding
chat = client.chat.completions.create(model="smol", max_tokens=8,
    messages=[{"role": "user", "content": "Say hello."}])
try:
    client.embeddings.create(model="smol", input="word " * 600)
    long = None
except openai.BadRequestError as e:
    long = e.message
print(json.dumps({"vectors": vectors, "again": again, "chat": chat.choices[0].message.content, "long": long}))
"#;
    let output = Command::new(python3())
        .args(["-c", script, &url])
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    let vectors: Vec<Vec<f32>> = report["vectors"]
        .as_array()
        .expect("vectors")
        .iter()
        .map(floats)
        .collect();
    assert_eq!(vectors.len(), 3, "one vector per text");
    // SmolLM2-135M's hidden size.
    assert!(vectors.iter().all(|v| v.len() == 576), "dimension 576");
    for v in &vectors {
        let norm = dot(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit length, got {norm}");
    }
    assert!(
        (dot(&vectors[0], &vectors[2]) - 1.0).abs() < 1e-4,
        "the same text gives the same vector"
    );
    assert!(
        dot(&vectors[0], &vectors[1]) < 0.99,
        "different texts give different vectors: {}",
        dot(&vectors[0], &vectors[1])
    );
    let again = floats(&report["again"]);
    assert!(
        (dot(&vectors[0], &again) - 1.0).abs() < 1e-4,
        "the same text alone, through base64"
    );
    assert!(
        !report["chat"].as_str().unwrap_or_default().is_empty(),
        "the model still chats: {report}"
    );
    let long = report["long"]
        .as_str()
        .expect("a text over the window is refused");
    assert!(
        long.contains("input[0]") && long.contains("512-token context window"),
        "{long}"
    );
}
