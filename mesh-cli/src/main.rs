//! `mesh-cli`: a thin gRPC client for agentmesh nodes.
//!
//! Flags are defined in the clap types below (their doc comments are the `--help`); every
//! command returns a `Result`, and errors are printed in one place, `main`. Exit codes: 0 ok,
//! 1 the operation failed, 2 bad usage.
//!
//! Much of what it prints came from elsewhere: a model's answer, a tool call's arguments, a
//! node's name, an error a node sent. All human output goes through [`show!`] and [`eshow!`]
//! (and table cells through [`print_table`]), which escape control characters, so that text
//! cannot move the cursor or rewrite what the operator reads, say before answering an approval.
//! `--json` output is printed as is: JSON escapes control characters itself.

/// `println!` for what a person reads: the text passes [`shown`].
macro_rules! show {
    () => {
        println!()
    };
    ($($arg:tt)*) => {
        println!("{}", $crate::shown(&format!($($arg)*)))
    };
}

/// `eprintln!` for what a person reads: the text passes [`shown`].
macro_rules! eshow {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::shown(&format!($($arg)*)))
    };
}

use std::{
    borrow::Cow,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, anyhow};
use clap::{Args, CommandFactory, Parser, Subcommand};
use mesh_domain::text::{LineBreaks, escape_controls};
use mesh_identity::{Dialer, MeshTls, OriginSigner, TlsFiles, bootstrap};
use mesh_proto::{convert::tier_or_read, v1 as pb};
use serde_json::{Value, json};

mod approvals;
mod ca;
mod config;
mod cron;
mod join;
mod keys;
mod memory;
mod tasks;

/// Talk to an agentmesh node: see the fleet, manage the mesh CA.
///
/// Connects to the node at --node (default 127.0.0.1:7700) with mTLS. Certificates come from
/// --ca/--cert/--key (or MESH_CA, MESH_CERT, MESH_KEY); without them, from the first of these
/// that holds a certificate: this user's config dir (`~/.config/agentmesh/{ca.pem,mesh-cli.pem,
/// mesh-cli.key}`, which `ca issue --role client --install` writes), then the `mesh-cli`
/// certificate a zero-config node of this user creates in its data dir
/// (`~/.local/share/agentmesh/tls`).
#[derive(Debug, Parser)]
#[command(name = "mesh-cli", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
pub(crate) struct ConnArgs {
    /// Node to talk to, HOST:PORT.
    #[arg(
        long,
        global = true,
        env = "MESH_NODE",
        default_value = "127.0.0.1:7700"
    )]
    pub(crate) node: String,
    /// Mesh CA certificate (PEM).
    #[arg(long, global = true, env = "MESH_CA", requires_all = ["cert", "key"])]
    ca: Option<PathBuf>,
    /// Client certificate (PEM), issued by the mesh CA.
    #[arg(long, global = true, env = "MESH_CERT", requires_all = ["ca", "key"])]
    cert: Option<PathBuf>,
    /// Client private key (PEM).
    #[arg(long, global = true, env = "MESH_KEY", requires_all = ["ca", "cert"])]
    key: Option<PathBuf>,
    /// Plain TCP, for a node started with --insecure.
    #[arg(long, global = true, conflicts_with_all = ["ca", "cert", "key"])]
    insecure: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show every node this node knows: name, id, address, state, roles, models, GPUs, load,
    /// MCP tools.
    Status {
        /// Print JSON (`{"nodes": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Inspect nodes.
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// Run an agent task and stream its output.
    ///
    /// Name what runs it with --role, --model or --persona. Output streams to stdout as it is
    /// generated; tool calls and model fall-throughs are reported on stderr. Exit code 0 when
    /// the task completes, 1 when it fails.
    Run(tasks::RunArgs),
    /// List recent tasks (newest first), or show / cancel one.
    Tasks(tasks::TasksArgs),
    /// Read and write the fleet's shared memory.
    #[command(subcommand)]
    Memory(memory::MemoryCommand),
    /// Schedules that run tasks on the fleet at set times, whichever nodes are up.
    ///
    /// Each schedule is fired by one live node (chosen by hashing its id over the live nodes),
    /// so it keeps firing while the node that created it is off.
    #[command(subcommand)]
    Cron(cron::CronCommand),
    /// The front door's API keys: add and revoke them at run time, see their usage over the
    /// fleet, per model, against their budgets and rate limits.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// The node's runtime settings: tier caps, the approval policy, declared GPUs, the front
    /// door's loopback exemption. Set without editing its config file or restarting it.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Tool calls waiting for a person's approval (a node's `[approval]` policy): list them
    /// from any node, approve or deny one.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// The mesh certificate authority, where its key is: issue, list and revoke certificates.
    #[command(subcommand)]
    Ca(ca::CaCommand),
    /// Join tokens: add a device to the mesh with one line instead of certificate files.
    #[command(subcommand)]
    Token(join::TokenCommand),
    /// Get this operator's mesh-cli certificate with a client token (`mesh-cli token create
    /// --role client`): writes ca.pem, mesh-cli.pem and mesh-cli.key (owner-only) into the
    /// operator's config dir (e.g. ~/.config/agentmesh).
    Join {
        /// The token, `agentmesh-join:…`; `-` reads it from standard input. Better `-` or the
        /// environment variable MESH_JOIN_TOKEN than the token itself: an argument shows in
        /// `ps` and the shell's history.
        #[arg(env = "MESH_JOIN_TOKEN", hide_env_values = true)]
        token: String,
        /// The name in the certificate. Default: `<host name>-cli`.
        #[arg(long)]
        name: Option<String>,
        /// The key's algorithm: `ed25519` (the default), or `p256` for a client whose TLS
        /// offers no Ed25519.
        #[arg(long, value_name = "TYPE", default_value = "ed25519", value_parser = ["ed25519", "p256"])]
        key_type: String,
    },
}

