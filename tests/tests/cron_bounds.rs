//! Issue 26, point 7: schedules are bounded. Any certificate, even capped at `read`, could add
//! schedules without bound (800 with 250 KiB prompts cost every node ~30% of a core and
//! 482 MiB, and `cron ls` failed for everyone: its answer was over 200 MB). Here a flood is
//! refused past the caps for each creator, `cron ls` pages through what is kept, and two nodes
//! that each accepted schedules up to a cap apart keep them all once they meet, holding back the
//! same ones.

use std::time::Duration;

use mesh_domain::CertRole;
use mesh_proto::v1 as pb;
use mesh_tests::{Harness, NodeOptions, NodeProcess, wait_for};
use mesh_tls::{MeshTls, TlsFiles};
use serde_json::Value;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(30);
/// A large prompt, under the 256 KiB a prompt may have.
const LARGE_PROMPT: usize = 250 * 1024;

/// `cron ls --json` on `node`: name → held (why, or null).
fn listed(h: &Harness, node: &NodeProcess) -> Vec<(String, Value)> {
    let out: Value =
        serde_json::from_str(&h.cli_ok(node, &["cron", "ls", "--json"])).expect("json");
    out.as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["held"].clone(),
            )
        })
        .collect()
}

async fn channel_as(files: &TlsFiles, node: &NodeProcess) -> Channel {
    MeshTls::load(files)
        .expect("certificate")
        .dialer()
        .connect(&node.addr)
        .await
        .expect("connect")
        .channel
}

