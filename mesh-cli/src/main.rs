//! `mesh-cli`: a thin gRPC client for agentmesh nodes.
//!
//! Flags are defined in the clap types below (their doc comments are the `--help`); every
//! command returns a `Result`, and errors are printed in one place, `main`. Exit codes: 0 ok,
//! 1 the operation failed, 2 bad usage.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, anyhow};
use clap::{Args, CommandFactory, Parser, Subcommand};
use mesh_identity::{CertRole, bootstrap, ca};
use mesh_proto::v1 as pb;

mod approvals;
mod connect;
mod cron;
mod join;
mod keys;
mod memory;
mod nodes;
mod run;
mod tasks;

use connect::channel;

/// Talk to an agentmesh node: see the fleet, manage the mesh CA.
///
/// Connects to the node at --node (default: the local node) with mTLS. Certificates come from
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
    /// Node to talk to: a node's name (as `status` lists it, looked up in the local node's
    /// peer table), HOST:PORT, or HOST (port 7700). Default: the local node (the address a
    /// zero-config node of this user wrote into its data dir, else 127.0.0.1:7700).
    #[arg(
        long = "node",
        id = "node",
        value_name = "NAME|HOST[:PORT]",
        global = true,
        env = "MESH_NODE"
    )]
    asked: Option<String>,
    /// The address `--node` resolved to (set by `main` before a command runs).
    #[arg(skip)]
    pub(crate) node: String,
    /// How `--node` was resolved when it named no address, for errors.
    #[arg(skip)]
    found: Option<String>,
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
    /// Show every node this node knows: name, id, address, state, health, roles, models,
    /// GPUs, load (tasks running and queued), replication lag, MCP tools.
    Status {
        /// Print JSON (`{"nodes": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep showing the fleet as it changes (nodes joining, leaving, their health and
        /// load), live from the node, until Ctrl-C. With --json: one object per line.
        #[arg(long)]
        watch: bool,
    },
    /// Inspect nodes.
    #[command(subcommand)]
    Nodes(nodes::NodesCommand),
    /// Run an agent task and stream its output.
    ///
    /// Name what runs it with --role, --model or --persona; without them, role `chat` when the
    /// fleet serves it. The task's id comes first (on stderr), then the output streams to
    /// stdout as it is generated, steps (tool calls, model fall-throughs) on stderr, and the
    /// outcome last. Ctrl-C asks whether to cancel the task (a second Ctrl-C cancels it); not
    /// cancelled, it keeps running and mesh-cli says how to cancel it. Exit code 0 when the
    /// task completes, 1 otherwise.
    Run(run::RunArgs),
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
    /// Tool calls waiting for a person's approval (a node's `[approval]` policy): list them
    /// from any node, approve or deny one.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Manage the mesh certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Join tokens: add a device to the mesh with one line instead of certificate files.
    #[command(subcommand)]
    Token(join::TokenCommand),
    /// Get this operator's mesh-cli certificate with a client token (`mesh-cli token create
    /// --role client`): writes ca.pem, mesh-cli.pem and mesh-cli.key (owner-only) into the
    /// operator's config dir (e.g. ~/.config/agentmesh).
    Join {
        /// The token, `agentmesh-join:…`.
        token: String,
        /// The name in the certificate. Default: `<host name>-cli`.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum CaCommand {
    /// Create a new mesh CA: writes DIR/ca.pem (give to every node) and DIR/ca.key (keep private).
    Init {
        /// Directory to write into (created if missing).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a certificate for a node or a client: writes DIR/NAME.pem and DIR/NAME.key.
    ///
    /// `--role node` for a device that runs mesh-node (it serves the mesh and calls other nodes;
    /// it always covers NAME, localhost, 127.0.0.1 and ::1: add its other addresses with --san).
    /// `--role client` for an operator's mesh-cli: it can call nodes but never serve as one, and
    /// nodes cap its tasks at their `security.client_max_tier`.
    Issue {
        /// Directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// Node (or client) name.
        #[arg(long)]
        name: String,
        /// What the certificate is for: `node` or `client`.
        #[arg(long, value_parser = ["node", "client"])]
        role: String,
        /// Extra subject alternative name, IP address or DNS name; repeatable.
        #[arg(long = "san", value_name = "IP_OR_DNS")]
        sans: Vec<String>,
        /// With `--role client`: write the certificate, its key (mode 0600) and the CA
        /// certificate into this user's config dir (`~/.config/agentmesh`), where mesh-cli finds
        /// them without flags, instead of DIR/NAME.pem and DIR/NAME.key.
        #[arg(long, conflicts_with = "sans")]
        install: bool,
        /// The key's algorithm: `ed25519` (the default), or `p256` for a client whose TLS
        /// offers no Ed25519 (Python's grpcio, on which `grpcio-reflection` runs).
        #[arg(long, value_name = "TYPE", default_value = "ed25519", value_parser = ["ed25519", "p256"])]
        key_type: String,
    },
    /// Revoke a node's or client's certificate: signs a revocation with DIR/ca.key and sends it
    /// to the node (--node / MESH_NODE), which replicates it. Every node then refuses the
    /// certificate, ends its connections and streams, drops it from its peers and ignores what
    /// it writes from now on, also after restarts. It cannot be undone: issue a new certificate.
    Revoke {
        /// Directory holding ca.pem and ca.key (and NAME.pem when revoking by name).
        #[arg(long)]
        dir: PathBuf,
        /// The certificate: its name (DIR/NAME.pem) or its id (64 hex digits, as `status` shows).
        target: String,
        /// Why, kept with the revocation for people.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

fn main() -> ExitCode {
    mesh_identity::install_crypto_provider();
    let cli = Cli::parse();
    // A node's certificate belongs in its config's [tls], not in an operator's config dir.
    if let Command::Ca(CaCommand::Issue {
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
            let mut cli = cli;
            let talks_to_a_node = !matches!(
                cli.command,
                Command::Ca(CaCommand::Init { .. } | CaCommand::Issue { .. })
                    | Command::Token(_)
                    | Command::Join { .. }
            );
            let dialer = connect::dialer(&cli.conn).ok();
            if talks_to_a_node {
                let resolved = connect::resolve(cli.conn.asked.as_deref(), dialer.as_ref()).await;
                cli.conn.node = resolved.addr;
                cli.conn.found = resolved.found;
            }
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
            eprintln!(
                "error: {}",
                mesh_domain::text::causes_once(e.chain().map(ToString::to_string))
            );
            ExitCode::FAILURE
        }
    }
}

/// A call the node refused, in words: the node's own sentence, without tonic's description of
/// the status code in front of it.
pub(crate) fn refused(call: &str, node: &str, status: &tonic::Status) -> anyhow::Error {
    anyhow!("{call} on {node}: {}", status_words(status))
}

/// A status in words: its message, or the code's description when it has none.
pub(crate) fn status_words(status: &tonic::Status) -> String {
    if status.message().is_empty() {
        status.code().to_string()
    } else {
        status.message().to_owned()
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Status { json, watch } => nodes::status(&cli.conn, json, watch).await,
        Command::Nodes(command) => nodes::run(&cli.conn, command).await,
        Command::Run(args) => run::run(&cli.conn, args).await,
        Command::Tasks(args) => tasks::tasks(&cli.conn, args).await,
        Command::Memory(command) => memory::run(&cli.conn, command).await,
        Command::Cron(command) => cron::run(&cli.conn, command).await,
        Command::Keys(command) => keys::run(&cli.conn, command).await,
        Command::Approvals(command) => approvals::run(&cli.conn, command).await,
        Command::Token(join::TokenCommand::Create(args)) => join::create(args),
        Command::Join { token, name } => join::join(&token, name).await,
        Command::Ca(CaCommand::Init { dir }) => {
            let (cert, key) = ca::ca_init(&dir)?;
            println!(
                "created mesh CA\n  certificate: {}\n  private key: {}",
                cert.display(),
                key.display()
            );
            println!(
                "next: mesh-cli ca issue --dir {} --role node --name <node>",
                dir.display()
            );
            Ok(())
        }
        Command::Ca(CaCommand::Revoke {
            dir,
            target,
            reason,
        }) => revoke(&cli.conn, &dir, &target, reason).await,
        Command::Ca(CaCommand::Issue {
            dir,
            name,
            install: true,
            key_type,
            ..
        }) => {
            let key_type: ca::KeyType = key_type.parse().map_err(|e: String| anyhow!(e))?;
            let config_dir = bootstrap::user_config_dir().ok_or_else(|| {
                anyhow!("this platform has no config dir to install into; use `ca issue` without --install and pass the files with --ca, --cert and --key")
            })?;
            let files = bootstrap::install_client(&dir, &name, &config_dir, key_type)?;
            println!(
                "installed client certificate for {name}; mesh-cli finds it without flags\n  CA certificate: {}\n  certificate:    {}\n  private key:    {}",
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            );
            Ok(())
        }
        Command::Ca(CaCommand::Issue {
            dir,
            name,
            sans,
            role,
            install: false,
            key_type,
        }) => {
            let role: CertRole = role.parse().map_err(|e: String| anyhow!(e))?;
            let key_type: ca::KeyType = key_type.parse().map_err(|e: String| anyhow!(e))?;
            let (cert, key) = ca::issue_with(&dir, &name, &sans, role, key_type)?;
            println!(
                "issued {role} certificate for {name}\n  certificate: {}\n  private key: {}",
                cert.display(),
                key.display()
            );
            Ok(())
        }
    }
}

/// `ca revoke`: signs the revocation of `target` with the CA in `dir` and sends it to the node.
async fn revoke(
    conn: &ConnArgs,
    dir: &std::path::Path,
    target: &str,
    reason: String,
) -> anyhow::Result<()> {
    let id = mesh_identity::revocation::certificate_id(dir, target).with_context(|| {
        format!("find the certificate `{target}` (give its name, as DIR/NAME.pem, or its 64-hex-digit id)")
    })?;
    let signer = ca::CaSigner::load(&dir.join(ca::CA_CERT_FILE), &dir.join(ca::CA_KEY_FILE))?;
    let name = if id.as_str() == target {
        id.short().to_owned()
    } else {
        target.to_owned()
    };
    let revocation = mesh_identity::Revocation {
        id: id.clone(),
        name: name.clone(),
        revoked_at_ms: unix_ms(),
        reason,
    };
    let signed = revocation.sign(&signer)?;
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    let response = client
        .revoke(signed)
        .await
        .map_err(|s| refused("Revoke", &conn.node, &s))?
        .into_inner();
    let how = if response.new {
        "revoked"
    } else {
        "already revoked"
    };
    println!("{how} {name} (id {id}); every node refuses it within seconds of hearing of it");
    Ok(())
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

pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
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
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
