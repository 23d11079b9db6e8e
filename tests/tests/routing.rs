//! Routing and delegation across real nodes: a laptop with no models, two GPU nodes serving
//! `coder` (declared GPUs, each with its own scripted model server) and a node serving `chat`.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

struct Fleet {
    harness: Harness,
    laptop: NodeProcess,
    gpu1: NodeProcess,
    gpu2: NodeProcess,
    chat: NodeProcess,
    fake1: FakeOpenAi,
    fake2: FakeOpenAi,
    _fake_chat: FakeOpenAi,
}

fn gpu_node(fake: &FakeOpenAi, vram_mb: u64) -> String {
    format!(
        r#"
[[resources.gpus]]
name = "RTX"
vram_mb = {vram_mb}

[[models]]
name = "coder-model"
backend = "openai"
base_url = "{}"
model = "scripted"

[roles]
coder = ["coder-model"]
"#,
        fake.base_url()
    )
}

/// Starts the four nodes (everyone dials the laptop) and waits for the full mesh: a laptop, two
/// GPU nodes (with `gpu_security` added to their `[security]` table) and a chat node.
fn fleet(gpu_security: &str) -> Fleet {
    let harness = Harness::new().expect("harness");
    let (fake1, fake2, fake_chat) = (
        FakeOpenAi::start(),
        FakeOpenAi::start(),
        FakeOpenAi::start(),
    );
    let laptop = harness.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu1 = harness
        .spawn(
            NodeOptions::new("gpu1")
                .peer(&laptop.addr)
                .security(&format!("client_max_tier = \"shell\"\n{gpu_security}"))
                .extra(&gpu_node(&fake1, 24576)),
        )
        .expect("gpu1");
    let gpu2 = harness
        .spawn(
            NodeOptions::new("gpu2")
                .peer(&laptop.addr)
                .security(&format!("client_max_tier = \"shell\"\n{gpu_security}"))
                .extra(&gpu_node(&fake2, 16384)),
        )
        .expect("gpu2");
    let chat = harness
        .spawn(NodeOptions::new("chatbox").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"chat-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nchat = [\"chat-model\"]\n",
            fake_chat.base_url()
        )))
        .expect("chat");
    harness
        .wait_all_up(&[&laptop, &gpu1, &gpu2, &chat], DEADLINE)
        .expect("full mesh");
    Fleet {
        harness,
        laptop,
        gpu1,
        gpu2,
        chat,
        fake1,
        fake2,
        _fake_chat: fake_chat,
    }
}

