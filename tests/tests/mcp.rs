//! MCP servers as tools, shared across the mesh, with real MCP servers: `mcp-server-time` from
//! PyPI over stdio, and a streamable-HTTP server built with the official `mcp` Python SDK
//! (`tests/python/mcp_http_server.py`). A laptop node with no MCP server of its own and a
//! scripted model (the fake OpenAI server, so each tool call is exact) uses the tools a `tools`
//! node hosts; the fake's next request shows what reached the model.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    python3, wait_for,
};
use serde_json::{Value, json};

/// Starting Python MCP servers and learning a peer's tools takes a few seconds.
const DEADLINE: Duration = Duration::from_secs(30);

/// A laptop with the fake model and no MCP, and a `tools` node hosting `mcp` (no model), which
/// dials the laptop; returns once the laptop sees the tools node offer `tool`.
fn fleet(
    harness: &Harness,
    fake: &FakeOpenAi,
    mcp: &str,
    tool: &str,
) -> (NodeProcess, NodeProcess) {
    let laptop = harness
        .spawn(NodeOptions::new("laptop").extra(&fake.node_config("")))
        .expect("laptop");
    let tools = harness
        .spawn(NodeOptions::new("tools").peer(&laptop.addr).extra(mcp))
        .expect("tools");
    wait_for(
        &format!("the laptop to see `{tool}` on tools"),
        DEADLINE,
        || {
            advertised(harness, &laptop, "tools")
                .contains(&tool.to_owned())
                .then_some(())
        },
    )
    .expect("the tool is advertised");
    (laptop, tools)
}

