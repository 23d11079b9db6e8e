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
//! a person copies to the other device), and nothing else is replaced. A foreground command
//! that fails is run again until it works or a deadline passes, as a person runs it again while
//! a node is still starting, except for bad usage (exit code 2), which no retry mends. What the
//! README says a command shows is checked on what it printed (see [`Promise`]); `status` is run
//! again until it shows it, as a person would while the nodes find each other. The embedded
//! model is put where `deploy/fetch-model.sh` finds it (from where `deploy/test.sh
//! --setup-only` fetched it), so the walk downloads nothing. Needs root.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use mesh_tests::{Lan, Netns, bin, embedded_model_path, require_root};

/// How long a command may keep failing, or keep not showing what the README says, before the
/// walk fails (a node starting, peers being found, the model loading).
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

/// What the README says a command of the walk shows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Promise {
    /// `mesh-cli status`: every device, `up` and `healthy`, and nothing else.
    Fleet,
    /// `mesh-cli run`: the task's id first, an answer, and last the completion on the device
    /// with the model, from its embedded model.
    Answer,
    /// `mesh-cli --node NAME nodes ls`: every device, `up` and `healthy`, asked by name.
    ByName,
}

/// The promises, by the start of the command they are about; each must be in the walk.
const PROMISES: [(&str, Promise); 3] = [
    ("mesh-cli status", Promise::Fleet),
    ("mesh-cli run ", Promise::Answer),
    ("mesh-cli --node ", Promise::ByName),
];

fn promise(command: &str) -> Option<Promise> {
    PROMISES
        .iter()
        .find(|(start, _)| command.starts_with(start))
        .map(|(_, promise)| *promise)
}

impl Promise {
    /// Whether it is run again until it holds (the fleet converging) or checked once.
    fn polled(self) -> bool {
        self != Promise::Answer
    }

    /// Whether `output` shows what the README says: `devices` are the walk's, `model_device`
    /// the one that fetched the model.
    fn check(self, output: &Output, devices: &[String], model_device: &str) -> Result<(), String> {
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        match self {
            Promise::Fleet | Promise::ByName => {
                let rows = table(&stdout);
                let mut names: Vec<&str> = rows.iter().map(|r| r["NAME"].as_str()).collect();
                names.sort_unstable();
                let mut want: Vec<&str> = devices.iter().map(String::as_str).collect();
                want.sort_unstable();
                if names != want {
                    return Err(format!("lists {names:?}, not {want:?}"));
                }
                for row in &rows {
                    if row["STATE"] != "up" || row["HEALTH"] != "healthy" {
                        return Err(format!(
                            "{} is {} and {}",
                            row["NAME"], row["STATE"], row["HEALTH"]
                        ));
                    }
                }
                Ok(())
            }
            Promise::Answer => {
                let lines: Vec<&str> = stderr.lines().collect();
                if stdout.trim().is_empty() {
                    return Err("no answer on stdout".into());
                }
                if !lines.first().is_some_and(|l| l.starts_with("· task ")) {
                    return Err("the first line is not the task's id".into());
                }
                let done = format!("✓ completed on {model_device} ");
                if !lines.last().is_some_and(|l| l.starts_with(&done)) {
                    return Err(format!("the last line is not `{done}…`"));
                }
                // The model a zero-config node serves when fetch-model.sh put it there.
                if !lines.iter().any(|l| l.contains(": smollm2-135m ")) {
                    return Err("no round ran on the embedded model smollm2-135m".into());
                }
                Ok(())
            }
        }
    }
}

/// A table as mesh-cli prints it (a header, columns aligned under it), as one map per row
/// from the header's column names (which may hold single spaces, as `LAST SEEN`) to the
/// row's trimmed values.
fn table(text: &str) -> Vec<HashMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let header: Vec<char> = header.chars().collect();
    // A column starts at a non-space after two spaces (or the line's start).
    let starts: Vec<usize> = (0..header.len())
        .filter(|&i| {
            header[i] != ' ' && (i == 0 || (i >= 2 && header[i - 1] == ' ' && header[i - 2] == ' '))
        })
        .collect();
    let cell = |chars: &[char], i: usize| -> String {
        let from = starts[i].min(chars.len());
        let to = starts
            .get(i + 1)
            .map_or(chars.len(), |&s| s.min(chars.len()));
        chars[from..to].iter().collect::<String>().trim().to_owned()
    };
    let names: Vec<String> = (0..starts.len()).map(|i| cell(&header, i)).collect();
    lines
        .map(|line| {
            let chars: Vec<char> = line.chars().collect();
            names
                .iter()
                .enumerate()
                .map(|(i, name)| (name.clone(), cell(&chars, i)))
                .collect()
        })
        .collect()
}

/// One device: its namespace, home and host name.
struct Device {
    name: String,
    ns: String,
    home: PathBuf,
}

