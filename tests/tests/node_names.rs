//! Node names bound to certificates (issue 26, item 5), with real processes: a node's name is
//! the one its certificate was issued for, one live node holds a name at a time, and `--on`
//! also takes a node's id. The issue, reproduced against the code before: a certificate issued
//! to `evil` with `name = "a"` in its config got 10 of 10 `run --on a` tasks meant for `a`.

use std::time::Duration;

use mesh_proto::v1 as pb;
use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    hostile::{Behaviour, HostilePeer},
    wait_for,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

/// A node serving role `coder` with `fake`'s scripted model.
fn coder(name: &str, fake: &FakeOpenAi) -> NodeOptions {
    NodeOptions::new(name).extra(&format!(
        "[[models]]\nname = \"coder-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\ncoder = [\"coder-model\"]\n",
        fake.base_url()
    ))
}

/// What `hostile` answers `GetInfo` with: called `name`, serving `coder` on a GPU with more
/// VRAM than any real node here, idle, so the router would rank it first.
fn tempting(hostile: &HostilePeer, name: &str) -> pb::NodeInfo {
    pb::NodeInfo {
        roles: vec!["coder".into()],
        models: vec![pb::Model {
            name: "coder-model".into(),
            backend: "openai".into(),
            model: "scripted".into(),
            ..Default::default()
        }],
        role_chains: vec![pb::RoleChain {
            role: "coder".into(),
            models: vec!["coder-model".into()],
        }],
        resources: Some(pb::Resources {
            cpu_count: 64,
            gpus: vec![pb::Gpu {
                name: "H100".into(),
                vram_mb: 81_920,
                vram_free_mb: None,
                source: "declared".into(),
            }],
            ..Default::default()
        }),
        load: Some(pb::Load {
            workers: 64,
            queue_capacity: 64,
            ..Default::default()
        }),
        remote_max_tier: pb::Tier::Read.into(),
        ..hostile.info(name)
    }
}

