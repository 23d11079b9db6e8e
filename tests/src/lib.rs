//! Test harness: real `mesh-node` processes on real sockets with real TLS, optionally inside
//! network namespaces for real mDNS, and `mesh-cli` to look at them.
//!
//! - [`Harness`] owns a temp dir with a mesh CA and issues certificates.
//! - [`Harness::spawn`] writes a config and starts a node (as a child process, so tests can
//!   SIGKILL it), waiting until it has written the address it listens on.
//! - [`Netns`] and [`Lan`] create network namespaces (loopback only, or several hosts on one
//!   bridge) and remove them on drop. mDNS never runs outside them.
//! - [`wait_for`] polls a condition until a deadline; tests never sleep to let things settle.
//! - [`sign_record`] signs a wire record as a node would (tests that play a node, or forge one).
//! - [`swim_sim`] simulates SWIM membership (foca) over a simulated network and clock.
//! - [`terminal`] runs a command in a pseudo-terminal with keys typed into it, and reads what a
//!   running command prints.
//! - [`hostile`] is a member of the mesh that misbehaves: a client sending adversarial
//!   messages, and a fake peer the node dials (see [`hostile::HostilePeer`]).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

pub mod fake_openai;
pub mod hostile;
pub mod hostile_soak;
pub mod soak;
pub mod swim_sim;
pub mod terminal;

use anyhow::{Context, anyhow, bail};
use mesh_cert::{CertRole, OriginSigner, ca};
use mesh_domain::NodeId;
use mesh_node::testing::{Entry, Record};
use mesh_proto::v1 as pb;
use mesh_tls::TlsFiles;
use serde_json::Value;
use tempfile::TempDir;

/// Signs `record` with `signer`, as the node named in its `origin` signs its writes (when the
/// signer is that node's) or as a forger would (when it is not).
pub fn sign_record(signer: &OriginSigner, record: &mut pb::MemoryRecord) -> anyhow::Result<()> {
    let entry = Entry {
        namespace: record.namespace.clone(),
        key: record.key.clone(),
        record: Record {
            value: record.value.clone(),
            hlc: record.hlc,
            origin: NodeId::parse(&record.origin)?,
            seq: record.seq,
            tombstone: record.tombstone,
            signature: Vec::new(),
        },
    };
    record.signature = signer.sign(&entry.signed_bytes())?;
    Ok(())
}

/// The `[[mcp]]` entry of `mcp-server-time` (from PyPI, in the tests' venv) over stdio, its
/// tools counted as `read`.
pub fn mcp_time_server() -> String {
    format!(
        "[[mcp]]\nname = \"time\"\ncommand = {:?}\nargs = [\"-m\", \"mcp_server_time\", \"--local-timezone\", \"UTC\"]\ntier = \"read\"\n",
        python3()
    )
}

/// Path of a workspace binary (`mesh-node`, `mesh-cli`) next to the test executable.
pub fn bin(name: &str) -> PathBuf {
    // Tests run from target/<profile>/deps, bench binaries from target/<profile>.
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .collect();
    candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} not found next to {}: build the binaries first (`cargo test --workspace` does, or `cargo build --bins`)",
                exe.display()
            )
        })
}

/// The Python interpreter that has the tests' Python clients (`openai`, `zeroconf`):
/// `MESH_PYTHON` when set, else the virtual environment `deploy/test.sh --setup-only` creates in
/// `<workspace>/target/venv` (a stock Debian or Ubuntu refuses `pip install` into the system
/// Python, PEP 668).
pub fn python3() -> PathBuf {
    if let Some(python) = std::env::var_os("MESH_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace");
    let venv = workspace.join("target/venv/bin/python3");
    assert!(
        venv.exists(),
        "{} not found: run `deploy/test.sh --setup-only` first (it creates that virtual \
         environment with the tests' Python clients, `openai` and `zeroconf`), or set \
         MESH_PYTHON to a python3 that has them",
        venv.display()
    );
    venv
}

