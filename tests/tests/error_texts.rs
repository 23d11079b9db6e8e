//! Errors say their cause once, in words (issue 28): a port in use, a data dir another node
//! holds, an executing node lost mid-task, and a node's refusal without tonic's description of
//! the status code in front of the node's own sentence. Real processes.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, bin,
    fake_openai::{FakeOpenAi, Scripted},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

/// `mesh-node ARGS`, expected to fail at start: its exit code and stderr.
fn node_fails(args: &[&str]) -> (Option<i32>, String) {
    let home = tempfile::tempdir().expect("home");
    let mut child = Command::new(bin("mesh-node"))
        .args(args)
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env_remove("MESH_NODE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-node");
    let status = wait_for("mesh-node to give up", DEADLINE, || {
        child.try_wait().ok().flatten()
    })
    .unwrap_or_else(|e| {
        let _ = child.kill();
        panic!("{e}: it started instead")
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    (status.code(), stderr)
}

/// The `error:` line of a node's stderr.
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in:\n{stderr}"))
}

/// Issue 28: `Address already in use (os error 98) … : Address already in use (os error 98)`.
#[test]
fn a_port_in_use_is_said_once_in_words() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let data = harness.path().join("second");
    let (code, stderr) = node_fails(&[
        "--no-mdns",
        "--listen",
        &alpha.addr,
        "--data-dir",
        data.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert_eq!(line.matches("Address already in use").count(), 1, "{line}");
    assert!(!line.contains("os error"), "{line}");
    assert!(
        line.contains(&alpha.addr) && line.contains("--listen"),
        "{line}"
    );
}

/// Issue 28: sled's lock error came out as a Debug struct, twice. Now one sentence names the
/// data dir and that another mesh-node runs on it.
#[test]
fn a_data_dir_another_node_holds_is_one_sentence() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let config = harness.path().join("alpha.toml");
    let (code, stderr) = node_fails(&[
        "--config",
        config.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.contains(&format!(
            "the data dir {} is in use: another mesh-node runs on it",
            alpha.data_dir.display()
        )),
        "{line}"
    );
    for raw in ["Os {", "WouldBlock", "could not acquire lock"] {
        assert!(!line.contains(raw), "{line}");
    }
}

/// Issue 28: when the executing node died, the caller read `h2 protocol error: error reading a
/// body from connection`. Now: `gpu went away mid-task (…)`, and that no other node could take
/// the task over.
#[test]
fn a_lost_executor_is_named_in_words() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let laptop = harness.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = harness
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(&format!(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n\n[roles]\nchat = [\"m\"]\n",
            fake.base_url()
        )))
        .expect("gpu");
    harness
        .wait_all_up(&[&laptop, &gpu], DEADLINE)
        .expect("mesh");
    fake.push([Scripted::stall()]);
    let caller = harness
        .cli_command(&laptop, &["run", "--json", "--role", "chat", "wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    wait_for("the model call on gpu", DEADLINE, || {
        (fake.in_flight() == 1).then_some(())
    })
    .expect("running on gpu");
    gpu.signal("KILL").expect("kill gpu");
    let output = caller.wait_with_output().expect("caller ends");
    let result: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(output.status.code(), Some(1), "{result:#}");
    let error = result["error"].as_str().expect("error");
    assert!(
        error.starts_with("gpu went away mid-task (the connection to it closed)")
            && error.ends_with("no other node could take the task over"),
        "{error}"
    );
    for raw in ["h2", "protocol error", "Unknown", "stream broke"] {
        assert!(!error.contains(raw), "{error}");
    }
}

/// Issue 28: tonic's "The caller does not have permission to execute the specified
/// operation:" came before the node's own sentence.
#[test]
fn a_refusal_is_the_nodes_own_sentence() {
    let harness = Harness::new().expect("harness");
    let alpha = harness
        .spawn(NodeOptions::new("alpha").security("client_max_tier = \"write\"\n"))
        .expect("alpha");
    let output = harness
        .cli(&alpha, &["keys", "add", "team"])
        .expect("keys add");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("front-door keys is for the mesh's operators"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("The caller does not have permission"),
        "{stderr}"
    );
}
