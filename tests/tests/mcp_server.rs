//! The mesh as an MCP server: the official `mcp` Python client (`tests/python/mcp_client.py`)
//! lists a node's `/mcp` tools and calls them. `run_task` through a node without models comes
//! back with the answer of its peer's model (and its progress); `list_nodes` shows the fleet;
//! `memory_put` then `memory_get` and `memory_search` find the value; `cron_list` shows a
//! schedule; bad arguments are JSON-RPC errors naming the argument; the node's own namespaces
//! are refused. A node whose `/mcp` callers are capped at `read` (the default) refuses
//! `memory_put` and a write-tier task; a keyed door refuses `/mcp` without a key (401), with a
//! key that lacks the `mcp` scope (403), and `run_task` for a model its key may not use; an
//! open door on loopback refuses a request that names another host (DNS rebinding); a client
//! that gives up on `run_task` cancels the task.

use std::{
    io::{Read, Write},
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    mcp_client, wait_for,
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

/// The results of `ops`, once the connection worked.
fn results(node: &NodeProcess, key: Option<&str>, ops: &Value) -> Vec<Value> {
    let answer = mcp_client(node, key, ops);
    answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {answer}"))
        .clone()
}

/// A call of `tool` with `args` (and progress asked for).
fn call(tool: &str, args: Value) -> Value {
    json!({"op": "call", "tool": tool, "args": args, "progress": true})
}

/// A successful call's text.
fn ok_text(result: &Value) -> &str {
    assert_eq!(result["is_error"], false, "{result}");
    result["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{result}"))
}

/// A refused or failed call's message (a tool error result).
fn tool_error(result: &Value) -> &str {
    assert_eq!(result["is_error"], true, "{result}");
    result["text"].as_str().unwrap_or_default()
}

/// A JSON-RPC error's message, after checking it is "invalid params".
fn invalid_params(result: &Value) -> &str {
    assert_eq!(result["mcp_error"]["code"], -32602, "{result}");
    result["mcp_error"]["message"].as_str().unwrap_or_default()
}