/// Runs `tests/python/mcp_client.py` (its doc says what `ops` may be) against the `/mcp` of
/// `node`'s front door, with `key` as a bearer key: the script's answer.
pub fn mcp_client(node: &NodeProcess, key: Option<&str>, ops: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/mcp_client.py");
    let url = format!("{}/mcp", node.http_url().expect("front door"));
    let output = Command::new(python3())
        .arg(script)
        .arg(&url)
        .arg(key.unwrap_or("-"))
        .arg(ops.to_string())
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs `mcp`)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "mcp_client.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Runs `script` with `python3 -c` and `args`; its stdout, which must be JSON, once it
/// succeeded.
pub fn python_json(script: &str, args: &[&str]) -> Value {
    let output = Command::new(python3())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs the clients)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}

/// Sends `method path` with `headers` and `body` to `node`'s front door, on a connection of
/// its own: the status, the response's head (lower-case) and what came of its body within
/// 10 s (a stream that stays open is cut there).
pub fn http_request(
    node: &NodeProcess,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let url = node.http_url().expect("front door");
    let addr = url.trim_start_matches("http://");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut socket = std::net::TcpStream::connect(addr).expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    socket.write_all(request.as_bytes()).expect("send");
    let mut response = Vec::new();
    let _ = socket.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// The command-line client `name` (`claude`, `codex`) as `deploy/test.sh --setup-only`
/// installs it from npm, at the versions it pins: `<workspace>/target/npm/node_modules/.bin`, or
/// `MESH_NPM_BIN` when set.
pub fn npm_bin(name: &str) -> PathBuf {
    let dir = match std::env::var_os("MESH_NPM_BIN").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is inside the workspace")
            .join("target/npm/node_modules/.bin"),
    };
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} not found: run `deploy/test.sh --setup-only` first (it installs Claude Code and \
         Codex from npm into target/npm, at pinned versions), or set MESH_NPM_BIN to the \
         directory that has `{name}`",
        bin.display()
    );
    bin
}

/// How often [`wait_for`] polls.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A bench's positional argument `n` (1-based) as a number, or `default` when it is absent or
/// not a number.
pub fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Raises this process's soft open-files limit to its hard one (flood tests hold thousands of
/// sockets) and returns the hard limit; an error names the fix when even that leaves fewer
/// than `needed`.
pub fn raise_open_files_limit(needed: u64) -> anyhow::Result<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(65_536);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        },
    )
    .context("raise the open-files limit")?;
    if hard < needed {
        bail!(
            "the hard open-files limit ({hard}) is below the {needed} this needs: raise it (ulimit -Hn)"
        );
    }
    Ok(hard)
}

/// The embedded model's GGUF file (SmolLM2-135M-Instruct, which `deploy/fetch-model.sh` puts
/// into the default data dir; `MESH_EMBEDDED_MODEL` may point at another copy), or a failed
/// test that says how to get it: a test of the real model never passes silently without one.
pub fn embedded_model_path() -> PathBuf {
    let path = match std::env::var_os("MESH_EMBEDDED_MODEL") {
        Some(path) => PathBuf::from(path),
        None => mesh_node::config::default_model_path(
            &mesh_join::bootstrap::default_data_dir().expect("this platform has a data dir"),
        ),
    };
    assert!(
        path.is_file(),
        "the embedded model is missing at {}: run deploy/fetch-model.sh (deploy/test.sh does), \
         or set MESH_EMBEDDED_MODEL to the GGUF file",
        path.display()
    );
    path
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(POLL_EVERY); // poll again until the deadline
    }
}

/// Requires root (network namespaces, tmpfs mounts, traffic control), failing the test with a
/// clear message otherwise.
pub fn require_root() {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "this test needs root: it creates network namespaces (`ip netns add`, so mDNS never \
         leaves the machine), mounts a small tmpfs or shapes traffic; run it as root (CI does)"
    );
}

