//! Front-door keys over a real fleet: a key's day budget and its requests-per-minute limit hold
//! across two nodes (429 in OpenAI's shape, naming the limit, with `Retry-After`), a key may use
//! only its models (403), `mesh-cli keys usage --json` matches what the backend reported, and
//! `/metrics` counts per key. Keys added with `mesh-cli keys add` work on another node without a
//! restart and `keys rm` revokes them everywhere; adding needs an operator's client certificate
//! with the `shell` tier, and the keys' namespace cannot be read or written through the memory.
//!
//! Two nodes with static peers and mDNS off: a laptop without models and a gpu serving `m` from
//! a scripted fake backend, so every request is placed on the gpu, whichever node it enters.

use std::{
    io::{Read, Write},
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    unix_ms, wait_for,
};
use serde_json::Value;

/// How long to wait for usage to reach the other node: a push is normally there in well under
/// a second, but on a machine saturated by builds a push can be dropped (the queue is bounded)
/// and the records then come with the next sync, every 30 s. Each wait returns as soon as its
/// condition holds.
const DEADLINE: Duration = Duration::from_secs(45);

/// The gpu: serves `m` (role `chat`) from `fake`, with `extra` config.
fn gpu(h: &Harness, fake: &FakeOpenAi, peer: &NodeProcess, extra: &str) -> NodeProcess {
    h.spawn(
        NodeOptions::new("gpu")
            .peer(&peer.addr)
            .extra(&fake.node_config(extra)),
    )
    .expect("gpu")
}

/// One answer of the front door: status, headers (lower-case names) and JSON body.
struct Answer {
    status: u16,
    headers: String,
    body: Value,
}

/// A chat for `model` through `node` with `key` as a Bearer token (none: no header).
fn chat(node: &NodeProcess, key: Option<&str>, model: &str) -> Answer {
    let body =
        format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}"#);
    let (status, headers, body) = post(node, key, &body);
    Answer {
        status,
        headers,
        body: serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
    }
}

/// `POST /v1/chat/completions` with `body` through `node`: status, headers (lower-case) and
/// the body as text.
fn post(node: &NodeProcess, key: Option<&str>, body: &str) -> (u16, String, String) {
    post_to(node, "/v1/chat/completions", key, body)
}

