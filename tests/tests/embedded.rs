//! The embedded model backend with the real SmolLM2-135M-Instruct GGUF (`deploy/fetch-model.sh`
//! puts it into the default data dir; `MESH_EMBEDDED_MODEL` may point at another copy): a task
//! submitted to a laptop with no models runs on a "gpu" node whose `chat` role is the embedded
//! model; the model in-process (streaming, usage, stop, decode speed); structured output held to
//! a JSON schema by a grammar, in-process and through a node without models with the `openai`
//! client; and the clear errors for a missing or broken file, on which a node starts degraded and
//! a chain falls through.
//!
//! Every test here FAILS when the GGUF file is missing, with the command that fetches it: a real
//! model run is the point of this file, so it never passes silently without one.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use mesh_domain::{
    ChatRequest, ChatResponse, Message, ResponseFormat, Role, Sampling, ToolChoice, ToolSpec,
};
use mesh_node::{
    config::FETCH_HINT,
    testing::{ChatModel, EmbeddedModel, EmbeddedOptions, ModelError, delta_channel},
};
use mesh_tests::{Harness, NodeOptions, http_request, wait_for};
use serde_json::{Value, json};

const QUESTION: &str = "What is the capital of France? Answer in one word.";
/// Generous: CI runs this on two cores shared with other test binaries.
const DEADLINE: Duration = Duration::from_secs(60);

/// The GGUF file, or a failed test that says how to get it.
fn model_path() -> PathBuf {
    mesh_tests::embedded_model_path()
}

/// One inference thread per model: the tests here run in parallel on two cores, where two
/// threads per model would spin-wait on each other (llama.cpp's decode collapses from ~80 to a
/// few tokens/s when its threads do not all get a core).
const THREADS: usize = 1;

fn options(path: &Path) -> EmbeddedOptions {
    EmbeddedOptions {
        path: path.to_owned(),
        threads: THREADS,
        context_window: 2048,
        timeout: DEADLINE,
        embeddings: false,
    }
}

fn embedded_toml(name: &str, path: &Path) -> String {
    format!(
        "[[models]]\nname = {name:?}\nbackend = \"embedded\"\npath = {path:?}\nthreads = {THREADS}\n"
    )
}

/// Runs `request` on `model`, reading its deltas as they come (the channel is bounded: the
/// engine waits for a reader): the answer, and the text streamed.
async fn chat_streamed(
    model: &EmbeddedModel,
    request: &ChatRequest,
) -> (Result<ChatResponse, ModelError>, String) {
    let (tx, mut rx) = delta_channel();
    let chat = async move {
        let answer = model.chat(request, &tx).await;
        drop(tx);
        answer
    };
    let read = async {
        let mut streamed = String::new();
        while let Some(delta) = rx.recv().await {
            streamed.push_str(&delta);
        }
        streamed
    };
    tokio::join!(chat, read)
}

/// The token count in a `completed` event's text: "✓ completed on gpu in 1 rounds (42 tokens)".
fn completed_tokens(events: &[Value]) -> u64 {
    let text = events
        .iter()
        .find(|e| e["type"] == "completed")
        .and_then(|e| e["text"].as_str())
        .unwrap_or_else(|| panic!("no completed event: {events:#?}"));
    text.rsplit('(')
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {text:?}"))
}