static UNIQUE: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("run `ip` (install iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// A network namespace with its loopback up; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `am<pid>-<n>`.
    pub fn new() -> anyhow::Result<Self> {
        require_root();
        let name = unique("am");
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `cmd` wrapped in `ip netns exec <name>`.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Several hosts (namespaces) on one bridge, which lives in a namespace of its own, so nothing
/// touches the machine's real interfaces. Host `i` has address `10.77.0.(i+1)/24` on `eth0`.
#[derive(Debug)]
pub struct Lan {
    /// The hosts, in order.
    pub hosts: Vec<Netns>,
    hub: Netns,
}

impl Lan {
    /// Builds `n` hosts on a bridge.
    pub fn new(n: usize) -> anyhow::Result<Self> {
        let hub = Netns::new()?;
        ip(&["-n", hub.name(), "link", "add", "br0", "type", "bridge"])?;
        // Without a multicast querier, snooping could starve mDNS; flood instead, like a switch.
        ip(&[
            "-n",
            hub.name(),
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", hub.name(), "link", "set", "br0", "up"])?;
        let mut hosts = Vec::new();
        for i in 0..n {
            let host = Netns::new()?;
            let port = format!("p{i}");
            ip(&[
                "-n",
                hub.name(),
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.name(),
            ])?;
            ip(&[
                "-n",
                hub.name(),
                "link",
                "set",
                &port,
                "master",
                "br0",
                "up",
            ])?;
            ip(&[
                "-n",
                host.name(),
                "addr",
                "add",
                &format!("{}/24", Self::addr(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", host.name(), "link", "set", "eth0", "up"])?;
            hosts.push(host);
        }
        Ok(Self { hosts, hub })
    }

    /// The IPv4 address of host `i`.
    pub fn addr(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// The hub namespace (holds the bridge).
    pub fn hub(&self) -> &Netns {
        &self.hub
    }
}

/// How to start one node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Node name; its certificate is issued under this name.
    pub name: String,
    /// `node.listen`.
    pub listen: String,
    /// `discovery.mdns`.
    pub mdns: bool,
    /// `discovery.static_peers`.
    pub static_peers: Vec<String>,
    /// Run inside this namespace.
    pub netns: Option<String>,
    /// Certificate files; default: issued by the harness CA.
    pub tls: Option<TlsFiles>,
    /// TOML appended to the config (roles, models, GPUs, …).
    pub extra: String,
    /// More keys of the `[node]` table, as TOML lines.
    pub node_keys: String,
    /// A command the node runs under, e.g. `env FAKETIME=+5s LD_PRELOAD=…/libfaketime.so.1`.
    pub wrapper: Vec<String>,
    /// `http.api_keys` of the front door (which listens on an ephemeral loopback port).
    pub http_keys: Vec<String>,
    /// More keys of the `[http]` table, as TOML lines.
    pub http_lines: String,
    /// The `[security]` table, as TOML lines. Default: `client_max_tier = "shell"`, so the
    /// harness's client certificate (the tests' operator) may run any tier; tests of the caps
    /// set their own.
    pub security: String,
    /// Holds the harness CA's key (`tls.ca_key`): an issuer of join tokens.
    pub issuer: bool,
    /// `RUST_LOG` of the node; default: `MESH_TEST_LOG`, else `info,mesh_node=debug`. Benches
    /// set `info`, as a deployment runs, so debug logging does not weigh on what they measure.
    pub log: Option<String>,
    /// Starts with this join token, passed as [`NodeOptions::join_via`] says.
    pub join: Option<String>,
    /// How the join token reaches the node.
    pub join_via: TokenVia,
    /// No certificate files: the node uses the zero-config layout `<data_dir>/tls` (where a
    /// join stores its certificate).
    pub zero_config_tls: bool,
    /// Logs in the human format instead of JSON (as a terminal or journald shows them).
    pub human_log: bool,
    /// No `node.name` in the config: the node's name is its host's (its certificate is still
    /// issued under `name`).
    pub unnamed: bool,
}

impl NodeOptions {
    /// A node on 127.0.0.1 with an ephemeral port and mDNS off.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            listen: "127.0.0.1:0".into(),
            mdns: false,
            static_peers: Vec::new(),
            netns: None,
            tls: None,
            extra: String::new(),
            node_keys: String::new(),
            wrapper: Vec::new(),
            http_keys: Vec::new(),
            http_lines: String::new(),
            security: "client_max_tier = \"shell\"\n".into(),
            issuer: false,
            log: None,
            join: None,
            join_via: TokenVia::Argument,
            zero_config_tls: false,
            human_log: false,
            unnamed: false,
        }
    }

    /// Leaves `node.name` out of the config, so the node is named by its host.
    pub fn unnamed(mut self) -> Self {
        self.unnamed = true;
        self
    }

    /// Makes the node an issuer: it holds the harness CA's key and redeems join tokens.
    pub fn issuer(mut self) -> Self {
        self.issuer = true;
        self
    }

    /// Sets the node's `RUST_LOG` filter.
    pub fn log(mut self, filter: &str) -> Self {
        self.log = Some(filter.into());
        self
    }

    /// Starts the node with `--join TOKEN` instead of certificates from the harness CA.
    pub fn join(mut self, token: &str) -> Self {
        self.join = Some(token.into());
        self.zero_config_tls = true;
        self
    }

    /// Passes the join token as `via` says instead of as `--join TOKEN`.
    pub fn join_via(mut self, via: TokenVia) -> Self {
        self.join_via = via;
        self
    }

    /// Starts the node with the certificates in its data dir (after a join), not the harness's.
    pub fn zero_config_tls(mut self) -> Self {
        self.zero_config_tls = true;
        self
    }

    /// Logs in the human format instead of JSON.
    pub fn human_log(mut self) -> Self {
        self.human_log = true;
        self
    }

    /// Sets the `[security]` table (TOML lines), replacing the default.
    pub fn security(mut self, lines: &str) -> Self {
        self.security = lines.into();
        self
    }

    /// Requires one of these bearer keys at the front door.
    pub fn http_keys(mut self, keys: &[&str]) -> Self {
        self.http_keys = keys.iter().map(|k| (*k).to_owned()).collect();
        self
    }

    /// Adds a key of the `[http]` table, e.g. `allowed_origins = ["http://localhost:3000"]`.
    pub fn http(mut self, line: &str) -> Self {
        self.http_lines.push_str(line);
        self.http_lines.push('\n');
        self
    }

    /// Adds a static peer.
    pub fn peer(mut self, addr: impl Into<String>) -> Self {
        self.static_peers.push(addr.into());
        self
    }

    /// Turns mDNS on and runs in `ns` (mDNS only ever runs inside a namespace).
    pub fn mdns_in(mut self, ns: &Netns) -> Self {
        self.mdns = true;
        self.netns = Some(ns.name().into());
        self
    }

    /// Runs in `ns` without mDNS.
    pub fn in_netns(mut self, ns: &Netns) -> Self {
        self.netns = Some(ns.name().into());
        self
    }

    /// Adds a key of the `[node]` table, e.g. `min_free_disk_mb = 8`.
    pub fn node_key(mut self, line: &str) -> Self {
        self.node_keys.push_str(line);
        self.node_keys.push('\n');
        self
    }

    /// Runs the node under `command` (its arguments, then the node's command line).
    pub fn wrapped(mut self, command: &[&str]) -> Self {
        self.wrapper = command.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// Appends config TOML.
    pub fn extra(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }
}

/// How a join token reaches `mesh-node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenVia {
    /// `--join TOKEN`.
    Argument,
    /// `--join -`, and the token on standard input.
    Stdin,
    /// `MESH_JOIN_TOKEN=TOKEN`.
    Environment,
}

/// A running `mesh-node` child process.
#[derive(Debug)]
pub struct NodeProcess {
    /// Node name.
    pub name: String,
    /// The address it listens on, as it wrote it.
    pub addr: String,
    /// Its data dir.
    pub data_dir: PathBuf,
    /// Its log file (stderr).
    pub log: PathBuf,
    /// Namespace it runs in.
    pub netns: Option<String>,
    child: Child,
}

impl NodeProcess {
    /// `http://HOST:PORT` of the node's OpenAI-compatible front door, once it listens.
    pub fn http_url(&self) -> anyhow::Result<String> {
        let file = self.data_dir.join("http.addr");
        let addr = wait_for(
            &format!("{}'s front door", self.name),
            Duration::from_secs(10),
            || {
                fs::read_to_string(&file)
                    .ok()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
            },
        )?;
        Ok(format!("http://{addr}"))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `"TERM"`, `"KILL"`) to the node.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {} failed", self.child.id());
        }
        Ok(())
    }

    /// Waits for the process to exit, returning its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let child = &mut self.child;
        wait_for("node to exit", timeout, || {
            child.try_wait().ok().flatten().map(|status| status.code())
        })
    }

    /// The node's `/metrics` page (OpenMetrics text), fetched from its front door.
    pub fn metrics(&self) -> anyhow::Result<String> {
        use std::io::{Read, Write};
        let url = self.http_url()?;
        let host = url.trim_start_matches("http://");
        let mut socket = std::net::TcpStream::connect(host).context("connect to the front door")?;
        write!(
            socket,
            "GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        socket.read_to_string(&mut response)?;
        Ok(response)
    }

    /// How many file descriptors the process has open now (0 once it is gone).
    pub fn open_fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |dir| dir.count())
    }

    /// The process's resident set size now, KiB (`VmRSS`; 0 once it is gone).
    pub fn rss_kib(&self) -> u64 {
        fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The node's log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp dir with a mesh CA; starts nodes and runs `mesh-cli` against them.
#[derive(Debug)]
pub struct Harness {
    dir: TempDir,
    ca_dir: PathBuf,
    client: TlsFiles,
    /// Declared last: released after the temp dir is gone (the nodes, declared after the
    /// harness in a test, are stopped before it).
    _turn: Turn,
}

/// The tests are one binary whose tests run two at a time. Most share the machine; a test
/// whose load is its point (a datagram flood at full speed, a soak) runs alone, as it did
/// when each file was a binary of its own: [`Harness::alone`] waits for every other harness
/// to go and keeps new ones waiting (std's lock lets a waiting writer in before new readers).
static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// Harnesses this thread holds: a test with two harnesses takes its turn once (a second
    /// read while a writer waits would wait for itself).
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A harness's share of the machine.
#[derive(Debug)]
enum Turn {
    /// `None` for a second harness of the same test.
    Shared {
        _guard: Option<std::sync::RwLockReadGuard<'static, ()>>,
    },
    Alone {
        _guard: std::sync::RwLockWriteGuard<'static, ()>,
    },
}

impl Turn {
    fn shared() -> Self {
        let guard = (HELD.get() == 0).then(|| {
            TURNS
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        HELD.set(HELD.get() + 1);
        Turn::Shared { _guard: guard }
    }

    fn alone() -> Self {
        assert_eq!(
            HELD.get(),
            0,
            "Harness::alone in a test that already holds a harness would wait for itself"
        );
        let guard = TURNS
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        HELD.set(1);
        Turn::Alone { _guard: guard }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        HELD.set(HELD.get().saturating_sub(1));
    }
}

impl Harness {
    /// Creates the CA and a client certificate for `mesh-cli`.
    pub fn new() -> anyhow::Result<Self> {
        Self::with_turn(Turn::shared())
    }

    /// [`Harness::new`] for a test that must have the machine to itself (see [`TURNS`]): it
    /// waits until no other test holds a harness.
    pub fn alone() -> anyhow::Result<Self> {
        Self::with_turn(Turn::alone())
    }

    fn with_turn(turn: Turn) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("agentmesh-test")
            .tempdir()?;
        let ca_dir = dir.path().join("ca");
        ca::ca_init(&ca_dir)?;
        let (cert, key) = ca::issue(&ca_dir, "test-client", &[], CertRole::Client)?;
        let client = TlsFiles {
            ca: ca_dir.join(ca::CA_CERT_FILE),
            cert,
            key,
        };
        Ok(Self {
            dir,
            ca_dir,
            client,
            _turn: turn,
        })
    }

    /// The temp dir.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The CA directory (`ca.pem`, `ca.key`, issued certificates).
    pub fn ca_dir(&self) -> &Path {
        &self.ca_dir
    }

    /// Issues (or reuses) a node certificate named `name` from the harness CA.
    pub fn issue(&self, name: &str) -> anyhow::Result<TlsFiles> {
        self.issue_as(name, CertRole::Node)
    }

    /// Issues (or reuses) a certificate named `name` for `role` from the harness CA.
    pub fn issue_as(&self, name: &str, role: CertRole) -> anyhow::Result<TlsFiles> {
        let cert = self.ca_dir.join(format!("{name}.pem"));
        let key = self.ca_dir.join(format!("{name}.key"));
        if !cert.exists() {
            ca::issue(&self.ca_dir, name, &[], role)?;
        }
        Ok(TlsFiles {
            ca: self.ca_dir.join(ca::CA_CERT_FILE),
            cert,
            key,
        })
    }

    /// Another node certificate for `name` (a new key) from the harness CA, in a directory of
    /// its own: what a CA that issues a name twice hands out.
    pub fn issue_again(&self, name: &str) -> anyhow::Result<TlsFiles> {
        let dir = self.path().join(unique("again-"));
        fs::create_dir_all(&dir)?;
        let ca = ca::CaSigner::load(
            &self.ca_dir.join(ca::CA_CERT_FILE),
            &self.ca_dir.join(ca::CA_KEY_FILE),
        )?;
        let (key, csr) = ca::new_key_and_csr(name, ca::KeyType::Ed25519)?;
        let files = TlsFiles {
            ca: self.ca_dir.join(ca::CA_CERT_FILE),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        fs::write(&files.cert, ca.sign_csr(&csr, name, CertRole::Node)?)?;
        fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }

    /// An mTLS channel to `node` with a member certificate of the harness CA.
    pub async fn member_channel(
        &self,
        node: &NodeProcess,
    ) -> anyhow::Result<tonic::transport::Channel> {
        let member = self.issue("member")?;
        let dialer = mesh_tls::MeshTls::load(&member)?.dialer();
        Ok(dialer.connect(&node.addr).await?.channel)
    }

    /// The client certificate files for `mesh-cli`.
    pub fn client_files(&self) -> &TlsFiles {
        &self.client
    }

    /// Writes `<name>.toml` and starts the node, returning once it listens.
    pub fn spawn(&self, options: NodeOptions) -> anyhow::Result<NodeProcess> {
        let tls = match &options.tls {
            _ if options.zero_config_tls => None,
            Some(tls) => Some(tls.clone()),
            None => Some(self.issue(&options.name)?),
        };
        let data_dir = self.path().join(format!("data-{}", options.name));
        let _ = fs::remove_file(data_dir.join("node.addr"));
        let _ = fs::remove_file(data_dir.join("http.addr"));
        let mut config = String::new();
        writeln!(config, "[node]")?;
        if !options.unnamed {
            writeln!(config, "name = {:?}", options.name)?;
        }
        writeln!(
            config,
            "listen = {:?}\ndata_dir = {:?}\n{}",
            options.listen, data_dir, options.node_keys
        )?;
        writeln!(
            config,
            "[discovery]\nmdns = {}\nstatic_peers = {:?}\n",
            options.mdns, options.static_peers
        )?;
        if let Some(tls) = &tls {
            writeln!(
                config,
                "[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}",
                tls.ca, tls.cert, tls.key
            )?;
            if options.issuer {
                writeln!(config, "ca_key = {:?}", self.ca_dir.join(ca::CA_KEY_FILE))?;
            }
        }
        writeln!(
            config,
            "[http]\nlisten = \"127.0.0.1:0\"\napi_keys = {:?}\n{}",
            options.http_keys, options.http_lines
        )?;
        writeln!(config, "[security]\n{}", options.security)?;
        config.push_str(&options.extra);
        let config_path = self.path().join(format!("{}.toml", options.name));
        fs::write(&config_path, config)?;
        let log = self.path().join(format!("{}.log", options.name));

        let node_bin = bin("mesh-node");
        let mut line: Vec<std::ffi::OsString> = Vec::new();
        if let Some(ns) = &options.netns {
            line.extend(["ip", "netns", "exec", ns].map(Into::into));
        }
        line.extend(options.wrapper.iter().map(Into::into));
        line.push(node_bin.into_os_string());
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]);
        cmd.arg("--config")
            .arg(&config_path)
            .args([
                "--log-format",
                if options.human_log { "human" } else { "json" },
            ])
            .env_remove("MESH_JOIN_TOKEN")
            .env(
                "RUST_LOG",
                options
                    .log
                    .clone()
                    .or_else(|| std::env::var("MESH_TEST_LOG").ok())
                    .unwrap_or_else(|| "info,mesh_node=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        if let Some(token) = &options.join {
            match options.join_via {
                TokenVia::Argument => cmd.args(["--join", token]),
                TokenVia::Stdin => cmd.args(["--join", "-"]).stdin(Stdio::piped()),
                TokenVia::Environment => cmd.env("MESH_JOIN_TOKEN", token),
            };
        }
        let mut child = cmd.spawn().context("start mesh-node")?;
        if let (Some(token), Some(mut stdin)) = (&options.join, child.stdin.take()) {
            use std::io::Write;
            writeln!(stdin, "{token}").context("write the join token to mesh-node's stdin")?;
        }

        let addr_file = data_dir.join("node.addr");
        let addr = wait_for(
            &format!("{} to listen", options.name),
            Duration::from_secs(20),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(anyhow!(
                        "{} exited with {status} before listening:\n{}",
                        options.name,
                        fs::read_to_string(&log).unwrap_or_default()
                    )));
                }
                fs::read_to_string(&addr_file)
                    .ok()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .map(Ok)
            },
        )??;
        Ok(NodeProcess {
            name: options.name,
            addr,
            data_dir,
            log,
            netns: options.netns,
            child,
        })
    }

    /// Runs `mesh-cli` with the harness client certificate against `node`, in its namespace.
    pub fn cli(&self, node: &NodeProcess, args: &[&str]) -> anyhow::Result<Output> {
        Ok(self.cli_command(node, args).output()?)
    }

    /// Runs `mesh-cli` against `node` like [`Harness::cli`], asserting that it succeeds (the
    /// failure shows its stderr), and returns what it printed.
    pub fn cli_ok(&self, node: &NodeProcess, args: &[&str]) -> String {
        let output = self.cli(node, args).expect("mesh-cli");
        assert!(
            output.status.success(),
            "mesh-cli {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Task `id`'s events, as `mesh-cli tasks show ID --json` on `node` lists them.
    pub fn task_events(&self, node: &NodeProcess, id: &str) -> Vec<serde_json::Value> {
        let output = self
            .cli(node, &["tasks", "show", id, "--json"])
            .expect("mesh-cli tasks show");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let shown: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        shown["events"].as_array().cloned().unwrap_or_default()
    }

    /// `mesh-cli run --json ARGS` on `node`: the exit code and the printed object.
    pub fn run_json(
        &self,
        node: &NodeProcess,
        args: &[&str],
    ) -> anyhow::Result<(Option<i32>, Value)> {
        let mut full = vec!["run", "--json"];
        full.extend_from_slice(args);
        let output = self.cli(node, &full)?;
        let value = serde_json::from_slice(&output.stdout).with_context(|| {
            format!(
                "mesh-cli run printed no JSON; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        Ok((output.status.code(), value))
    }

    /// Runs `mesh-cli` against `node` presenting the certificate `files` instead of the harness's
    /// client certificate (a node certificate used as mesh-cli's, a revoked one, …).
    pub fn cli_as(
        &self,
        files: &TlsFiles,
        node: &NodeProcess,
        args: &[&str],
    ) -> anyhow::Result<Output> {
        Ok(Self::command_as(files, node, args).output()?)
    }

    /// The `mesh-cli` command for `node` (in its namespace, with the client certificate).
    pub fn cli_command(&self, node: &NodeProcess, args: &[&str]) -> Command {
        Self::command_as(&self.client, node, args)
    }

    /// The `mesh-cli` command for `node` (in its namespace) presenting `files`.
    fn command_as(files: &TlsFiles, node: &NodeProcess, args: &[&str]) -> Command {
        let cli = bin("mesh-cli");
        let mut cmd = match &node.netns {
            Some(ns) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", ns]).arg(&cli);
                cmd
            }
            None => Command::new(&cli),
        };
        cmd.arg("--node")
            .arg(&node.addr)
            .arg("--ca")
            .arg(&files.ca)
            .arg("--cert")
            .arg(&files.cert)
            .arg("--key")
            .arg(&files.key)
            .args(args)
            .env_remove("MESH_NODE")
            .stdin(Stdio::null());
        cmd
    }

    /// `mesh-cli status --json` on `node`.
    pub fn status(&self, node: &NodeProcess) -> anyhow::Result<Value> {
        let output = self.cli(node, &["status", "--json"])?;
        if !output.status.success() {
            bail!(
                "mesh-cli status failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(serde_json::from_slice(&output.stdout)?)
    }

    /// The state `observer` reports for the node named `name` (`None` if unknown or unreachable).
    pub fn state_of(&self, observer: &NodeProcess, name: &str) -> Option<String> {
        let status = self.status(observer).ok()?;
        status["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["state"].as_str().map(str::to_owned))
    }

    /// Waits until every node in `nodes` lists every other as `up`.
    pub fn wait_all_up(&self, nodes: &[&NodeProcess], timeout: Duration) -> anyhow::Result<()> {
        for observer in nodes {
            for other in nodes {
                if observer.name == other.name {
                    continue;
                }
                wait_for(
                    &format!("{} to see {} up", observer.name, other.name),
                    timeout,
                    || {
                        (self.state_of(observer, &other.name).as_deref() == Some("up"))
                            .then_some(())
                    },
                )?;
            }
        }
        Ok(())
    }
}
