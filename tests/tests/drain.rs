//! Draining a node (issue 30, item 5) across real nodes: `gpu` (a declared GPU, so the others
//! send it work first; one worker), `spare` (a model, no GPU) and `laptop` (no model), each
//! model a scripted fake whose answers the test holds back until it opens a gate.

use std::{
    process::{Child, Stdio},
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Gate, Scripted},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);

/// A node whose role `chat` is `fake`; with a declared GPU when `gpu`, so routers rank it
/// first.
fn model_config(fake: &FakeOpenAi, gpu: bool) -> String {
    let gpus = if gpu {
        "[[resources.gpus]]\nname = \"RTX\"\nvram_mb = 24576\n"
    } else {
        ""
    };
    format!(
        "{gpus}\n[[models]]\nname = \"fake\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nchat = [\"fake\"]\n\n[tasks]\nworkers = 1\nqueue = 4\n",
        fake.base_url()
    )
}

/// `gpu`, which lets client certificates run `shell` (the harness's default, so its client
/// may drain it), with `node_keys` added to its `[node]`.
fn gpu_node(h: &Harness, fake: &FakeOpenAi, node_keys: &str) -> NodeProcess {
    h.spawn(
        NodeOptions::new("gpu")
            .node_key(node_keys)
            .extra(&model_config(fake, true)),
    )
    .expect("gpu")
}

/// `gpu` (with `node_keys`) and `laptop`, each up in the other's view.
fn gpu_and_laptop(h: &Harness, fake: &FakeOpenAi, node_keys: &str) -> (NodeProcess, NodeProcess) {
    let gpu = gpu_node(h, fake, node_keys);
    let laptop = h
        .spawn(NodeOptions::new("laptop").peer(&gpu.addr))
        .expect("laptop");
    h.wait_all_up(&[&gpu, &laptop], DEADLINE).expect("mesh");
    (gpu, laptop)
}

/// `spare`, a node without a GPU whose role `chat` is `fake`, dialing `gpu`.
fn spare_node(h: &Harness, fake: &FakeOpenAi, gpu: &NodeProcess) -> NodeProcess {
    h.spawn(
        NodeOptions::new("spare")
            .peer(&gpu.addr)
            .extra(&model_config(fake, false)),
    )
    .expect("spare")
}

/// Runs a task on `gpu` directly whose model answers `answer` once `gate` opens, and returns
/// its caller once it runs there.
fn held_task(
    h: &Harness,
    gpu: &NodeProcess,
    fake: &FakeOpenAi,
    gate: &Gate,
    answer: &str,
) -> Child {
    fake.push([Scripted::text(answer).until(gate)]);
    let caller = run_in_background(h, gpu, "a held task");
    wait_for("the held task running", DEADLINE, || {
        task_with_status(h, gpu, "running")
    })
    .expect("running");
    caller
}