/// `name` as `observer`'s `mesh-cli status --json` shows it.
fn node(harness: &Harness, observer: &NodeProcess, name: &str) -> Option<Value> {
    let status = harness.status(observer).ok()?;
    status["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
        .cloned()
}

/// The MCP tools `observer` sees `name` advertise.
fn advertised(harness: &Harness, observer: &NodeProcess, name: &str) -> Vec<String> {
    node(harness, observer, name)
        .and_then(|n| {
            n["mcp_tools"].as_array().map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// `name`'s health reasons as it reports them itself.
fn health_reasons(harness: &Harness, node_process: &NodeProcess) -> Vec<String> {
    node(harness, node_process, &node_process.name)
        .and_then(|n| {
            n["health"]["reasons"].as_array().map(|reasons| {
                reasons
                    .iter()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The content of the last message of the fake's request `n` (the tool result the model got).
fn last_message(fake: &FakeOpenAi, n: usize) -> String {
    fake.requests()
        .get(n)
        .and_then(|r| r["messages"].as_array()?.last().cloned())
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// The pid of a child of `parent` whose command line contains `needle`.
fn child_of(parent: u32, needle: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The fields after the command name: state, ppid, …
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (ppid == parent && String::from_utf8_lossy(&cmdline).contains(needle)).then_some(pid)
        })
}

fn run_ok(harness: &Harness, node: &NodeProcess, args: &[&str]) -> Value {
    let (code, result) = harness.run_json(node, args).expect("mesh-cli run");
    assert_eq!(code, Some(0), "{result:#}");
    result
}

#[test]
fn a_task_on_a_laptop_without_mcp_uses_the_time_tool_hosted_on_another_node() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let (laptop, tools) = fleet(
        &harness,
        &fake,
        &mesh_tests::mcp_time_server(),
        "time__get_current_time",
    );
    assert!(
        advertised(&harness, &laptop, "laptop").is_empty(),
        "the laptop hosts no MCP tool"
    );

    fake.push([
        Scripted::tool("time__get_current_time", r#"{"timezone": "Europe/Paris"}"#),
        Scripted::text("It is evening in Paris."),
    ]);
    let result = run_ok(
        &harness,
        &laptop,
        &["--role", "chat", "What time is it in Paris?"],
    );
    assert_eq!(result["output"], "It is evening in Paris.");
    assert_eq!(result["executed_on"], "laptop");

    // The model was offered the tool with the server's own schema, namespaced.
    let offered = &fake.requests()[0]["tools"];
    let time = offered
        .as_array()
        .and_then(|tools| {
            tools
                .iter()
                .find(|t| t["function"]["name"] == "time__get_current_time")
        })
        .unwrap_or_else(|| panic!("not offered: {offered:#}"));
    assert!(
        time["function"]["parameters"]["properties"]["timezone"].is_object(),
        "{time:#}"
    );
    // The real result of mcp-server-time, run on the tools node, reached the model.
    let answer = last_message(&fake, 1);
    let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|_| json!(answer));
    assert_eq!(answer["timezone"], "Europe/Paris", "{answer:#}");
    assert!(
        answer["datetime"].as_str().is_some_and(|d| d.contains('T')),
        "{answer:#}"
    );
    assert!(
        tools
            .log_text()
            .contains("MCP tool called from another node"),
        "the call ran on the tools node"
    );

    // `nodes show` names the tool and its tier.
    let shown = harness
        .cli(&laptop, &["nodes", "show", "tools"])
        .expect("nodes show");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("time__get_current_time (read)"), "{shown}");

    // `run --tool` makes the first round's model call the tool; later rounds choose freely.
    fake.push([
        Scripted::tool("time__get_current_time", r#"{"timezone": "UTC"}"#),
        Scripted::text("It is now."),
    ]);
    let before = fake.requests().len();
    let result = run_ok(
        &harness,
        &laptop,
        &[
            "--role",
            "chat",
            "--tool",
            "time__get_current_time",
            "Time?",
        ],
    );
    assert_eq!(result["output"], "It is now.");
    let sent = &fake.requests()[before..];
    assert_eq!(
        sent[0]["tool_choice"],
        json!({"type": "function", "function": {"name": "time__get_current_time"}})
    );
    assert!(sent[1].get("tool_choice").is_none(), "{}", sent[1]);
    // A tool the task is not offered fails the task before any model call, naming what it may
    // call; a name that cannot be a tool is refused by the CLI.
    let (code, failed) = harness
        .run_json(
            &laptop,
            &["--role", "chat", "--tool", "time__set_clock", "Set it."],
        )
        .expect("run");
    assert_eq!(code, Some(1), "{failed:#}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("`time__set_clock` is not offered")
            && error.contains("time__get_current_time"),
        "{failed:#}"
    );
    assert_eq!(fake.requests().len(), before + 2, "no model call for it");
    let bad = harness
        .cli(&laptop, &["run", "--role", "chat", "--tool", "a b", "x"])
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("`a b` is not a tool name"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// The demo's step as a test, with the real model and the demo's MCP server
/// (`deploy/mcp-sysinfo.py`, standard library only): a laptop without models asks how the home
/// server is doing; the task runs on the gpu's SmolLM2, which calls (`--tool`) the `status`
/// tool the server hosts; the gpu's `[approval]` policy holds the call until a person approves
/// it through the laptop; then the tool runs on the server and its answer reaches the model.
#[test]
fn the_embedded_model_calls_a_tool_hosted_on_another_node_after_an_approval() {
    let harness = Harness::new().expect("harness");
    // A small context window bounds the model's final answer (it stops when the window is
    // full), so the test does not wait on a long ramble.
    let gpu = harness
        .spawn(NodeOptions::new("gpu").extra(&format!(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = {:?}\nthreads = 1\ncontext_window = 768\n\n[roles]\nchat = [\"smol\"]\n\n[approval]\nservers = [\"sysinfo\"]\n",
            mesh_tests::embedded_model_path()
        )))
        .expect("gpu");
    let sysinfo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/mcp-sysinfo.py");
    let server = harness
        .spawn(NodeOptions::new("server").peer(&gpu.addr).extra(&format!(
            "[[mcp]]\nname = \"sysinfo\"\ncommand = {:?}\nargs = [{sysinfo:?}]\ntier = \"read\"\n",
            python3()
        )))
        .expect("server");
    let laptop = harness
        .spawn(NodeOptions::new("laptop").peer(&gpu.addr))
        .expect("laptop");
    harness
        .wait_all_up(&[&gpu, &server, &laptop], DEADLINE)
        .expect("mesh");
    wait_for("the gpu to see the sysinfo tool", DEADLINE, || {
        advertised(&harness, &gpu, "server")
            .contains(&"sysinfo__status".to_owned())
            .then_some(())
    })
    .expect("advertised");

    let caller = harness
        .cli_command(
            &laptop,
            &[
                "run",
                "--json",
                "--role",
                "chat",
                "--max-rounds",
                "2",
                "--tool",
                "sysinfo__status",
                "How is the home server doing?",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-cli run");
    let approval = wait_for(
        "the call to wait for approval",
        Duration::from_secs(60),
        || {
            let output = harness.cli(&laptop, &["approvals", "ls", "--json"]).ok()?;
            let list: Value = serde_json::from_slice(&output.stdout).ok()?;
            list["approvals"].as_array()?.first().cloned()
        },
    )
    .expect("an approval waits");
    assert_eq!(approval["tool"], "sysinfo__status", "{approval:#}");
    assert_eq!(approval["node"], "gpu", "{approval:#}");
    assert!(
        !server
            .log_text()
            .contains("MCP tool called from another node"),
        "the tool must not run before the approval"
    );
    let id = approval["approval_id"].as_str().expect("id");
    let approved = harness
        .cli(&laptop, &["approvals", "approve", id])
        .expect("approve");
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );

    let output = caller.wait_with_output().expect("the caller ends");
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(result["status"], "completed", "{result:#}");
    assert_eq!(result["executed_on"], "gpu", "{result:#}");
    assert!(
        server
            .log_text()
            .contains("MCP tool called from another node"),
        "the call ran on the server"
    );
    // The tool's answer went back to the model as the call's result.
    let task = result["task_id"].as_str().expect("task id");
    let events = harness.task_events(&gpu, task);
    let output = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .and_then(|e| e["text"].as_str())
        .unwrap_or_default();
    assert!(output.contains("load "), "{events:#?}");
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let order = [
        "approval_requested",
        "approval_decided",
        "tool_result",
        "completed",
    ];
    let mut at = 0;
    for wanted in order {
        at += types[at..]
            .iter()
            .position(|t| *t == wanted)
            .unwrap_or_else(|| panic!("no {wanted} after {:?}: {types:?}", &types[..at]));
    }
}

#[test]
fn a_crashed_stdio_server_is_named_in_health_restarted_and_used_again() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let (laptop, tools) = fleet(
        &harness,
        &fake,
        &mesh_tests::mcp_time_server(),
        "time__get_current_time",
    );
    let first = child_of(tools.pid(), "mcp_server_time").expect("the server runs under tools");
    let killed = Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());

    let reason = wait_for("tools to name the server in its health", DEADLINE, || {
        health_reasons(&harness, &tools)
            .into_iter()
            .find(|r| r.starts_with("mcp time:"))
    })
    .expect("degraded");
    assert!(reason.contains("exited"), "{reason}");
    let second = wait_for(
        "the server to run again and its reason to clear",
        DEADLINE,
        || {
            let restarted = child_of(tools.pid(), "mcp_server_time").filter(|pid| *pid != first)?;
            let clear = !health_reasons(&harness, &tools)
                .iter()
                .any(|r| r.starts_with("mcp time:"));
            let offered = advertised(&harness, &laptop, "tools")
                .contains(&"time__get_current_time".to_owned());
            (clear && offered).then_some(restarted)
        },
    )
    .expect("restarted");
    assert_ne!(first, second);

    fake.push([
        Scripted::tool("time__get_current_time", r#"{"timezone": "Asia/Tokyo"}"#),
        Scripted::text("done"),
    ]);
    run_ok(&harness, &laptop, &["--role", "chat", "And in Tokyo?"]);
    let answer = last_message(&fake, 1);
    assert!(
        answer.contains("Asia/Tokyo") && answer.contains("datetime"),
        "{answer}"
    );
}

/// The streamable-HTTP test server, and the file it records each `tools/call` it receives in.
struct HttpServer {
    child: Child,
    port: u16,
    calls: PathBuf,
}

impl HttpServer {
    fn start(dir: &Path) -> Self {
        let calls = dir.join("mcp-calls.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/mcp_http_server.py");
        let mut child = Command::new(python3())
            .arg(script)
            .arg(&calls)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the MCP HTTP server");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(port) = line.strip_prefix("port ") {
                    let _ = tx.send(port.trim().parse::<u16>());
                }
            }
        });
        let port = rx
            .recv_timeout(DEADLINE)
            .expect("the server says its port")
            .expect("a port number");
        Self { child, port, calls }
    }

    /// The `tools/call` requests that reached the server: (tool, arguments).
    fn calls(&self) -> Vec<(String, Value)> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|call| {
                (
                    call["tool"].as_str().unwrap_or_default().to_owned(),
                    call["args"].clone(),
                )
            })
            .collect()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two `[[mcp]]` entries on the same HTTP server: `calc` (its `add`, tier `read`) and `notes`
/// (its `write_note`, the default tier `write`). The tools node lets remote callers run `read`
/// only (the default `security.remote_max_tier`).
#[test]
fn over_http_bad_arguments_never_reach_the_server_and_a_write_tool_is_refused_to_a_remote_caller() {
    let fake = FakeOpenAi::start();
    let harness = Harness::new().expect("harness");
    let server = HttpServer::start(harness.path());
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let mcp = format!(
        "[[mcp]]\nname = \"calc\"\nurl = \"{url}\"\ntier = \"read\"\ntools = [\"add\"]\n\n[[mcp]]\nname = \"notes\"\nurl = \"{url}\"\ntools = [\"write_note\"]\n"
    );
    let (laptop, _tools) = fleet(&harness, &fake, &mcp, "notes__write_note");
    assert_eq!(
        advertised(&harness, &laptop, "tools"),
        ["calc__add", "notes__write_note"]
    );

    fake.push([
        Scripted::tool("calc__add", r#"{"a": "one", "b": 2}"#),
        Scripted::tool("calc__add", r#"{"a": 1, "b": 2}"#),
        Scripted::tool("notes__write_note", r#"{"title": "t", "text": "secret"}"#),
        Scripted::text("done"),
    ]);
    // The laptop's operator may write; the tools node lets other nodes' tasks only read.
    run_ok(
        &harness,
        &laptop,
        &["--role", "chat", "--tier", "write", "add, then note it"],
    );

    let refused = last_message(&fake, 1);
    assert!(
        refused.contains("do not match its input schema") && refused.contains("/a"),
        "{refused}"
    );
    assert_eq!(last_message(&fake, 2), "3");
    let denied = last_message(&fake, 3);
    assert!(
        denied.contains("PermissionDenied") && denied.contains("security.remote_max_tier"),
        "{denied}"
    );
    // Only the valid `add` reached the server: not the bad arguments, not the write.
    assert_eq!(
        server.calls(),
        [("add".to_owned(), json!({"a": 1, "b": 2}))]
    );
    // A read-tier task is not even offered the write tool.
    fake.push([Scripted::text("ok")]);
    run_ok(&harness, &laptop, &["--role", "chat", "just read"]);
    let offered = fake.requests()[4]["tools"].to_string();
    assert!(offered.contains("calc__add"), "{offered}");
    assert!(!offered.contains("notes__write_note"), "{offered}");
}
