//! The `mesh-node` binary's contract with operators: bad config is refused before anything
//! starts, with the key and the file named and exit code 2; `--insecure` is loopback-only, and so
//! is a front door without API keys unless it is allowed.

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

fn mesh_node(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesh-node"))
        .args(args)
        .env_remove("MESH_NODE_CONFIG")
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .stdin(Stdio::null())
        .output()
        .expect("run mesh-node")
}

/// Waits until the node `child` has started (it wrote `node.addr` into `data`), stops it with
/// SIGTERM and returns what it printed.
fn run_until_started(mut child: std::process::Child, data: &std::path::Path) -> Output {
    let addr_file = data.join("node.addr");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !addr_file.exists() {
        assert!(Instant::now() < deadline, "node did not start");
        assert!(
            child.try_wait().expect("poll").is_none(),
            "node exited early"
        );
        std::thread::sleep(Duration::from_millis(50)); // poll until the deadline
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    child.wait_with_output().expect("wait")
}

#[test]
fn a_config_error_names_the_key_and_the_file_and_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("[node]\nlisten = \"everywhere\"\n", "node.listen"),
        ("[node]\nnmae = \"typo\"\n", "nmae"),
        (
            "[security]\nremote_max_tier = \"root\"\n",
            "security.remote_max_tier",
        ),
        // Checked against the node's tool table once it is built at start.
        (
            "[discovery]\nmdns = false\n[node]\nlisten = \"127.0.0.1:0\"\nroles = [\"chat\"]\n\
             [[personas]]\nname = \"p\"\nrole = \"chat\"\ntools = [\"file_read\", \"rm_rf\"]\n",
            "personas[0].tools[1]",
        ),
    ];
    for (text, key) in cases {
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).expect("write config");
        let output = mesh_node(
            &["--config", path.to_str().expect("utf-8 path")],
            dir.path(),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{key}: {stderr}");
        assert!(stderr.contains(key), "{key} not named: {stderr}");
        assert!(stderr.contains("node.toml"), "file not named: {stderr}");
    }
    let output = mesh_node(&["--config", "/nonexistent/node.toml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/node.toml"));
}

/// The front door refuses to open beyond loopback without keys: the node does not start, and
/// the message names `http.api_keys` and `http.allow_unauthenticated`.
#[test]
fn a_front_door_beyond_loopback_without_keys_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("node.toml");
    std::fs::write(&path, "[http]\nlisten = \"0.0.0.0:0\"\n").expect("write config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mesh-node"))
        .args(["--no-mdns", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env_remove("MESH_NODE_CONFIG")
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // A node that starts anyway would run until stopped: wait for the exit with a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("wait");
            panic!(
                "the node started with an open front door beyond loopback:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50)); // poll until the deadline
    }
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for named in ["http.api_keys", "http.allow_unauthenticated", "node.toml"] {
        assert!(stderr.contains(named), "{named} not named: {stderr}");
    }
}

#[test]
fn insecure_is_refused_on_a_non_loopback_address_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    let data = data.to_str().expect("utf-8 path");
    let output = mesh_node(
        &[
            "--insecure",
            "--no-mdns",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            data,
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--insecure-allow-remote"), "{stderr}");

    // Allowed explicitly, it starts (and warns); SIGTERM stops it cleanly.
    let child = Command::new(env!("CARGO_BIN_EXE_mesh-node"))
        .args([
            "--insecure",
            "--insecure-allow-remote",
            "--no-mdns",
            "--listen",
            "0.0.0.0:0",
        ])
        .args(["--data-dir", data])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = run_until_started(child, std::path::Path::new(data));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("--insecure: plain TCP"),
        "warning missing: {stderr}"
    );
}

#[test]
fn a_log_written_to_a_pipe_carries_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    // The front door on a port of its own, not the default 7780.
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "[http]\nlisten = \"127.0.0.1:0\"\n").expect("write config");
    let child = Command::new(env!("CARGO_BIN_EXE_mesh-node"))
        .args(["--insecure", "--no-mdns", "--listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .env_remove("MESH_NODE_CONFIG")
        .env_remove("MESH_LOG_FORMAT")
        .env_remove("RUST_LOG")
        // tracing-subscriber leaves colour out by itself under NO_COLOR: test the pipe alone.
        .env_remove("NO_COLOR")
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = run_until_started(child, &data);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A WARN line: on a terminal its level is coloured.
    assert!(stderr.contains("--insecure: plain TCP"), "no log: {stderr}");
    assert!(
        !output.stderr.contains(&0x1b),
        "ANSI escape codes in a log written to a pipe: {stderr:?}"
    );
}
