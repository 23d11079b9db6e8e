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

use mesh_identity::{bootstrap, ca};
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
        mesh_identity::ca::KeyType::Ed25519,
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
        ca::issue(&other_ca, "mallory", &[], mesh_identity::CertRole::Node).expect("issue");
    let mut mallory = NodeOptions::new("mallory").mdns_in(&ns);
    mallory.tls = Some(mesh_identity::TlsFiles {
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
    let sealer = mesh_node::peers::envelope::Sealer::new(std::sync::Arc::new(
        mesh_identity::MeshTls::load(mallory_tls)
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