/// How `observer`'s router sees `node` for a `chat` task (`run --explain`).
fn explained(h: &Harness, observer: &NodeProcess, node: &str) -> Value {
    let explain = json(&h.cli_ok(
        observer,
        &["run", "--role", "chat", "--explain", "--json", "x"],
    ));
    explain["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == node))
        .cloned()
        .unwrap_or_else(|| panic!("{node} not listed: {explain:#}"))
}

fn run_in_background(h: &Harness, node: &NodeProcess, prompt: &str) -> Child {
    h.cli_command(node, &["run", "--json", "--role", "chat", prompt])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run")
}

/// What `mesh-cli run --json` printed once the task ended (within [`DEADLINE`]; a caller
/// still waiting then is stopped and the test fails).
fn result(mut child: Child) -> Value {
    let ended = wait_for("the task's caller to end", DEADLINE, || {
        child.try_wait().ok().flatten()
    });
    if let Err(e) = ended {
        let _ = child.kill();
        panic!("{e}");
    }
    let output = child.wait_with_output().expect("the caller's output");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Asserts that the task `caller` follows completed on `node` with `output`.
fn completed_on(caller: Child, node: &str, output: &str) {
    let done = result(caller);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["executed_on"], node, "{done:#}");
    assert_eq!(done["output"], output, "{done:#}");
}

/// The id of a task of `status` on `node`.
fn task_with_status(h: &Harness, node: &NodeProcess, status: &str) -> Option<String> {
    let output = h.cli(node, &["tasks", "--json"]).ok()?;
    let list: Value = serde_json::from_slice(&output.stdout).ok()?;
    list["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["status"] == status)
        .and_then(|t| t["task_id"].as_str().map(str::to_owned))
}

fn wait_state(h: &Harness, observer: &NodeProcess, name: &str, state: &str) {
    wait_for(
        &format!("{name} {state} to {}", observer.name),
        DEADLINE,
        || (h.state_of(observer, name).as_deref() == Some(state)).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", h.state_of(observer, name)));
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_drained_node_passes_on_its_queue_finishes_what_runs_and_takes_nothing_new_until_undrained() {
    let h = Harness::new().expect("harness");
    let (fake_gpu, fake_spare) = (FakeOpenAi::start(), FakeOpenAi::start());
    let gate = Gate::new();
    let (gpu, laptop) = gpu_and_laptop(&h, &fake_gpu, "");

    // One task runs on gpu (held by its model), the next waits in its queue: no other node
    // serves `chat` yet.
    let first = held_task(&h, &gpu, &fake_gpu, &gate, "first, on gpu");
    let second = run_in_background(&h, &gpu, "second");
    let second_id = wait_for("the second task queued", DEADLINE, || {
        task_with_status(&h, &gpu, "queued")
    })
    .expect("queued");
    let spare = spare_node(&h, &fake_spare, &gpu);
    h.wait_all_up(&[&gpu, &laptop, &spare], DEADLINE)
        .expect("mesh");
    fake_spare.push([
        Scripted::text("second, on spare"),
        Scripted::text("third, on spare"),
    ]);

    let drained = json(&h.cli_ok(&laptop, &["drain", "gpu", "--json"]));
    assert_eq!(drained["node"], "gpu", "{drained:#}");
    assert_eq!(drained["state"], "draining", "{drained:#}");
    assert_eq!(drained["was_draining"], false, "{drained:#}");
    assert_eq!(
        drained["handed_off"], 1,
        "the queued task went: {drained:#}"
    );
    assert_eq!(drained["queued"], 0, "{drained:#}");

    // The queued task completes on spare; its caller follows it on gpu all along.
    completed_on(second, "spare", "second, on spare");
    let events = h.task_events(&gpu, &second_id);
    assert!(
        events.iter().any(|e| e["type"] == "warning"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("gpu is draining"))),
        "{events:#?}"
    );

    // Work remains on gpu (the first task): `draining`, in the fleet's view and its own.
    wait_state(&h, &laptop, "gpu", "draining");
    wait_state(&h, &gpu, "gpu", "draining");
    let shown = h.cli_ok(&laptop, &["nodes", "show", "gpu"]);
    assert!(shown.contains("state:      draining"), "{shown}");

    // New work goes elsewhere: the router says why gpu is left out, and asking for gpu
    // alone finds no node.
    let on_gpu = explained(&h, &laptop, "gpu");
    assert_eq!(on_gpu["reason"], "draining", "{on_gpu:#}");
    assert_eq!(on_gpu["eligible"], false, "{on_gpu:#}");
    let (code, third) = h
        .run_json(&laptop, &["--role", "chat", "third"])
        .expect("run");
    assert_eq!(code, Some(0), "{third:#}");
    assert_eq!(third["executed_on"], "spare", "{third:#}");
    let (code, refused) = h
        .run_json(&laptop, &["--role", "chat", "--on", "gpu", "fourth"])
        .expect("run");
    assert_eq!(code, Some(1), "{refused:#}");
    let error = refused["error"].as_str().expect("error");
    assert!(error.contains("gpu: draining"), "{error}");

    // The running task finishes where it runs; then nothing is left: `drained`.
    gate.open();
    completed_on(first, "gpu", "first, on gpu");
    wait_state(&h, &laptop, "gpu", "drained");
    let status = h.cli_ok(&laptop, &["status"]);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("gpu ") && l.contains(" drained ")),
        "{status}"
    );
    assert_eq!(
        fake_gpu.requests().len(),
        1,
        "gpu's model ran the first task only"
    );

    // Undrained (named by its short id this time), it takes work again (and ranks first, with
    // its GPU).
    let status = h.status(&gpu).expect("status");
    let id = &status["nodes"][0]["id"].as_str().expect("id")[..12];
    let undrained = json(&h.cli_ok(&laptop, &["undrain", id, "--json"]));
    assert_eq!(undrained["node"], "gpu", "{undrained:#}");
    assert_eq!(undrained["was_draining"], true, "{undrained:#}");
    assert_eq!(undrained["state"], "up", "{undrained:#}");
    wait_state(&h, &laptop, "gpu", "up");
    fake_gpu.push([Scripted::text("back on gpu")]);
    let (code, fifth) = h
        .run_json(&laptop, &["--role", "chat", "fifth"])
        .expect("run");
    assert_eq!(code, Some(0), "{fifth:#}");
    assert_eq!(fifth["executed_on"], "gpu", "{fifth:#}");
}

#[test]
fn at_the_timeout_a_task_another_node_sent_goes_back_to_it_and_completes_elsewhere() {
    let h = Harness::new().expect("harness");
    let (fake_gpu, fake_spare) = (FakeOpenAi::start(), FakeOpenAi::start());
    let (gpu, laptop) = gpu_and_laptop(&h, &fake_gpu, "");
    let spare = spare_node(&h, &fake_spare, &gpu);
    h.wait_all_up(&[&gpu, &spare, &laptop], DEADLINE)
        .expect("mesh");
    fake_gpu.push([Scripted::stall()]);
    fake_spare.push([Scripted::text("done on spare")]);

    // The laptop sends the task to gpu (its GPU ranks first), where it never ends by itself.
    let caller = run_in_background(&h, &laptop, "a long task");
    let id = wait_for("the task running on gpu", DEADLINE, || {
        task_with_status(&h, &gpu, "running")
    })
    .expect("running on gpu");
    let drained = json(&h.cli_ok(&laptop, &["drain", "gpu", "--timeout", "1s", "--json"]));
    assert_eq!(drained["running"], 1, "{drained:#}");

    // At the timeout gpu hands it back; the laptop resumes it on spare from its journal, as
    // when a node is lost.
    completed_on(caller, "spare", "done on spare");
    let events = h.task_events(&laptop, &id);
    let moved = events
        .iter()
        .find(|e| e["type"] == "resumed" && e["text"].as_str().is_some_and(|t| t.contains("spare")))
        .unwrap_or_else(|| panic!("no resumption on spare: {events:#?}"));
    assert!(
        moved["text"]
            .as_str()
            .is_some_and(|t| t.contains("handed the task over: the node was drained")),
        "{moved:#}"
    );
    let on_gpu = h.task_events(&gpu, &id);
    let last = on_gpu.last().expect("events on gpu");
    assert_eq!(last["type"], "failed", "{on_gpu:#?}");
    assert!(
        last["text"]
            .as_str()
            .is_some_and(|t| t.contains("gpu handed the task over")),
        "{last:#}"
    );
    // Its generation on gpu stopped with it, and nothing is left there.
    wait_for("gpu's model call to end", DEADLINE, || {
        (fake_gpu.in_flight() == 0).then_some(())
    })
    .expect("stopped");
    wait_state(&h, &laptop, "gpu", "drained");
}

#[test]
fn a_caller_not_allowed_the_shell_tier_may_not_drain_a_node() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    // Client certificates may run up to `write` here (the default): not enough to drain it.
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .security("")
                .extra(&model_config(&fake, true)),
        )
        .expect("gpu");
    // By name, and by id prefix (the short id `status` shows): the node itself refuses.
    let status = h.status(&gpu).expect("status");
    let id = status["nodes"][0]["id"].as_str().expect("id")[..12].to_owned();
    for command in [["drain", "gpu"], ["undrain", id.as_str()]] {
        let output = h.cli(&gpu, &command).expect("mesh-cli");
        assert_eq!(output.status.code(), Some(1), "{command:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("drain needs a client certificate the node allows the `shell` tier"),
            "{command:?}: {stderr}"
        );
        assert!(
            stderr.contains("this node lets client certificates run up to `write`"),
            "{command:?}: {stderr}"
        );
    }
    // A node's certificate (lent, or taken from a node) is no operator's either.
    let node_files = h.issue("intruder").expect("node certificate");
    let output = h
        .cli_as(&node_files, &gpu, &["drain", "gpu", "--json"])
        .expect("mesh-cli");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("which is not a client certificate"),
        "{stderr}"
    );
    // Nothing changed: it still takes work.
    assert_eq!(h.state_of(&gpu, "gpu").as_deref(), Some("up"));
    let on_gpu = explained(&h, &gpu, "gpu");
    assert_eq!(on_gpu["eligible"], true, "{on_gpu:#}");
}

#[test]
fn sigterm_with_drain_on_stop_lets_a_running_task_finish_while_peers_see_the_node_draining() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let gate = Gate::new();
    let (mut gpu, laptop) = gpu_and_laptop(&h, &fake, "drain_on_stop_s = 120");
    let caller = held_task(&h, &gpu, &fake, &gate, "finished before leaving");

    gpu.signal("TERM").expect("sigterm");
    // Still a member while it drains, and one no router sends work to.
    wait_state(&h, &laptop, "gpu", "draining");
    assert_eq!(explained(&h, &laptop, "gpu")["reason"], "draining");

    gate.open();
    completed_on(caller, "gpu", "finished before leaving");
    assert_eq!(
        gpu.wait_exit(DEADLINE).expect("exit"),
        Some(0),
        "{}",
        gpu.log_text()
    );
    wait_state(&h, &laptop, "gpu", "down");
}
