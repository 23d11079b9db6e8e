//! A fleet on loopback with mDNS off: static peers, SWIM membership and liveness, and what
//! `mesh-cli status --json` promises scripts.

use std::time::{Duration, Instant};

use mesh_tests::{Harness, NodeOptions, wait_for};

const GPU_NODE: &str = r#"
[node.labels]
site = "home"

[[resources.gpus]]
name = "RTX 4090"
vram_mb = 24576

[[models]]
name = "qwen-coder"
backend = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "qwen2.5-coder:7b"

[roles]
coder = ["qwen-coder"]
"#;

#[test]
fn static_peers_pointing_one_way_are_enough_for_everyone_to_see_everyone() {
    let harness = Harness::new().expect("harness");
    let a = harness
        .spawn(NodeOptions::new("alpha").extra(GPU_NODE))
        .expect("alpha");
    let b = harness
        .spawn(NodeOptions::new("beta").peer(&a.addr))
        .expect("beta");
    let c = harness
        .spawn(NodeOptions::new("gamma").peer(&a.addr))
        .expect("gamma");
    // b and c only know a; they must learn each other through a (SWIM gossip and the repair).
    harness
        .wait_all_up(&[&a, &b, &c], Duration::from_secs(15))
        .expect("full mesh");

    let status = harness.status(&c).expect("status");
    let nodes = status["nodes"].as_array().expect("nodes list");
    assert_eq!(nodes.len(), 3, "{status:#}");
    assert_eq!(nodes[0]["name"], "gamma", "the node asked comes first");
    let alpha = nodes
        .iter()
        .find(|n| n["name"] == "alpha")
        .expect("alpha listed");
    assert_eq!(alpha["state"], "up");
    assert_eq!(alpha["addr"], a.addr.as_str());
    assert_eq!(alpha["id"].as_str().expect("id").len(), 64);
    assert_eq!(alpha["roles"], serde_json::json!(["coder"]));
    assert_eq!(alpha["models"][0]["name"], "qwen-coder");
    assert_eq!(alpha["gpus"][0]["name"], "RTX 4090");
    assert_eq!(alpha["gpus"][0]["vram_mb"], 24576);
    assert_eq!(alpha["load"]["running"], 0);
    assert_eq!(alpha["load"]["queued"], 0);
    assert!(alpha["last_seen_ms"].as_u64().expect("last_seen_ms") > 0);
    assert_eq!(alpha["labels"]["site"], "home");

    let table = harness.cli(&c, &["status"]).expect("table");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.contains("RTX 4090 (24 GiB)"), "{text}");
    assert!(text.contains("qwen-coder"), "{text}");

    let show = harness
        .cli(&c, &["nodes", "show", "alpha", "--json"])
        .expect("show");
    assert!(show.status.success());
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).expect("json");
    assert_eq!(shown["role_chains"]["coder"][0], "qwen-coder");

    let missing = harness
        .cli(&c, &["nodes", "show", "nobody"])
        .expect("show missing");
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("no node named `nobody`") && err.contains("alpha"),
        "{err}"
    );
}

#[test]
fn a_node_stopped_with_sigterm_is_down_everywhere_within_a_second_and_exits_zero() {
    let harness = Harness::new().expect("harness");
    let a = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let mut b = harness
        .spawn(NodeOptions::new("beta").peer(&a.addr))
        .expect("beta");
    let c = harness
        .spawn(NodeOptions::new("gamma").peer(&a.addr))
        .expect("gamma");
    harness
        .wait_all_up(&[&a, &b, &c], Duration::from_secs(15))
        .expect("full mesh");

    let sent = Instant::now();
    b.signal("TERM").expect("sigterm");
    for observer in [&a, &c] {
        wait_for("beta down", Duration::from_secs(1), || {
            (harness.state_of(observer, "beta").as_deref() == Some("down")).then_some(())
        })
        .unwrap_or_else(|e| panic!("{} after {:?}: {e}", observer.name, sent.elapsed()));
    }
    assert_eq!(
        b.wait_exit(Duration::from_secs(10)).expect("exit"),
        Some(0),
        "graceful shutdown exits 0:\n{}",
        b.log_text()
    );
    assert!(
        !b.data_dir.join("node.addr").exists(),
        "shutdown removes the address file"
    );
}