/// `POST /mcp` of an `initialize` over plain HTTP, with `host` as the Host header and `key`:
/// the status code.
fn post_initialize(node: &NodeProcess, host: Option<&str>, key: Option<&str>) -> u16 {
    let url = node.http_url().expect("front door");
    let addr = url.trim_start_matches("http://");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n",
        host.unwrap_or(addr),
        body.len()
    );
    if let Some(key) = key {
        request.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut socket = std::net::TcpStream::connect(addr).expect("connect");
    socket.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    // The answer may be a stream that stays open briefly; the status line is all we need.
    let mut buf = [0u8; 4096];
    while !response.contains("\r\n") {
        let n = socket.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        response.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"))
}

#[test]
fn the_mcp_client_uses_the_fleet_through_a_node_without_models() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    // The laptop lets its `/mcp` callers write; the gpu keeps the default (`read`).
    let laptop = h
        .spawn(
            NodeOptions::new("laptop")
                .security("client_max_tier = \"shell\"\nmcp_max_tier = \"write\"\n"),
        )
        .expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .extra(&fake.node_config("")),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let added = h
        .cli(
            &laptop,
            &[
                "cron",
                "add",
                "--role",
                "chat",
                "--name",
                "nightly",
                "--schedule",
                "0 2 * * *",
                "summarise the day",
            ],
        )
        .expect("mesh-cli");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    fake.push([Scripted::text("the answer from the gpu")]);

    let got = results(
        &laptop,
        None,
        &json!([
            {"op": "list_tools"},
            call("run_task", json!({"prompt": "say hello", "role": "chat"})),
            call("list_nodes", json!({})),
            call("memory_put", json!({"namespace": "notes", "key": "k1", "value": "hello mesh"})),
            call("memory_get", json!({"namespace": "notes", "key": "k1"})),
            call("memory_search", json!({"namespace": "notes", "contains": "mesh"})),
            call("cron_list", json!({})),
            // Bad arguments: JSON-RPC errors naming what is wrong.
            call("run_task", json!({"role": "chat"})),
            call("run_task", json!({"prompt": "x", "role": "chat", "model": "m"})),
            call("memory_get", json!({"namespace": "notes"})),
            call("memory_put", json!({"namespace": "notes", "key": "", "value": "v"})),
            call("memory_search", json!({"namespace": "notes", "limit": 1000})),
            call("no_such_tool", json!({})),
            // The node's own namespaces, refused as the Memory service refuses them.
            call("memory_get", json!({"namespace": "http_keys", "key": "x"})),
            call("memory_put", json!({"namespace": "cron", "key": "x", "value": "{}"})),
            // A model nobody serves: the task is refused with the router's reasons.
            call("run_task", json!({"prompt": "x", "model": "ghost"})),
        ]),
    );

    let tools: Vec<&str> = got[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in [
        "run_task",
        "list_nodes",
        "memory_get",
        "memory_search",
        "memory_put",
        "cron_list",
    ] {
        assert!(tools.contains(&name), "{name} not in {tools:?}");
    }
    assert_eq!(
        got[0]["schemas"]["run_task"]["required"],
        json!(["prompt"]),
        "{}",
        got[0]
    );

    let run = &got[1];
    assert_eq!(ok_text(run), "the answer from the gpu");
    assert_eq!(run["structured"]["executed_on"], "gpu", "{run}");
    // Regression (issue 27): the answer was only in the text part, and Claude Code gives its
    // model the structured part. It is in both, as the declared output schema says (the
    // client checks the structured part against it).
    assert_eq!(
        run["structured"]["answer"], "the answer from the gpu",
        "{run}"
    );
    assert_eq!(
        got[0]["output_schemas"]["run_task"]["properties"]["answer"]["type"], "string",
        "{}",
        got[0]
    );
    let progress: Vec<&str> = run["progress"]
        .as_array()
        .expect("progress")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        // The events' own words, as `mesh-cli run` prints them.
        progress.iter().any(|p| p.starts_with("↪ delegated to gpu")),
        "{progress:?}"
    );
    assert!(
        progress
            .iter()
            .any(|p| p.contains("round 1: m (attempt 1)")),
        "{progress:?}"
    );
    assert_eq!(fake.requests().len(), 1, "the task reached the gpu's model");
    assert!(fake.requests()[0].to_string().contains("say hello"));

    let nodes: Value = serde_json::from_str(ok_text(&got[2])).expect("list_nodes JSON");
    let names: Vec<&str> = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["laptop", "gpu"], "{nodes}");
    assert_eq!(nodes[1]["state"], "up", "{nodes}");
    assert!(
        nodes[1]["models"]
            .as_array()
            .is_some_and(|m| m.contains(&json!("m"))),
        "{nodes}"
    );

    assert!(ok_text(&got[3]).contains("stored notes/k1"), "{}", got[3]);
    assert_eq!(ok_text(&got[4]), "hello mesh");
    assert!(ok_text(&got[5]).contains("\"k1\""), "{}", got[5]);
    let schedules = &got[6]["structured"]["schedules"];
    assert_eq!(schedules[0]["name"], "nightly", "{}", got[6]);
    assert_eq!(schedules[0]["target"], "role:chat", "{}", got[6]);
    assert!(schedules[0]["next_at_ms"].as_u64().is_some(), "{}", got[6]);

    assert!(
        invalid_params(&got[7]).contains("missing field `prompt`"),
        "{}",
        got[7]
    );
    assert!(
        invalid_params(&got[8]).contains("exactly one of"),
        "{}",
        got[8]
    );
    assert!(
        invalid_params(&got[9]).contains("missing field `key`"),
        "{}",
        got[9]
    );
    assert!(
        invalid_params(&got[10]).starts_with("memory_put: key:"),
        "{}",
        got[10]
    );
    assert!(invalid_params(&got[11]).contains("limit"), "{}", got[11]);
    assert!(
        invalid_params(&got[12]).contains("no tool `no_such_tool`"),
        "{}",
        got[12]
    );
    assert!(tool_error(&got[13]).contains("private"), "{}", got[13]);
    assert!(
        tool_error(&got[14]).contains("belongs to the node"),
        "{}",
        got[14]
    );
    assert!(tool_error(&got[15]).contains("ghost"), "{}", got[15]);

    // An open door on loopback answers only requests that name a loopback host.
    assert_eq!(post_initialize(&laptop, None, None), 200);
    assert_eq!(
        post_initialize(&laptop, Some("attacker.example"), None),
        403
    );

    // The gpu caps its `/mcp` callers at `read`: no write, no write-tier task, whatever the
    // caller asks; reads still work.
    let capped = results(
        &gpu,
        None,
        &json!([
            call(
                "memory_put",
                json!({"namespace": "notes", "key": "capped", "value": "no"})
            ),
            call(
                "run_task",
                json!({"prompt": "write something", "role": "chat", "tier": "write"})
            ),
            call("memory_get", json!({"namespace": "notes", "key": "capped"})),
        ]),
    );
    for refused in &capped[..2] {
        let message = tool_error(refused);
        assert!(
            message.contains("security.mcp_max_tier") && message.contains("`read`"),
            "{refused}"
        );
    }
    assert!(
        tool_error(&capped[2]).contains("no key `capped`"),
        "{}",
        capped[2]
    );
    assert_eq!(fake.requests().len(), 1, "the write-tier task never ran");
}

