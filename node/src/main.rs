//! The `mesh-node` daemon: parse flags, load config, start the node, wait for a signal, stop.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, ValueEnum};
use std::io::IsTerminal;

use mesh_join::{
    client::{NodeJoin, join_node},
    token::{FROM_STDIN, JoinToken, read_token},
};
use mesh_node::{
    config::{Config, Overrides, TlsMode},
    server::{self, Node, StartError},
};

/// mimalloc instead of glibc's malloc: the front door allocates per request on many threads, where
/// glibc's arenas showed up as lock waits and consolidation in profiles
/// (docs/src/benchmarks/front-door.md).
/// Built without transparent huge pages (`no_thp`): with them an idle node's few megabytes of
/// heap sat in 2-MiB pages, ~48 MB of its RSS.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run an agentmesh node.
///
/// With no flags it starts with zero config: name = host name, data in the platform data dir,
/// gRPC on port 7700 (or the next free one up to 7710), mDNS discovery on, and mTLS with a CA of
/// its own created in `<data-dir>/tls` on first start.
#[derive(Debug, Parser)]
#[command(name = "mesh-node", version, about, long_about)]
struct Args {
    /// TOML config file (see docs/src/operations/config.md for every key).
    #[arg(short, long, env = "MESH_NODE_CONFIG")]
    config: Option<PathBuf>,
    /// Node name (overrides node.name).
    #[arg(long)]
    name: Option<String>,
    /// Listen address, IP:PORT (overrides node.listen).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (overrides node.data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A peer to dial at start, HOST:PORT; repeatable, added to discovery.static_peers.
    #[arg(long = "static-peer", value_name = "HOST:PORT")]
    static_peers: Vec<String>,
    /// Turn mDNS advertising and browsing off.
    #[arg(long)]
    no_mdns: bool,
    /// Plain TCP without authentication (local experiments only; loopback unless
    /// --insecure-allow-remote).
    #[arg(long)]
    insecure: bool,
    /// Allow --insecure on a non-loopback address.
    #[arg(long, requires = "insecure")]
    insecure_allow_remote: bool,
    /// Join a mesh with a token from `mesh-cli token create --role node` (run where the CA key
    /// is): generates this node's key here, gets its certificate from the issuer the token
    /// names (checking that issuer's CA against the token's pin first), stores both in
    /// `<data-dir>/tls`, and starts. Later starts need no token; with one again it does nothing
    /// when the data dir already belongs to that mesh, unless the issuer refuses the
    /// certificate there as revoked: then the node joins again with the token (the revoked
    /// certificate and key are kept as `NAME.pem.revoked` and `NAME.key.revoked`). `--join -`
    /// reads the token from standard input; with MESH_JOIN_TOKEN set, `--join` is not needed.
    /// Both keep the token out of `ps` and the shell's history, where a token given here shows.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MESH_JOIN_TOKEN",
        hide_env_values = true
    )]
    join: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, env = "MESH_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

fn main() -> ExitCode {
    mesh_tls::install_crypto_provider();
    let args = Args::parse();
    init_tracing(args.log_format);

    let overrides = Overrides {
        name: args.name,
        listen: args.listen,
        data_dir: args.data_dir,
        static_peers: args.static_peers,
        no_mdns: args.no_mdns,
        insecure: args.insecure,
        insecure_allow_remote: args.insecure_allow_remote,
    };
    let config = match Config::load(args.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let join = match args
        .join
        .as_deref()
        .map(|given| {
            if given == FROM_STDIN && std::io::stdin().is_terminal() {
                eprint!("paste the join token and press Enter: ");
            }
            read_token(given, std::io::stdin().lock())
        })
        .transpose()
    {
        Ok(token) => token,
        Err(e) => {
            eprintln!("error: --join: {e}");
            return ExitCode::from(2);
        }
    };
    if join.is_some() && config.tls != TlsMode::Bootstrap {
        eprintln!(
            "error: --join stores the certificate it gets in <data dir>/tls, but the configuration names certificate files (tls.ca, tls.cert, tls.key, or tls.insecure): remove them to join with a token"
        );
        return ExitCode::from(2);
    }
    match mesh_node::raise_open_files_limit() {
        Ok(limit) => tracing::info!(
            was = limit.was,
            open_files = %limit
                .now
                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
            "open-files limit (soft) raised to the hard limit"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit; a flood of idle sockets may exhaust it sooner")
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, join)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "error: {}",
                mesh_domain::text::causes_once(e.chain().map(ToString::to_string))
            );
            // A configuration the node could only check at start is still bad usage.
            match e.downcast_ref::<StartError>() {
                Some(StartError::Config(_)) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

async fn run(config: Config, join: Option<JoinToken>) -> anyhow::Result<()> {
    if let Some(token) = join {
        match join_node(&config.data_dir, &config.name, &token).await? {
            NodeJoin::Joined => {
                tracing::info!(issuer = %token.issuer, name = %config.name, "joined the mesh")
            }
            NodeJoin::AlreadyMember => tracing::info!(
                "this data dir already holds a certificate from the token's mesh; --join does nothing"
            ),
            NodeJoin::Rejoined { set_aside } => tracing::warn!(
                issuer = %token.issuer,
                name = %config.name,
                set_aside = ?set_aside,
                "this node's certificate was revoked by the mesh CA; joined the mesh again with the token (a new key and certificate; the revoked ones are kept aside)"
            ),
        }
    }
    let listener = server::bind(config.listen).await?;
    let node = Node::start(config, listener).await?;
    wait_for_signal().await?;
    node.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}

fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,h2=warn,hyper=warn,tower=warn,mdns_sd=warn"));
    // Colour only on a terminal, so that a log written to a file, a pipe or journald carries no
    // escape codes, and not when NO_COLOR is set to anything but "" (https://no-color.org).
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
