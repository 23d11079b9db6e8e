//! The operator without flags: `mesh-cli` run as the same user finds its certificate by itself
//! (the config dir `ca issue --role client --install` writes, then a zero-config node's data
//! dir), flags and `MESH_*` variables override what it finds, and a node that meets a node of
//! another mesh names it once, with the way to bring it in (or, when the node is alone in a
//! mesh of its own, the way for it to join the other).
//!
//! Every process gets HOME, XDG_DATA_HOME and XDG_CONFIG_HOME in a temp dir of its own and no
//! `MESH_*` variable, so the machine's own files and environment play no part.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use mesh_cert::ca;
use mesh_join::bootstrap;
use mesh_tests::{Harness, Netns, NodeOptions, bin, wait_for};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

/// An operator's home: the places `mesh-cli` and a zero-config node look in.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("agentmesh-home")
                .tempdir()
                .expect("temp home"),
        }
    }

    /// `~/.config/agentmesh`, as `dirs` resolves it under this home.
    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config/agentmesh")
    }

    /// `~/.local/share/agentmesh`, a zero-config node's data dir under this home.
    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data/agentmesh")
    }

    /// `program` as this user, with no `MESH_*` variable.
    fn command(&self, mut cmd: Command) -> Command {
        for var in [
            "MESH_NODE",
            "MESH_CA",
            "MESH_CERT",
            "MESH_KEY",
            "MESH_NODE_CONFIG",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("HOME", self.dir.path())
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .stdin(Stdio::null());
        cmd
    }

    /// `mesh-cli ARGS` as this user.
    fn cli(&self, args: &[&str]) -> Output {
        self.command(Command::new(bin("mesh-cli")))
            .args(args)
            .output()
            .expect("run mesh-cli")
    }
}

/// A `mesh-node` this test starts itself, killed on drop.
struct OwnNode(Child);