/// `POST path` with `body` through `node`: status, headers (lower-case) and the body as text.
fn post_to(node: &NodeProcess, path: &str, key: Option<&str>, body: &str) -> (u16, String, String) {
    let url = node.http_url().expect("front door");
    let host = url.trim_start_matches("http://");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(key) = key {
        request.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    socket.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no body: {response}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// `mesh-cli ARGS` on `node`: its stdout as JSON, once it succeeded.
fn cli_json(h: &Harness, node: &NodeProcess, args: &[&str]) -> Value {
    let output = h.cli(node, args).expect("mesh-cli");
    assert!(
        output.status.success(),
        "mesh-cli {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Key `name`'s entry of `keys usage --json` on `node`.
fn usage_of(h: &Harness, node: &NodeProcess, name: &str) -> Value {
    let usage = cli_json(h, node, &["keys", "usage", "--json"]);
    usage["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

fn sha256_hex(key: &str) -> String {
    mesh_node::api_keys::key_sha256(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_keys_day_budget_and_rate_limit_hold_across_two_nodes_and_usage_matches_the_backend() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    // Every answer reports 10 prompt and 5 completion tokens: two fill `team`'s day of 30.
    fake.otherwise(Scripted::text("ok").usage(10, 5));
    let (team, bot) = ("sk-team-0123456789abcdef", "sk-bot-0123456789abcdef");
    // `team` by a key file (mode 0600), `bot` by its hash.
    let team_file = h.path().join("team.key");
    std::fs::write(&team_file, format!("{team}\n")).expect("key file");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&team_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
    }
    let keys = format!(
        "[[http.keys]]\nname = \"team\"\nkey_file = \"{}\"\nmodels = [\"m\"]\nmax_tokens_per_day = 30\n\n\
         [[http.keys]]\nname = \"bot\"\nkey_sha256 = \"{}\"\nrequests_per_minute = 2\n",
        team_file.display(),
        sha256_hex(bot)
    );
    let laptop = h
        .spawn(NodeOptions::new("laptop").extra(&keys))
        .expect("laptop");
    let gpu = gpu(&h, &fake, &laptop, &keys);
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");

    // A key is needed, and the key may use only its models.
    assert_eq!(chat(&laptop, None, "m").status, 401);
    let other = chat(&laptop, Some(team), "role:chat");
    assert_eq!(other.status, 403, "{}", other.body);
    assert_eq!(other.body["error"]["code"], "model_not_allowed");
    let message = other.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`team`") && message.contains("`role:chat`"),
        "{message}"
    );
    // Embeddings obey the same policy: another model is refused before it is placed.
    let (status, _, body) = post_to(
        &laptop,
        "/v1/embeddings",
        Some(team),
        r#"{"model": "e", "input": "hi"}"#,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("model_not_allowed"), "{body}");

    // The day budget: 15 tokens through the laptop, then the gpu sees them once replicated,
    // takes the next 15, and refuses the third request.
    let first = chat(&laptop, Some(team), "m");
    assert_eq!(first.status, 200, "{}", first.body);
    wait_for("the gpu to see the laptop's 15 tokens", DEADLINE, || {
        (usage_of(&h, &gpu, "team")["tokens_today"] == 15).then_some(())
    })
    .expect("replicated usage");
    let second = chat(&gpu, Some(team), "m");
    assert_eq!(second.status, 200, "{}", second.body);
    let refused = chat(&gpu, Some(team), "m");
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["error"]["type"], "rate_limit_error");
    assert_eq!(refused.body["error"]["code"], "max_tokens_per_day");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("resets in"), "{message}");
    let retry_after: u64 = refused
        .headers
        .lines()
        .find_map(|line| line.strip_prefix("retry-after: "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {}", refused.headers));
    assert!((1..=24 * 3600).contains(&retry_after), "{retry_after}");
    // And the laptop refuses it too, once it sees the gpu's tokens.
    wait_for("the laptop to refuse the spent key", DEADLINE, || {
        (chat(&laptop, Some(team), "m").status == 429).then_some(())
    })
    .expect("budget on the laptop");
    assert_eq!(
        fake.requests().len(),
        2,
        "a refused request reached the model"
    );

    // `keys usage --json` says what the backend reported, summed over the two nodes, once
    // the gpu's settled record has replicated (its request is counted, with a reservation,
    // when it is admitted, and its tokens are written when it ends: two writes).
    wait_for("the laptop to see both requests settled", DEADLINE, || {
        let usage = usage_of(&h, &laptop, "team");
        let today = &usage["today"]["m"];
        let settled = today["prompt_tokens"].as_u64().unwrap_or(0)
            + today["completion_tokens"].as_u64().unwrap_or(0)
            == usage["tokens_today"].as_u64().unwrap_or(u64::MAX);
        (today["requests"] == 2 && settled).then_some(usage)
    })
    .map(|usage| {
        assert_eq!(usage["today"]["m"]["prompt_tokens"], 20, "{usage}");
        assert_eq!(usage["today"]["m"]["completion_tokens"], 10, "{usage}");
        assert_eq!(usage["limits"]["max_tokens_per_day"], 30, "{usage}");
        assert!(usage["day_resets_at_ms"].as_u64().unwrap_or(0) > unix_ms());
    })
    .expect("usage");
    // The table for people says the same.
    let table = h.cli(&laptop, &["keys", "usage"]).expect("mesh-cli");
    let table = String::from_utf8_lossy(&table.stdout);
    let team_row = table
        .lines()
        .find(|line| line.starts_with("team"))
        .unwrap_or_else(|| panic!("no row for team:\n{table}"));
    assert!(team_row.contains("30/30"), "{table}");
    assert!(table.contains("day resets"), "{table}");
    let metrics = laptop.metrics().expect("metrics");
    assert!(
        metrics.contains(r#"agentmesh_http_key_requests_total{key="team",model="m"} 1"#),
        "{metrics}"
    );
    assert!(
        // The chat and the embeddings for a model `team` may not use.
        metrics.contains(r#"agentmesh_http_key_refusals_total{key="team",limit="model"} 2"#),
        "{metrics}"
    );

    // Requests per minute, over both nodes: a minute boundary in the middle would reset the
    // count, so start with at least 15 s of the minute left (a condition on the clock).
    wait_for("15 s left in the minute", Duration::from_secs(20), || {
        (unix_ms() % 60_000 < 45_000).then_some(())
    })
    .expect("clock");
    assert_eq!(chat(&laptop, Some(bot), "m").status, 200);
    wait_for("the gpu to see the laptop's request", DEADLINE, || {
        (usage_of(&h, &gpu, "bot")["requests_this_minute"] == 1).then_some(())
    })
    .expect("replicated request");
    assert_eq!(chat(&gpu, Some(bot), "m").status, 200);
    let refused = chat(&gpu, Some(bot), "m");
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "requests_per_minute");
    assert!(
        refused.headers.contains("retry-after: "),
        "{}",
        refused.headers
    );
}

#[test]
fn keys_added_at_run_time_work_on_another_node_until_revoked_and_only_operators_manage_them() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    fake.otherwise(Scripted::text("ok").usage(3, 4));
    // The laptop lets client certificates run `write` at most: not an operator's node for keys.
    let laptop = h
        .spawn(NodeOptions::new("laptop").security("client_max_tier = \"write\"\n"))
        .expect("laptop");
    let gpu = gpu(&h, &fake, &laptop, "");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    // No key anywhere yet: the loopback front door is open.
    assert_eq!(chat(&laptop, None, "m").status, 200);

    // A client certificate without the `shell` tier, and a node certificate, may not add keys.
    let refused = h.cli(&laptop, &["keys", "add", "ops"]).expect("mesh-cli");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("for the mesh's operators"),
        "{stderr}"
    );
    assert!(stderr.contains("client_max_tier"), "{stderr}");
    let node_cert = h
        .issue_as("intruder", mesh_identity::CertRole::Node)
        .expect("cert");
    let refused = h
        .cli_as(&node_cert, &gpu, &["keys", "add", "ops"])
        .expect("mesh-cli");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("not a client certificate"),
        "{stderr}"
    );
    // Both may list.
    assert_eq!(
        cli_json(&h, &laptop, &["keys", "list", "--json"])["keys"],
        serde_json::json!([])
    );

    // The operator adds a key on the gpu; the laptop accepts it without a restart, and now
    // wants a key.
    let added = cli_json(
        &h,
        &gpu,
        &["keys", "add", "ops", "--tokens-per-day", "1000", "--json"],
    );
    let key = added["key"]
        .as_str()
        .expect("the key, printed once")
        .to_owned();
    assert!(key.starts_with("sk-mesh-"), "{key}");
    // Until the laptop knows of a key its door is open and takes any bearer uncounted, so a
    // 200 counts only once a keyless request is refused (keys, once required, stay required).
    wait_for("the laptop to accept the new key", DEADLINE, || {
        (chat(&laptop, None, "m").status == 401 && chat(&laptop, Some(&key), "m").status == 200)
            .then_some(())
    })
    .expect("key replicated");
    // A streamed answer is counted too: the gpu's usage shows both requests, with the tokens
    // the backend reported (3 + 4 each).
    let (status, _, streamed) = post(
        &laptop,
        Some(&key),
        r#"{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    assert_eq!(status, 200, "{streamed}");
    assert!(streamed.contains("[DONE]"), "{streamed}");
    let usage = wait_for("the gpu to count both requests", DEADLINE, || {
        let usage = usage_of(&h, &gpu, "ops");
        (usage["today"]["m"]["requests"] == 2 && usage["tokens_today"] == 14).then_some(usage)
    })
    .expect("usage");
    assert_eq!(usage["today"]["m"]["prompt_tokens"], 6, "{usage}");
    assert_eq!(usage["today"]["m"]["completion_tokens"], 8, "{usage}");
    let listed = cli_json(&h, &laptop, &["keys", "list", "--json"]);
    assert_eq!(listed["keys"][0]["name"], "ops", "{listed}");
    assert_eq!(listed["keys"][0]["source"], "runtime", "{listed}");
    assert_eq!(
        listed["keys"][0]["policy"]["max_tokens_per_day"], 1000,
        "{listed}"
    );
    let hash = sha256_hex(&key);
    assert!(
        !listed.to_string().contains(&hash),
        "a hash was listed: {listed}"
    );

    // The keys' namespace is the node's: not readable or writable through the memory.
    for args in [
        vec!["memory", "get", "http_keys", "ops"],
        vec!["memory", "ls", "http_keys"],
        vec!["memory", "put", "http_keys", "ops", "{}"],
        vec!["memory", "put", "http_key_usage", "ops/2026-01-01/x", "{}"],
    ] {
        let output = h.cli(&gpu, &args).expect("mesh-cli");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was allowed");
        assert!(
            stderr.contains("private") || stderr.contains("belongs to the node"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains(&hash), "{stderr}");
    }

    // Revoking needs the operator too; then every node refuses the key, and the front doors
    // stay keyed (the last key's removal opens nothing).
    let refused = h.cli(&laptop, &["keys", "rm", "ops"]).expect("mesh-cli");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("for the mesh's operators"),
        "{stderr}"
    );
    let removed = h.cli(&gpu, &["keys", "rm", "ops"]).expect("mesh-cli");
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    for node in [&gpu, &laptop] {
        wait_for("the key to be refused", DEADLINE, || {
            (chat(node, Some(&key), "m").status == 401).then_some(())
        })
        .expect("revoked");
        assert_eq!(chat(node, None, "m").status, 401);
    }
}
