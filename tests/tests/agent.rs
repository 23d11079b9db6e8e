//! The agent runtime end to end: a real node process, real gRPC and `mesh-cli`, and a scripted
//! fake OpenAI server standing in for the model so every round of the tools loop is exact.

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

fn model_config(fake: &FakeOpenAi, extra: &str) -> String {
    format!(
        r#"
[[models]]
name = "fake"
backend = "openai"
base_url = "{}"
model = "scripted"

[roles]
chat = ["fake"]
{extra}
"#,
        fake.base_url()
    )
}

fn start(harness: &Harness, name: &str, config: &str) -> NodeProcess {
    harness
        .spawn(NodeOptions::new(name).extra(config))
        .expect("node starts")
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

#[test]
fn a_three_round_tool_loop_reads_a_file_lists_nodes_and_answers() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    std::fs::write(
        node.data_dir.join("workspace/notes.txt"),
        "the build is green",
    )
    .expect("notes");
    fake.push([
        Scripted::tool("file_read", r#"{"path": "notes.txt"}"#),
        Scripted::tool("list_nodes", "{}"),
        Scripted::text("The build is green and alpha is up."),
    ]);

    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "summarise the notes"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["status"], "completed");
    assert_eq!(result["output"], "The build is green and alpha is up.");
    assert_eq!(result["executed_on"], "alpha");
    assert!(result.get("error").is_none());

    let requests = fake.requests();
    assert_eq!(requests.len(), 3, "three model rounds");
    assert!(requests[0]["tools"].to_string().contains("file_read"));
    assert!(
        !requests[0]["tools"].to_string().contains("shell_exec"),
        "a read-tier task is not offered shell_exec"
    );
    assert!(
        fake.request_text(1).contains("the build is green"),
        "round 2 sees the file"
    );
    assert!(
        fake.request_text(2).contains("alpha"),
        "round 3 sees the node list"
    );

    let events = harness.task_events(&node, result["task_id"].as_str().expect("id"));
    assert_eq!(count(&events, "tool_called"), 2);
    assert_eq!(count(&events, "tool_result"), 2);
    assert_eq!(count(&events, "model_call"), 3);
    assert_eq!(events.first().expect("first")["type"], "accepted");
    assert_eq!(events.last().expect("last")["type"], "completed");

    // The plain (streaming) form prints the answer on stdout and the tool steps on stderr.
    fake.push([Scripted::text("streamed answer")]);
    let output = harness
        .cli(&node, &["run", "--role", "chat", "again"])
        .expect("run");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "streamed answer"
    );
}

#[test]
fn a_dead_primary_falls_through_to_the_backup_and_the_node_reports_it() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let config = format!(
        r#"
[[models]]
name = "dead"
backend = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "nothing-listens-here"

[[models]]
name = "backup"
backend = "openai"
base_url = "{}"
model = "scripted"

[roles]
chat = ["dead", "backup"]
"#,
        fake.base_url()
    );
    let node = start(&harness, "alpha", &config);
    fake.push([Scripted::text("answered by the backup")]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "hello"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["output"], "answered by the backup");
    let events = harness.task_events(&node, result["task_id"].as_str().expect("id"));
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "model_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{events:#?}");
    assert!(failed[0]["text"].as_str().expect("text").contains("dead"));
    assert!(
        failed[0]["text"]
            .as_str()
            .expect("text")
            .contains("trying the next model")
    );

    // The startup probe found the dead endpoint: the node is degraded, and says why.
    wait_for("degraded health", DEADLINE, || {
        let status = harness.status(&node).ok()?;
        let health = &status["nodes"][0]["health"];
        (health["status"] == "degraded" && health["reasons"].to_string().contains("model dead"))
            .then_some(())
    })
    .expect("model probe reported");
}

#[test]
fn the_same_call_four_times_is_a_detected_loop() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push((0..4).map(|_| Scripted::tool("list_nodes", "{}")));
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "loop"])
        .expect("run");
    assert_eq!(code, Some(1));
    assert_eq!(result["status"], "failed");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("loop detected"),
        "{result:#}"
    );
    assert_eq!(result["error_kind"], "gate");
    assert!(
        fake.request_text(3).contains("same arguments 3 times"),
        "the intervention reached the model before the 4th call"
    );
}

