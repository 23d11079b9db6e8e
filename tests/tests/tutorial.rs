//! The README's "Three devices in ten minutes", walked as written (issue 28): the test reads the
//! block after the `<!-- tutorial:` marker in README.md and runs its commands, in order, on
//! three devices, so the README cannot drift from what works. Each device is a network
//! namespace on one bridge (real mDNS between them, none on this machine's interfaces), with a
//! host name of its own (a UTS namespace: zero-config nodes are named after it) and a home of
//! its own (HOME: each node's data dir and each mesh-cli's config), and no config file at all.
//!
//! The block's grammar, which is also how a person reads it: `# on DEVICE` says where the
//! next commands run; a command ending in `&` starts a node that keeps running; `# prints
//! NAME` after a command means its output is what NAME stands for in later commands (a token
//! a person copies to the other device). A foreground command that fails is run again until
//! it works or a deadline passes, as a person runs it again while a node is still starting.
//! The embedded model is put where `deploy/fetch-model.sh` finds it, so the walk downloads
//! nothing. Needs root.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use mesh_tests::{Lan, Netns, bin, embedded_model_path, require_root};
use serde_json::Value;

/// How long a command may keep failing before the walk fails (a node starting, a peer being
/// found, the model loading).
const RETRY_FOR: Duration = Duration::from_secs(120);

/// One command of the walk.
#[derive(Debug)]
struct Step {
    device: String,
    command: String,
    background: bool,
    /// The placeholder its output stands for.
    prints: Option<String>,
}

fn readme() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README")
}

/// The tutorial's steps, from the fenced block after the marker.
fn steps(readme: &str) -> Vec<Step> {
    let after = readme
        .split_once("<!-- tutorial:")
        .expect("README.md has a `<!-- tutorial:` marker before the three devices' block")
        .1;
    let block = after
        .split_once("```sh\n")
        .expect("a ```sh block after the marker")
        .1
        .split_once("```")
        .expect("the block ends")
        .0;
    let mut devices: Vec<String> = Vec::new();
    let mut steps = Vec::new();
    for line in block.lines() {
        let line = line.trim();
        if let Some(on) = line.strip_prefix("# on ") {
            let names = on.split(" (").next().unwrap_or(on);
            devices = names
                .split([',', ' '])
                .filter(|w| !w.is_empty() && *w != "and")
                .map(str::to_owned)
                .collect();
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (command, comment) = match line.split_once(" # ") {
            Some((command, comment)) => (command.trim(), comment.trim()),
            None => (line, ""),
        };
        let prints = comment
            .strip_prefix("prints ")
            .and_then(|rest| rest.split([':', ',', ' ']).next())
            .map(str::to_owned);
        let (command, background) = match command.strip_suffix('&') {
            Some(command) => (command.trim(), true),
            None => (command, false),
        };
        assert!(
            !devices.is_empty(),
            "`{command}` comes before any `# on DEVICE`"
        );
        for device in &devices {
            steps.push(Step {
                device: device.clone(),
                command: command.to_owned(),
                background,
                prints: prints.clone(),
            });
        }
    }
    steps
}

/// One device: its namespace, home and host name.
struct Device {
    name: String,
    ns: String,
    home: PathBuf,
}

impl Device {
    /// `line` run by `sh` on this device, as its user: its host name, its home, the built
    /// binaries first on PATH, in the repository's root (for `deploy/fetch-model.sh`).
    fn command(&self, line: &str) -> Command {
        let bins = bin("mesh-node");
        let bins = bins.parent().expect("bin dir");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "unshare", "--uts", "sh", "-c"])
            .arg("hostname \"$0\" && exec sh -c \"$1\"")
            .arg(&self.name)
            .arg(line)
            .env_clear()
            .env("HOME", &self.home)
            .env(
                "PATH",
                format!(
                    "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    bins.display()
                ),
            )
            .env("RUST_LOG", "info,mesh_node=debug")
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .stdin(Stdio::null());
        cmd
    }
}

/// The nodes the walk started, stopped (SIGTERM, then SIGKILL) when it ends.
struct Nodes(Vec<(String, Child, PathBuf)>);