#[derive(Debug, Subcommand)]
enum NodesCommand {
    /// Show everything one node advertises.
    Show {
        /// The node's name (as `status` lists it).
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    mesh_identity::install_crypto_provider();
    let cli = Cli::parse();
    // A node's certificate belongs in its config's [tls], not in an operator's config dir.
    if let Command::Ca(ca::CaCommand::Issue {
        install: true,
        role,
        ..
    }) = &cli.command
        && role != "client"
    {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("--install is for `--role client` only (got `--role {role}`): a node's certificate goes in its config's [tls]"),
            )
            .exit();
    }
    let result = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(async {
            let talks_to_a_node = !matches!(
                cli.command,
                Command::Ca(
                    ca::CaCommand::Init { .. }
                        | ca::CaCommand::Issue { .. }
                        | ca::CaCommand::Certs { .. }
                ) | Command::Token(_)
                    | Command::Join { .. }
            );
            let dialer = dialer(&cli.conn).ok();
            let node = cli.conn.node.clone();
            let result = run(cli).await;
            // A node that refuses this certificate after the handshake makes a call fail as
            // merely "cancelled": ask it why, once, and say so.
            match (result, dialer) {
                (Err(e), Some(dialer))
                    if talks_to_a_node && e.downcast_ref::<tasks::Reported>().is_none() =>
                {
                    match dialer.certificate_refusal(&node).await {
                        Some(refusal) => Err(anyhow!("{refusal} ({e:#})")),
                        None => Err(e),
                    }
                }
                (result, _) => result,
            }
        }),
        Err(e) => Err(anyhow!("cannot start the async runtime: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Already reported on stdout (`run --json`).
        Err(e) if e.downcast_ref::<tasks::Reported>().is_some() => ExitCode::FAILURE,
        Err(e) => {
            eshow!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Status { json } => status(&cli.conn, json).await,
        Command::Nodes(NodesCommand::Show { name, json }) => show(&cli.conn, &name, json).await,
        Command::Run(args) => tasks::run(&cli.conn, args).await,
        Command::Tasks(args) => tasks::tasks(&cli.conn, args).await,
        Command::Memory(command) => memory::run(&cli.conn, command).await,
        Command::Cron(command) => cron::run(&cli.conn, command).await,
        Command::Keys(command) => keys::run(&cli.conn, command).await,
        Command::Approvals(command) => approvals::run(&cli.conn, command).await,
        Command::Config(command) => config::run(&cli.conn, command).await,
        Command::Token(join::TokenCommand::Create(args)) => join::create(args),
        Command::Join {
            token,
            name,
            key_type,
        } => {
            let key_type: mesh_identity::ca::KeyType =
                key_type.parse().map_err(|e: String| anyhow!(e))?;
            join::join(&token, name, key_type).await
        }
        Command::Ca(command) => crate::ca::run(&cli.conn, command).await,
    }
}

/// A channel to the node `conn` names.
pub(crate) async fn channel(conn: &ConnArgs) -> anyhow::Result<tonic::transport::Channel> {
    let dialer = dialer(conn)?;
    let connection = match dialer.connect(&conn.node).await {
        Ok(connection) => connection,
        // It answered, but mesh-cli's certificate is of another mesh: no point asking whether
        // it runs.
        Err(e @ mesh_identity::DialError::ForeignMesh { .. }) => {
            return Err(anyhow!(
                "{e}; to talk to it, use the files of its mesh: --ca, --cert and --key (or MESH_CA, MESH_CERT, MESH_KEY)"
            ));
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot reach a node at {} (is mesh-node running? set --node or MESH_NODE)",
                conn.node
            )));
        }
    };
    Ok(connection.channel)
}