#[test]
fn malformed_arguments_get_one_correction_then_fail() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push([
        Scripted::tool("file_read", "{not json"),
        Scripted::tool("file_read", "{still: not json"),
    ]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "read"])
        .expect("run");
    assert_eq!(code, Some(1));
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("malformed tool call"),
        "{result:#}"
    );
    assert!(
        fake.request_text(1).contains("not a valid JSON object"),
        "one correction"
    );
    assert_eq!(fake.requests().len(), 2);
}

#[test]
fn shell_is_refused_below_the_shell_tier_and_runs_at_it() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    let marker = harness.path().join("shell-ran");
    let call = format!(r#"{{"command": "touch {}"}}"#, marker.display());

    fake.push([
        Scripted::tool("shell_exec", &call),
        Scripted::text("could not"),
    ]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "touch it"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert!(
        !marker.exists(),
        "the command must not run at the read tier"
    );
    assert!(
        fake.request_text(1).contains("Refused"),
        "the model sees the refusal"
    );

    fake.push([Scripted::tool("shell_exec", &call), Scripted::text("done")]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "--tier", "shell", "touch it"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert!(marker.exists(), "at the shell tier the command runs");
    assert!(fake.request_text(3).contains("exit_code"));
}

#[test]
fn a_task_over_its_token_budget_fails_with_the_figures() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push([Scripted::text("expensive").usage(900, 600)]);
    let (code, result) = harness
        .run_json(
            &node,
            &["--role", "chat", "--token-budget", "1000", "spend"],
        )
        .expect("run");
    assert_eq!(code, Some(1));
    assert_eq!(result["error_kind"], "budget");
    assert_eq!(result["error_fields"]["limit"], "1000");
    assert_eq!(result["error_fields"]["used"], "1500");
}

#[test]
fn a_deadline_ends_a_task_whose_model_never_answers() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push([Scripted::stall()]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "--timeout", "1", "wait"])
        .expect("run");
    assert_eq!(code, Some(1));
    assert_eq!(result["error_kind"], "deadline", "{result:#}");
}

/// Starts `mesh-cli run --json` in the background.
fn run_in_background(harness: &Harness, node: &NodeProcess, prompt: &str) -> std::process::Child {
    harness
        .cli_command(node, &["run", "--json", "--role", "chat", prompt])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run")
}

fn tasks_with_status(harness: &Harness, node: &NodeProcess, status: &str) -> Vec<String> {
    let output = harness.cli(node, &["tasks", "--json"]).expect("tasks");
    let list: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    list["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["status"] == status)
        .filter_map(|t| t["task_id"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn cancelling_a_running_task_ends_it_for_its_caller() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push([Scripted::stall()]);
    let caller = run_in_background(&harness, &node, "wait forever");
    let id = wait_for("the task to run", DEADLINE, || {
        tasks_with_status(&harness, &node, "running").pop()
    })
    .expect("running");
    let output = harness
        .cli(&node, &["tasks", "cancel", &id])
        .expect("cancel");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = caller.wait_with_output().expect("caller ends");
    assert_eq!(output.status.code(), Some(1));
    let result: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(result["error_kind"], "cancelled", "{result:#}");
}

#[test]
fn a_full_queue_answers_resource_exhausted_at_once() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(
        &harness,
        "alpha",
        &model_config(&fake, "[tasks]\nworkers = 1\nqueue = 1\n"),
    );
    fake.push([Scripted::stall(), Scripted::stall()]);
    let running = run_in_background(&harness, &node, "first");
    wait_for("first task running", DEADLINE, || {
        tasks_with_status(&harness, &node, "running").pop()
    })
    .expect("running");
    let queued = run_in_background(&harness, &node, "second");
    wait_for("second task queued", DEADLINE, || {
        tasks_with_status(&harness, &node, "queued").pop()
    })
    .expect("queued");

    let started = Instant::now();
    let output = harness
        .cli(&node, &["run", "--role", "chat", "third"])
        .expect("third");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("queue full"), "{stderr}");
    assert!(
        started.elapsed() < DEADLINE,
        "refused at once, not after a wait"
    );

    // The load the node advertises is real.
    let status = harness.status(&node).expect("status");
    assert_eq!(status["nodes"][0]["load"]["running"], 1);
    assert_eq!(status["nodes"][0]["load"]["queued"], 1);

    for id in tasks_with_status(&harness, &node, "running")
        .into_iter()
        .chain(tasks_with_status(&harness, &node, "queued"))
    {
        harness
            .cli(&node, &["tasks", "cancel", &id])
            .expect("cancel");
    }
    for child in [running, queued] {
        let output = child.wait_with_output().expect("caller ends");
        assert_eq!(output.status.code(), Some(1));
    }
}

#[test]
fn task_history_survives_a_restart() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let config = model_config(&fake, "");
    let mut node = start(&harness, "alpha", &config);
    fake.push([Scripted::text("remember me")]);
    let (code, result) = harness
        .run_json(&node, &["--role", "chat", "first"])
        .expect("run");
    assert_eq!(code, Some(0));
    let id = result["task_id"].as_str().expect("id").to_owned();

    node.signal("TERM").expect("stop");
    assert_eq!(node.wait_exit(DEADLINE).expect("exit"), Some(0));
    let node = start(&harness, "alpha", &config);
    let completed = tasks_with_status(&harness, &node, "completed");
    assert_eq!(completed, std::slice::from_ref(&id));
    let events = harness.task_events(&node, &id);
    assert_eq!(events.last().expect("events")["type"], "completed");
}

