//! `mesh-cli` saying what it knows about the fleet (issue 28): `status` with a HEALTH column
//! (a node whose model backend is gone reads `degraded` and why) and the load spelled out;
//! `nodes ls`; `status --watch`, live from the node; `--node NAME` looked up in the local node's
//! peer table; `memory ls` listing namespaces and writers by name; and, on a device whose node
//! joined with a token, errors that name the issuer and `mesh-cli join`.
//!
//! Real nodes and the real `mesh-cli`; the CLI's home (where it finds the local node) is a temp
//! dir of each test's.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use mesh_tests::{Harness, NodeOptions, NodeProcess, bin, terminal::Printed, wait_for};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

/// `mesh-cli ARGS` with the harness's client certificate, with `home` as HOME and data dir
/// (where it finds the local node) and no `--node` unless `args` has one.
fn cli_at(harness: &Harness, home: &Path, args: &[&str]) -> Command {
    let files = harness.client_files();
    let mut cmd = Command::new(bin("mesh-cli"));
    cmd.arg("--ca")
        .arg(&files.ca)
        .arg("--cert")
        .arg(&files.cert)
        .arg("--key")
        .arg(&files.key)
        .args(args)
        .env_remove("MESH_NODE")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .stdin(Stdio::null());
    cmd
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The row of `table` whose first cell is `name`.
fn row<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

/// Issue 28: `status` read `up` for a node whose model backend was gone, and `LOAD 0/0` meant
/// nothing to a newcomer. Now HEALTH says `degraded` and why, and LOAD says what it counts;
/// `nodes ls` says the same in a short table.
#[test]
fn status_shows_a_degraded_node_with_its_reason_and_the_load_spelled_out_and_nodes_ls_too() {
    let harness = Harness::new().expect("harness");
    let laptop = harness.spawn(NodeOptions::new("laptop")).expect("laptop");
    // Its model server is not there (nothing listens on port 9).
    let gpu = harness
        .spawn(NodeOptions::new("gpu").peer(&laptop.addr).extra(
            "[[models]]\nname = \"qwen\"\nbackend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"q\"\n\n[roles]\nchat = [\"qwen\"]\n",
        ))
        .expect("gpu");
    harness
        .wait_all_up(&[&laptop, &gpu], DEADLINE)
        .expect("mesh");
    let (status, _) = wait_for("gpu's health to reach the laptop", DEADLINE, || {
        let output = harness.cli(&laptop, &["status"]).ok()?;
        let (stdout, stderr) = text(&output);
        row(&stdout, "gpu")?
            .contains("model qwen unreachable")
            .then_some((stdout, stderr))
    })
    .unwrap_or_else(|e| {
        let shown = harness.cli(&laptop, &["status"]).expect("status");
        panic!("{e}:\n{}", text(&shown).0)
    });
    let header = status.lines().next().expect("header");
    assert!(
        header.contains("HEALTH") && header.contains("LOAD"),
        "{status}"
    );
    let gpu_row = row(&status, "gpu").expect("gpu row");
    assert!(
        gpu_row.contains(" up ") && gpu_row.contains("degraded: "),
        "{status}"
    );
    assert!(gpu_row.contains("0 running, 0 queued"), "{status}");

    let ls = harness.cli(&laptop, &["nodes", "ls"]).expect("nodes ls");
    let (stdout, stderr) = text(&ls);
    assert!(ls.status.success(), "{stderr}");
    assert_eq!(
        stdout
            .lines()
            .next()
            .map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "STATE", "HEALTH", "ADDRESS", "ROLES", "LOAD"]),
        "{stdout}"
    );
    let gpu_row = row(&stdout, "gpu").expect("gpu in nodes ls");
    assert!(
        gpu_row.contains("model qwen unreachable") && gpu_row.contains(&gpu.addr),
        "{stdout}"
    );
    assert!(row(&stdout, "laptop").is_some(), "{stdout}");
    let json = harness
        .cli(&laptop, &["nodes", "ls", "--json"])
        .expect("nodes ls --json");
    let listed: Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(
        listed["nodes"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
}

/// The state of `name` in the last table `status --watch` printed so far.
fn watched_state(printed: &str, name: &str) -> Option<String> {
    let last = printed.rsplit("── ").next()?;
    let line = row(last.split_once('\n')?.1, name)?;
    line.split_whitespace().nth(3).map(str::to_owned)
}

/// `status --watch` prints the fleet again as it changes, from the node's own stream: a node
/// that joins and then leaves shows up and then down, without the command being run again.
#[test]
fn status_watch_shows_a_node_joining_and_leaving_live() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let mut watch = harness
        .cli_command(&alpha, &["status", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("status --watch");
    let printed = Printed::collect(watch.stdout.take().expect("stdout"));
    let errors = Printed::collect(watch.stderr.take().expect("stderr"));
    printed.wait_until("the first table", DEADLINE, |t| {
        watched_state(t, "alpha").as_deref() == Some("up")
    });

    let mut beta = harness
        .spawn(NodeOptions::new("beta").peer(&alpha.addr))
        .expect("beta");
    printed.wait_until("beta up", DEADLINE, |t| {
        watched_state(t, "beta").as_deref() == Some("up")
    });
    beta.signal("TERM").expect("stop beta");
    beta.wait_exit(DEADLINE).expect("beta stopped");
    printed.wait_until("beta down", DEADLINE, |t| {
        watched_state(t, "beta").as_deref() == Some("down")
    });
    assert!(
        watch.try_wait().expect("wait").is_none(),
        "still watching: {}",
        errors.text()
    );
    let _ = watch.kill();
    let _ = watch.wait();
}

/// Issue 28: `--node` took only HOST:PORT although the local node knows every peer's name and
/// address. A name is looked up in the local node's peer table (the local node being the one
/// whose address a zero-config node writes into the data dir), and a host without a port gets
/// the default port.
#[test]
fn node_names_are_looked_up_in_the_local_nodes_peer_table() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let beta = harness
        .spawn(NodeOptions::new("beta").peer(&alpha.addr))
        .expect("beta");
    harness
        .wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("mesh");
    let home = tempfile::tempdir().expect("home");
    let data = home.path().join("data/agentmesh");
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(data.join("node.addr"), format!("{}\n", alpha.addr)).expect("node.addr");

    let asked = |node: &str| -> Value {
        let output = cli_at(&harness, home.path(), &["--node", node, "status", "--json"])
            .output()
            .expect("status");
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "--node {node}: {stderr}");
        serde_json::from_str(&stdout).expect("json")
    };
    // The answering node lists itself first.
    assert_eq!(asked("beta")["nodes"][0]["name"], "beta");
    assert_eq!(asked("alpha")["nodes"][0]["name"], "alpha");
    // No --node: the local node.
    let output = cli_at(&harness, home.path(), &["status", "--json"])
        .output()
        .expect("status");
    let local: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(local["nodes"][0]["name"], "alpha");

    // A name nobody knows is tried as a host on port 7700, and the error says both.
    let output = cli_at(&harness, home.path(), &["--node", "nosuchnode", "status"])
        .output()
        .expect("status");
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("nosuchnode:7700")
            && stderr.contains("`nosuchnode` is not a node the local node")
            && stderr.contains("it knows alpha, beta"),
        "{stderr}"
    );
}