#[test]
fn a_chat_task_from_a_laptop_runs_on_the_embedded_model_of_the_gpu_node() {
    let path = model_path();
    let harness = Harness::new().expect("harness");
    let gpu = harness
        .spawn(NodeOptions::new("gpu").extra(&format!(
            "{}\n[roles]\nchat = [\"smol\"]\n",
            embedded_toml("smol", &path)
        )))
        .expect("gpu");
    let laptop = harness
        .spawn(NodeOptions::new("laptop").peer(&gpu.addr))
        .expect("laptop");
    harness
        .wait_all_up(&[&laptop, &gpu], DEADLINE)
        .expect("both up");

    let (code, result) = harness
        .run_json(&laptop, &["--role", "chat", QUESTION])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["status"], "completed", "{result:#}");
    assert_eq!(
        result["executed_on"], "gpu",
        "the laptop serves no models: {result:#}"
    );
    let answer = result["output"].as_str().expect("output");
    assert!(!answer.trim().is_empty(), "empty answer: {result:#}");
    assert!(
        !answer.contains("<|im_"),
        "a turn marker leaked: {answer:?}"
    );

    // The usage the embedded model reported travels back with the relayed events. It is bounded
    // by the 2048-token context (prompt + answer), which the agent's own estimate (prompt and
    // tool specs at 4 characters per token) is not.
    let id = result["task_id"].as_str().expect("task id");
    let tokens = completed_tokens(&harness.task_events(&laptop, id));
    assert!(tokens > 0 && tokens <= 2048, "{tokens} tokens");

    // The gpu node loaded the model once and measured its decode speed, which the laptop sees
    // in the gpu node's capabilities (and ranks by).
    let log = gpu.log_text();
    assert_eq!(log.matches("embedded model loaded").count(), 1, "{log}");
    wait_for("the gpu model's speed at the laptop", DEADLINE, || {
        let status = harness.status(&laptop).ok()?;
        let gpu = status["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "gpu")?;
        let speed = gpu["models"][0]["tokens_per_s"].as_f64()?;
        (speed > 0.0).then_some(())
    })
    .expect("the speed is advertised");
    // And on the gpu node's /metrics, as a gauge per model; the laptop, with no model, has
    // no series rather than a zero.
    let (status, _, metrics) = http_request(&gpu, "GET", "/metrics", &[], "");
    assert_eq!(status, 200, "{metrics}");
    let speed: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"agentmesh_model_tokens_per_second{model="smol"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no speed gauge for smol: {metrics}"));
    assert!(speed > 0.0, "{metrics}");
    let (_, _, metrics) = http_request(&laptop, "GET", "/metrics", &[], "");
    assert!(
        !metrics.contains("agentmesh_model_tokens_per_second{"),
        "{metrics}"
    );
}

#[test]
fn the_model_streams_its_answer_reports_usage_and_measures_its_speed() {
    let path = model_path();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let model = EmbeddedModel::start("smol", options(&path));
        model.ready().await.expect("the model loads");
        let request = ChatRequest {
            messages: vec![Message::text(Role::User, QUESTION)],
            tools: Vec::new(),
            ..Default::default()
        };
        let (response, streamed) = chat_streamed(&model, &request).await;
        let response = response.expect("chat");
        assert_eq!(streamed, response.content, "the deltas are the answer");
        assert!(!response.content.trim().is_empty());
        assert!(
            !response.content.contains("<|im_"),
            "{:?}",
            response.content
        );
        assert!(response.tool_calls.is_empty());
        let usage = response.usage.expect("usage is reported");
        // "<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n": the question and 7 markers.
        assert!(
            (15..60).contains(&usage.prompt_tokens),
            "prompt tokens: {usage:?}"
        );
        assert!(
            usage.completion_tokens > 0 && usage.completion_tokens < 2048,
            "{usage:?}"
        );
        // Measured at load, before the first request was served.
        let speed = model.tokens_per_s().expect("speed measured at load");
        assert!(speed > 0.0, "{speed}");

        let measured = model.measure_decode(64).await.expect("measure");
        assert_eq!(measured.tokens, 64);
        assert!(measured.tokens_per_s().is_some_and(|t| t > 0.0));
    });
}