impl Drop for OwnNode {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node names `mesh-cli status --json` printed, or what went wrong.
fn status_names(output: &Output) -> Result<Vec<String>, String> {
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let status: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
    Ok(status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect())
}

/// The issue's test: a node started with no config and `--no-mdns`, and `mesh-cli status` with
/// no flag at all, as the same user. Both run in a namespace of their own, so the default ports
/// (7700, 7780) are free whatever else runs on this machine.
#[test]
fn mesh_cli_without_flags_reaches_a_zero_config_node_of_the_same_user() {
    let ns = Netns::new().expect("netns");
    let home = Home::new();
    let log = home.dir.path().join("node.log");
    let _node = OwnNode(
        home.command(ns.command(&bin("mesh-node")))
            .arg("--no-mdns")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start mesh-node"),
    );
    let addr_file = home.data_dir().join("node.addr");
    wait_for("the zero-config node to listen", DEADLINE, || {
        addr_file.exists().then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));

    let output = home
        .command(ns.command(&bin("mesh-cli")))
        .args(["status", "--json"])
        .output()
        .expect("run mesh-cli");
    let names = status_names(&output).unwrap_or_else(|e| panic!("mesh-cli status failed: {e}"));
    assert_eq!(names.len(), 1, "{names:?}");
}

/// A CA of another mesh with a client certificate, as a zero-config node of this user would
/// have left in its data dir: a decoy that must lose to the operator's own files.
fn decoy_zero_config_node(home: &Home) {
    bootstrap::bootstrap(&home.data_dir(), "decoy").expect("decoy CA");
    assert!(bootstrap::cli_files(&home.data_dir()).cert.exists());
}

#[test]
fn ca_issue_install_then_status_without_flags_reaches_a_node_of_that_ca() {
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let home = Home::new();
    decoy_zero_config_node(&home);

    // Only the decoy: found, and refused by the node's mesh.
    let status = ["--node", node.addr.as_str(), "status", "--json"];
    let before = status_names(&home.cli(&status));
    assert!(
        before.is_err(),
        "the decoy must not reach alpha: {before:?}"
    );

    let ca_dir = harness.ca_dir().to_str().expect("utf-8 path");
    let install = home.cli(&[
        "ca",
        "issue",
        "--dir",
        ca_dir,
        "--role",
        "client",
        "--name",
        "operator",
        "--install",
    ]);
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    assert!(bootstrap::user_cli_files(&home.config_dir()).key.exists());

    // The config dir comes before the data dir.
    let names = status_names(&home.cli(&status)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names, ["alpha"]);
}

#[test]
fn flags_and_env_override_the_files_mesh_cli_finds() {
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let home = Home::new();
    // The found files are of another mesh.
    let other = home.dir.path().join("other-ca");
    ca::ca_init(&other).expect("other CA");
    bootstrap::install_client(
        &other,
        "stranger",
        &home.config_dir(),
        mesh_cert::ca::KeyType::Ed25519,
    )
    .expect("install");
    let status = ["--node", node.addr.as_str(), "status", "--json"];
    let found = status_names(&home.cli(&status)).expect_err("found files of another mesh");
    assert!(
        found.contains("`alpha` there belongs to another mesh"),
        "{found}"
    );
    assert!(found.contains("--ca, --cert and --key"), "{found}");

    let ours = harness.client_files();
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    let (ca, cert, key) = (path(&ours.ca), path(&ours.cert), path(&ours.key));
    let with_flags = home.cli(&[
        "--ca", &ca, "--cert", &cert, "--key", &key, "--node", &node.addr, "status", "--json",
    ]);
    assert_eq!(status_names(&with_flags), Ok(vec!["alpha".to_owned()]));

    let with_env = home
        .command(Command::new(bin("mesh-cli")))
        .envs([("MESH_CA", &ca), ("MESH_CERT", &cert), ("MESH_KEY", &key)])
        .args(status)
        .output()
        .expect("run mesh-cli");
    assert_eq!(status_names(&with_env), Ok(vec!["alpha".to_owned()]));
}

/// The hint a node logs about a node of another mesh; the debug line of each failed dial
/// carries the dial error, not this.
const FOREIGN_HINT: &str = "belongs to another mesh (its certificate is not from this mesh's CA)";

/// Two nodes of different CAs find each other by real mDNS (in a namespace of this test): each
/// names the other once, at its first dropped membership datagram, and not again after it.
#[test]
fn a_node_names_a_node_of_another_mesh_once_with_the_way_to_bring_it_in() {
    let ns = Netns::new().expect("netns");
    let harness = Harness::new().expect("harness");
    let other_ca = harness.path().join("other-ca");
    ca::ca_init(&other_ca).expect("other CA");
    let (cert, key) =
        ca::issue(&other_ca, "mallory", &[], mesh_cert::CertRole::Node).expect("issue");
    let mut mallory = NodeOptions::new("mallory").mdns_in(&ns);
    mallory.tls = Some(mesh_tls::TlsFiles {
        ca: other_ca.join(ca::CA_CERT_FILE),
        cert,
        key,
    });
    let mallory_tls = mallory.tls.clone().expect("mallory's certificate");
    let mallory_tls = &mallory_tls;
    let mallory = harness.spawn(mallory).expect("mallory");
    let alpha = harness
        .spawn(NodeOptions::new("alpha").mdns_in(&ns))
        .expect("alpha");

    // Mallory's datagrams keep coming to alpha (sealed here with its certificate, as its
    // retries would be): each is dropped and counted, and none is named again.
    let wait_hint = |node: &mesh_tests::NodeProcess| {
        wait_for(
            &format!("{} to name the other", node.name),
            DEADLINE,
            || node.log_text().contains(FOREIGN_HINT).then_some(()),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log_text()));
    };
    wait_hint(&alpha);
    // Each drop is a debug line (the node's front door is inside the namespace, out of reach).
    let drops = |node: &mesh_tests::NodeProcess| {
        node.log_text()
            .lines()
            .filter(|l| l.contains("membership datagram dropped") && l.contains("another mesh"))
            .count()
    };
    let before = drops(&alpha);
    let sealer = mesh_node::testing::Sealer::new(std::sync::Arc::new(
        mesh_tls::MeshTls::load(mallory_tls)
            .expect("mallory tls")
            .origin_signer()
            .expect("signer"),
    ));
    // Sent from inside the namespace, where alpha listens.
    let (host, port) = alpha.addr.rsplit_once(':').expect("host:port");
    for _ in 0..2 {
        let datagram = sealer.seal(b"\x00again").expect("seal");
        let hex: String = datagram.iter().map(|b| format!("{b:02x}")).collect();
        let sent = ns
            .command(&mesh_tests::python3())
            .args([
                "-c",
                "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(bytes.fromhex(sys.argv[1]), (sys.argv[2], int(sys.argv[3])))",
                &hex,
                host,
                port,
            ])
            .status()
            .expect("python3");
        assert!(sent.success());
    }
    wait_for("alpha to drop mallory's datagrams", DEADLINE, || {
        (drops(&alpha) >= before + 2).then_some(())
    })
    .expect("dropped and counted");
    for (node, other) in [(&alpha, &mallory), (&mallory, &alpha)] {
        // Named at its first datagram; below, more come and are dropped without another hint.
        wait_for(
            &format!("{} to name {}", node.name, other.name),
            DEADLINE,
            || node.log_text().contains(FOREIGN_HINT).then_some(()),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log_text()));
        let log = node.log_text();
        let hints: Vec<&str> = log.lines().filter(|l| l.contains(FOREIGN_HINT)).collect();
        assert_eq!(
            hints.len(),
            1,
            "{} named it more than once:\n{log}",
            node.name
        );
        assert!(
            hints[0].contains(&format!("`{}` at ", other.name)),
            "{} did not name {}: {}",
            node.name,
            other.name,
            hints[0]
        );
        assert!(hints[0].contains("WARN"), "{}", hints[0]);
    }
    // Neither joined the other's fleet.
    let status = harness.status(&alpha).expect("status");
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
}