/// Issue 28: `memory ls` needed a namespace and showed writers as ids. Without one it lists
/// the namespaces; the writer of a key is shown by name, on the node that wrote it and on a
/// peer that got it by replication.
#[test]
fn memory_ls_lists_namespaces_and_names_the_writer() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let beta = harness
        .spawn(NodeOptions::new("beta").peer(&alpha.addr))
        .expect("beta");
    harness
        .wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("mesh");
    let put = harness
        .cli(&alpha, &["memory", "put", "notes", "build", "green"])
        .expect("put");
    assert!(put.status.success(), "{}", text(&put).1);

    let namespaces = harness.cli(&alpha, &["memory", "ls"]).expect("ls");
    let (stdout, stderr) = text(&namespaces);
    assert!(namespaces.status.success(), "{stderr}");
    assert!(
        row(&stdout, "notes").is_some_and(|r| r.contains("shared")),
        "{stdout}"
    );
    let json = harness
        .cli(&alpha, &["memory", "ls", "--json"])
        .expect("ls --json");
    let listed: Value = serde_json::from_slice(&json.stdout).expect("json");
    assert!(
        listed["namespaces"].as_array().is_some_and(|n| n
            .iter()
            .any(|n| n["name"] == "notes" && n["kind"] == "shared")),
        "{listed}"
    );

    for node in [&alpha, &beta] {
        let keys = wait_for("the key on every node", DEADLINE, || {
            let output = harness.cli(node, &["memory", "ls", "notes"]).ok()?;
            let stdout = text(&output).0;
            row(&stdout, "build").is_some().then_some(stdout)
        })
        .expect("listed");
        assert!(
            keys.lines()
                .next()
                .is_some_and(|h| h.contains("WRITTEN BY"))
        );
        let build = row(&keys, "build").expect("row");
        assert!(
            build.split_whitespace().last() == Some("alpha"),
            "{}: {keys}",
            node.name
        );
    }
}