#[test]
fn max_tokens_stop_strings_and_seeded_sampling_reach_the_engine() {
    let path = model_path();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let model = EmbeddedModel::start("smol", options(&path));
        model.ready().await.expect("the model loads");
        let ask = |sampling: Sampling| {
            let model = &model;
            async move {
                // Nobody reads the text (the receiver is dropped): only the answer counts.
                let (tx, _) = delta_channel();
                let request = ChatRequest {
                    messages: vec![Message::text(Role::User, QUESTION)],
                    sampling,
                    ..Default::default()
                };
                model.chat(&request, &tx).await.expect("chat")
            }
        };
        // Greedy decoding answers the same every time; its answer names the city.
        let full = ask(Sampling::default()).await;
        let at = full
            .content
            .find("Paris")
            .expect("the greedy answer names Paris");

        let short = ask(Sampling {
            max_tokens: Some(2),
            ..Sampling::default()
        })
        .await;
        let usage = short.usage.expect("usage");
        assert_eq!(usage.completion_tokens, 2, "{:?}", short.content);
        assert!(full.content.starts_with(&short.content), "{short:?}");

        let stopped = ask(Sampling {
            stop: vec!["Paris".into()],
            ..Sampling::default()
        })
        .await;
        assert_eq!(
            stopped.content,
            full.content[..at],
            "cut before the stop string"
        );

        // A temperature draws; the same seed draws the same answer.
        let seeded = Sampling {
            temperature: Some(1.5),
            top_p: Some(0.95),
            seed: Some(7),
            max_tokens: Some(24),
            ..Sampling::default()
        };
        let first = ask(seeded.clone()).await;
        let again = ask(seeded).await;
        assert!(!first.content.is_empty());
        assert_eq!(first.content, again.content, "one seed, one answer");
        // ...and other seeds draw other answers (greedy decoding would give one answer).
        let mut answers = std::collections::BTreeSet::new();
        for seed in 1..=5 {
            let drawn = ask(Sampling {
                temperature: Some(1.5),
                seed: Some(seed),
                max_tokens: Some(24),
                ..Sampling::default()
            })
            .await;
            answers.insert(drawn.content);
        }
        assert!(answers.len() > 1, "five seeds, one answer: {answers:?}");
    });
}

#[test]
fn a_missing_or_broken_model_file_is_a_clear_error_naming_the_path_and_the_fix() {
    let path = model_path();
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let missing = dir.path().join("nowhere.gguf");
        let not_gguf = dir.path().join("notes.gguf");
        std::fs::write(&not_gguf, "just some text").expect("write");
        // A download cut short: the header is right, the tensors are missing.
        let truncated = dir.path().join("truncated.gguf");
        let bytes = std::fs::read(&path).expect("read the model");
        std::fs::write(&truncated, &bytes[..1 << 20]).expect("write");

        for (file, problem) in [
            (&missing, "not found"),
            (&not_gguf, "not a GGUF file"),
            (&truncated, "cannot load"),
        ] {
            let model = EmbeddedModel::start("broken", options(file));
            let Err(ModelError::Unreachable(message)) = model.ready().await else {
                panic!("{} must not load", file.display());
            };
            let shown = file.display().to_string();
            assert!(message.contains(&shown), "{message}");
            assert!(message.contains(problem), "{message}");
            assert!(message.contains(FETCH_HINT), "{message}");
            // A chat call gets the same answer, as an error the chain falls through.
            // Nobody reads the text (the receiver is dropped): only the answer counts.
            let (tx, _) = delta_channel();
            let request = ChatRequest {
                messages: vec![Message::text(Role::User, "hi")],
                tools: Vec::new(),
                ..Default::default()
            };
            let error = model.chat(&request, &tx).await.expect_err("no model");
            assert!(error.falls_through(), "{error}");
            assert!(error.to_string().contains(&shown), "{error}");
        }
    });
}

#[test]
fn a_node_with_a_missing_model_file_starts_degraded_and_its_chain_falls_through() {
    let path = model_path();
    let harness = Harness::new().expect("harness");
    let missing = harness.path().join("models/missing.gguf");
    let node = harness
        .spawn(NodeOptions::new("alpha").extra(&format!(
            "{}\n{}\n[roles]\nchat = [\"gone\", \"smol\"]\n",
            embedded_toml("gone", &missing),
            embedded_toml("smol", &path)
        )))
        .expect("the node starts");
    wait_for("degraded health", DEADLINE, || {
        let status = harness.status(&node).ok()?;
        let health = &status["nodes"][0]["health"];
        let reasons = health["reasons"].to_string();
        (health["status"] == "degraded"
            && reasons.contains("model gone")
            && reasons.contains("missing.gguf")
            && reasons.contains("deploy/fetch-model.sh"))
        .then_some(())
    })
    .expect("the missing file is reported");

    let (code, result) = harness
        .run_json(&node, &["--role", "chat", QUESTION])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert!(!result["output"].as_str().unwrap_or_default().is_empty());
    let id = result["task_id"].as_str().expect("task id");
    let events = harness.task_events(&node, id);
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "model_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{events:#?}");
    let text = failed[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("missing.gguf") && text.contains("trying the next model"),
        "{text}"
    );
}