impl Nodes {
    /// Fails the walk when a node stopped by itself, with its log.
    fn check_running(&mut self) {
        for (device, child, log) in &mut self.0 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the node on {device} stopped ({status}):\n{}",
                    fs::read_to_string(&*log).unwrap_or_default()
                );
            }
        }
    }

    fn logs(&self) -> String {
        self.0
            .iter()
            .map(|(device, _, log)| {
                format!(
                    "--- {device}:\n{}",
                    fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        for (_, child, _) in &mut self.0 {
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50)); // poll until it exits or the deadline
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_readmes_three_devices_walk_works_as_written() {
    require_root();
    let readme = readme();
    let steps = steps(&readme);
    let mut names: Vec<String> = Vec::new();
    for step in &steps {
        if !names.contains(&step.device) {
            names.push(step.device.clone());
        }
    }
    assert_eq!(names.len(), 3, "three devices: {names:?}");
    let lan = Lan::new(names.len()).expect("network namespaces");
    let homes = tempfile::Builder::new()
        .prefix("agentmesh-tutorial")
        .tempdir()
        .expect("homes");
    let devices: HashMap<String, Device> = names
        .iter()
        .zip(&lan.hosts)
        .map(|(name, ns): (&String, &Netns)| {
            let home = homes.path().join(name);
            fs::create_dir_all(&home).expect("home");
            (
                name.clone(),
                Device {
                    name: name.clone(),
                    ns: ns.name().to_owned(),
                    home,
                },
            )
        })
        .collect();
    // The model where `deploy/fetch-model.sh` puts it, on the devices that run it, so that it
    // finds it there and checks it instead of downloading it.
    let model = embedded_model_path();
    let fetching = steps
        .iter()
        .filter(|s| s.command.starts_with("deploy/fetch-model.sh"))
        .map(|s| &devices[&s.device]);
    for device in fetching {
        let models = device.home.join(".local/share/agentmesh/models");
        fs::create_dir_all(&models).expect("models dir");
        let target = models.join(model.file_name().expect("file name"));
        if fs::hard_link(&model, &target).is_err() {
            fs::copy(&model, &target).expect("copy the model");
        }
    }

    let mut nodes = Nodes(Vec::new());
    let mut said: HashMap<String, String> = HashMap::new();
    // (device, command, stdout, stderr) of each foreground command.
    let mut outputs: Vec<(String, String, String, String)> = Vec::new();
    for step in &steps {
        let device = &devices[&step.device];
        let mut line = step.command.clone();
        for (name, value) in &said {
            line = line.replace(name.as_str(), value);
        }
        if step.background {
            let log = device.home.join(format!("node-{}.log", nodes.0.len()));
            let child = device
                .command(&format!("exec {line}"))
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).expect("log"))
                .spawn()
                .unwrap_or_else(|e| panic!("start `{line}` on {}: {e}", step.device));
            nodes.0.push((step.device.clone(), child, log));
            continue;
        }
        let started = Instant::now();
        let output = loop {
            nodes.check_running();
            let output = device
                .command(&line)
                .output()
                .unwrap_or_else(|e| panic!("run `{line}` on {}: {e}", step.device));
            if output.status.success() {
                break output;
            }
            assert!(
                started.elapsed() < RETRY_FOR,
                "`{line}` on {} still fails after {RETRY_FOR:?}:\n{}\n{}",
                step.device,
                text(&output),
                nodes.logs()
            );
            std::thread::sleep(Duration::from_millis(500)); // a person runs it again; the deadline is above
        };
        if let Some(name) = &step.prints {
            let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            assert!(
                value.starts_with("agentmesh-join:"),
                "`{line}` printed no token: {}",
                text(&output)
            );
            said.insert(name.clone(), value);
        }
        outputs.push((
            step.device.clone(),
            step.command.clone(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }

    // What the README says the walk shows.
    let shown = |command: &str| -> (&str, &str) {
        outputs
            .iter()
            .find(|(_, c, _, _)| c.starts_with(command))
            .map(|(_, _, out, err)| (out.as_str(), err.as_str()))
            .unwrap_or_else(|| panic!("the walk has no `{command}`"))
    };
    let (answer, steps_shown) = shown("mesh-cli run");
    assert!(!answer.trim().is_empty(), "no answer: {steps_shown}");
    assert!(
        steps_shown
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("· task ")),
        "{steps_shown}"
    );
    assert!(
        steps_shown
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("✓ completed on gpu-box")),
        "{steps_shown}"
    );
    let status = devices["laptop"]
        .command("mesh-cli status --json")
        .output()
        .expect("status");
    let fleet: Value = serde_json::from_slice(&status.stdout).expect("json");
    let mut up: Vec<String> = fleet["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["state"] == "up")
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect();
    up.sort();
    assert_eq!(up, ["gpu-box", "homeserver", "laptop"], "{fleet:#}");
    let (listed, _) = shown("mesh-cli --node gpu-box nodes ls");
    assert!(
        listed.lines().filter(|l| l.contains(" up ")).count() == 3,
        "{listed}"
    );
}

/// The grammar above, on a block of its own: devices, background nodes, placeholders.
#[test]
fn the_tutorial_block_is_read_as_a_person_reads_it() {
    let readme = "intro\n<!-- tutorial: x -->\n```sh\n# on a (first)\nmesh-node &\nmesh-cli token create   # prints TOKEN: a token\n\n# on b and c\nmesh-node --join TOKEN &\n```\nafter\n";
    let steps = steps(readme);
    let seen: Vec<(&str, &str, bool, Option<&str>)> = steps
        .iter()
        .map(|s| {
            (
                s.device.as_str(),
                s.command.as_str(),
                s.background,
                s.prints.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("a", "mesh-node", true, None),
            ("a", "mesh-cli token create", false, Some("TOKEN")),
            ("b", "mesh-node --join TOKEN", true, None),
            ("c", "mesh-node --join TOKEN", true, None),
        ]
    );
}
