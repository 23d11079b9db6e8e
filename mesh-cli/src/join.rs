//! `mesh-cli token create` (where the CA key is) and `mesh-cli join` (on an operator's machine):
//! adding a device to the mesh with a join token instead of copying certificate files.

use std::{
    io::IsTerminal,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use mesh_cert::{CertRole, ca::KeyType};
use mesh_join::{
    bootstrap,
    client::join_client,
    token::{FROM_STDIN, create_token, read_token},
};
use serde_json::json;

/// `mesh-cli token …`
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a join token: one line that lets a new device join the mesh.
    ///
    /// Run it where the mesh CA key is (by default the zero-config CA of this machine's node).
    /// On the new device, `mesh-node --join -` (role node) or `mesh-cli join -` (role client),
    /// pasting the token on standard input, or either with the token in MESH_JOIN_TOKEN. The token pins the CA by its SHA-256, names the issuer to get the certificate
    /// from, expires after --ttl and is good for --uses devices. Nothing is stored: the issuer
    /// checks it with a key derived from the CA key and counts its uses. Treat it like a
    /// password until it expires.
    Create(CreateArgs),
}

/// Flags of `mesh-cli token create`.
#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// What the new device gets: `node` (runs mesh-node) or `client` (an operator's mesh-cli).
    #[arg(long, default_value = "node", value_parser = ["node", "client"])]
    role: String,
    /// How long the token stays valid, e.g. 30m, 1h, 2d (at most 7 days).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How many devices may join with it (1-100).
    #[arg(long, default_value_t = 1)]
    uses: u32,
    /// The issuer the new device gets its certificate from, HOST:PORT: a node with this CA's
    /// key (`tls.ca_key`, or the zero-config node whose CA it is). Default: the local node's
    /// address (from its data dir), with this machine's LAN address when it listens on all.
    #[arg(long, value_name = "HOST:PORT")]
    issuer: Option<String>,
    /// Directory holding ca.pem and ca.key. Default: the local zero-config node's
    /// `<data dir>/tls`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print JSON (`{"token", "role", "expires", "uses", "issuer"}`) instead of the bare token.
    #[arg(long)]
    json: bool,
}

/// `mesh-cli token create`.
pub(crate) fn create(args: CreateArgs) -> anyhow::Result<()> {
    let data_dir = bootstrap::default_data_dir();
    let dir = match (args.dir, &data_dir) {
        (Some(dir), _) => dir,
        (None, Some(data_dir)) => {
            // A node that joined with a token holds no CA key: only its issuer makes tokens.
            if let Some(issuer) = crate::connect::joined_at(data_dir) {
                return Err(anyhow!(
                    "this device's node joined the mesh through the issuer at {issuer} and holds no CA key, so it cannot make tokens:                      run `mesh-cli token create` on that machine (or pass --dir DIR with the mesh's ca.pem and ca.key)"
                ));
            }
            bootstrap::tls_dir(data_dir)
        }
        (None, None) => return Err(anyhow!("this platform has no data dir: pass --dir")),
    };
    let ca = crate::ca::signer(&dir)?;
    let issuer = match args.issuer {
        Some(issuer) => issuer,
        None => local_issuer(&dir)?,
    };
    let role: CertRole = args.role.parse().map_err(|e: String| anyhow!(e))?;
    let token = create_token(&ca, role, args.ttl, args.uses, &issuer)?;
    let claims = &token.secret.claims;
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "token": token.to_string(),
                "role": role.to_string(),
                "expires": claims.expires,
                "uses": claims.uses,
                "issuer": token.issuer,
            }))?
        );
    } else {
        show!("{token}");
        let next = match role {
            CertRole::Node => "mesh-node --join -",
            CertRole::Client => "mesh-cli join -",
        };
        eshow!(
            "a {role} token for {} device(s), valid for {}, redeemed at {issuer}; on the new device run `{next}` and paste it (or set MESH_JOIN_TOKEN to it and leave the token out)",
            claims.uses,
            humantime::format_duration(args.ttl)
        );
    }
    Ok(())
}

/// The local node's address as another device reaches it: `<data dir>/node.addr` next to the
/// CA dir, with a LAN address of this machine when the node listens on all addresses.
fn local_issuer(ca_dir: &Path) -> anyhow::Result<String> {
    let hint = "pass --issuer HOST:PORT (the address of a node with this CA's key that the new device can reach)";
    let file = ca_dir
        .parent()
        .map(|data_dir| data_dir.join("node.addr"))
        .ok_or_else(|| anyhow!("{hint}"))?;
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("read {} (is the node running?); {hint}", file.display()))?;
    let addr: SocketAddr = text
        .trim()
        .parse()
        .with_context(|| format!("{} holds no address; {hint}", file.display()))?;
    if !addr.ip().is_unspecified() {
        return Ok(addr.to_string());
    }
    let lan = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|iface| iface.ip())
        .find(|ip| matches!(ip, IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local()))
        .ok_or_else(|| {
            anyhow!("the node listens on {addr} and this machine has no LAN address; {hint}")
        })?;
    Ok(SocketAddr::new(lan, addr.port()).to_string())
}

/// `mesh-cli join TOKEN` (`-`: from standard input).
pub(crate) async fn join(
    token: &str,
    name: Option<String>,
    key_type: KeyType,
) -> anyhow::Result<()> {
    if token == FROM_STDIN && std::io::stdin().is_terminal() {
        eprint!("paste the join token and press Enter: ");
    }
    let token = read_token(token, std::io::stdin().lock())?;
    let dir = bootstrap::user_config_dir()
        .ok_or_else(|| anyhow!("this platform has no config dir for mesh-cli's files"))?;
    let name = match name {
        Some(name) => name,
        None => default_name(),
    };
    let files = join_client(&dir, &name, &token, key_type).await?;
    show!(
        "joined the mesh as client `{name}`\n  CA:          {}\n  certificate: {}\n  private key: {}",
        files.ca.display(),
        files.cert.display(),
        files.key.display()
    );
    Ok(())
}

/// `<host>-cli`: says which machine an operator's certificate is on.
fn default_name() -> String {
    let host: String = gethostname::gethostname()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(58)
        .collect();
    if host.is_empty() {
        "cli".to_owned()
    } else {
        format!("{host}-cli")
    }
}
