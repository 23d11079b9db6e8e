//! Durable tasks (issue 30): a task whose node is lost resumes on another node from its journal
//! without repeating what it already did; a call caught between its intent and its result is
//! not run again and the model is told; a caller re-attaches on any node after the origin is
//! lost; an executor stopped and resumed after its task moved is fenced.
//!
//! The fleet: a laptop (the origin, no models) and two GPU nodes serving `coder`, each with its
//! own scripted model server. The tools' side effects are lines appended to one file the test
//! reads, and memory writes: each completed step must show exactly once.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Gate, Scripted},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);

struct Fleet {
    harness: Harness,
    laptop: NodeProcess,
    gpu1: NodeProcess,
    gpu2: NodeProcess,
    fake1: FakeOpenAi,
    fake2: FakeOpenAi,
    /// Where the tools' side effects are appended, one line each.
    effects: PathBuf,
    _dir: tempfile::TempDir,
}

fn gpu_node(fake: &FakeOpenAi, vram_mb: u64, root: &Path) -> String {
    format!(
        r#"
[[resources.gpus]]
name = "RTX"
vram_mb = {vram_mb}

[tools]
roots = [{root:?}]

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

/// The laptop and two GPU nodes (gpu1 ranks first: more VRAM), all up.
fn fleet() -> Fleet {
    fleet_with_laptop("")
}

/// [`fleet`], the laptop's config given `laptop_extra` (a judge model, say).
fn fleet_with_laptop(laptop_extra: &str) -> Fleet {
    let harness = Harness::new().expect("harness");
    let dir = tempfile::tempdir().expect("tempdir");
    let effects = dir.path().join("effects.log");
    let (fake1, fake2) = (FakeOpenAi::start(), FakeOpenAi::start());
    let laptop = harness
        .spawn(NodeOptions::new("laptop").extra(laptop_extra))
        .expect("laptop");
    let gpu = |name: &str, fake: &FakeOpenAi, vram| {
        harness
            .spawn(
                NodeOptions::new(name)
                    .peer(&laptop.addr)
                    .security("client_max_tier = \"shell\"\nremote_max_tier = \"shell\"\n")
                    .extra(&gpu_node(fake, vram, dir.path())),
            )
            .expect("gpu node")
    };
    let gpu1 = gpu("gpu1", &fake1, 24576);
    let gpu2 = gpu("gpu2", &fake2, 16384);
    harness
        .wait_all_up(&[&laptop, &gpu1, &gpu2], DEADLINE)
        .expect("full mesh");
    Fleet {
        harness,
        laptop,
        gpu1,
        gpu2,
        fake1,
        fake2,
        effects,
        _dir: dir,
    }
}

/// A `shell_exec` call that appends `line` to the effects file.
fn append(effects: &Path, line: &str) -> Scripted {
    let command = format!("echo {line} >> {}", effects.display());
    Scripted::tool(
        "shell_exec",
        &serde_json::json!({ "command": command }).to_string(),
    )
}

/// A `memory_put` call of `key` in namespace `notes`.
fn remember(key: &str) -> Scripted {
    Scripted::tool(
        "memory_put",
        &serde_json::json!({"namespace": "notes", "key": key, "value": "done"}).to_string(),
    )
}

/// The lines appended to the effects file so far.
fn effects(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `mesh-cli run --json --role coder --require gpu ARGS` on the laptop, in the background.
fn submit_with(f: &Fleet, args: &[&str]) -> std::process::Child {
    let mut full = vec!["run", "--json", "--role", "coder", "--require", "gpu"];
    full.extend_from_slice(args);
    f.harness
        .cli_command(&f.laptop, &full)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run")
}

/// A shell-tier task of `prompt` ([`submit_with`]).
fn submit(f: &Fleet, prompt: &str) -> std::process::Child {
    submit_with(f, &["--tier", "shell", prompt])
}

/// What the caller printed once it ended (within a minute, else the nodes' logs are shown):
/// exit code and its JSON.
fn outcome(f: &Fleet, mut caller: std::process::Child) -> (Option<i32>, Value) {
    if wait_for("the caller to end", 2 * DEADLINE, || {
        caller.try_wait().ok().flatten()
    })
    .is_err()
    {
        let _ = caller.kill();
        panic!(
            "the caller did not end\nlaptop:\n{}\ngpu1:\n{}\ngpu2:\n{}",
            f.laptop.log_text(),
            f.gpu1.log_text(),
            f.gpu2.log_text()
        );
    }
    let output = caller.wait_with_output().expect("caller");
    let value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code(), value)
}

/// How many messages of `role` the `n`th request to `fake` carried.
fn messages_of(fake: &FakeOpenAi, n: usize, role: &str) -> usize {
    fake.requests()
        .get(n)
        .and_then(|r| r["messages"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|m| m["role"] == role)
        .count()
}

/// The id of the task `node` lists first, and its status.
fn newest_task(harness: &Harness, node: &NodeProcess) -> Option<(String, String)> {
    let output = harness.cli(node, &["tasks", "--json"]).ok()?;
    let list: Value = serde_json::from_slice(&output.stdout).ok()?;
    let task = list["tasks"].as_array()?.first()?.clone();
    Some((
        task["task_id"].as_str()?.to_owned(),
        task["status"].as_str()?.to_owned(),
    ))
}

/// Sum of `agentmesh_memory_records_refused_total{reason="fenced"}` over `nodes`.
fn fenced(nodes: &[&NodeProcess]) -> u64 {
    nodes
        .iter()
        .filter_map(|n| n.metrics().ok())
        .flat_map(|page| {
            page.lines()
                .filter(|l| {
                    l.starts_with("agentmesh_memory_records_refused_total")
                        && l.contains("reason=\"fenced\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum::<f64>() as u64
}

/// Issue 30, deliver 3: the executing node is SIGKILLed after three of six side-effecting
/// steps (shell appends and memory writes); the task finishes on the other node, which is
/// given the first three steps' results instead of running them, so every step's effect is
/// there exactly once, and the events say where and from which step it resumed.
#[test]
fn a_task_whose_node_is_killed_mid_way_resumes_elsewhere_without_repeating_a_step() {
    let f = fleet();
    f.fake1.push([
        append(&f.effects, "1"),
        remember("k1"),
        append(&f.effects, "2"),
        Scripted::stall(),
    ]);
    f.fake2.push([
        append(&f.effects, "3"),
        remember("k2"),
        append(&f.effects, "4"),
        Scripted::text("all six steps done"),
    ]);
    let caller = submit(&f, "do the six steps");
    wait_for("gpu1 to ask its model a fourth time", DEADLINE, || {
        (f.fake1.requests().len() >= 4).then_some(())
    })
    .expect("three steps on gpu1");
    f.gpu1.signal("KILL").expect("sigkill");

    let (code, result) = outcome(&f, caller);
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["output"], "all six steps done");
    assert_eq!(result["executed_on"], "gpu2");
    assert_eq!(effects(&f.effects), ["1", "2", "3", "4"], "each step once");
    // gpu2's model was given the three steps gpu1 completed, and gpu2 ran none of them.
    assert_eq!(
        messages_of(&f.fake2, 0, "tool"),
        3,
        "{}",
        f.fake2.request_text(0)
    );
    assert_eq!(f.fake2.requests().len(), 4);
    for key in ["k1", "k2"] {
        let value = f
            .harness
            .cli_ok(&f.laptop, &["memory", "get", "notes", key]);
        assert_eq!(value.trim(), "done", "{key}");
    }
    let id = result["task_id"].as_str().expect("task id");
    let events = f.harness.task_events(&f.laptop, id);
    let resumed: Vec<&Value> = events.iter().filter(|e| e["type"] == "resumed").collect();
    assert_eq!(resumed.len(), 1, "{events:#?}");
    let text = resumed[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("gpu2") && text.contains("epoch 2") && text.contains("from step"),
        "{text}"
    );
}

/// Issue 30, deliver 3, the ambiguous window: gpu1 is SIGKILLed while a `shell_exec` runs
/// (its intent recorded and confirmed, no result). The command is not run again: the model on
/// gpu2 is told the call was interrupted, and the task completes with its answer.
#[test]
fn a_call_interrupted_between_intent_and_result_is_not_run_again_and_the_model_is_told() {
    let f = fleet();
    let command = format!("echo once >> {}; /bin/sleep 30", f.effects.display());
    f.fake1.push([Scripted::tool(
        "shell_exec",
        &serde_json::json!({ "command": command }).to_string(),
    )]);
    f.fake2.push([Scripted::text("checked: it ran once")]);
    let caller = submit(&f, "run the long command");
    wait_for("the command to have started on gpu1", DEADLINE, || {
        (!effects(&f.effects).is_empty()).then_some(())
    })
    .expect("started");
    f.gpu1.signal("KILL").expect("sigkill");

    let (code, result) = outcome(&f, caller);
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["output"], "checked: it ran once");
    assert_eq!(effects(&f.effects), ["once"], "not run again");
    let told = f.fake2.request_text(0);
    assert!(
        told.contains("interrupted") && told.contains("may or may not"),
        "{told}"
    );
}

/// Issue 30, deliver 4: a task submitted with `run --detach` (its id printed at once) runs on
/// gpu1; the origin is SIGKILLed; the task goes on there, and `mesh-cli tasks watch ID`
/// against gpu2 (which neither started nor ran it) streams it to its answer from the journal.
#[test]
fn a_caller_re_attaches_on_another_node_after_the_origin_is_killed() {
    let f = fleet();
    let gate = Gate::new();
    f.fake1.push([
        append(&f.effects, "1"),
        Scripted::text("finished without its origin").until(&gate),
    ]);
    // Detached: the id comes back at once, the task runs on.
    let detached = f.harness.cli_ok(
        &f.laptop,
        &[
            "run",
            "--detach",
            "--json",
            "--role",
            "coder",
            "--tier",
            "shell",
            "--require",
            "gpu",
            "work while the laptop sleeps",
        ],
    );
    let detached: Value = serde_json::from_str(&detached).expect("json");
    let id = detached["task_id"].as_str().expect("task id").to_owned();
    wait_for("gpu1 to ask its model a second time", DEADLINE, || {
        (f.fake1.requests().len() >= 2).then_some(())
    })
    .expect("first step on gpu1");
    f.laptop.signal("KILL").expect("sigkill the origin");
    let watch = f
        .harness
        .cli_command(&f.gpu2, &["tasks", "watch", &id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli tasks watch");
    gate.open();
    let output = watch.wait_with_output().expect("watch");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(result["status"], "completed", "{result:#}");
    assert_eq!(result["output"], "finished without its origin");
    assert_eq!(result["executed_on"], "gpu1");
    assert_eq!(effects(&f.effects), ["1"]);
}

/// Issue 30, deliver 2: gpu1 is SIGSTOPped while its model answers; the laptop sees it down in
/// the membership and resumes the task on gpu2, which finishes it. gpu1, continued, gets its
/// model's answer (a side-effecting call): its appends are refused and counted, and it does
/// not run the call.
#[test]
fn a_stopped_executor_resumed_after_its_task_moved_is_fenced_and_runs_nothing() {
    let f = fleet();
    let gate = Gate::new();
    f.fake1.push([
        append(&f.effects, "1"),
        append(&f.effects, "stale").until(&gate),
    ]);
    f.fake2.push([Scripted::text("finished on gpu2")]);
    let caller = submit(&f, "two steps");
    wait_for("gpu1 to ask its model a second time", DEADLINE, || {
        (f.fake1.requests().len() >= 2).then_some(())
    })
    .expect("first step on gpu1");
    f.gpu1.signal("STOP").expect("sigstop");
    gate.open();

    let (code, result) = outcome(&f, caller);
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["executed_on"], "gpu2");
    assert_eq!(effects(&f.effects), ["1"]);

    // gpu1 refused nothing before it was stopped (nothing superseded it yet), and a stopped
    // node's metrics page would never answer.
    let before = fenced(&[&f.laptop, &f.gpu2]);
    f.gpu1.signal("CONT").expect("sigcont");
    wait_for("gpu1 to stop its superseded run", DEADLINE, || {
        newest_task(&f.harness, &f.gpu1).filter(|(_, status)| status != "running")
    })
    .expect("gpu1's run ended");
    let after = wait_for("gpu1's appends to be refused", DEADLINE, || {
        Some(fenced(&[&f.laptop, &f.gpu1, &f.gpu2])).filter(|n| *n > before)
    })
    .expect("refused and counted");
    assert!(after > before);
    assert_eq!(effects(&f.effects), ["1"], "the stale call did not run");
}

/// Issue 30, deliver 1: an evaluated task's judged attempts are in its journal. gpu1 answers
/// attempt 1, the judge (on the laptop) scores it low, and gpu1 is SIGKILLed during attempt 2;
/// gpu2 resumes at attempt 2 with the revised prompt: attempt 1 is neither run nor judged again,
/// and the answer is attempt 2's.
#[test]
fn an_evaluated_task_resumes_at_the_attempt_it_was_in() {
    let judging = FakeOpenAi::start();
    let f = fleet_with_laptop(&format!(
        "[[models]]\nname = \"j\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\njudge = [\"j\"]\n",
        judging.base_url()
    ));
    let verdict = |score: f64, critique: &str| {
        Scripted::text(&serde_json::json!({"score": score, "critique": critique}).to_string())
    };
    judging.push([verdict(0.2, "name the sources"), verdict(0.95, "good")]);
    f.fake1
        .push([Scripted::text("first answer"), Scripted::stall()]);
    f.fake2
        .push([Scripted::text("second answer, with sources")]);
    let caller = submit_with(
        &f,
        &[
            "--evaluate",
            "judge",
            "--threshold",
            "0.9",
            "--attempts",
            "3",
            "summarise it",
        ],
    );
    wait_for("gpu1's second attempt", DEADLINE, || {
        (f.fake1.requests().len() >= 2).then_some(())
    })
    .expect("attempt 2 on gpu1");
    f.gpu1.signal("KILL").expect("sigkill");

    let (code, result) = outcome(&f, caller);
    assert_eq!(code, Some(0), "{result:#}");
    assert_eq!(result["output"], "second answer, with sources");
    assert_eq!(result["executed_on"], "gpu2");
    assert_eq!(f.fake2.requests().len(), 1, "attempt 1 not run again");
    assert!(
        f.fake2.request_text(0).contains("name the sources"),
        "attempt 2's revised prompt: {}",
        f.fake2.request_text(0)
    );
    assert_eq!(judging.requests().len(), 2, "attempt 1 not judged again");
}