impl Device {
    /// `line` run by `sh` on this device, as its user, for at most `limit`: its host name, its
    /// home, the built binaries first on PATH, in the repository's root (for
    /// `deploy/fetch-model.sh`).
    fn command(&self, line: &str, limit: Option<Duration>) -> Command {
        let bins = bin("mesh-node");
        let bins = bins.parent().expect("bin dir");
        let mut cmd = Command::new("timeout");
        match limit {
            Some(limit) => cmd.args(["-k", "2", &format!("{}", limit.as_secs().max(1))]),
            None => cmd.arg("0"), // no limit: a node, stopped by `Nodes`
        };
        cmd.args([
            "ip", "netns", "exec", &self.ns, "unshare", "--uts", "sh", "-c",
        ])
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
    for (start, promise) in PROMISES {
        assert!(
            steps.iter().any(|s| s.command.starts_with(start)),
            "the walk has no `{start}…`, which shows {promise:?}"
        );
    }
    let model_device = steps
        .iter()
        .find(|s| s.command.starts_with("deploy/fetch-model.sh"))
        .map(|s| s.device.clone())
        .expect("a device fetches the model");
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
    // The model where `deploy/fetch-model.sh` puts it on the device that runs it, so that it
    // finds it there and checks its hash instead of downloading it.
    let model = embedded_model_path();
    let models = devices[&model_device]
        .home
        .join(".local/share/agentmesh/models");
    fs::create_dir_all(&models).expect("models dir");
    let target = models.join(model.file_name().expect("file name"));
    if fs::hard_link(&model, &target).is_err() {
        fs::copy(&model, &target).expect("copy the model");
    }

    let mut nodes = Nodes(Vec::new());
    let mut said: HashMap<String, String> = HashMap::new();
    for step in &steps {
        let device = &devices[&step.device];
        let mut line = step.command.clone();
        for (name, value) in &said {
            line = line.replace(name.as_str(), value);
        }
        if step.background {
            let log = device.home.join(format!("node-{}.log", nodes.0.len()));
            let child = device
                .command(&format!("exec {line}"), None)
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).expect("log"))
                .spawn()
                .unwrap_or_else(|e| panic!("start `{line}` on {}: {e}", step.device));
            nodes.0.push((step.device.clone(), child, log));
            continue;
        }
        let promise = promise(&step.command);
        let deadline = Instant::now() + RETRY_FOR;
        let output = loop {
            nodes.check_running();
            let output = device
                .command(
                    &line,
                    Some(deadline.saturating_duration_since(Instant::now())),
                )
                .output()
                .unwrap_or_else(|e| panic!("run `{line}` on {}: {e}", step.device));
            let why = if output.status.code() == Some(2) {
                panic!(
                    "`{line}` on {}: bad usage, which no retry mends:\n{}",
                    step.device,
                    text(&output)
                );
            } else if !output.status.success() {
                format!("it failed ({})", output.status)
            } else {
                match promise.map(|p| (p, p.check(&output, &names, &model_device))) {
                    None | Some((_, Ok(()))) => break output,
                    Some((p, Err(why))) if !p.polled() => panic!(
                        "`{line}` on {} does not show what the README says: {why}:\n{}\n{}",
                        step.device,
                        text(&output),
                        nodes.logs()
                    ),
                    Some((_, Err(why))) => why,
                }
            };
            assert!(
                Instant::now() < deadline,
                "`{line}` on {}: {why} after {RETRY_FOR:?}:\n{}\n{}",
                step.device,
                text(&output),
                nodes.logs()
            );
            std::thread::sleep(Duration::from_millis(200)); // a person runs it again; the deadline is above
        };
        if let Some(name) = &step.prints {
            let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            assert!(
                value.starts_with("agentmesh-join:") && !value.contains(char::is_whitespace),
                "`{line}` printed no token, or more than one line: {}",
                text(&output)
            );
            said.insert(name.clone(), value);
        }
    }
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

/// The tables the promises read, as mesh-cli prints them (column names with a space, values
/// with spaces), and what a promise refuses.
#[test]
fn a_status_table_is_read_by_its_columns() {
    let status = "NAME    ID            STATE  HEALTH    LOAD                 LAST SEEN\n\
                  a       0f42d0730541  up     healthy   0 running, 0 queued  now\n\
                  b       1f42d0730541  up     degraded  1 running, 0 queued  2s ago\n";
    let rows = table(status);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["LOAD"], "0 running, 0 queued");
    assert_eq!(rows[1]["LAST SEEN"], "2s ago");
    let output = |stdout: &str| Output {
        status: Command::new("true").status().expect("true"),
        stdout: stdout.as_bytes().to_vec(),
        stderr: Vec::new(),
    };
    let devices = ["a".to_owned(), "b".to_owned()];
    let degraded = Promise::Fleet.check(&output(status), &devices, "a");
    assert_eq!(degraded, Err("b is up and degraded".into()));
    let missing = Promise::Fleet.check(
        &output(&status.replace("degraded", "healthy ")),
        &devices[..1],
        "a",
    );
    assert!(missing.is_err(), "{missing:?}");
    let healthy = Promise::Fleet.check(
        &output(&status.replace("degraded", "healthy ")),
        &devices,
        "a",
    );
    assert_eq!(healthy, Ok(()));
}