/// A zero-config `mesh-node` of one home: no certificate files, its data in the home's data
/// dir, on an ephemeral loopback port with mDNS off. The one file it is given holds only
/// `http.listen` (an ephemeral port, so tests running at once do not race for 7780) and
/// whatever `extra` adds.
struct ZeroConfig {
    node: OwnNode,
    addr: String,
    log: PathBuf,
    data_dir: PathBuf,
}

impl ZeroConfig {
    /// Starts `name` as `home`'s user with `args` (e.g. `--join TOKEN`) and waits until it
    /// listens.
    fn start(home: &Home, name: &str, args: &[&str], extra: &str) -> Self {
        let data_dir = home.data_dir();
        let _ = std::fs::remove_file(data_dir.join("node.addr"));
        let _ = std::fs::remove_file(data_dir.join("http.addr"));
        let config = home.dir.path().join("node.toml");
        std::fs::write(
            &config,
            format!("[http]\nlisten = \"127.0.0.1:0\"\n{extra}"),
        )
        .expect("config");
        // Appended to across restarts, so a test reads everything the node said.
        let log = home.dir.path().join(format!("{name}.log"));
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let mut child = home
            .command(Command::new(bin("mesh-node")))
            .args(["--name", name, "--listen", "127.0.0.1:0", "--no-mdns"])
            .arg("--config")
            .arg(&config)
            .args(args)
            .env("RUST_LOG", "info,mesh_node=debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start mesh-node");
        let addr_file = data_dir.join("node.addr");
        let addr = wait_for(&format!("{name} to listen"), DEADLINE, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{name} exited with {status}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::fs::read_to_string(&addr_file)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
        Self {
            node: OwnNode(child),
            addr,
            log,
            data_dir,
        }
    }

    /// Stops the node with SIGTERM and waits for it to exit.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.node.0.id().to_string()])
            .status();
        wait_for("the node to exit", DEADLINE, || {
            self.node.0.try_wait().ok().flatten()
        })
        .expect("stopped");
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` on its front door: the status code and the body.
    fn http_get(&self, path: &str) -> (u16, String) {
        http(&self.data_dir, path, None)
    }
}

/// One `GET path` to the front door whose address `data_dir/http.addr` holds, naming `host`
/// (default: that address): the status code and the body.
fn http(data_dir: &Path, path: &str, host: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let file = data_dir.join("http.addr");
    let addr = wait_for("the front door", DEADLINE, || {
        std::fs::read_to_string(&file)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .expect("front door");
    let mut socket = std::net::TcpStream::connect(&addr).expect("connect to the front door");
    let host = host.unwrap_or(&addr);
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    (status, body.to_owned())
}

/// `mesh-cli ARGS` as `home`'s user, which must succeed: its stdout.
fn cli_ok(home: &Home, args: &[&str]) -> String {
    let output = home.cli(args);
    assert!(
        output.status.success(),
        "mesh-cli {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The rows of `status --json` on `addr` named `name`, as `home`'s operator sees them.
fn rows_named(home: &Home, addr: &str, name: &str) -> Vec<Value> {
    let output = home.cli(&["--node", addr, "status", "--json"]);
    if !output.status.success() {
        return Vec::new();
    }
    let status: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == name)
        .cloned()
        .collect()
}

/// Issue 28, deliverable 1, the reproduction: a device that joined with tokens (its node
/// `homeserver`, and its operator's `homeserver-cli` from `mesh-cli join`) is revoked with
/// `mesh-cli ca revoke --device homeserver` on the zero-config issuer, without `--dir`. Then
/// the device's mesh-cli certificate is refused too (before, `memory put` from the "revoked"
/// device still succeeded); `ca certs` lists what was issued and revoked; the revoked node,
/// restarted, reports `unhealthy` with the reason and logs it (before, it said `healthy`);
/// `--join` with a new token re-enrols it (before, "--join does nothing" and it ran on with the
/// revoked certificate); and the fleet lists the device once (before, twice for good).
#[test]
fn a_device_revoked_by_name_is_shut_out_node_and_cli_and_rejoins_with_a_new_token() {
    let laptop_home = Home::new();
    let laptop = ZeroConfig::start(&laptop_home, "laptop", &[], "");
    let token = |role: &str| {
        cli_ok(
            &laptop_home,
            &["token", "create", "--role", role, "--issuer", &laptop.addr],
        )
        .trim()
        .to_owned()
    };
    let home = Home::new();
    let homeserver = ZeroConfig::start(&home, "homeserver", &["--join", &token("node")], "");
    cli_ok(
        &home,
        &["join", &token("client"), "--name", "homeserver-cli"],
    );
    wait_for("the laptop to list homeserver up", DEADLINE, || {
        let rows = rows_named(&laptop_home, &laptop.addr, "homeserver");
        (rows.len() == 1 && rows[0]["state"] == "up").then_some(())
    })
    .expect("joined");
    // The device's operator writes to the fleet through the laptop.
    let laptop_node = ["--node", laptop.addr.as_str()];
    cli_ok(
        &home,
        &[&laptop_node[..], &["memory", "put", "notes", "before", "x"]].concat(),
    );

    // The CA lists everything it issued: its own node and mesh-cli, and what the tokens got.
    let certs: Value =
        serde_json::from_str(&cli_ok(&laptop_home, &["ca", "certs", "--json"])).expect("json");
    let listed = |certs: &Value, name: &str| -> Vec<Value> {
        certs["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == name)
            .cloned()
            .collect()
    };
    for (name, role) in [
        ("laptop", "node"),
        ("mesh-cli", "client"),
        ("homeserver", "node"),
        ("homeserver-cli", "client"),
    ] {
        let found = listed(&certs, name);
        assert_eq!(found.len(), 1, "{name}: {certs}");
        assert_eq!(found[0]["role"], role, "{name}");
        assert_eq!(found[0]["revoked"], false, "{name}");
        assert!(found[0]["expires"].as_i64() > found[0]["issued"].as_i64());
    }
    let table = cli_ok(&laptop_home, &["ca", "certs"]);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|header| header.contains("NAME")
                && header.contains("ROLE")
                && header.contains("EXPIRES")
                && header.contains("REVOKED")),
        "{table}"
    );

    // The device is off when it is revoked, so it cannot hear of it from the fleet.
    homeserver.stop();
    let revoked = cli_ok(
        &laptop_home,
        &[
            &laptop_node[..],
            &["ca", "revoke", "--device", "homeserver", "--reason", "lost"],
        ]
        .concat(),
    );
    for name in ["homeserver ", "homeserver-cli "] {
        assert!(revoked.contains(&format!("revoked {name}")), "{revoked}");
    }
    let certs: Value =
        serde_json::from_str(&cli_ok(&laptop_home, &["ca", "certs", "--json"])).expect("json");
    for name in ["homeserver", "homeserver-cli"] {
        assert_eq!(listed(&certs, name)[0]["revoked"], true, "{name}: {certs}");
    }
    assert_eq!(listed(&certs, "laptop")[0]["revoked"], false);

    // The device's mesh-cli certificate is refused, saying why.
    let put = home.cli(&[&laptop_node[..], &["memory", "put", "notes", "after", "x"]].concat());
    let stderr = String::from_utf8_lossy(&put.stderr);
    assert!(!put.status.success(), "a revoked client still writes");
    assert!(stderr.contains("revoked"), "{stderr}");

    // Started again, the revoked node finds out from its issuer (it never got the revocation,
    // and the fleet refuses its connections) and says so.
    let homeserver = ZeroConfig::start(&home, "homeserver", &[], "");
    wait_for("homeserver to report itself unhealthy", DEADLINE, || {
        let (_, body) = homeserver.http_get("/healthz");
        let health: Value = serde_json::from_str(&body).ok()?;
        (health["status"] == "unhealthy"
            && health["reasons"].as_array()?.iter().any(|r| {
                r.as_str()
                    .is_some_and(|r| r.contains("this node's certificate was revoked"))
            }))
        .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", homeserver.log_text()));
    assert!(
        homeserver
            .log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("this node's certificate was revoked")),
        "{}",
        homeserver.log_text()
    );

    // A new token re-enrols it: a new certificate, the revoked one kept aside.
    homeserver.stop();
    let homeserver = ZeroConfig::start(&home, "homeserver", &["--join", &token("node")], "");
    assert!(
        homeserver.log_text().contains("joined the mesh again"),
        "{}",
        homeserver.log_text()
    );
    let tls = home.data_dir().join("tls");
    assert!(tls.join("homeserver.pem.revoked").exists());
    assert!(tls.join("homeserver.key.revoked").exists());
    // The fleet lists the device once, as it is now.
    wait_for(
        "the laptop to list the new homeserver up, once",
        DEADLINE,
        || {
            let rows = rows_named(&laptop_home, &laptop.addr, "homeserver");
            (rows.len() == 1 && rows[0]["state"] == "up").then_some(())
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}",
            rows_named(&laptop_home, &laptop.addr, "homeserver")
        )
    });
    let certs: Value =
        serde_json::from_str(&cli_ok(&laptop_home, &["ca", "certs", "--json"])).expect("json");
    let revoked: Vec<bool> = listed(&certs, "homeserver")
        .iter()
        .map(|c| c["revoked"] == true)
        .collect();
    assert_eq!(revoked.len(), 2, "{certs}");
    assert_eq!(revoked.iter().filter(|r| **r).count(), 1, "{certs}");
    drop(homeserver);
}

/// The `settings` of `config show --json` as `home`'s operator sees them on `addr`, by key.
fn settings(home: &Home, addr: &str) -> serde_json::Map<String, Value> {
    let shown: Value =
        serde_json::from_str(&cli_ok(home, &["--node", addr, "config", "show", "--json"]))
            .expect("json");
    shown["settings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["key"].as_str()?.to_owned(), s.clone())))
        .collect()
}

/// Issue 28, deliverable 2: a zero-config node is operated with mesh-cli alone. Its machine's
/// own mesh-cli certificate (made by the node, found without flags) adds a front-door key
/// (before, refused for want of `client_max_tier = "shell"` in a file that did not exist),
/// and is told the first key closes every door, loopback included; another client
/// certificate of the same CA is refused, naming what it needs, and so is its shell task,
/// naming the command; runtime settings change the approval policy, the GPUs, the tier caps
/// and the loopback exemption at once, a bad value is refused naming its key, and all of it
/// survives a restart and wins over the file, which `config show` says.
#[test]
fn a_zero_config_node_is_operated_with_mesh_cli_alone_and_its_settings_survive_a_restart() {
    let home = Home::new();
    // The one setting of the file: approvals for `write` calls, which a runtime setting
    // overrides below.
    let file = "[approval]\ntiers = [\"write\"]\n";
    let node = ZeroConfig::start(&home, "solo", &[], file);
    let at = |node: &ZeroConfig, args: &[&str]| -> Vec<String> {
        ["--node", node.addr.as_str()]
            .iter()
            .chain(args)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let operator = |node: &ZeroConfig, args: &[&str]| {
        let args = at(node, args);
        home.cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // Another client certificate of the node's CA (`ca issue` finds the CA without --dir).
    cli_ok(
        &home,
        &["ca", "issue", "--role", "client", "--name", "guest"],
    );
    let tls = home.data_dir().join("tls");
    let file_arg = |name: &str| tls.join(name).display().to_string();
    let (ca, cert, key) = (
        file_arg("ca.pem"),
        file_arg("guest.pem"),
        file_arg("guest.key"),
    );
    let guest = |node: &ZeroConfig, args: &[&str]| {
        let mut full = vec!["--ca", &ca, "--cert", &cert, "--key", &key];
        let args = at(node, args);
        full.extend(args.iter().map(String::as_str));
        home.cli(&full)
    };
    let stderr = |output: &Output| String::from_utf8_lossy(&output.stderr).into_owned();
    for args in [
        &["keys", "add", "sneaky"][..],
        &["config", "set", "security.client_max_tier", "shell"],
    ] {
        let refused = guest(&node, args);
        assert!(!refused.status.success(), "{args:?}");
        let said = stderr(&refused);
        assert!(said.contains("for the mesh's operators"), "{said}");
        assert!(said.contains("guest"), "{said}");
        assert!(
            said.contains("mesh-cli config set security.client_max_tier shell"),
            "{said}"
        );
    }
    // The refusal of a task names the command, and no longer what the caller "asks for".
    let refused = guest(&node, &["run", "--role", "chat", "--tier", "shell", "hi"]);
    assert!(!refused.status.success());
    let said = stderr(&refused);
    assert!(
        said.contains("mesh-cli config set security.client_max_tier shell"),
        "{said}"
    );
    assert!(!said.contains("asks for"), "{said}");

    // The door is open until the first key; the operator adds one, and is warned.
    assert_eq!(node.http_get("/v1/models").0, 200);
    let added = operator(&node, &["keys", "add", "first"]);
    assert!(added.status.success(), "{}", stderr(&added));
    let warning = stderr(&added);
    assert!(
        warning.contains("first front-door key")
            && warning.contains("loopback included")
            && warning.contains("mesh-cli config set http.loopback_without_key true"),
        "{warning}"
    );
    assert_eq!(
        node.http_get("/v1/models").0,
        401,
        "the loopback door is closed"
    );
    let second = operator(&node, &["keys", "add", "second"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(!stderr(&second).contains("first front-door key"));

    // A bad value, or a key that is no runtime setting, is refused naming the key.
    for (key, value, says) in [
        (
            "security.client_max_tier",
            "root",
            "`security.client_max_tier`",
        ),
        ("resources.gpus", "RTX 4090", "`resources.gpus[0]`"),
        ("tasks.workers", "4", "not a runtime setting"),
    ] {
        let refused = operator(&node, &["config", "set", key, value]);
        assert!(!refused.status.success(), "{key} {value}");
        assert!(stderr(&refused).contains(says), "{}", stderr(&refused));
    }

    // Set at run time, applied at once.
    let set = cli_ok(
        &home,
        &at(&node, &["config", "set", "approval.tiers", "shell"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        set.contains("applied now") && set.contains("wins over the config file"),
        "{set}"
    );
    for (key, value) in [
        ("resources.gpus", "RTX 4090:24576"),
        ("http.loopback_without_key", "true"),
        ("security.client_max_tier", "shell"),
    ] {
        let set = operator(&node, &["config", "set", key, value]);
        assert!(set.status.success(), "{key}: {}", stderr(&set));
    }
    assert_eq!(
        node.http_get("/v1/models").0,
        200,
        "loopback needs no key now"
    );
    // Not for a web page that rebound its own name to 127.0.0.1.
    let rebound = http(&node.data_dir, "/v1/models", Some("rebound.example:7780"));
    assert_eq!(rebound.0, 401, "{rebound:?}");
    let gpus = |node: &ZeroConfig| -> Vec<String> {
        let shown = operator(node, &["nodes", "show", "solo", "--json"]);
        let shown: Value = serde_json::from_slice(&shown.stdout).unwrap_or(Value::Null);
        shown["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["source"] == "declared")
            .filter_map(|g| Some(format!("{} {}", g["name"].as_str()?, g["vram_mb"])))
            .collect()
    };
    assert_eq!(gpus(&node), ["RTX 4090 24576"]);
    // The guest's certificate may run `shell` now, so it is an operator here.
    let now_allowed = guest(&node, &["keys", "add", "third"]);
    assert!(now_allowed.status.success(), "{}", stderr(&now_allowed));

    // Kept across a restart, winning over the file, and shown as such.
    node.stop();
    let node = ZeroConfig::start(&home, "solo", &[], file);
    let shown = settings(&home, &node.addr);
    let tiers = &shown["approval.tiers"];
    assert_eq!(tiers["value"], serde_json::json!(["shell"]), "{tiers}");
    assert_eq!(tiers["source"], "runtime");
    assert_eq!(tiers["file"], serde_json::json!(["write"]));
    assert_eq!(shown["security.client_max_tier"]["value"], "shell");
    assert_eq!(shown["security.mcp_max_tier"]["source"], "default");
    assert_eq!(shown["http.loopback_without_key"]["value"], true);
    assert_eq!(gpus(&node), ["RTX 4090 24576"]);
    assert_eq!(node.http_get("/v1/models").0, 200);
    assert!(
        node.log_text()
            .contains("a runtime setting (`mesh-cli config set`) wins over the config file"),
        "{}",
        node.log_text()
    );
    let table = cli_ok(
        &home,
        &at(&node, &["config", "show"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("approval.tiers") && l.contains("wins over the config file")),
        "{table}"
    );

    // Unset: the file's value again, at once.
    let unset = operator(&node, &["config", "unset", "approval.tiers"]);
    assert!(
        String::from_utf8_lossy(&unset.stdout).contains(r#"["write"]"#),
        "{}",
        stderr(&unset)
    );
    let unset = operator(&node, &["config", "unset", "http.loopback_without_key"]);
    assert!(unset.status.success(), "{}", stderr(&unset));
    assert_eq!(node.http_get("/v1/models").0, 401);
}

/// Issue 28: on a device whose node joined with a token, its person runs `mesh-cli join` after
/// the node started (the README's order). That mesh-cli certificate operates the node at once;
/// before, the node read its machine's client certificates only when it started, so `config
/// set` was refused until a restart.
#[test]
fn a_mesh_cli_joined_after_its_node_started_operates_it_at_once() {
    let issuer_home = Home::new();
    let issuer = ZeroConfig::start(&issuer_home, "homeserver", &[], "");
    let token = |role: &str| {
        cli_ok(
            &issuer_home,
            &["token", "create", "--role", role, "--issuer", &issuer.addr],
        )
        .trim()
        .to_owned()
    };
    let home = Home::new();
    let laptop = ZeroConfig::start(&home, "laptop", &["--join", &token("node")], "");
    cli_ok(&home, &["join", &token("client")]);
    let set = home.cli(&[
        "--node",
        &laptop.addr,
        "config",
        "set",
        "approval.tiers",
        "shell",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let tiers = &settings(&home, &laptop.addr)["approval.tiers"];
    assert_eq!(tiers["value"], serde_json::json!(["shell"]), "{tiers}");
    assert_eq!(tiers["source"], "runtime");
}

/// Issue 28: a second device started without `--join` makes a mesh of its own, and the hint
/// told the real fleet's members to join it. Now the stray (alone in its mesh) is told how it
/// joins the fleet, and the fleet's members how to bring it in; each says it once.
#[test]
fn a_stray_device_is_told_to_join_the_fleet_and_the_fleet_to_bring_it_in() {
    let ns = Netns::new().expect("netns");
    let harness = Harness::new().expect("harness");
    let alpha = harness
        .spawn(NodeOptions::new("alpha").mdns_in(&ns))
        .expect("alpha");
    let beta = harness
        .spawn(NodeOptions::new("beta").mdns_in(&ns))
        .expect("beta");
    harness
        .wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("the fleet");
    // The stray: zero config, a CA of its own, in the same network.
    let home = Home::new();
    let log = home.dir.path().join("stray.log");
    let _stray = OwnNode(
        home.command(ns.command(&bin("mesh-node")))
            .args(["--name", "stray", "--listen", "0.0.0.0:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start the stray"),
    );
    let stray_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let hint = wait_for("the stray to name the fleet", DEADLINE, || {
        stray_log()
            .lines()
            .find(|l| l.contains(FOREIGN_HINT))
            .map(str::to_owned)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", stray_log()));
    assert!(
        hint.contains("this node is alone in a mesh of its own")
            && (hint.contains("If this device belongs to `alpha`'s mesh")
                || hint.contains("If this device belongs to `beta`'s mesh"))
            && hint.contains("mesh-node --join TOKEN"),
        "{hint}"
    );
    for member in [&alpha, &beta] {
        let said = wait_for(
            &format!("{} to name the stray", member.name),
            DEADLINE,
            || {
                let log = member.log_text();
                let hints: Vec<String> = log
                    .lines()
                    .filter(|l| l.contains(FOREIGN_HINT) && l.contains("`stray` at "))
                    .map(str::to_owned)
                    .collect();
                (!hints.is_empty()).then_some(hints)
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", member.log_text()));
        assert_eq!(said.len(), 1, "{said:#?}");
        assert!(
            said[0].contains("to bring `stray` in") && !said[0].contains("alone"),
            "{}",
            said[0]
        );
    }
}