fn tasks(harness: &Harness, node: &NodeProcess) -> Vec<Value> {
    let output = harness.cli(node, &["tasks", "--json"]).expect("tasks");
    let list: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    list["tasks"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_coder_task_from_the_laptop_runs_on_a_gpu_node_and_lineage_shows_on_both() {
    let f = fleet("");
    f.fake1.push([Scripted::text("written on gpu1")]);
    let (code, result) = f
        .harness
        .run_json(
            &f.laptop,
            &["--role", "coder", "--require", "gpu", "write code"],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["executed_on"], "gpu1", "more VRAM ranks first");
    assert_eq!(result["output"], "written on gpu1");
    let id = result["task_id"].as_str().expect("id");

    let on_laptop = tasks(&f.harness, &f.laptop);
    assert_eq!(on_laptop[0]["task_id"], id);
    assert_eq!(on_laptop[0]["route"], serde_json::json!(["gpu1"]));
    assert_eq!(on_laptop[0]["hops"], 0);
    let on_gpu = tasks(&f.harness, &f.gpu1);
    assert_eq!(
        on_gpu[0]["task_id"], id,
        "the same task id on the executing node"
    );
    assert_eq!(on_gpu[0]["origin_node"], "laptop");
    assert_eq!(on_gpu[0]["hops"], 1);
    assert!(tasks(&f.harness, &f.gpu2).is_empty());

    let shown = f
        .harness
        .cli(&f.laptop, &["tasks", "show", id])
        .expect("show");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("route:    gpu1"), "{text}");
    assert!(text.contains("delegated to gpu1"), "{text}");

    // --on picks the node; --explain shows the ranking without running anything.
    f.fake2.push([Scripted::text("from gpu2")]);
    let (code, result) = f
        .harness
        .run_json(&f.laptop, &["--role", "coder", "--on", "gpu2", "again"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["executed_on"], "gpu2");
    let explain = f
        .harness
        .cli(
            &f.laptop,
            &["run", "--role", "coder", "--explain", "--json", "x"],
        )
        .expect("explain");
    let explain: Value = serde_json::from_slice(&explain.stdout).expect("json");
    let candidates = explain["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 4);
    assert_eq!(candidates[0]["node"], "gpu1");
    assert_eq!(candidates[0]["eligible"], true);
    let laptop = candidates
        .iter()
        .find(|c| c["node"] == "laptop")
        .expect("laptop");
    assert_eq!(laptop["reason"], "serves no model for role `coder`");
    assert_eq!(f.fake1.requests().len(), 1, "explain ran nothing");
}

#[test]
fn a_role_nobody_serves_fails_at_once_with_every_nodes_reason() {
    let f = fleet("");
    let started = Instant::now();
    let (code, result) = f
        .harness
        .run_json(&f.laptop, &["--role", "painter", "paint"])
        .expect("run");
    let elapsed = started.elapsed();
    assert_eq!(code, Some(1));
    let error = result["error"].as_str().expect("error");
    for node in ["laptop", "gpu1", "gpu2", "chatbox"] {
        assert!(error.contains(node), "{node} missing: {error}");
    }
    assert!(
        error.contains("serves no model for role `painter`"),
        "{error}"
    );
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");
    let _ = &f.chat;
}

#[test]
fn a_remote_shell_request_is_refused_by_a_read_only_node_and_nothing_runs() {
    let f = fleet("");
    let marker = f.harness.path().join("must-not-exist");
    f.fake1.push([
        Scripted::tool(
            "shell_exec",
            &format!(r#"{{"command": "touch {}"}}"#, marker.display()),
        ),
        Scripted::text("done"),
    ]);
    let (code, result) = f
        .harness
        .run_json(
            &f.laptop,
            &["--role", "coder", "--tier", "shell", "--on", "gpu1", "x"],
        )
        .expect("run");
    assert_eq!(code, Some(1), "{result:#}");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("up to tier `read`"),
        "{result:#}"
    );
    assert!(!marker.exists());
    assert!(
        f.fake1.requests().is_empty(),
        "the GPU node's model was never called"
    );
}

/// Starts `mesh-cli run --json` against `node` in the background.
fn background(harness: &Harness, node: &NodeProcess, args: &[&str]) -> std::process::Child {
    let mut full = vec!["run", "--json"];
    full.extend_from_slice(args);
    harness
        .cli_command(node, &full)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run")
}

fn running_on(harness: &Harness, node: &NodeProcess) -> Option<String> {
    tasks(harness, node)
        .iter()
        .find(|t| t["status"] == "running")
        .and_then(|t| t["task_id"].as_str().map(str::to_owned))
}

#[test]
fn when_the_executing_node_is_killed_the_task_fails_over_to_the_other_gpu_node() {
    let f = fleet("");
    f.fake1.push([Scripted::stall()]);
    f.fake2.push([Scripted::text("answer from gpu2")]);
    let caller = background(
        &f.harness,
        &f.laptop,
        &["--role", "coder", "--require", "gpu", "build it"],
    );
    wait_for("the task running on gpu1", DEADLINE, || {
        running_on(&f.harness, &f.gpu1)
    })
    .expect("running on gpu1");
    f.gpu1.signal("KILL").expect("sigkill");

    let output = caller.wait_with_output().expect("caller");
    let result: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(output.status.code(), Some(0), "{result:#}");
    assert_eq!(result["executed_on"], "gpu2");
    assert_eq!(result["output"], "answer from gpu2");
    let on_laptop = tasks(&f.harness, &f.laptop);
    assert_eq!(on_laptop[0]["route"], serde_json::json!(["gpu1", "gpu2"]));
}

#[test]
fn a_full_queue_spills_to_the_next_node() {
    let f = fleet("[tasks]\nworkers = 1\nqueue = 1\n");
    f.fake1.push([Scripted::stall(), Scripted::stall()]);
    f.fake2.push([Scripted::text("spilled to gpu2")]);
    // Fill gpu1 directly: one running, one queued.
    let first = background(
        &f.harness,
        &f.gpu1,
        &["--role", "coder", "--on", "gpu1", "one"],
    );
    wait_for("gpu1 running", DEADLINE, || running_on(&f.harness, &f.gpu1)).expect("running");
    let second = background(
        &f.harness,
        &f.gpu1,
        &["--role", "coder", "--on", "gpu1", "two"],
    );
    wait_for("gpu1 queued", DEADLINE, || {
        tasks(&f.harness, &f.gpu1)
            .iter()
            .any(|t| t["status"] == "queued")
            .then_some(())
    })
    .expect("queued");

    let (code, result) = f
        .harness
        .run_json(&f.laptop, &["--role", "coder", "three"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["executed_on"], "gpu2");

    for task in tasks(&f.harness, &f.gpu1) {
        if let Some(id) = task["task_id"].as_str() {
            let _ = f.harness.cli(&f.gpu1, &["tasks", "cancel", id]);
        }
    }
    for child in [first, second] {
        let _ = child.wait_with_output();
    }
}

#[test]
fn cancelling_a_delegated_task_on_the_origin_cancels_it_on_the_executing_node() {
    let f = fleet("");
    f.fake1.push([Scripted::stall()]);
    let caller = background(&f.harness, &f.laptop, &["--role", "coder", "wait"]);
    let id = wait_for("the task running on gpu1", DEADLINE, || {
        running_on(&f.harness, &f.gpu1)
    })
    .expect("running on gpu1");
    let output = f
        .harness
        .cli(&f.laptop, &["tasks", "cancel", &id])
        .expect("cancel");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = caller.wait_with_output().expect("caller");
    assert_eq!(output.status.code(), Some(1));
    wait_for("gpu1 to cancel its copy", DEADLINE, || {
        tasks(&f.harness, &f.gpu1)
            .iter()
            .any(|t| t["task_id"] == id.as_str() && t["status"] == "cancelled")
            .then_some(())
    })
    .expect("cancelled on gpu1 too");
}
