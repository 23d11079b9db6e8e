//! `mesh-cli run` as a person uses it (issue 28): with no flags it runs on role `chat` (or says
//! which roles the fleet serves, and where); it prints the task's id first and its outcome
//! last; Ctrl-C in a terminal asks whether to cancel (a second Ctrl-C cancels), a no leaves the
//! task running and says how to cancel it; a cancelled task is recorded `cancelled`, and
//! `tasks cancel` answers the status after the cancel. The node that runs a task logs one line
//! when it starts and one when it ends.
//!
//! Real nodes, real `mesh-cli`, a scripted fake OpenAI server as the model; the terminal is a
//! pseudo-terminal from `script(1)`.

use std::{process::Stdio, time::Duration};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    terminal::{Printed, Terminal},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

fn serving(fake: &FakeOpenAi, role: &str) -> String {
    format!(
        "[[models]]\nname = \"{role}-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\n{role} = [\"{role}-model\"]\n",
        fake.base_url()
    )
}

/// A laptop without models and a gpu node serving `role` from `fake`, both up.
fn laptop_and_gpu(harness: &Harness, fake: &FakeOpenAi, role: &str) -> (NodeProcess, NodeProcess) {
    let laptop = harness.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = harness
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .extra(&serving(fake, role)),
        )
        .expect("gpu");
    harness
        .wait_all_up(&[&laptop, &gpu], DEADLINE)
        .expect("mesh");
    (laptop, gpu)
}

fn tasks(harness: &Harness, node: &NodeProcess) -> Vec<Value> {
    let output = harness.cli(node, &["tasks", "--json"]).expect("tasks");
    let list: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    list["tasks"].as_array().cloned().unwrap_or_default()
}

fn status_of(harness: &Harness, node: &NodeProcess, id: &str) -> Option<String> {
    tasks(harness, node)
        .iter()
        .find(|t| t["task_id"] == id)
        .and_then(|t| t["status"].as_str().map(str::to_owned))
}

/// The task id in a `· task ID` line of `text`.
fn task_id(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains("· task "))?;
    let after = line.split("· task ").nth(1)?;
    Some(
        after
            .split(|c: char| c == ':' || c.is_whitespace())
            .next()?
            .to_owned(),
    )
}

/// Issue 28: `run` without --role was a usage error; now it runs on role `chat`, which a peer
/// serves, and prints the task's id first and the completion line last (after the answer).
#[test]
fn run_with_no_flags_uses_chat_and_prints_the_task_id_first_and_the_outcome_last() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let (laptop, _gpu) = laptop_and_gpu(&harness, &fake, "chat");
    fake.push([Scripted::text("Paris.")]);

    let output = harness
        .cli(&laptop, &["run", "What is the capital of France?"])
        .expect("run");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "Paris.");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("· task ") && l.contains("role chat (the default")),
        "{stderr}"
    );
    let id = task_id(&stderr).expect("an id");
    assert_eq!(
        status_of(&harness, &laptop, &id).as_deref(),
        Some("completed")
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("✓ completed on gpu in 1 round")),
        "{stderr}"
    );
}

/// With no node serving `chat`, `run` with no flags names the roles the fleet serves and the
/// nodes serving them.
#[test]
fn run_with_no_flags_and_no_chat_served_lists_the_roles_served_and_where() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let (laptop, _gpu) = laptop_and_gpu(&harness, &fake, "coder");
    let output = harness.cli(&laptop, &["run", "hello"]).expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no node serves role `chat`")
            && stderr.contains("coder (on gpu)")
            && stderr.contains("--role ROLE"),
        "{stderr}"
    );
    assert!(fake.requests().is_empty(), "nothing ran");
}

/// A node and a task that waits for ever on its model, run from a terminal.
struct Waiting {
    harness: Harness,
    node: NodeProcess,
    fake: FakeOpenAi,
    terminal: Terminal,
    id: String,
}

fn waiting_task_in_a_terminal() -> Waiting {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = harness
        .spawn(NodeOptions::new("alpha").extra(&serving(&fake, "chat")))
        .expect("alpha");
    fake.push([Scripted::stall()]);
    let terminal = Terminal::run(&harness.cli_command(&node, &["run", "wait forever"]));
    terminal
        .printed
        .wait_until("the task's id", DEADLINE, |t| task_id(t).is_some());
    let id = task_id(&terminal.printed.text()).expect("id");
    wait_for("the model call", DEADLINE, || {
        (fake.in_flight() == 1).then_some(())
    })
    .expect("the task waits on its model");
    Waiting {
        harness,
        node,
        fake,
        terminal,
        id,
    }
}

/// Issue 28: Ctrl-C left the task running with no id to cancel it by. In a terminal it now
/// asks; `y` cancels the task, which is recorded `cancelled` (not `failed`), in the list and in
/// its events.
#[test]
fn ctrl_c_asks_and_yes_cancels_the_task_which_is_recorded_cancelled() {
    let mut w = waiting_task_in_a_terminal();
    w.terminal.type_keys("\x03");
    w.terminal
        .printed
        .wait_until("the question", DEADLINE, |t| {
            t.contains(&format!("cancel task {}? [y/N]", w.id))
        });
    w.terminal.type_keys("y\n");
    let code = w.terminal.wait(DEADLINE);
    let shown = w.terminal.printed.text();
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains(&format!("✗ task {} cancelled", w.id)),
        "{shown}"
    );
    assert_eq!(
        status_of(&w.harness, &w.node, &w.id).as_deref(),
        Some("cancelled")
    );
    let show = w
        .harness
        .cli(&w.node, &["tasks", "show", &w.id])
        .expect("show");
    assert!(
        String::from_utf8_lossy(&show.stdout).contains("status:   cancelled"),
        "{}",
        String::from_utf8_lossy(&show.stdout)
    );
    wait_for("the model call to stop", DEADLINE, || {
        (w.fake.in_flight() == 0).then_some(())
    })
    .expect("the model stopped");
}