#[test]
fn a_persona_brings_its_prompt_its_tools_and_its_tier_cap() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let personas = r#"
[[personas]]
name = "reader"
role = "chat"
system_prompt = "You only read files."
tools = ["file_read"]
max_tier = "read"
"#;
    let node = start(&harness, "alpha", &model_config(&fake, personas));
    let marker = harness.path().join("persona-shell");
    let call = format!(r#"{{"command": "touch {}"}}"#, marker.display());
    fake.push([
        Scripted::tool("shell_exec", &call),
        Scripted::text("no shell for me"),
    ]);
    let (code, result) = harness
        .run_json(
            &node,
            &["--persona", "reader", "--tier", "shell", "try the shell"],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert!(
        !marker.exists(),
        "the persona's read cap wins over the caller's shell tier"
    );
    let first = &fake.requests()[0];
    assert_eq!(first["messages"][0]["role"], "system");
    assert_eq!(first["messages"][0]["content"], "You only read files.");
    let tools: Vec<_> = first["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    assert_eq!(tools, ["file_read"]);

    let (code, result) = harness
        .run_json(&node, &["--persona", "nobody", "hello"])
        .expect("run");
    assert_eq!(code, Some(1));
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error_kind"], "rejected");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("has no persona `nobody`")
    );
}

#[test]
fn sigterm_hands_back_queued_tasks_and_cancels_running_ones_after_the_grace_period() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let mut node = start(
        &harness,
        "alpha",
        &model_config(&fake, "[tasks]\nworkers = 1\nqueue = 4\n"),
    );
    fake.push([Scripted::stall(), Scripted::stall()]);
    let running = run_in_background(&harness, &node, "first");
    wait_for("first task running", DEADLINE, || {
        tasks_with_status(&harness, &node, "running").pop()
    })
    .expect("running");
    let queued = run_in_background(&harness, &node, "second");
    wait_for("second task queued", DEADLINE, || {
        tasks_with_status(&harness, &node, "queued").pop()
    })
    .expect("queued");

    node.signal("TERM").expect("sigterm");
    let result = |child: std::process::Child| -> Value {
        let output = child.wait_with_output().expect("caller ends");
        assert_eq!(output.status.code(), Some(1));
        serde_json::from_slice(&output.stdout).expect("json")
    };
    let queued = result(queued);
    assert_eq!(queued["error_kind"], "cancelled");
    assert!(
        queued["error"]
            .as_str()
            .expect("error")
            .contains("shutting down"),
        "{queued:#}"
    );
    let running = result(running);
    assert_eq!(running["error_kind"], "cancelled");
    assert!(
        running["error"]
            .as_str()
            .expect("error")
            .contains("shutting down"),
        "{running:#}"
    );
    assert_eq!(
        node.wait_exit(Duration::from_secs(30)).expect("exit"),
        Some(0)
    );
}