/// Every node the asked node knows, itself first.
async fn fleet(conn: &ConnArgs) -> anyhow::Result<Vec<Value>> {
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    let response = client
        .list_peers(pb::ListPeersRequest {})
        .await
        .map_err(|s| anyhow!("ListPeers on {}: {}: {}", conn.node, s.code(), s.message()))?
        .into_inner();
    let now = unix_ms();
    let mut nodes = Vec::new();
    if let Some(own) = response.node {
        nodes.push(node_json(&own, &conn.node, "up", now, "self"));
        nodes[0]["replication_lag"] = json!({"records": 0, "seconds": 0.0});
    }
    for peer in response.peers {
        if let Some(info) = &peer.info {
            let state = mesh_proto::convert::peer_state(peer.state).as_str();
            let mut node = node_json(info, &peer.addr, state, peer.last_seen_ms, &peer.source);
            node["replication_lag"] = json!({
                "records": peer.lag_records,
                "seconds": peer.lag_ms as f64 / 1000.0,
            });
            nodes.push(node);
        }
    }
    Ok(nodes)
}

async fn status(conn: &ConnArgs, json: bool) -> anyhow::Result<()> {
    let nodes = fleet(conn).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "nodes": nodes }))?
        );
        return Ok(());
    }
    let header = [
        "NAME",
        "ID",
        "ADDRESS",
        "STATE",
        "ROLES",
        "MODELS",
        "GPUS",
        "LOAD",
        "LAST SEEN",
        "MEM LAG",
        "MCP TOOLS",
    ];
    let now = unix_ms();
    let rows: Vec<[String; 11]> = nodes
        .iter()
        .map(|n| {
            [
                n["name"].as_str().unwrap_or_default().to_owned(),
                n["id"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(12)
                    .collect(),
                n["addr"].as_str().unwrap_or_default().to_owned(),
                n["state"].as_str().unwrap_or_default().to_owned(),
                join(&n["roles"], |v| v.as_str().map(str::to_owned)),
                join(&n["models"], |m| m["name"].as_str().map(str::to_owned)),
                join(&n["gpus"], |g| {
                    Some(format!(
                        "{} ({} GiB)",
                        g["name"].as_str()?,
                        g["vram_mb"].as_u64()? / 1024
                    ))
                }),
                format!("{}/{}", n["load"]["running"], n["load"]["queued"]),
                ago(now, n["last_seen_ms"].as_u64().unwrap_or(0)),
                match n["replication_lag"]["records"].as_u64().unwrap_or(0) {
                    0 => "-".to_owned(),
                    records => format!(
                        "{records} rec, {:.0}s",
                        n["replication_lag"]["seconds"].as_f64().unwrap_or(0.0)
                    ),
                },
                match n["mcp_tools"].as_array().map_or(0, Vec::len) {
                    0 => "-".to_owned(),
                    count => count.to_string(),
                },
            ]
        })
        .collect();
    print_table(&header, &rows);
    Ok(())
}

