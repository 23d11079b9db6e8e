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

/// `println!` that ends mesh-cli quietly when stdout's reader has gone (`mesh-cli … | head`)
/// instead of panicking, as ripgrep does; every line mesh-cli prints to stdout passes here.
macro_rules! out {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}

/// `println!` for what a person reads: the text passes [`shown`].
macro_rules! show {
    () => {
        out!()
    };
    ($($arg:tt)*) => {
        out!("{}", $crate::shown(&format!($($arg)*)))
    };
}

/// `eprintln!` for what a person reads: the text passes [`shown`].
macro_rules! eshow {
    () => {
        eprintln!()
    };
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::shown(&format!($($arg)*)))
    };
}

use std::process::ExitCode;

use anyhow::anyhow;
use clap::{CommandFactory, Parser, Subcommand};

mod approvals;
mod ca;
mod config;
mod connect;
mod cron;
mod drain;
mod join;
mod keys;
mod memory;
mod nodes;
mod output;
mod run;
mod tasks;

// What every command uses, named here so each module says `crate::channel`, `crate::shown`.
use connect::{ConnArgs, channel, signer};
use output::{ago, print_table, refused, shown, status_words, unix_ms};

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
    /// Drain a node before maintenance: no new tasks or chats; its work moves or finishes.
    ///
    /// The node takes no new tasks or chats (every router leaves it out, reason `draining`),
    /// passes its queued tasks to other nodes, and lets running ones finish; at --timeout, a
    /// task another node sent is handed back to that node (which runs it elsewhere) and the
    /// drained node's own are cancelled. `status` shows it `draining` while work remains, then
    /// `drained`. A restart ends the drain.
    ///
    /// Needs an operator of that node: a client certificate it allows the `shell` tier
    /// (`security.client_max_tier = "shell"`), or the mesh-cli certificate of its own machine.
    Drain(drain::DrainArgs),
    /// End a drain: the node takes tasks and chats again. Who may: as for `drain`.
    Undrain(drain::UndrainArgs),
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
    /// The node's runtime settings: tier caps, the approval policy, declared GPUs, the front
    /// door's loopback exemption. Set without editing its config file or restarting it.
    #[command(subcommand)]
    Config(config::ConfigCommand),
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

fn main() -> ExitCode {
    mesh_tls::install_crypto_provider();
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
            let mut cli = cli;
            let talks_to_a_node = !matches!(
                cli.command,
                Command::Ca(
                    ca::CaCommand::Init { .. }
                        | ca::CaCommand::Issue { .. }
                        | ca::CaCommand::Certs { .. }
                ) | Command::Token(_)
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
            eshow!(
                "error: {}",
                mesh_domain::text::causes_once(e.chain().map(ToString::to_string))
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Status { json, watch } => nodes::status(&cli.conn, json, watch).await,
        Command::Nodes(command) => nodes::run(&cli.conn, command).await,
        Command::Drain(args) => drain::drain(&cli.conn, args).await,
        Command::Undrain(args) => drain::undrain(&cli.conn, args).await,
        Command::Run(args) => run::run(&cli.conn, args).await,
        Command::Tasks(args) => match tasks::watched(&args) {
            Some((id, json)) => run::watch(&cli.conn, id, json).await,
            None => tasks::tasks(&cli.conn, args).await,
        },
        Command::Memory(command) => memory::run(&cli.conn, command).await,
        Command::Cron(command) => cron::run(&cli.conn, command).await,
        Command::Keys(command) => keys::run(&cli.conn, command).await,
        Command::Approvals(command) => approvals::run(&cli.conn, command).await,
        Command::Token(join::TokenCommand::Create(args)) => join::create(args),
        Command::Config(command) => config::run(&cli.conn, command).await,
        Command::Join {
            token,
            name,
            key_type,
        } => {
            let key_type: mesh_cert::ca::KeyType =
                key_type.parse().map_err(|e: String| anyhow!(e))?;
            join::join(&token, name, key_type).await
        }
        Command::Ca(command) => crate::ca::run(&cli.conn, command).await,
    }
}