/// A streaming client on a raw socket with a small receive buffer: sends a chat for `max_tokens`
/// tokens to the front door at `base`, reads until the first chunk, says `stalled` and stops
/// reading. Then, for each `count` line on its stdin, it prints the tokens the model generated
/// so far (`/metrics`, read on a connection of its own); on any other line it reads the stream
/// to its end and prints what it got as JSON.
const STALLING_CLIENT: &str = r#"
import json, socket, sys, urllib.request
base, max_tokens = sys.argv[1], int(sys.argv[2])
host, port = base.removeprefix("http://").rsplit(":", 1)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
# Before connecting: the window the client advertises is then small from the start.
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect((host, int(port)))
body = json.dumps({"model": "smol", "stream": True, "max_tokens": max_tokens, "seed": 7,
                   "messages": [{"role": "user", "content":
                       "Write a very long story about a lighthouse keeper and the sea."}]}).encode()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
          b"Content-Type: application/json\r\nConnection: close\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
got = b""
while b"data: {" not in got:
    piece = s.recv(1024)
    if not piece:
        sys.exit("the stream ended before its first chunk: " + got.decode(errors="replace"))
    got += piece
print("stalled", flush=True)
series = 'agentmesh_model_tokens_generated_total{model="smol"} '
for command in sys.stdin:
    if command.strip() != "count":
        break
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    print(next((l[len(series):] for l in metrics.splitlines() if l.startswith(series)), "0"),
          flush=True)
while True:
    piece = s.recv(65536)
    if not piece:
        break
    got += piece
text = got.decode(errors="replace")
print(json.dumps({"head": text.split("\r\n")[0], "done": "data: [DONE]" in text}), flush=True)
"#;