async fn show(conn: &ConnArgs, name: &str, json: bool) -> anyhow::Result<()> {
    let nodes = fleet(conn).await?;
    let Some(node) = nodes.iter().find(|n| n["name"] == name) else {
        let known: Vec<&str> = nodes.iter().filter_map(|n| n["name"].as_str()).collect();
        return Err(anyhow!(
            "no node named `{name}`; known nodes: {}",
            known.join(", ")
        ));
    };
    if json {
        println!("{}", serde_json::to_string_pretty(node)?);
        return Ok(());
    }
    let text = |key: &str| node[key].as_str().unwrap_or_default().to_owned();
    show!("name:       {}", text("name"));
    show!("id:         {}", text("id"));
    show!("address:    {}", text("addr"));
    show!(
        "state:      {} (last seen {})",
        text("state"),
        ago(unix_ms(), node["last_seen_ms"].as_u64().unwrap_or(0))
    );
    show!(
        "version:    {} (protocol {})",
        text("version"),
        node["protocol"]
    );
    show!(
        "health:     {}",
        node["health"]["status"].as_str().unwrap_or_default()
    );
    for reason in node["health"]["reasons"].as_array().into_iter().flatten() {
        show!("            - {}", reason.as_str().unwrap_or_default());
    }
    show!(
        "roles:      {}",
        join(&node["roles"], |v| v.as_str().map(str::to_owned))
    );
    show!(
        "labels:     {}",
        node["labels"]
            .as_object()
            .map(|m| m
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    show!("models:");
    for m in node["models"].as_array().into_iter().flatten() {
        show!(
            "  - {} ({} {})",
            m["name"].as_str().unwrap_or_default(),
            m["backend"].as_str().unwrap_or_default(),
            m["model"].as_str().unwrap_or_default()
        );
    }
    show!(
        "personas:   {}",
        join(&node["personas"], |p| Some(format!(
            "{} ({})",
            p["name"].as_str()?,
            p["role"].as_str()?
        )))
    );
    show!(
        "cpus:       {} (load {:.2})",
        node["cpu_count"],
        node["cpu_load"].as_f64().unwrap_or(0.0)
    );
    show!(
        "memory:     {} MiB available of {} MiB",
        node["memory_available_bytes"].as_u64().unwrap_or(0) >> 20,
        node["memory_total_bytes"].as_u64().unwrap_or(0) >> 20
    );
    show!("gpus:");
    for g in node["gpus"].as_array().into_iter().flatten() {
        show!(
            "  - {} {} MiB ({})",
            g["name"].as_str().unwrap_or_default(),
            g["vram_mb"],
            g["source"].as_str().unwrap_or_default()
        );
    }
    show!(
        "load:       {} running, {} queued",
        node["load"]["running"],
        node["load"]["queued"]
    );
    show!("remote tier: {}", text("remote_max_tier"));
    show!("mcp tools:");
    for tool in node["mcp_tools"].as_array().into_iter().flatten() {
        let description = tool["description"].as_str().unwrap_or_default();
        let first_line = description.lines().next().unwrap_or_default();
        show!(
            "  - {} ({}) {}",
            tool["name"].as_str().unwrap_or_default(),
            tool["tier"].as_str().unwrap_or_default(),
            first_line.chars().take(80).collect::<String>()
        );
    }
    Ok(())
}

fn node_json(
    info: &pb::NodeInfo,
    addr: &str,
    state: &str,
    last_seen_ms: u64,
    source: &str,
) -> Value {
    let resources = info.resources.clone().unwrap_or_default();
    let load = info.load.unwrap_or_default();
    let health = info.health.clone().unwrap_or_default();
    json!({
        "name": info.name,
        "id": info.id,
        "addr": addr,
        "state": state,
        "source": source,
        "version": info.version,
        "protocol": info.protocol,
        "addrs": info.addrs,
        "roles": info.roles,
        "labels": info.labels,
        "models": info.models.iter().map(|m| json!({
            "name": m.name, "backend": m.backend, "model": m.model, "base_url": m.base_url,
            "tokens_per_s": m.tokens_per_s,
        })).collect::<Vec<_>>(),
        "role_chains": info.role_chains.iter().map(|c| (c.role.clone(), json!(c.models))).collect::<serde_json::Map<_, _>>(),
        "personas": info.personas.iter().map(|p| json!({"name": p.name, "role": p.role})).collect::<Vec<_>>(),
        "gpus": resources.gpus.iter().map(|g| json!({
            "name": g.name, "vram_mb": g.vram_mb, "vram_free_mb": g.vram_free_mb, "source": g.source,
        })).collect::<Vec<_>>(),
        "cpu_count": resources.cpu_count,
        "cpu_load": resources.cpu_load,
        "memory_total_bytes": resources.memory_total_bytes,
        "memory_available_bytes": resources.memory_available_bytes,
        "load": {"running": load.running, "queued": load.queued},
        "health": {
            "status": match pb::HealthStatus::try_from(health.status) {
                Ok(pb::HealthStatus::Healthy) => "healthy",
                Ok(pb::HealthStatus::Degraded) => "degraded",
                _ => "unhealthy",
            },
            "reasons": health.reasons,
        },
        "remote_max_tier": tier_or_read(info.remote_max_tier).to_string(),
        "mcp_tools": info.mcp_tools.iter().map(|t| json!({
            "name": t.name,
            "description": t.description,
            "tier": tier_or_read(t.tier).to_string(),
            "input_schema": serde_json::from_str::<Value>(&t.input_schema).unwrap_or(Value::Null),
        })).collect::<Vec<_>>(),
        "cert_fingerprint": info.cert_fingerprint,
        "last_seen_ms": last_seen_ms,
    })
}

/// The dialer the flags ask for. Without --ca/--cert/--key (or their `MESH_*` variables), the
/// first place of [`bootstrap::cli_file_places`] that holds a certificate.
fn dialer(conn: &ConnArgs) -> anyhow::Result<Dialer> {
    Ok(match tls(conn)? {
        Some(tls) => tls.dialer(),
        None => Dialer::Plain,
    })
}

/// mesh-cli's certificate and key (`None` with --insecure).
fn tls(conn: &ConnArgs) -> anyhow::Result<Option<MeshTls>> {
    if conn.insecure {
        return Ok(None);
    }
    let files = match (&conn.ca, &conn.cert, &conn.key) {
        (Some(ca), Some(cert), Some(key)) => TlsFiles {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => found_cli_files()?,
    };
    Ok(Some(MeshTls::load(&files)?))
}

/// What signs the operator's statements (a decision on an approval, a key): the key of
/// mesh-cli's own certificate (`None` with --insecure, where nobody has one).
pub(crate) fn signer(conn: &ConnArgs) -> anyhow::Result<Option<OriginSigner>> {
    tls(conn)?
        .map(|tls| tls.origin_signer())
        .transpose()
        .context("use mesh-cli's key to sign")
}

/// The first of mesh-cli's places that holds a certificate; the error lists every place looked
/// in and the ways to put one there.
fn found_cli_files() -> anyhow::Result<TlsFiles> {
    let places = bootstrap::cli_file_places();
    if let Some(files) = places.iter().find(|files| files.cert.exists()) {
        return Ok(files.clone());
    }
    let looked: Vec<String> = places
        .iter()
        .map(|files| format!("  {}", files.cert.display()))
        .collect();
    Err(anyhow!(
        "no client certificate; looked for one in:\n{}\n\
         to fix: where the mesh CA is, run `mesh-cli ca issue --dir <ca dir> --role client --name <you> --install` \
         (it writes the first place), or pass --ca, --cert and --key (or set MESH_CA, MESH_CERT, MESH_KEY), \
         or --insecure for a node started with --insecure",
        looked.join("\n")
    ))
}

fn join(list: &Value, item: impl Fn(&Value) -> Option<String>) -> String {
    let items: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(item)
        .collect();
    if items.is_empty() {
        "-".into()
    } else {
        items.join(",")
    }
}

pub(crate) fn ago(now_ms: u64, then_ms: u64) -> String {
    if then_ms == 0 {
        return "never".into();
    }
    let age = Duration::from_millis(now_ms.saturating_sub(then_ms));
    match age.as_secs() {
        0 => "now".into(),
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s => format!("{}h ago", s / 3600),
    }
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `text` as a terminal may show it: line breaks and tabs kept, every other control character
/// escaped (ESC and with it CSI and OSC sequences, CR, backspace, C1 controls; see
/// [`escape_controls`]).
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    escape_controls(text, LineBreaks::Keep)
}

/// Prints a table; each cell stays on its line (line breaks in it are escaped too).
pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let rows: Vec<[Cow<'_, str>; N]> = rows
        .iter()
        .map(|row| {
            row.each_ref()
                .map(|cell| escape_controls(cell, LineBreaks::Escape))
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(AsRef::as_ref).collect());
    }
}