fn add_request(name: &str, prompt_bytes: usize) -> pb::CronAddRequest {
    pb::CronAddRequest {
        name: name.into(),
        // Never within the test: nothing needs a model.
        schedule: "0 0 1 1 *".into(),
        task: Some(pb::SubmitRequest {
            prompt: "x".repeat(prompt_bytes),
            target: Some(pb::submit_request::Target::Role("research".into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Adds `count` schedules named `prefix-N` as `files`, eight at a time; the names accepted and
/// every refusal.
async fn flood(
    files: &TlsFiles,
    node: &NodeProcess,
    prefix: &str,
    count: usize,
) -> (Vec<String>, Vec<tonic::Status>) {
    let client = pb::cron_client::CronClient::new(channel_as(files, node).await);
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:03}")).collect();
    for batch in names.chunks(8) {
        let mut calls = tokio::task::JoinSet::new();
        for name in batch {
            let (mut client, name) = (client.clone(), name.clone());
            calls.spawn(async move {
                let result = client.add(add_request(&name, LARGE_PROMPT)).await;
                (name, result.map(drop))
            });
        }
        while let Some(done) = calls.join_next().await {
            match done.expect("call") {
                (name, Ok(())) => accepted.push(name),
                (_, Err(status)) => refused.push(status),
            }
        }
    }
    (accepted, refused)
}

fn assert_refused_by(refused: &[tonic::Status], key: &str) {
    assert!(!refused.is_empty(), "nothing was refused by `{key}`");
    for status in refused {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        let message = status.message();
        assert!(message.contains(&format!("`{key}`")), "{message}");
        assert!(message.contains("mesh-cli cron rm"), "{message}");
        assert!(message.contains("raise"), "{message}");
    }
}

#[test]
fn a_flood_of_large_schedules_is_refused_past_the_caps_of_each_creator_and_ls_pages() {
    let h = Harness::new().expect("harness");
    // 8 MiB in all, 4 MiB (the default) per creator: two creators' worth of 250 KiB schedules.
    let node = h
        .spawn(NodeOptions::new("solo").extra("[cron]\nmax_mb = 8\n"))
        .expect("node");
    let alice = h.issue_as("alice", CertRole::Client).expect("alice");
    let bob = h.issue_as("bob", CertRole::Client).expect("bob");
    let carol = h.issue_as("carol", CertRole::Client).expect("carol");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    // 800 from alice: 4 MiB / (250 KiB + the rest of the record) = 16 are kept.
    let (kept, refused) = runtime.block_on(flood(&alice, &node, "alice", 800));
    assert_eq!(kept.len(), 16, "alice's schedules kept");
    assert_eq!(refused.len(), 800 - 16);
    assert_refused_by(&refused, "cron.max_mb_per_creator");
    // The cap holds for a second creator too, who has room of their own.
    let (kept, refused) = runtime.block_on(flood(&bob, &node, "bob", 40));
    assert_eq!(kept.len(), 16, "bob's schedules kept");
    assert_refused_by(&refused, "cron.max_mb_per_creator");
    // Two creators fill the node's 8 MiB: a third is refused by the cap in all.
    let (kept, refused) = runtime.block_on(flood(&carol, &node, "carol", 2));
    assert!(kept.is_empty(), "{kept:?}");
    assert_refused_by(&refused, "cron.max_mb");
    // mesh-cli says so, and exits 1.
    let output = h
        .cli_as(
            &alice,
            &node,
            &[
                "cron",
                "add",
                "--name",
                "one-more",
                "--schedule",
                "0 0 1 1 *",
                "--role",
                "research",
                &"y".repeat(120 * 1024),
            ],
        )
        .expect("mesh-cli");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`cron.max_mb_per_creator`") && stderr.contains("mesh-cli cron rm"),
        "{stderr}"
    );

    // 32 schedules of 250 KiB do not fit one answer: it is cut, and `cron ls` follows the pages.
    let first = runtime.block_on(async {
        pb::cron_client::CronClient::new(channel_as(h.client_files(), &node).await)
            .list(pb::CronListRequest::default())
            .await
            .expect("list")
            .into_inner()
    });
    assert!(!first.next_after.is_empty(), "one page held everything");
    assert!(first.schedules.len() < 32, "{}", first.schedules.len());
    let bad_cursor = runtime.block_on(async {
        pb::cron_client::CronClient::new(channel_as(h.client_files(), &node).await)
            .list(pb::CronListRequest {
                after: "not a name!".into(),
                ..Default::default()
            })
            .await
            .expect_err("a cursor that is no schedule name")
    });
    assert_eq!(bad_cursor.code(), tonic::Code::InvalidArgument);
    assert!(bad_cursor.message().starts_with("after:"), "{bad_cursor:?}");
    let names: Vec<String> = listed(&h, &node).into_iter().map(|(n, _)| n).collect();
    let mut want: Vec<String> = (0..800)
        .map(|i| format!("alice-{i:03}"))
        .chain((0..40).map(|i| format!("bob-{i:03}")))
        .filter(|name| names.contains(name))
        .collect();
    want.sort();
    assert_eq!(names.len(), 32, "{names:?}");
    assert_eq!(names, want, "listed once each, by name");
    let table = h.cli_ok(&node, &["cron", "ls"]);
    assert_eq!(table.lines().count(), 1 + 32, "{table}");
    assert!(table.lines().next().is_some_and(|l| l.starts_with("NAME")));
}

/// Two nodes apart each accept one creator's schedules up to the cap; once they meet, every
/// schedule is kept on both, both hold back the same newest ones, and removing an older one
/// lets the oldest held one fire, on both.
#[test]
fn nodes_that_accepted_up_to_the_cap_apart_keep_every_schedule_and_hold_back_the_same() {
    let h = Harness::new().expect("harness");
    let cap = "[cron]\nmax_schedules_per_creator = 3\n";
    let a = h.spawn(NodeOptions::new("a").extra(cap)).expect("a");
    let mut b = h.spawn(NodeOptions::new("b").extra(cap)).expect("b");
    let add = |node: &NodeProcess, name: &str| {
        h.cli(
            node,
            &[
                "cron",
                "add",
                "--name",
                name,
                "--schedule",
                "0 0 1 1 *",
                "--role",
                "research",
                "later",
            ],
        )
        .expect("mesh-cli")
    };
    // Interleaved in time, so the oldest three are a-0, b-0, a-1.
    for i in 0..3 {
        for node in [&a, &b] {
            let output = add(node, &format!("{}-{i}", node.name));
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    for node in [&a, &b] {
        let output = add(node, &format!("{}-3", node.name));
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("`cron.max_schedules_per_creator` = 3"),
            "{stderr}"
        );
    }

    // b comes back knowing a: their memories replicate.
    b.signal("TERM").expect("stop b");
    b.wait_exit(DEADLINE).expect("b stopped");
    let b = h
        .spawn(NodeOptions::new("b").peer(&a.addr).extra(cap))
        .expect("b again");
    h.wait_all_up(&[&a, &b], DEADLINE).expect("mesh");
    let held_after_meeting = vec![
        ("a-0", false),
        ("a-1", false),
        ("a-2", true),
        ("b-0", false),
        ("b-1", true),
        ("b-2", true),
    ];
    for node in [&a, &b] {
        let got = wait_for(&format!("six schedules on {}", node.name), DEADLINE, || {
            let list = listed(&h, node);
            (list.len() == 6).then_some(list)
        })
        .expect("all kept");
        let held: Vec<(&str, bool)> = got
            .iter()
            .map(|(name, held)| (name.as_str(), !held.is_null()))
            .collect();
        assert_eq!(held, held_after_meeting, "on {}", node.name);
        let why = got[2].1.as_str().unwrap_or_default();
        assert!(why.contains("cron.max_schedules_per_creator"), "{why}");
        // Past the cap, no node takes one more, though the held ones count only here.
        assert_eq!(add(node, "more").status.code(), Some(1));
    }
    let table = h.cli_ok(&a, &["cron", "ls"]);
    assert!(table.contains("held: held back"), "{table}");

    // Removing the oldest lets the oldest held one (b-1) fire, on both nodes.
    h.cli_ok(&a, &["cron", "rm", "a-0"]);
    for node in [&a, &b] {
        wait_for(&format!("b-1 active on {}", node.name), DEADLINE, || {
            let list = listed(&h, node);
            let held: Vec<(String, bool)> = list
                .into_iter()
                .map(|(name, held)| (name, !held.is_null()))
                .collect();
            let want: Vec<(String, bool)> = [
                ("a-1", false),
                ("a-2", true),
                ("b-0", false),
                ("b-1", false),
                ("b-2", true),
            ]
            .map(|(n, h)| (n.to_owned(), h))
            .to_vec();
            (held == want).then_some(())
        })
        .expect("the oldest held schedule fires");
    }
}