#[test]
fn a_node_killed_with_sigkill_is_down_within_five_seconds_and_rejoins_on_restart() {
    let harness = Harness::new().expect("harness");
    let a = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let mut b = harness
        .spawn(NodeOptions::new("beta").peer(&a.addr))
        .expect("beta");
    harness
        .wait_all_up(&[&a, &b], Duration::from_secs(15))
        .expect("pair");

    let sent = Instant::now();
    b.signal("KILL").expect("sigkill");
    wait_for("beta down", Duration::from_secs(5), || {
        (harness.state_of(&a, "beta").as_deref() == Some("down")).then_some(())
    })
    .unwrap_or_else(|e| panic!("after {:?}: {e}", sent.elapsed()));
    b.wait_exit(Duration::from_secs(5)).expect("killed");

    // The same node (same certificate, so the same id) comes back and is up again.
    let b = harness
        .spawn(NodeOptions::new("beta").peer(&a.addr))
        .expect("beta again");
    harness
        .wait_all_up(&[&a, &b], Duration::from_secs(15))
        .expect("beta back up");
    let status = harness.status(&a).expect("status");
    let betas = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["name"] == "beta")
        .count();
    assert_eq!(
        betas, 1,
        "a restarted node keeps its id, so it is listed once"
    );
}

/// Whether `log` (a node's JSON log) shows the peer `name` moved to state `to`.
fn logged_state(log: &str, name: &str, to: &str) -> bool {
    log.lines().any(|line| {
        line.contains("\"peer state\"")
            && line.contains(&format!("\"peer\":\"{name}\""))
            && line.contains(&format!("\"to\":\"{to}\""))
    })
}

/// Issue 17: SWIM's suspicion with refutation. A node frozen (SIGSTOP) for less than the
/// suspicion timeout is suspected by whoever probes it, refutes when it thaws, and is never
/// marked down anywhere.
#[test]
fn a_node_frozen_shorter_than_the_suspicion_timeout_refutes_and_is_never_down() {
    let harness = Harness::new().expect("harness");
    let a = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let b = harness
        .spawn(NodeOptions::new("beta").peer(&a.addr))
        .expect("beta");
    let c = harness
        .spawn(NodeOptions::new("gamma").peer(&a.addr))
        .expect("gamma");
    harness
        .wait_all_up(&[&a, &b, &c], Duration::from_secs(15))
        .expect("full mesh");

    b.signal("STOP").expect("sigstop");
    // Frozen until alpha or gamma suspects it (each probes a member every 500 ms, and a failed
    // probe takes up to a period to become a suspicion); thawed at once, beta has most of the
    // 2-s suspicion left to refute.
    let frozen = Instant::now();
    let suspected = wait_for("beta suspected", Duration::from_secs(5), || {
        [&a, &c]
            .iter()
            .any(|o| logged_state(&o.log_text(), "beta", "suspect"))
            .then_some(())
    });
    b.signal("CONT").expect("sigcont");
    eprintln!("beta frozen for {:?}", frozen.elapsed());
    suspected.expect("a frozen beta is suspected");
    for observer in [&a, &c] {
        wait_for("beta up again", Duration::from_secs(10), || {
            (harness.state_of(observer, "beta").as_deref() == Some("up")).then_some(())
        })
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", observer.name, observer.log_text()));
    }
    for observer in [&a, &c] {
        assert!(
            !logged_state(&observer.log_text(), "beta", "down"),
            "{} marked the live beta down:\n{}",
            observer.name,
            observer.log_text()
        );
    }
}

/// Issue 17: twenty nodes that know only a seed (static peer, no mDNS) all see each other up.
/// The deadline is generous (a busy 2-core CI); the speed is the bench's to measure.
#[test]
fn twenty_nodes_with_one_seed_reach_a_full_view() {
    const NODES: usize = 20;
    let harness = Harness::new().expect("harness");
    let seed = harness.spawn(NodeOptions::new("n00")).expect("seed");
    let mut nodes = vec![seed];
    for i in 1..NODES {
        let node = harness
            .spawn(NodeOptions::new(&format!("n{i:02}")).peer(&nodes[0].addr))
            .expect("node");
        nodes.push(node);
    }
    let started = Instant::now();
    for observer in &nodes {
        wait_for(
            &format!("{} to see all {NODES} up", observer.name),
            Duration::from_secs(60),
            || {
                let status = harness.status(observer).ok()?;
                let up = status["nodes"]
                    .as_array()?
                    .iter()
                    .skip(1)
                    .filter(|n| n["state"] == "up")
                    .count();
                (up == NODES - 1).then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", observer.log_text()));
    }
    eprintln!(
        "full view of {NODES} nodes {:?} after the last start",
        started.elapsed()
    );
}