/// The zero-config data dir of a device whose node joined with a token: `mesh-cli` of that
/// device finds it at `<home>/data/agentmesh` (a link to the joined node's data dir).
fn joined_device(joined: &NodeProcess) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("home");
    std::fs::create_dir_all(home.path().join("data")).expect("data");
    std::os::unix::fs::symlink(&joined.data_dir, home.path().join("data/agentmesh"))
        .expect("link the data dir");
    home
}

fn bare_cli(home: &Path, args: &[&str]) -> Output {
    Command::new(bin("mesh-cli"))
        .args(args)
        .env_remove("MESH_NODE")
        .env_remove("MESH_CA")
        .env_remove("MESH_CERT")
        .env_remove("MESH_KEY")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .stdin(Stdio::null())
        .output()
        .expect("mesh-cli")
}

/// Issue 28: on a device whose node joined with a token, `mesh-cli status` listed certificate
/// paths and `ca issue`, and `token create` failed on a missing ca.key. Both now name the
/// issuer the device joined through and say what to run where.
#[test]
fn a_joined_devices_cli_names_its_issuer_and_mesh_cli_join() {
    let harness = Harness::new().expect("harness");
    let issuer = harness
        .spawn(NodeOptions::new("issuer").issuer())
        .expect("issuer");
    let made = Command::new(bin("mesh-cli"))
        .args(["token", "create", "--dir"])
        .arg(harness.ca_dir())
        .args(["--issuer", &issuer.addr])
        .output()
        .expect("token create");
    assert!(made.status.success(), "{}", text(&made).1);
    let token = text(&made).0.trim().to_owned();
    let joined = harness
        .spawn(NodeOptions::new("laptop").join(&token))
        .expect("joined");
    let home = joined_device(&joined);

    let status = bare_cli(home.path(), &["status"]);
    let (_, stderr) = text(&status);
    assert_eq!(status.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("through the issuer at {}", issuer.addr))
            && stderr.contains("`mesh-cli token create --role client`")
            && stderr.contains("`mesh-cli join TOKEN`"),
        "{stderr}"
    );
    assert!(!stderr.contains("ca issue"), "{stderr}");

    let create = bare_cli(home.path(), &["token", "create"]);
    let (_, stderr) = text(&create);
    assert_eq!(create.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("through the issuer at {}", issuer.addr))
            && stderr.contains("run `mesh-cli token create` on that machine"),
        "{stderr}"
    );
    assert!(!stderr.contains("ca.key: "), "{stderr}");
}

/// `WatchPeers` holds a task per stream: a caller (any certificate of the mesh may watch) gets
/// at most 64 at once on a node, the next is `RESOURCE_EXHAUSTED`, and a closed one frees its
/// place. Without the bound, the 65th opens.
#[tokio::test]
async fn a_node_serves_at_most_64_fleet_watchers() {
    use mesh_proto::v1 as pb;
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let dialer = mesh_tls::MeshTls::load(harness.client_files())
        .expect("client files")
        .dialer();
    let channel = dialer.connect(&alpha.addr).await.expect("connect").channel;
    let watch = || {
        let mut client = pb::node_client::NodeClient::new(channel.clone());
        async move { client.watch_peers(pb::WatchPeersRequest {}).await }
    };
    let mut open = Vec::new();
    for _ in 0..64 {
        let mut stream = watch()
            .await
            .expect("a watcher within the bound")
            .into_inner();
        stream
            .message()
            .await
            .expect("the first view")
            .expect("a view");
        open.push(stream);
    }
    let refused = watch().await.expect_err("the 65th watcher");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("64 fleet watchers"),
        "{refused:?}"
    );
    drop(open.pop());
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match watch().await {
            Ok(_) => break,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(tokio::time::Instant::now() < deadline, "no place was freed");
                tokio::time::sleep(Duration::from_millis(50)).await; // poll until the deadline
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}