#[test]
fn a_task_that_keeps_calling_tools_stops_at_max_rounds() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    fake.push((0..3).map(|i| Scripted::tool("list_nodes", &format!("{{\"page\": {i}}}"))));
    let (code, result) = harness
        .run_json(
            &node,
            &["--role", "chat", "--max-rounds", "2", "keep going"],
        )
        .expect("run");
    assert_eq!(code, Some(1));
    assert_eq!(result["error_kind"], "budget", "{result:#}");
    assert_eq!(result["error_fields"]["what"], "rounds");
    assert_eq!(result["error_fields"]["limit"], "2");
    assert_eq!(fake.requests().len(), 2);
}

#[test]
fn a_persona_that_always_delegates_is_stopped_by_the_hop_limit() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    // Each nesting level holds a worker while its sub-task runs, so give it enough of them.
    let config = r#"
[[personas]]
name = "relay"
role = "chat"
system_prompt = "Always delegate."
tools = ["delegate"]

[tasks]
workers = 8
"#;
    let node = start(&harness, "alpha", &model_config(&fake, config));
    let call = r#"{"persona": "relay", "prompt": "go deeper"}"#;
    fake.push((0..5).map(|_| Scripted::tool("delegate", call)));
    fake.push((0..5).map(|_| Scripted::text("stopped")));
    let (code, result) = harness
        .run_json(&node, &["--persona", "relay", "start"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    // Levels 0..=4 ran; the fifth nesting (hops 5) was refused and the model saw why.
    let refused = fake
        .requests()
        .iter()
        .any(|r| r["messages"].to_string().contains("hop limit"));
    assert!(
        refused,
        "the innermost delegate call was refused by the hop limit"
    );
    let output = harness.cli(&node, &["tasks", "--json"]).expect("tasks");
    let list: Value = serde_json::from_slice(&output.stdout).expect("json");
    let mut hops: Vec<u64> = list["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["hops"].as_u64().expect("hops"))
        .collect();
    hops.sort_unstable();
    assert_eq!(hops, [0, 1, 2, 3, 4]);
    let with_parent = list["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter(|t| !t["parent_id"].as_str().unwrap_or_default().is_empty())
        .count();
    assert_eq!(with_parent, 4, "every sub-task names its parent");
}

#[test]
fn a_delegate_call_above_the_tasks_tier_is_refused_and_no_sub_task_runs() {
    let fake = FakeOpenAi::start();
    let worker = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    // Role `worker` (in the `[roles]` table model_config opens) is served by a second fake model,
    // so every sub-task shows there.
    let extra = format!(
        r#"worker = ["worker"]

[[models]]
name = "worker"
backend = "openai"
base_url = "{}"
model = "scripted"
"#,
        worker.base_url()
    );
    let node = start(&harness, "alpha", &model_config(&fake, &extra));
    let marker = harness.path().join("delegated-shell-ran");
    let shell = format!(r#"{{"command": "touch {}"}}"#, marker.display());
    let delegate = |tier: &str| {
        Scripted::tool(
            "delegate",
            &format!(r#"{{"role": "worker", "tier": "{tier}", "prompt": "run it"}}"#),
        )
    };

    // A `write` task may delegate, but not a `shell` sub-task, nor one at a tier it does not
    // know (which counts as `shell`).
    fake.push([
        delegate("shell"),
        delegate("root"),
        Scripted::text("could not delegate"),
    ]);
    worker.push([
        Scripted::tool("shell_exec", &shell),
        Scripted::text("ran it"),
    ]);
    let (code, result) = harness
        .run_json(
            &node,
            &["--role", "chat", "--tier", "write", "delegate the shell"],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["output"], "could not delegate");
    assert_eq!(
        worker.requests().len(),
        0,
        "a sub-task reached the worker model; its first request: {}",
        worker.request_text(0)
    );
    assert!(!marker.exists(), "the shell command must not run");
    let seen = fake.request_text(2);
    assert_eq!(
        seen.matches(
            "Refused: `delegate` needs the `shell` tier and this task may only use `write`"
        )
        .count(),
        2,
        "the model sees both refusals and why: {seen}"
    );
    let id = result["task_id"].as_str().expect("id");
    let events = harness.task_events(&node, id);
    let refusals: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "intervention")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(refusals.len(), 2, "{events:#?}");
    assert!(
        refusals.iter().all(|t| t.contains("supervisor (tier)")),
        "{refusals:?}"
    );
    let output = harness.cli(&node, &["tasks", "--json"]).expect("tasks");
    let list: Value = serde_json::from_slice(&output.stdout).expect("json");
    let tasks = list["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 1, "no sub-task was created: {list:#}");
    assert_eq!(tasks[0]["task_id"], id);

    // The control: a `shell` task delegating the same `shell` sub-task runs it.
    fake.push([delegate("shell"), Scripted::text("delegated")]);
    let (code, result) = harness
        .run_json(
            &node,
            &["--role", "chat", "--tier", "shell", "delegate the shell"],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(worker.requests().len(), 2, "the sub-task ran on the worker");
    assert!(marker.exists(), "the delegated shell command ran");
    assert!(
        fake.request_text(4).contains("ran it"),
        "the sub-task's answer reached the parent"
    );
}

#[test]
fn agents_read_search_and_write_the_shared_memory() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = start(&harness, "alpha", &model_config(&fake, ""));
    let output = harness
        .cli(&node, &["memory", "put", "notes", "release", "friday"])
        .expect("put");
    assert!(output.status.success());
    fake.push([
        Scripted::tool("memory_get", r#"{"namespace": "notes", "key": "release"}"#),
        Scripted::tool(
            "memory_search",
            r#"{"namespace": "notes", "contains": "fri"}"#,
        ),
        Scripted::tool(
            "memory_put",
            r#"{"namespace": "notes", "key": "answer", "value": "ship on friday"}"#,
        ),
        Scripted::text("noted"),
    ]);
    let (code, result) = harness
        .run_json(
            &node,
            &["--role", "chat", "--tier", "write", "when do we ship?"],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    assert!(
        fake.request_text(1).contains("friday"),
        "memory_get result reached the model"
    );
    assert!(
        fake.request_text(2).contains("release"),
        "memory_search found the key"
    );
    let output = harness
        .cli(&node, &["memory", "get", "notes", "answer"])
        .expect("get");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ship on friday");
}

#[test]
fn file_tools_cannot_leave_the_roots_by_dots_absolute_paths_or_symlinks() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let outside = tempfile::tempdir().expect("a directory outside the roots");
    std::fs::write(outside.path().join("secret.txt"), "TOP-SECRET-42").expect("secret");
    let root = harness.path().join("ws");
    std::fs::create_dir_all(&root).expect("root");
    std::os::unix::fs::symlink(outside.path(), root.join("link")).expect("symlink");
    let node = start(
        &harness,
        "alpha",
        &model_config(&fake, &format!("[tools]\nroots = [{:?}]\n", root)),
    );
    let secret = outside.path().join("secret.txt");
    let escaped = outside.path().join("written.txt");
    let attempts = [
        Scripted::tool("file_read", r#"{"path": "../../../../../../etc/passwd"}"#),
        Scripted::tool(
            "file_read",
            &format!(r#"{{"path": {:?}}}"#, secret.display().to_string()),
        ),
        Scripted::tool("file_read", r#"{"path": "link/secret.txt"}"#),
        Scripted::tool(
            "file_write",
            &format!(
                r#"{{"path": {:?}, "content": "pwned"}}"#,
                escaped.display().to_string()
            ),
        ),
        Scripted::tool(
            "file_write",
            r#"{"path": "link/written.txt", "content": "pwned"}"#,
        ),
        Scripted::text("nothing got out"),
    ];
    fake.push(attempts);
    let (code, result) = harness
        .run_json(
            &node,
            &[
                "--role",
                "chat",
                "--tier",
                "write",
                "--max-rounds",
                "10",
                "escape",
            ],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    let seen: String = (0..fake.requests().len())
        .map(|n| fake.request_text(n))
        .collect();
    assert!(
        !seen.contains("TOP-SECRET-42"),
        "a secret reached the model"
    );
    assert!(
        !seen.contains("root:x:0:0"),
        "/etc/passwd reached the model"
    );
    assert!(!escaped.exists(), "a file was written outside the roots");
    // Each request carries the whole conversation, so the last one holds all five refusals.
    let last = fake.request_text(5);
    assert_eq!(
        last.matches("is outside the directories this node allows")
            .count(),
        5,
        "every attempt was refused with the reason: {last}"
    );
}
