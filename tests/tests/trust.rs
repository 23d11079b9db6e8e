//! Who may do what, on every path (issue 15): a node whose `security.remote_max_tier` is `read`
//! and whose `security.client_max_tier` is `write` runs no shell task for anyone but its own
//! operator, whichever way the task arrives: `run --on` through another node, `run` straight at
//! it with a client or a node certificate, `cron add --on` (whoever owns the schedule), a
//! schedule written through `Memory.Put`, a schedule a peer pushes in its own name without
//! `Cron.Add`'s checks, a `delegate` call from a write-tier task, or the front door; and nobody
//! fires a schedule by hand (`cron run-now`) whose task they could not run themselves. Every check
//! looks for the side effect (the marker file a `shell_exec` would create, and whether the
//! node's model was called at all), not only for the status.

use std::{path::Path, process::Output, time::Duration};

use mesh_cert::CertRole;
use mesh_domain::{Principal, Target, TaskSpec, Tier};
use mesh_node::testing::{Overlap, Schedule};
use mesh_proto::v1 as pb;
use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    unix_ms, wait_for,
};
use mesh_tls::{MeshTls, TlsFiles};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_of(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// A model that answers every request with a `shell_exec` creating `marker`.
fn shell_model(marker: &Path) -> FakeOpenAi {
    let fake = FakeOpenAi::start();
    fake.otherwise(Scripted::tool(
        "shell_exec",
        &json!({"command": format!("touch {}", marker.display())}).to_string(),
    ));
    fake
}

fn model_config(fake: &FakeOpenAi, model: &str, role: &str) -> String {
    format!(
        "[[models]]\nname = \"{model}\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\n{role} = [\"{model}\"]\n",
        fake.base_url()
    )
}

/// The schedule names `node` lists, with their owners.
fn owners(h: &Harness, node: &NodeProcess) -> Vec<(String, String)> {
    json_of(&h.cli(node, &["cron", "ls", "--json"]).expect("cron ls"))
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["owner"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The firings of schedule `name` as `node` records them.
fn history(h: &Harness, node: &NodeProcess, name: &str) -> Vec<Value> {
    let output = h
        .cli(node, &["cron", "history", name, "--json"])
        .expect("cron history");
    if !output.status.success() {
        return Vec::new();
    }
    serde_json::from_slice::<Value>(&output.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Waits until schedule `name` has a firing that failed (fired by `owner`, when given), and
/// checks none ran (`done`).
fn refused_when_fired(h: &Harness, node: &NodeProcess, name: &str, owner: Option<&str>) {
    let firings = wait_for(&format!("a failed firing of `{name}`"), DEADLINE, || {
        let firings = history(h, node, name);
        firings
            .iter()
            .any(|f| f["status"] == "failed" && owner.is_none_or(|o| f["owner"] == o))
            .then_some(firings)
    })
    .expect("fired");
    for firing in firings {
        assert_ne!(firing["status"], "done", "{name}: {firing}");
    }
}

/// The current hybrid-logical-clock stamp (NTP64: seconds in the high 32 bits).
fn hlc_now() -> u64 {
    let ms = unix_ms();
    ((ms / 1000) << 32) | (((ms % 1000) << 32) / 1000)
}

/// Regression: `Memory.Put` and `Memory.Delete` wrote the system namespaces (`cron`,
/// `cron_firings`, `sessions`) for any caller, so a schedule could be planted past `Cron.Add`;
/// only the agent's `memory_put` refused them.
#[test]
fn a_shell_task_is_refused_by_a_read_only_node_on_every_path_and_nothing_runs() {
    let h = Harness::new().expect("harness");
    let marker = h.path().join("shell-ran-on-gpu");
    let gpu_model = shell_model(&marker);
    let planner_model = FakeOpenAi::start();
    // The laptop's own operator may run anything there (the harness's default), so every
    // refusal below is gpu's.
    let laptop = h
        .spawn(NodeOptions::new("laptop").extra(&model_config(
            &planner_model,
            "planner-model",
            "planner",
        )))
        .expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .peer(&laptop.addr)
                .security("remote_max_tier = \"read\"\nclient_max_tier = \"write\"\n")
                .extra(&model_config(&gpu_model, "coder-model", "coder")),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let node_cert = h
        .issue_as("borrowed-node", CertRole::Node)
        .expect("node cert");
    let nothing_ran = |path: &str| {
        assert!(!marker.exists(), "{path}: shell_exec ran on gpu");
        assert!(
            gpu_model.requests().is_empty(),
            "{path}: gpu's model was called"
        );
    };

    // `run --on gpu` through the laptop, and `run` straight at gpu with a client certificate
    // and with a node certificate used as mesh-cli's.
    let shell_task = ["--role", "coder", "--tier", "shell", "--on", "gpu", "x"];
    let (code, result) = h.run_json(&laptop, &shell_task).expect("run");
    assert_eq!(code, Some(1), "{result:#}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or_default()
            .contains("tier"),
        "{result:#}"
    );
    let (code, result) = h.run_json(&gpu, &shell_task).expect("run");
    assert_eq!(code, Some(1), "{result:#}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or_default()
            .contains("security.client_max_tier"),
        "{result:#}"
    );
    let mut as_node = vec!["run", "--json"];
    as_node.extend_from_slice(&shell_task);
    let output = h.cli_as(&node_cert, &gpu, &as_node).expect("mesh-cli");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("security.remote_max_tier"),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    nothing_ran("run");

    // `cron add --on gpu` straight at gpu: refused when added, for both certificates.
    let cron_add = |name: &str| {
        [
            "cron",
            "add",
            "--name",
            name,
            "--schedule",
            "* * * * * *",
            "--role",
            "coder",
            "--tier",
            "shell",
            "--on",
            "gpu",
            "x",
        ]
        .map(str::to_owned)
    };
    let add = cron_add("direct");
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    let output = h.cli(&gpu, &add).expect("cron add");
    assert_eq!(
        output.status.code(),
        Some(1),
        "cron add at gpu was accepted"
    );
    assert!(
        stderr(&output).contains("security.client_max_tier"),
        "{}",
        stderr(&output)
    );
    let output = h.cli_as(&node_cert, &gpu, &add).expect("mesh-cli");
    assert_eq!(
        output.status.code(),
        Some(1),
        "cron add at gpu was accepted"
    );
    assert!(
        stderr(&output).contains("security.remote_max_tier"),
        "{}",
        stderr(&output)
    );

    // `cron add --on gpu` through the laptop (which lets its operator run shell): accepted
    // there, owned by the laptop (a shell schedule is owned by its writer or by a node that
    // runs shell for other nodes, and gpu runs only `read` for them), and refused at every
    // firing. The other owner, gpu, is tried at the end, with the laptop gone.
    let mut added = Vec::new();
    for i in 0..3 {
        let name = format!("nightly-{i}");
        let add = cron_add(&name);
        let add: Vec<&str> = add.iter().map(String::as_str).collect();
        let output = h.cli(&laptop, &add).expect("cron add");
        assert!(output.status.success(), "{}", stderr(&output));
        added.push(name);
    }
    let owners = owners(&h, &laptop);
    for name in &added {
        assert!(
            owners.contains(&(name.clone(), "laptop".to_owned())),
            "{name}: {owners:?}"
        );
    }
    for name in &added {
        refused_when_fired(&h, &laptop, name, None);
        let removed = h.cli(&laptop, &["cron", "rm", name]).expect("cron rm");
        assert!(removed.status.success(), "{}", stderr(&removed));
    }
    nothing_ran("cron add");

    // A schedule written straight into the `cron` namespace (and the other system
    // namespaces): refused, by both nodes.
    for node in [&laptop, &gpu] {
        for ns in ["cron", "cron_firings", "sessions"] {
            let output = h
                .cli(node, &["memory", "put", ns, "planted", "{}"])
                .expect("memory put");
            assert_eq!(output.status.code(), Some(1), "memory put {ns} accepted");
            assert!(stderr(&output).contains(ns), "{}", stderr(&output));
        }
    }
    assert!(owners_named(&h, &laptop, "planted").is_empty());

    // A schedule a member pushes in its own name, past `Cron.Add`: it claims a client started
    // it, at tier shell, to run on gpu.
    let pushed = push_schedules(&h, &gpu, &node_cert, &added);
    for name in &pushed {
        refused_when_fired(&h, &gpu, name, None);
        let removed = h.cli(&gpu, &["cron", "rm", name]).expect("cron rm");
        assert!(removed.status.success(), "{}", stderr(&removed));
    }
    nothing_ran("a pushed schedule");

    // A write-tier task on the laptop whose model delegates a shell sub-task (above its own
    // tier) and a write sub-task (above gpu's cap for anything through another node) to gpu.
    planner_model.push([
        Scripted::tool(
            "delegate",
            r#"{"prompt": "x", "role": "coder", "tier": "shell", "on": "gpu"}"#,
        ),
        Scripted::tool(
            "delegate",
            r#"{"prompt": "x", "role": "coder", "tier": "write", "on": "gpu"}"#,
        ),
        Scripted::text("gave up"),
    ]);
    let (code, result) = h
        .run_json(
            &laptop,
            &[
                "--role", "planner", "--tier", "write", "--on", "laptop", "plan",
            ],
        )
        .expect("run");
    assert_eq!(code, Some(0), "{result:#}");
    let tool_results: Vec<String> = planner_model
        .requests()
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect();
    assert!(tool_results.len() >= 2, "{tool_results:?}");
    assert!(
        tool_results.iter().all(|r| r.contains("tier")),
        "each delegate call is refused for its tier: {tool_results:?}"
    );
    nothing_ran("delegate");

    // `cron run-now` fires a schedule as its creator: a caller who may not run its task here
    // may not fire it by hand either (the lent node certificate, against the operator's
    // write-tier schedule on the laptop).
    let output = h
        .cli(
            &laptop,
            &[
                "cron",
                "add",
                "--name",
                "yearly",
                "--schedule",
                "0 0 1 1 *",
                "--role",
                "planner",
                "--tier",
                "write",
                "--on",
                "laptop",
                "x",
            ],
        )
        .expect("cron add");
    assert!(output.status.success(), "{}", stderr(&output));
    let output = h
        .cli_as(&node_cert, &laptop, &["cron", "run-now", "yearly"])
        .expect("mesh-cli");
    assert_eq!(
        output.status.code(),
        Some(1),
        "run-now by a node certificate"
    );
    assert!(
        stderr(&output).contains("security.remote_max_tier"),
        "{}",
        stderr(&output)
    );
    assert!(history(&h, &laptop, "yearly").is_empty(), "it fired");
    let output = h
        .cli(&laptop, &["cron", "run-now", "yearly"])
        .expect("cron run-now");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(history(&h, &laptop, "yearly").len(), 1);

    // The front door: a chat reaches gpu's model, whose tool call goes back to the caller as
    // an answer; the node runs no tool for a chat.
    let url = laptop.http_url().expect("front door");
    let body = json!({
        "model": "coder-model",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "shell_exec", "parameters": {"type": "object"}}}],
    });
    let answer = http_post(&url, "/v1/chat/completions", &body.to_string());
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "shell_exec",
        "{answer:#}"
    );
    assert_eq!(
        gpu_model.requests().len(),
        1,
        "the chat reached gpu's model"
    );
    assert!(!marker.exists(), "the front door ran shell_exec");

    // A write-tier schedule whose writer, the laptop, is gone: gpu takes it over and fires it
    // as a task from another node (capped at `read`), although a task the operator started
    // there directly could run at `write`.
    let output = h
        .cli(
            &laptop,
            &[
                "cron",
                "add",
                "--name",
                "orphan",
                "--schedule",
                "* * * * * *",
                "--role",
                "coder",
                "--tier",
                "write",
                "--on",
                "gpu",
                "x",
            ],
        )
        .expect("cron add");
    assert!(output.status.success(), "{}", stderr(&output));
    wait_for("gpu to know the schedule", DEADLINE, || {
        (!owners_named(&h, &gpu, "orphan").is_empty()).then_some(())
    })
    .expect("replicated");
    laptop.signal("KILL").expect("kill laptop");
    wait_for("gpu to own the orphan", DEADLINE, || {
        (owners_named(&h, &gpu, "orphan")
            .first()
            .map(|(_, o)| o.as_str())
            == Some("gpu"))
        .then_some(())
    })
    .expect("taken over");
    refused_when_fired(&h, &gpu, "orphan", Some("gpu"));
    assert_eq!(
        gpu_model.requests().len(),
        1,
        "an orphan firing called gpu's model"
    );
    assert!(!marker.exists(), "an orphan firing ran shell_exec on gpu");
}

/// The schedules `node` lists under `name`.
fn owners_named(h: &Harness, node: &NodeProcess, name: &str) -> Vec<(String, String)> {
    owners(h, node)
        .into_iter()
        .filter(|(n, _)| n == name)
        .collect()
}

/// Pushes schedules into `node`'s memory as the member `files`, in its own name, none of them
/// checked by `Cron.Add`: each claims a client certificate created it at tier shell. Pushes
/// more until `node` itself owns one (it fires those), and returns the names.
fn push_schedules(
    h: &Harness,
    node: &NodeProcess,
    files: &TlsFiles,
    taken: &[String],
) -> Vec<String> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let tls = MeshTls::load(files).expect("member tls");
    let member_id = tls.identity().id.clone();
    let signer = tls.origin_signer().expect("the member's signer");
    let client = h.client_files();
    let client_id = MeshTls::load(client)
        .expect("client tls")
        .identity()
        .id
        .clone();
    let mut names = Vec::new();
    for seq in 1..=24u64 {
        let name = format!("pushed-{seq}");
        let mut task = TaskSpec::new("x", Target::Role("coder".into()));
        task.tier = Tier::Shell;
        task.require.on = Some("gpu".into());
        let schedule = Schedule {
            id: format!("pushed-schedule-{seq}"),
            name: name.clone(),
            expression: "* * * * * *".into(),
            timezone: String::new(),
            task,
            overlap: Overlap::Skip,
            catch_up_s: 60,
            enabled: true,
            created_at_ms: unix_ms() as i64,
            created_on: "laptop".into(),
            creator: Some(Principal {
                id: client_id.clone(),
                name: "test-client".into(),
                role: Some(CertRole::Client),
            }),
            origin: None,
        };
        let mut record = pb::MemoryRecord {
            namespace: "cron".into(),
            key: name.clone(),
            value: serde_json::to_vec(&schedule).expect("schedule JSON"),
            hlc: hlc_now(),
            origin: member_id.to_string(),
            seq,
            tombstone: false,
            signature: Vec::new(),
        };
        // Signed by the member itself: a genuine write of its own, past `Cron.Add`.
        mesh_tests::sign_record(&signer, &mut record).expect("sign");
        let answer = runtime.block_on(async {
            let channel = tls
                .dialer()
                .connect(&node.addr)
                .await
                .expect("dial")
                .channel;
            pb::memory_client::MemoryClient::new(channel)
                .push(pb::MemoryPushRequest {
                    records: vec![record],
                    node: member_id.to_string(),
                    certificates: vec![signer.certificate().to_vec()],
                })
                .await
        });
        let answer = answer.expect("push").into_inner();
        assert_eq!(answer.applied, 1, "{:?}", answer.refused);
        names.push(name.clone());
        let owned_here = wait_for(&format!("{name} listed"), DEADLINE, || {
            owners_named(h, node, &name).first().map(|(_, o)| o.clone())
        })
        .expect("listed");
        if owned_here == node.name {
            assert!(!taken.contains(&name));
            return names;
        }
    }
    panic!("{} owned none of the pushed schedules", node.name);
}

