//! Cron across real nodes: a schedule made on one node runs where its role is served, keeps
//! firing when its owner is killed, never runs a scheduled time twice, and bad input is refused
//! with the field named.

use std::{collections::HashSet, time::Duration};

use mesh_tests::{Harness, NodeOptions, NodeProcess, fake_openai::FakeOpenAi, wait_for};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);

fn research(fake: &FakeOpenAi) -> String {
    format!(
        "[[models]]\nname = \"notes-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\nresearch = [\"notes-model\"]\n",
        fake.base_url()
    )
}

fn cli_err(h: &Harness, node: &NodeProcess, args: &[&str]) -> String {
    let output = h.cli(node, args).expect("mesh-cli");
    assert_eq!(
        output.status.code(),
        Some(1),
        "mesh-cli {args:?} should fail"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(h: &Harness, node: &NodeProcess, args: &[&str]) -> Value {
    serde_json::from_str(&h.cli_ok(node, args)).expect("JSON")
}

fn history(h: &Harness, node: &NodeProcess, name: &str) -> Vec<Value> {
    let out = json(
        h,
        node,
        &["cron", "history", name, "--limit", "1000", "--json"],
    );
    out.as_array().cloned().unwrap_or_default()
}

fn owner_of(h: &Harness, node: &NodeProcess, name: &str) -> String {
    json(h, node, &["cron", "ls", "--json"])
        .as_array()
        .and_then(|list| list.iter().find(|s| s["name"] == name).cloned())
        .and_then(|s| s["owner"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn a_schedule_made_on_one_node_runs_where_its_role_is_served() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .extra(&research(&fake)),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");

    let added = h.cli_ok(
        &laptop,
        &[
            "cron",
            "add",
            "--name",
            "notes",
            "--schedule",
            "* * * * * *",
            "--role",
            "research",
            "summarise the day's notes",
        ],
    );
    assert!(added.contains("added `notes`"), "{added}");
    // The schedule was written on the laptop; the gpu knows it once the memory has replicated.
    wait_for("`notes` known on the gpu", DEADLINE, || {
        (!owner_of(&h, &gpu, "notes").is_empty()).then_some(())
    })
    .expect("replicated");
    let done = wait_for("a firing of `notes` that is done", DEADLINE, || {
        history(&h, &gpu, "notes")
            .into_iter()
            .find(|f| f["status"] == "done")
    })
    .expect("fired");
    assert_eq!(done["executed_on"], "gpu", "{done}");
    for field in ["fire_id", "scheduled_at", "owner", "executed_on", "status"] {
        assert!(done.get(field).is_some(), "{field} missing: {done}");
    }
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.to_string().contains("summarise the day's notes")),
        "the prompt reached the model"
    );
    let listed = json(&h, &gpu, &["cron", "ls", "--json"]);
    let schedule = &listed[0];
    assert_eq!(schedule["name"], "notes");
    assert_eq!(schedule["target"], "role:research");
    assert_eq!(schedule["timezone"], "UTC");
    assert_eq!(schedule["created_on"], "laptop");

    // Invalid input names the bad field; a taken name is refused.
    let base = ["cron", "add", "--role", "research"];
    let mut bad_expr = base.to_vec();
    bad_expr.extend(["--name", "bad", "--schedule", "61 * * * *", "x"]);
    assert!(cli_err(&h, &laptop, &bad_expr).contains("schedule:"));
    let mut bad_zone = base.to_vec();
    bad_zone.extend([
        "--name",
        "bad",
        "--schedule",
        "0 2 * * *",
        "--tz",
        "Mars/Olympus",
        "x",
    ]);
    assert!(cli_err(&h, &laptop, &bad_zone).contains("timezone:"));
    let mut taken = base.to_vec();
    taken.extend(["--name", "notes", "--schedule", "0 2 * * *", "x"]);
    assert!(cli_err(&h, &laptop, &taken).contains("already exists"));
    assert!(cli_err(&h, &laptop, &["cron", "history", "nope"]).contains("no schedule named"));

    // Removed: it stops firing. Run-now fires once by hand.
    h.cli_ok(&laptop, &["cron", "rm", "notes"]);
    wait_for("`notes` gone from the gpu node", DEADLINE, || {
        json(&h, &gpu, &["cron", "ls", "--json"])
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(())
    })
    .expect("removed");
    h.cli_ok(
        &laptop,
        &[
            "cron",
            "add",
            "--name",
            "yearly",
            "--schedule",
            "0 0 1 1 *",
            "--role",
            "research",
            "happy new year",
        ],
    );
    let fired = json(&h, &laptop, &["cron", "run-now", "yearly", "--json"]);
    assert_eq!(fired["manual"], true);
    wait_for("the manual firing done", DEADLINE, || {
        history(&h, &laptop, "yearly")
            .into_iter()
            .find(|f| f["status"] == "done" && f["executed_on"] == "gpu")
    })
    .expect("ran");
}

#[test]
fn firings_continue_when_the_owner_is_killed_and_no_time_runs_twice() {
    let h = Harness::new().expect("harness");
    let fake = FakeOpenAi::start();
    let worker = h
        .spawn(NodeOptions::new("worker").extra(&research(&fake)))
        .expect("worker");
    let mut a = h
        .spawn(NodeOptions::new("a").peer(&worker.addr))
        .expect("a");
    let mut b = h
        .spawn(NodeOptions::new("b").peer(&worker.addr))
        .expect("b");
    h.wait_all_up(&[&worker, &a, &b], DEADLINE).expect("mesh");

    // The schedule's owner must be a or b (the worker serves the role and stays up): a name
    // whose random id hashes to the worker is removed and another one tried.
    let mut name = String::new();
    for attempt in 0..20 {
        let candidate = format!("tick{attempt}");
        h.cli_ok(
            &worker,
            &[
                "cron",
                "add",
                "--name",
                &candidate,
                "--schedule",
                "*/2 * * * * *",
                "--role",
                "research",
                "tick",
            ],
        );
        if owner_of(&h, &worker, &candidate) != "worker" {
            name = candidate;
            break;
        }
        h.cli_ok(&worker, &["cron", "rm", &candidate]);
    }
    assert!(!name.is_empty(), "every attempt hashed to the worker");
    let first_owner = wait_for("two firings done by the first owner", DEADLINE, || {
        let done: Vec<Value> = history(&h, &worker, &name)
            .into_iter()
            .filter(|f| f["status"] == "done")
            .collect();
        (done.len() >= 2).then(|| done[0]["owner"].as_str().unwrap_or_default().to_owned())
    })
    .expect("firing");
    let killed_at = mesh_tests::unix_ms();
    let (victim, survivor) = if first_owner == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    assert_eq!(victim.name, first_owner);
    victim.signal("KILL").expect("kill the owner");
    victim.wait_exit(DEADLINE).expect("exit");

    let takeover = wait_for(
        "a firing by the next owner after the kill",
        DEADLINE,
        || {
            history(&h, &worker, &name).into_iter().find(|f| {
                f["status"] == "done"
                    && f["owner"] != first_owner.as_str()
                    && f["scheduled_at_ms"].as_u64().is_some_and(|t| t > killed_at)
            })
        },
    )
    .expect("the schedule kept firing");
    assert!(
        ["worker", survivor.name.as_str()].contains(&takeover["owner"].as_str().unwrap_or("")),
        "{takeover}"
    );

    // Each scheduled time appears once, and the worker ran each firing's task once.
    let firings = history(&h, &worker, &name);
    let times: Vec<u64> = firings
        .iter()
        .filter_map(|f| f["scheduled_at_ms"].as_u64())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "scheduled times repeat: {times:?}"
    );
    let tasks = json(&h, &worker, &["tasks", "--json", "--limit", "1000"]);
    let ran: Vec<&str> = tasks["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    let distinct: HashSet<&str> = ran.iter().copied().collect();
    assert_eq!(ran.len(), distinct.len(), "a task ran twice on the worker");
    let fired: HashSet<&str> = firings
        .iter()
        .filter_map(|f| f["task_id"].as_str())
        .collect();
    assert!(
        distinct.is_subset(&fired),
        "the worker ran tasks no firing accounts for"
    );
    assert_eq!(
        fake.requests().len(),
        ran.len(),
        "one model call per task: nothing ran twice"
    );
}