/// Issue 29: a chat's text crossed unbounded channels from the embedded engine to the front
/// door's client, so a client that stopped reading made the node generate, and hold, the whole
/// answer. Now the stream is bounded from the engine thread to the socket: while the client
/// does not read, the engine waits, and the tokens generated (`/metrics`) stop well short of
/// `max_tokens`; once it reads again, the generation goes on to the end of the answer.
///
/// In a namespace of its own, whose TCP send buffers are capped as a real link's would be: on
/// the machine's loopback (64 KiB segments) the kernel starts a connection's send buffer at a few
/// MiB, more than the whole answer of this model's 2,048-token context.
#[test]
fn a_slow_streaming_client_holds_the_embedded_models_generation_back() {
    use std::io::{BufRead, Write};
    /// What the answer may reach: far more tokens than the buffers on the way hold.
    const MAX_TOKENS: u64 = 1000;
    /// Most tokens generated while the client does not read: the deltas, events and frames
    /// channels (16 + 64 + 64 deltas), the response body's queue and both sockets' buffers
    /// (some 200 bytes of server-sent event per token), with room.
    const HELD: u64 = 500;
    let path = model_path();
    let ns = mesh_tests::Netns::new().expect("namespace");
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(["sysctl", "-q", "-w", "net.ipv4.tcp_wmem=4096 16384 16384"])
        .status()
        .expect("run sysctl");
    assert!(status.success(), "cap the namespace's TCP send buffers");
    let harness = Harness::new().expect("harness");
    let gpu = harness
        .spawn(
            NodeOptions::new("gpu")
                .in_netns(&ns)
                .extra(&embedded_toml("smol", &path)),
        )
        .expect("gpu");
    let url = gpu.http_url().expect("front door");
    let mut client = ns
        .command(&mesh_tests::python3())
        .args(["-c", STALLING_CLIENT, &url, &MAX_TOKENS.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut stdin = client.stdin.take().expect("stdin");
    let mut said = std::io::BufReader::new(client.stdout.take().expect("stdout"));
    let mut line = String::new();
    said.read_line(&mut line).expect("read the client");
    assert_eq!(line.trim(), "stalled", "the client got no first chunk");
    let mut generated = || -> u64 {
        writeln!(stdin, "count").expect("ask the client");
        line.clear();
        said.read_line(&mut line).expect("read the client");
        line.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };

    // The client reads nothing now. Unheld, the model would pass `HELD` tokens in `HELD / speed`
    // seconds; the count is watched twice that long (10 to 40 s) and must stay under.
    let speed = wait_for("the model's decode speed", DEADLINE, || {
        let status = harness.status(&gpu).ok()?;
        let gpu = status["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "gpu")?;
        gpu["models"][0]["tokens_per_s"]
            .as_f64()
            .filter(|v| *v > 0.0)
    })
    .expect("the speed is measured at load");
    let watched = Duration::from_secs_f64((2.0 * HELD as f64 / speed).clamp(10.0, 40.0));
    let until = std::time::Instant::now() + watched;
    let mut held = 0;
    while std::time::Instant::now() < until {
        held = generated();
        assert!(
            held < HELD,
            "{held} tokens generated for a client that reads nothing (decode speed {speed:.0} tok/s)"
        );
        // The window is what is tested (nothing to wait for: the count must stay under for its
        // length), sampled every 200 ms so the sampling does not take the model's core.
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(held > 0, "the generation started");

    // The client reads again: the generation goes on to the end of the answer.
    writeln!(stdin, "resume").expect("resume the client");
    line.clear();
    said.read_line(&mut line).expect("read the client");
    let got: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(client.wait().expect("client").success());
    assert!(
        got["head"].as_str().unwrap_or_default().contains(" 200"),
        "{got}"
    );
    assert_eq!(got["done"], true, "the stream ended with [DONE]: {got}");
    let metrics = ns
        .command(&mesh_tests::python3())
        .args(["-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"])
        .arg(format!("{url}/metrics"))
        .output()
        .expect("read /metrics");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let total: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agentmesh_model_tokens_generated_total{model=\"smol\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of generated tokens: {metrics}"));
    assert!(
        total > held,
        "the generation went on once the client read: {total} after {held} held"
    );
    println!(
        "held {held} tokens while the client stalled; {total} in all (speed {speed:.0} tok/s, watched {watched:?})"
    );
}

#[test]
fn a_call_that_times_out_is_abandoned_and_the_engine_serves_the_next_one() {
    let path = model_path();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let impatient = Duration::from_millis(1);
        let model = EmbeddedModel::start(
            "impatient",
            EmbeddedOptions {
                timeout: impatient,
                ..options(&path)
            },
        );
        model.ready().await.expect("the model loads");
        // Nobody reads the text (the receiver is dropped): only the answer counts.
        let (tx, _) = delta_channel();
        let request = ChatRequest {
            messages: vec![Message::text(
                Role::User,
                "Write a long story about the sea.",
            )],
            tools: Vec::new(),
            ..Default::default()
        };
        let error = model
            .chat(&request, &tx)
            .await
            .expect_err("1 ms is too short");
        assert_eq!(error, ModelError::Timeout(impatient));
        assert!(error.falls_through());
        // The engine dropped the abandoned request and still answers.
        let measured = model.measure_decode(8).await.expect("measure");
        assert_eq!(measured.tokens, 8);
    });
}

/// `response_format` on the embedded model: the grammar holds SmolLM2 to a JSON schema (it
/// writes free text without one) and to any JSON object; a schema the compiler refuses is a 400
/// refusal naming the field.
#[test]
fn structured_output_follows_the_schema_and_what_cannot_be_honoured_is_refused() {
    let path = model_path();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let model = EmbeddedModel::start("smol", options(&path));
        model.ready().await.expect("the model loads");
        let ask = |format: ResponseFormat| {
            let model = &model;
            async move {
                // Nobody reads the text (the receiver is dropped): only the answer counts.
                let (tx, _) = delta_channel();
                let request = ChatRequest {
                    messages: vec![Message::text(
                        Role::User,
                        "Describe the capital of France: its name, its country and its population.",
                    )],
                    response_format: Some(format),
                    ..Default::default()
                };
                model.chat(&request, &tx).await
            }
        };
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "country": {"type": "string", "maxLength": 30},
                "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
                "capital": {"type": "boolean"},
            },
            "required": ["city", "country", "population", "capital"],
            "additionalProperties": false,
        });
        let answer = ask(ResponseFormat::JsonSchema {
            name: "city".into(),
            schema,
            strict: true,
        })
        .await
        .expect("chat");
        let parsed: Value = serde_json::from_str(&answer.content)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", answer.content));
        let object = parsed.as_object().expect("an object");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["capital", "city", "country", "population"],
            "{parsed}"
        );
        for field in ["city", "country"] {
            let text = parsed[field].as_str().unwrap_or_else(|| panic!("{parsed}"));
            assert!(text.chars().count() <= 30, "{parsed}");
        }
        let population = parsed["population"]
            .as_u64()
            .unwrap_or_else(|| panic!("{parsed}"));
        assert!(population <= 100_000_000, "{parsed}");
        assert!(parsed["capital"].is_boolean(), "{parsed}");

        let answer = ask(ResponseFormat::JsonObject).await.expect("chat");
        let parsed: Value = serde_json::from_str(&answer.content)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", answer.content));
        assert!(parsed.is_object(), "{parsed}");

        let bad = ResponseFormat::JsonSchema {
            name: "bad".into(),
            schema: json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
            strict: false,
        };
        match ask(bad).await {
            Err(ModelError::Refused {
                status: 400,
                message,
            }) => {
                assert!(message.starts_with("response_format:"), "{message}")
            }
            other => panic!("a schema the compiler refuses must be a 400: {other:?}"),
        }
    });
}