/// POSTs `body` to the front door at `url` (plain HTTP/1.1) and returns the JSON answer.
fn http_post(url: &str, path: &str, body: &str) -> Value {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(host).expect("connect");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    let (_, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no body: {response}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
}

/// A certificate issued before roles existed: signed by the harness CA, good for both ends, with
/// no role in its subject.
fn legacy_identity(h: &Harness, name: &str) -> TlsFiles {
    let ca_dir = h.ca_dir();
    let ca_pem = std::fs::read_to_string(ca_dir.join(mesh_cert::ca::CA_CERT_FILE)).expect("ca");
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(ca_dir.join(mesh_cert::ca::CA_KEY_FILE)).expect("ca key"),
    )
    .expect("ca key pem");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("issuer");
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let files = TlsFiles {
        ca: ca_dir.join(mesh_cert::ca::CA_CERT_FILE),
        cert: h.path().join(format!("{name}.pem")),
        key: h.path().join(format!("{name}.key")),
    };
    std::fs::write(&files.cert, cert.pem()).expect("cert");
    std::fs::write(&files.key, key.serialize_pem()).expect("key");
    files
}

/// A client certificate never serves as a node: a node given one does not start, and a node
/// refuses it as a peer (a hello) and as a replica (`Memory.Sync`, `Memory.Push`). A legacy
/// certificate (no role) is trusted least, by both caps, and named in the log.
#[test]
fn a_client_certificate_never_acts_as_a_node_and_a_legacy_one_is_trusted_least() {
    let h = Harness::new().expect("harness");
    let mut options = NodeOptions::new("pretender");
    options.tls = Some(h.client_files().clone());
    let refused = h
        .spawn(options)
        .expect_err("a node with a client certificate must not start");
    let message = format!("{refused:#}");
    assert!(
        message.contains("exit status: 1")
            && message.contains("is a client certificate")
            && message.contains("mesh-cli ca issue --role node"),
        "{message}"
    );

    let node = h
        .spawn(
            NodeOptions::new("alpha")
                .security("remote_max_tier = \"read\"\nclient_max_tier = \"write\"\n"),
        )
        .expect("alpha");
    let client = MeshTls::load(h.client_files()).expect("client tls");
    let client_id = client.identity().id.to_string();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let codes = runtime.block_on(async {
        let channel = client
            .dialer()
            .connect(&node.addr)
            .await
            .expect("dial")
            .channel;
        let hello = pb::node_client::NodeClient::new(channel.clone())
            .watch_info(pb::WatchInfoRequest {
                hello: Some(pb::PeerHello {
                    name: "test-client".into(),
                    id: client_id.clone(),
                    port: 7700,
                }),
                interval_ms: 0,
            })
            .await
            .map(drop);
        let mut memory = pb::memory_client::MemoryClient::new(channel);
        let sync = memory
            .sync(pb::MemorySyncRequest {
                node: client_id.clone(),
                ..Default::default()
            })
            .await
            .map(drop);
        let push = memory
            .push(pb::MemoryPushRequest {
                records: Vec::new(),
                node: client_id.clone(),
                certificates: Vec::new(),
            })
            .await
            .map(drop);
        [("hello", hello), ("sync", sync), ("push", push)]
            .map(|(what, result)| (what, result.err().map(|status| status.code())))
    });
    for (what, code) in codes {
        assert_eq!(
            code,
            Some(tonic::Code::PermissionDenied),
            "{what} with a client certificate"
        );
    }

    // A legacy certificate as mesh-cli's: capped by both settings (here: read), and named.
    let legacy = legacy_identity(&h, "old-laptop");
    let output = h
        .cli_as(
            &legacy,
            &node,
            &["run", "--json", "--role", "x", "--tier", "write", "x"],
        )
        .expect("mesh-cli");
    assert_eq!(output.status.code(), Some(1));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("up to tier `read`") && printed.contains("security.remote_max_tier"),
        "{printed}"
    );
    wait_for("the legacy caller named in the log", DEADLINE, || {
        node.log_text()
            .lines()
            .find(|l| l.contains("carries no role") && l.contains("old-laptop"))
            .map(drop)
    })
    .expect("warned");
}