/// A second Ctrl-C, instead of an answer, cancels.
#[test]
fn a_second_ctrl_c_cancels_the_task() {
    let mut w = waiting_task_in_a_terminal();
    w.terminal.type_keys("\x03");
    w.terminal
        .printed
        .wait_until("the question", DEADLINE, |t| t.contains("[y/N]"));
    w.terminal.type_keys("\x03");
    let code = w.terminal.wait(DEADLINE);
    assert_eq!(code, Some(1), "{}", w.terminal.printed.text());
    assert_eq!(
        status_of(&w.harness, &w.node, &w.id).as_deref(),
        Some("cancelled")
    );
}

/// A no leaves the task running and says how to cancel it; `tasks cancel` then answers the
/// status after the cancel (it answered `running`, the status before it).
#[test]
fn no_leaves_the_task_running_and_says_how_to_cancel_it_and_tasks_cancel_answers_cancelled() {
    let mut w = waiting_task_in_a_terminal();
    w.terminal.type_keys("\x03");
    w.terminal
        .printed
        .wait_until("the question", DEADLINE, |t| t.contains("[y/N]"));
    w.terminal.type_keys("n\n");
    let code = w.terminal.wait(DEADLINE);
    let shown = w.terminal.printed.text();
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains(&format!("task {} keeps running on alpha", w.id))
            && shown.contains(&format!("tasks cancel {}", w.id)),
        "{shown}"
    );
    assert_eq!(
        status_of(&w.harness, &w.node, &w.id).as_deref(),
        Some("running")
    );
    let cancel = w
        .harness
        .cli(&w.node, &["tasks", "cancel", &w.id])
        .expect("cancel");
    assert_eq!(
        String::from_utf8_lossy(&cancel.stdout).trim(),
        format!("{}: cancelled", w.id),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
}

/// Without a terminal to ask in, Ctrl-C (SIGINT) stops following at once and says how to
/// cancel; the task keeps running.
#[test]
fn without_a_terminal_ctrl_c_leaves_the_task_running_and_says_how_to_cancel_it() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let node = harness
        .spawn(NodeOptions::new("alpha").extra(&serving(&fake, "chat")))
        .expect("alpha");
    fake.push([Scripted::stall()]);
    let mut caller = harness
        .cli_command(&node, &["run", "wait forever"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let printed = Printed::collect(caller.stderr.take().expect("stderr"));
    printed.wait_until("the task's id", DEADLINE, |t| task_id(t).is_some());
    let id = task_id(&printed.text()).expect("id");
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &caller.id().to_string()])
        .status()
        .expect("kill");
    assert!(interrupted.success());
    let code = wait_for("mesh-cli to stop", DEADLINE, || {
        caller.try_wait().ok().flatten()
    })
    .expect("stopped")
    .code();
    printed.wait_until("its last words", DEADLINE, |t| t.contains("tasks cancel"));
    assert_eq!(code, Some(1), "{}", printed.text());
    assert!(
        printed.text().contains(&format!(
            "cancel it with `mesh-cli --node {} tasks cancel {id}`",
            node.addr
        )),
        "{}",
        printed.text()
    );
    assert_eq!(status_of(&harness, &node, &id).as_deref(), Some("running"));
    let _ = harness.cli(&node, &["tasks", "cancel", &id]);
}

/// Issue 28: the executing node logged nothing about the tasks it ran. It now logs one line
/// when a task starts and one when it ends (id, origin, model, outcome, tokens, duration); the
/// node that only forwarded the task logs neither.
#[test]
fn the_executing_node_logs_a_line_when_a_task_starts_and_when_it_ends() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let (laptop, gpu) = laptop_and_gpu(&harness, &fake, "chat");
    fake.push([Scripted::text("done")]);
    let (code, result) = harness
        .run_json(&laptop, &["--role", "chat", "hello"])
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    let id = result["task_id"].as_str().expect("id").to_owned();

    let lines = |node: &NodeProcess, message: &str| -> Vec<Value> {
        node.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["fields"]["message"] == message && l["fields"]["task_id"] == id.as_str())
            .collect()
    };
    let ended = wait_for("gpu's end line", DEADLINE, || {
        let ended = lines(&gpu, "task ended");
        (!ended.is_empty()).then_some(ended)
    })
    .expect("logged");
    let started = lines(&gpu, "task started");
    assert_eq!(started.len(), 1, "{started:#?}");
    assert_eq!(started[0]["level"], "INFO");
    assert_eq!(started[0]["fields"]["origin"], "laptop");
    assert_eq!(ended.len(), 1, "{ended:#?}");
    let fields = &ended[0]["fields"];
    assert_eq!(ended[0]["level"], "INFO");
    assert_eq!(fields["origin"], "laptop");
    assert_eq!(fields["model"], "chat-model");
    assert_eq!(fields["outcome"], "completed");
    assert_eq!(fields["tokens"], 15);
    assert!(fields["duration_ms"].is_u64(), "{fields}");
    assert!(lines(&laptop, "task started").is_empty());
    assert!(lines(&laptop, "task ended").is_empty());
}