/// `tool_choice` on the embedded model: a demanded call comes back as the answer's tool call
/// (no text streamed), naming an offered tool with arguments that match its schema; with
/// `auto` SmolLM2 answers in text; a call it cannot write within `max_tokens` is an error.
#[test]
fn a_demanded_tool_call_follows_the_tools_schema() {
    let path = model_path();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let model = EmbeddedModel::start("smol", options(&path));
        model.ready().await.expect("the model loads");
        let tools = vec![
            ToolSpec {
                name: "weather".into(),
                description: "The weather in a city.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["city", "unit"],
                    "additionalProperties": false,
                }),
            },
            ToolSpec {
                name: "clock".into(),
                description: "The time now.".into(),
                parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
            },
        ];
        let ask = |choice: ToolChoice, max_tokens: Option<u32>| {
            let (model, tools) = (&model, tools.clone());
            async move {
                let mut request = ChatRequest {
                    messages: vec![Message::text(Role::User, "What is the weather in Paris?")],
                    tools,
                    tool_choice: Some(choice),
                    ..Default::default()
                };
                request.sampling.max_tokens = max_tokens;
                chat_streamed(model, &request).await
            }
        };
        let (answer, streamed) = ask(ToolChoice::Function("weather".into()), None).await;
        let answer = answer.expect("a call");
        assert_eq!(answer.content, "");
        assert_eq!(streamed, "", "a call is not streamed as text");
        assert_eq!(answer.tool_calls.len(), 1, "{answer:?}");
        let call = &answer.tool_calls[0];
        assert_eq!(call.name, "weather");
        let arguments: Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
        let city = arguments["city"].as_str().unwrap_or_else(|| panic!("{arguments}"));
        assert!(city.chars().count() <= 20, "{arguments}");
        assert!(["celsius", "fahrenheit"].contains(&arguments["unit"].as_str().unwrap_or("")));
        assert_eq!(arguments.as_object().map(|o| o.len()), Some(2), "{arguments}");

        let (answer, _) = ask(ToolChoice::Required, None).await;
        let answer = answer.expect("a call");
        assert!(
            ["weather", "clock"].contains(&answer.tool_calls[0].name.as_str()),
            "{answer:?}"
        );

        let (answer, streamed) = ask(ToolChoice::Auto, Some(8)).await;
        let answer = answer.expect("text");
        assert!(answer.tool_calls.is_empty() && !answer.content.is_empty(), "{answer:?}");
        assert_eq!(streamed, answer.content);

        match ask(ToolChoice::Function("weather".into()), Some(3)).await.0 {
            Err(ModelError::Protocol(message)) => {
                assert!(message.contains("cut off after 3 tokens"), "{message}")
            }
            other => panic!("a call cut by max_tokens must be an error: {other:?}"),
        }
    });
}