/// Issue 26, item 8: any key of the front door reached `/mcp`, whose memory tools read every
/// user namespace (and whose tasks' agents too); a key needs the `mcp` scope now.
#[test]
fn a_keyed_door_needs_a_key_with_the_mcp_scope_and_a_key_runs_only_its_models() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let (allowed, other, models_only) = (
        "sk-mcp-allowed-0123456789abcdef",
        "sk-mcp-other-0123456789abcdef",
        "sk-mcp-models-only-0123456789abcdef",
    );
    let keys = format!(
        "[[http.keys]]\nname = \"allowed\"\nkey_sha256 = \"{}\"\nmodels = [\"m\"]\nmcp = true\n\n\
         [[http.keys]]\nname = \"other\"\nkey_sha256 = \"{}\"\nmodels = [\"elsewhere\"]\nmcp = true\n\n\
         [[http.keys]]\nname = \"models-only\"\nkey_sha256 = \"{}\"\n",
        sha256_hex(allowed),
        sha256_hex(other),
        sha256_hex(models_only)
    );
    let gpu = h
        .spawn(NodeOptions::new("gpu").extra(&fake.node_config(&keys)))
        .expect("gpu");
    fake.push([Scripted::text("keyed answer")]);

    assert_eq!(post_initialize(&gpu, None, None), 401);
    assert_eq!(
        post_initialize(&gpu, None, Some("sk-not-a-key-of-this-mesh")),
        401
    );
    assert_eq!(post_initialize(&gpu, None, Some(allowed)), 200);
    // A key without the `mcp` scope: no `/mcp` at all (its memory tools, its tasks).
    assert_eq!(post_initialize(&gpu, None, Some(models_only)), 403);
    let scopeless = mcp_client(&gpu, Some(models_only), &json!([{"op": "list_tools"}]));
    assert!(
        scopeless["connect_error"].is_string() && scopeless["results"].is_null(),
        "{scopeless}"
    );
    // The official client cannot even connect without the key (the 401 above).
    let refused = mcp_client(&gpu, None, &json!([{"op": "list_tools"}]));
    assert!(
        refused["connect_error"].is_string() && refused["results"].is_null(),
        "{refused}"
    );

    let task = |model: &str| call("run_task", json!({"prompt": "hi", "model": model}));
    let denied = results(&gpu, Some(other), &json!([task("m")]));
    assert!(
        tool_error(&denied[0]).contains("key `other` may not use `m`"),
        "{}",
        denied[0]
    );
    assert!(fake.requests().is_empty(), "a refused key's task ran");
    let answered = results(&gpu, Some(allowed), &json!([task("m")]));
    assert_eq!(ok_text(&answered[0]), "keyed answer");
}

/// A client that stops waiting for `run_task` (Ctrl-C in a client, a closed connection)
/// cancels the task: the model stops generating, and the task ends cancelled.
#[test]
fn a_client_that_gives_up_on_run_task_cancels_the_task() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let gpu = h
        .spawn(NodeOptions::new("gpu").extra(&fake.node_config("")))
        .expect("gpu");
    fake.push([Scripted::trickle(Duration::from_millis(50))]);
    let got = results(
        &gpu,
        None,
        &json!([{
            "op": "call", "tool": "run_task", "args": {"prompt": "go on for ever", "role": "chat"},
            "progress": true, "give_up_after_s": 3,
        }]),
    );
    assert_eq!(got[0]["gave_up"], true, "{}", got[0]);
    assert!(
        got[0]["progress"]
            .as_array()
            .is_some_and(|p| p.iter().any(|m| m == "output: tick ")),
        "the task was generating when the client gave up: {}",
        got[0]
    );
    wait_for("the model call to stop", DEADLINE, || {
        (fake.in_flight() == 0).then_some(())
    })
    .expect("the model stopped generating");
    let status = wait_for("the task to end", DEADLINE, || {
        let listed = h.cli(&gpu, &["tasks", "--json"]).ok()?;
        let tasks: Value = serde_json::from_slice(&listed.stdout).ok()?;
        let task = tasks["tasks"].as_array()?.first()?.clone();
        (task["status"] != "running").then_some(task)
    })
    .expect("the task ended");
    assert_eq!(status["status"], "cancelled", "{status}");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("cancelled: the MCP client")),
        "{status}"
    );
}

fn sha256_hex(key: &str) -> String {
    mesh_node::testing::key_sha256(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