/// `(name, id)` of every node `observer` lists, itself included.
fn listed(h: &Harness, observer: &NodeProcess) -> Vec<(String, String)> {
    let status = h.status(observer).expect("status");
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or_default().to_owned(),
                n["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The id `node` reports for itself.
fn own_id(h: &Harness, node: &NodeProcess) -> String {
    let status = h.status(node).expect("status");
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node.name.as_str())
        .and_then(|n| n["id"].as_str())
        .expect("itself")
        .to_owned()
}

/// The `Delegated` events of task `id` on `node`: where it was sent, in order.
fn delegations(h: &Harness, node: &NodeProcess, id: &str) -> Vec<Value> {
    h.task_events(node, id)
        .into_iter()
        .filter(|e| e["type"] == "delegated")
        .collect()
}

/// Issue 26: a node whose certificate was issued to `evil` but which calls itself `a` (while
/// the real `a` is up), and one issued to `mallory` that calls itself `gpu` (a name no node
/// holds), are refused by the node that learns of them: neither is listed, 10 of 10 `run --on
/// a` run on the real `a` and are sent nowhere else, and `run --on gpu` finds no node instead of
/// the impostor. Both impostors advertise the role, the model and a larger GPU, so the router
/// would rank them first.
#[test]
fn a_node_calling_itself_by_another_name_than_its_certificates_gets_no_task() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    fake.otherwise(Scripted::text("done on a"));
    let evil = HostilePeer::new(&h, "evil").expect("evil");
    let evil_server = evil
        .serve(Behaviour::new(tempting(&evil, "a")))
        .expect("evil serves");
    let mallory = HostilePeer::new(&h, "mallory").expect("mallory");
    let mallory_server = mallory
        .serve(Behaviour::new(tempting(&mallory, "gpu")))
        .expect("mallory serves");
    let a = h.spawn(coder("a", &fake)).expect("a");
    let b = h
        .spawn(
            NodeOptions::new("b")
                .peer(&a.addr)
                .peer(evil_server.addr.to_string())
                .peer(mallory_server.addr.to_string()),
        )
        .expect("b");
    h.wait_all_up(&[&a, &b], DEADLINE).expect("a and b");
    for (name, issued) in [("a", "evil"), ("gpu", "mallory")] {
        let refusal =
            format!("it calls itself `{name}`, but its certificate was issued to `{issued}`");
        wait_for(&format!("b to refuse {issued}"), DEADLINE, || {
            b.log_text().contains(&refusal).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", listed(&h, &b), b.log_text()));
    }
    let a_id = own_id(&h, &a);
    let mut names = listed(&h, &b);
    names.sort();
    assert_eq!(
        names,
        [
            ("a".to_owned(), a_id.clone()),
            ("b".to_owned(), own_id(&h, &b))
        ],
        "b lists the real a and itself only (evil is {}, mallory {})",
        evil.id(),
        mallory.id()
    );

    for i in 0..10 {
        let (code, result) = h
            .run_json(&b, &["--role", "coder", "--on", "a", &format!("task {i}")])
            .expect("run");
        assert_eq!(code, Some(0), "{result:#}");
        assert_eq!(result["executed_on"], "a", "{result:#}");
        let id = result["task_id"].as_str().expect("task id");
        let sent = delegations(&h, &b, id);
        assert_eq!(sent.len(), 1, "sent once, to a: {sent:#?}");
    }
    assert_eq!(fake.requests().len(), 10, "a's model answered all ten");

    let (code, result) = h
        .run_json(&b, &["--role", "coder", "--on", "gpu", "x"])
        .expect("run");
    assert_eq!(code, Some(1), "{result:#}");
    let error = result.to_string();
    assert!(
        error.contains("no node can run this task")
            && error.contains("not the requested node `gpu`"),
        "{error}"
    );
}

/// Issue 26: a second certificate issued for `a` (another key) is a second member claiming a
/// live member's name: refused by every node while `a` is up (both `b`, which learns of it,
/// and `a`), and listed nowhere.
#[test]
fn a_second_member_claiming_a_live_members_name_is_refused() {
    let h = Harness::new().expect("harness");
    let a = h.spawn(NodeOptions::new("a")).expect("a");
    let twin =
        HostilePeer::with_files(&h.issue_again("a").expect("a second certificate")).expect("twin");
    let twin_server = twin
        .serve(Behaviour::new(twin.info("a")))
        .expect("twin serves");
    // b knows a before the twin comes: first come, first served (a twin b heard of first would
    // hold the name at b, and a would be the one refused there).
    let b = h.spawn(NodeOptions::new("b").peer(&a.addr)).expect("b");
    h.wait_all_up(&[&a, &b], DEADLINE).expect("a and b");
    twin_server
        .announce_to(&b.addr)
        .expect("the twin announces itself to b");
    let a_id = own_id(&h, &a);
    assert_ne!(a_id, twin.id(), "another key, another id");
    let refusal = format!("the name `a` is held by a live member ({})", &a_id[..12]);
    wait_for("b to refuse the twin", DEADLINE, || {
        b.log_text().contains(&refusal).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", listed(&h, &b), b.log_text()));
    // a hears of it through b's gossip.
    wait_for("a to refuse the twin", DEADLINE, || {
        a.log_text()
            .contains("the name `a` is held by this node")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", listed(&h, &a), a.log_text()));
    for observer in [&a, &b] {
        let ids: Vec<String> = listed(&h, observer).into_iter().map(|(_, id)| id).collect();
        assert!(
            !ids.contains(&twin.id()),
            "{} lists the twin: {ids:?}",
            observer.name
        );
        assert_eq!(ids.len(), 2, "{}: {ids:?}", observer.name);
    }
}

/// Issue 26: a node given a name other than its certificate's does not start, and says how to
/// fix it; one whose name only comes from its host runs under its certificate's name.
#[test]
fn a_node_runs_under_its_certificates_name_or_not_at_all() {
    let h = Harness::new().expect("harness");
    let mut options = NodeOptions::new("a");
    options.tls = Some(h.issue("evil").expect("evil's certificate"));
    let refused = h
        .spawn(options)
        .expect_err("a node named `a` with evil's certificate must not start");
    let message = format!("{refused:#}");
    for part in [
        "exit status: 1",
        "named `a`",
        "issued to `evil`",
        "name = \"evil\"",
        "mesh-cli ca issue --role node --name a",
    ] {
        assert!(message.contains(part), "`{part}` missing:\n{message}");
    }

    // Named by its host (whatever that is here: not `alpha`), it takes its certificate's name.
    let alpha = h.spawn(NodeOptions::new("alpha").unnamed()).expect("alpha");
    let names: Vec<String> = listed(&h, &alpha).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["alpha"]);
    assert!(
        alpha
            .log_text()
            .contains("the name its certificate was issued for"),
        "{}",
        alpha.log_text()
    );
}

/// Issue 26: `--on` takes a node's id, whole or as the short id `mesh-cli status` shows (12
/// hex digits), as well as its name; a shorter prefix picks nobody.
#[test]
fn run_on_takes_a_node_id_or_its_short_id() {
    let h = Harness::new().expect("harness");
    let (fake_a, fake_c) = (FakeOpenAi::start(), FakeOpenAi::start());
    fake_a.otherwise(Scripted::text("on a"));
    fake_c.otherwise(Scripted::text("on c"));
    let a = h.spawn(coder("a", &fake_a)).expect("a");
    let b = h.spawn(NodeOptions::new("b").peer(&a.addr)).expect("b");
    let c = h.spawn(coder("c", &fake_c).peer(&a.addr)).expect("c");
    h.wait_all_up(&[&a, &b, &c], DEADLINE).expect("the fleet");
    let c_id = own_id(&h, &c);
    for on in [c_id.as_str(), &c_id[..12], &c_id[..20]] {
        let (code, result) = h
            .run_json(&b, &["--role", "coder", "--on", on, "x"])
            .expect("run");
        assert_eq!(code, Some(0), "--on {on}: {result:#}");
        assert_eq!(result["executed_on"], "c", "--on {on}");
    }
    assert_eq!(fake_c.requests().len(), 3);
    assert!(fake_a.requests().is_empty(), "a was never asked");
    let (code, result) = h
        .run_json(&b, &["--role", "coder", "--on", &c_id[..11], "x"])
        .expect("run");
    assert_eq!(code, Some(1), "{result:#}");
    assert!(
        result.to_string().contains("not the requested node"),
        "{result:#}"
    );
}