/// Structured output end to end: the official `openai` client asks a node without models for a
/// JSON schema answer, the node places it on its peer's SmolLM2, and the answer parses and
/// matches the schema; `tool_choice` `required` gets a tool call the client reads as one. A
/// schema the engine cannot enforce is a 400 naming `response_format`, at the serving node's
/// front door and through a hop (`Models.Chat` carries a model's refusal as `INVALID_ARGUMENT`).
#[test]
fn the_openai_client_gets_schema_shaped_json_from_the_embedded_model_through_a_hop() {
    let path = model_path();
    let harness = Harness::new().expect("harness");
    let gpu = harness
        .spawn(NodeOptions::new("gpu").extra(&format!(
            "{}\n[roles]\nchat = [\"smol\"]\n",
            embedded_toml("smol", &path)
        )))
        .expect("gpu");
    let laptop = harness
        .spawn(NodeOptions::new("laptop").peer(&gpu.addr))
        .expect("laptop");
    harness
        .wait_all_up(&[&laptop, &gpu], DEADLINE)
        .expect("both up");
    let url = laptop.http_url().expect("front door");
    let gpu_url = gpu.http_url().expect("gpu front door");
    let script = r##"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k", max_retries=0, timeout=60)
serving = openai.OpenAI(base_url=sys.argv[2] + "/v1", api_key="k", max_retries=0, timeout=60)
ask = {"model": "smol", "messages": [{"role": "user", "content": "Name a colour and a number."}]}
schema = {"type": "object", "additionalProperties": False, "required": ["colour", "number"],
          "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                         "number": {"type": "integer", "minimum": 1, "maximum": 9}}}
r = client.chat.completions.create(
    response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}, **ask)
answer = json.loads(r.choices[0].message.content)
assert set(answer) == {"colour", "number"}, answer
assert answer["colour"] in ("red", "green", "blue") and 1 <= answer["number"] <= 9, answer
assert r.usage.completion_tokens > 0, r.usage
tool = {"type": "function", "function": {"name": "pick", "description": "Pick a colour.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["colour"],
                       "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}}}}}
r = client.chat.completions.create(tools=[tool], tool_choice="required", **ask)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
call = choice.message.tool_calls[0]
assert call.function.name == "pick" and json.loads(call.function.arguments)["colour"] in ("red", "blue"), call
unenforceable = {"type": "json_schema", "json_schema": {"name": "bad", "schema":
                 {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
refusals = []
for c in (serving, client):
    try:
        c.chat.completions.create(response_format=unenforceable, **ask)
        raise AssertionError("an unenforceable schema was not refused")
    except openai.APIStatusError as e:
        refusals.append({"status": e.status_code, "message": e.message})
print(json.dumps(refusals))
"##;
    let output = std::process::Command::new(mesh_tests::python3())
        .args(["-c", script, &url, &gpu_url])
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let refused: Value = serde_json::from_slice(&output.stdout).expect("json");
    for refusal in refused.as_array().expect("two refusals") {
        let message = refusal["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("response_format: embedded model `smol`"),
            "{refused}"
        );
    }
    assert_eq!(refused[0]["status"], 400, "at the serving node: {refused}");
    assert_eq!(refused[1]["status"], 400, "through a hop: {refused}");
}
