//! `mesh-cli ca …`: the mesh CA where its key is: create it, issue certificates, list what it
//! issued, and revoke certificates by name, id prefix or device. Without `--dir`, the CA is the
//! local zero-config node's (`<data dir>/tls`), as for `mesh-cli token create`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, anyhow};
use clap::Subcommand;
use mesh_cert::{
    CertRole, Revocation,
    ca::{self, CaSigner},
    issued::{self, IssuedCert},
};
use mesh_domain::NodeId;
use mesh_join::bootstrap;
use mesh_proto::v1 as pb;
use serde_json::{Value, json};

use crate::{ConnArgs, channel, print_table, unix_ms};

#[derive(Debug, Subcommand)]
pub(crate) enum CaCommand {
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
        /// Directory holding ca.pem and ca.key. Default: the local zero-config node's
        /// `<data dir>/tls`.
        #[arg(long)]
        dir: Option<PathBuf>,
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
        /// How long the certificate is valid, e.g. 8h or 30d (at most 825 days, the default).
        /// Nodes refuse it once it expires and end its open connections and streams: a short
        /// life suits a device lent for a day.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
    /// List the certificates this CA issued: name, role, id, when issued and when it expires,
    /// and whether it was revoked. From the CA's own record (`DIR/issued`), kept by `ca
    /// issue`, the node holding the CA key (join tokens) and `ca revoke`; certificates issued
    /// before that record existed are listed when DIR holds their NAME.pem.
    Certs {
        /// Directory holding ca.pem and ca.key. Default: the local zero-config node's
        /// `<data dir>/tls`.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print JSON (`{"certificates": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke certificates: signs a revocation with the CA key and sends it to the node
    /// (--node / MESH_NODE), which replicates it. Every node then refuses the certificate, ends
    /// its connections and streams, drops it from its peers and ignores what it writes from
    /// now on, also after restarts. It cannot be undone: issue a new certificate (or rejoin
    /// the device with `mesh-node --join TOKEN`).
    ///
    /// TARGET is a name the CA issued (`ca certs` lists them), or a unique prefix of a
    /// certificate's id (the 12 digits `status` shows will do); `--device NAME` revokes every
    /// certificate issued for a device: its node's (NAME) and its mesh-cli's (NAME-cli, the
    /// name `mesh-cli join` gives).
    Revoke {
        /// Directory holding ca.pem and ca.key. Default: the local zero-config node's
        /// `<data dir>/tls`.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The certificate: a name, or a unique id prefix.
        #[arg(required_unless_present = "device", conflicts_with = "device")]
        target: Option<String>,
        /// Revoke every certificate of this device: NAME and NAME-cli.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Why, kept with the revocation for people.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

/// The CA directory: `dir`, else the local zero-config node's `<data dir>/tls`.
pub(crate) fn ca_dir(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match (dir, bootstrap::default_data_dir()) {
        (Some(dir), _) => Ok(dir),
        (None, Some(data_dir)) => Ok(bootstrap::tls_dir(&data_dir)),
        (None, None) => Err(anyhow!("this platform has no data dir: pass --dir")),
    }
}

/// The CA in `dir`, loaded for signing.
pub(crate) fn signer(dir: &Path) -> anyhow::Result<CaSigner> {
    CaSigner::load(&dir.join(ca::CA_CERT_FILE), &dir.join(ca::CA_KEY_FILE))
        .context("load the mesh CA (pass --dir DIR with ca.pem and ca.key)")
}

/// Runs a `ca` command (`conn` is only used by `revoke`, which talks to a node).
pub(crate) async fn run(conn: &ConnArgs, command: CaCommand) -> anyhow::Result<()> {
    match command {
        CaCommand::Init { dir } => {
            let (cert, key) = ca::ca_init(&dir)?;
            show!(
                "created mesh CA\n  certificate: {}\n  private key: {}",
                cert.display(),
                key.display()
            );
            show!(
                "next: mesh-cli ca issue --dir {} --role node --name <node>",
                dir.display()
            );
            Ok(())
        }
        CaCommand::Issue {
            dir,
            name,
            sans,
            role,
            install,
            key_type,
            ttl,
        } => issue(
            ca_dir(dir)?,
            &name,
            &sans,
            &role,
            install,
            issue_options(&key_type, ttl)?,
        ),
        CaCommand::Certs { dir, json } => certs(&ca_dir(dir)?, json),
        CaCommand::Revoke {
            dir,
            target,
            device,
            reason,
        } => {
            let dir = ca_dir(dir)?;
            match (target, device) {
                (_, Some(device)) => revoke_device(conn, &dir, &device, &reason).await,
                (Some(target), None) => revoke(conn, &dir, &target, &reason).await,
                (None, None) => Err(anyhow!("name the certificate to revoke, or --device NAME")),
            }
        }
    }
}

fn issue(
    dir: PathBuf,
    name: &str,
    sans: &[String],
    role: &str,
    install: bool,
    options: ca::IssueOptions,
) -> anyhow::Result<()> {
    if install {
        let config_dir = bootstrap::user_config_dir().ok_or_else(|| {
            anyhow!("this platform has no config dir to install into; use `ca issue` without --install and pass the files with --ca, --cert and --key")
        })?;
        let files = bootstrap::install_client(&dir, name, &config_dir, options)?;
        show!(
            "installed client certificate for {name}; mesh-cli finds it without flags\n  CA certificate: {}\n  certificate:    {}\n  private key:    {}",
            files.ca.display(),
            files.cert.display(),
            files.key.display()
        );
        return Ok(());
    }
    let role: CertRole = role.parse().map_err(|e: String| anyhow!(e))?;
    let (cert, key) = ca::issue_with(&dir, name, sans, role, options)?;
    show!(
        "issued {role} certificate for {name}\n  certificate: {}\n  private key: {}",
        cert.display(),
        key.display()
    );
    Ok(())
}

/// What `ca issue --key-type --ttl` asks for.
fn issue_options(key_type: &str, ttl: Option<Duration>) -> anyhow::Result<ca::IssueOptions> {
    Ok(ca::IssueOptions {
        key_type: key_type.parse().map_err(|e: String| anyhow!(e))?,
        validity: ttl.unwrap_or(ca::CERT_VALIDITY),
    })
}

/// A Unix time as a UTC date and time, for the table.
fn date(unix_s: i64) -> String {
    chrono::DateTime::from_timestamp(unix_s, 0).map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M").to_string(),
    )
}

fn role_name(role: Option<CertRole>) -> String {
    role.map_or_else(|| "legacy".to_owned(), |role| role.to_string())
}

/// `ca certs`.
fn certs(dir: &Path, json: bool) -> anyhow::Result<()> {
    // The same check as signing: this is the CA's own listing, not any directory's.
    signer(dir)?;
    let certs = issued::list(dir)?;
    if json {
        let list: Vec<Value> = certs
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "role": role_name(c.role),
                    "id": c.id.to_string(),
                    "issued": c.issued,
                    "expires": c.expires,
                    "revoked": c.revoked,
                })
            })
            .collect();
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "certificates": list }))?
        );
        return Ok(());
    }
    let rows: Vec<[String; 6]> = certs
        .iter()
        .map(|c| {
            [
                c.name.clone(),
                role_name(c.role),
                c.id.short().to_owned(),
                date(c.issued),
                date(c.expires),
                if c.revoked { "revoked" } else { "-" }.to_owned(),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME",
            "ROLE",
            "ID",
            "ISSUED (UTC)",
            "EXPIRES (UTC)",
            "REVOKED",
        ],
        &rows,
    );
    Ok(())
}

/// What to revoke: a certificate's id and the name to show and sign.
struct Target {
    id: NodeId,
    name: String,
}

impl From<&IssuedCert> for Target {
    fn from(cert: &IssuedCert) -> Self {
        Self {
            id: cert.id.clone(),
            name: cert.name.clone(),
        }
    }
}

/// `ca revoke TARGET`: a name or id prefix of the CA's records; else a full id, or an id
/// prefix of a node the asked node knows (certificates issued before the records existed).
async fn revoke(conn: &ConnArgs, dir: &Path, target: &str, reason: &str) -> anyhow::Result<()> {
    let ca = signer(dir)?;
    let certs = issued::list(dir)?;
    let found = match issued::find(&certs, target) {
        Ok(found) => found.into_iter().map(Target::from).collect(),
        Err(issued::FindError::NoMatch { .. }) if NodeId::parse(target).is_ok() => {
            vec![Target {
                id: NodeId::parse(target)?,
                name: target.chars().take(12).collect(),
            }]
        }
        Err(e @ issued::FindError::NoMatch { .. }) => match peer_by_prefix(conn, target).await? {
            Some(target) => vec![target],
            None => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    };
    send(conn, dir, &ca, &found, reason).await
}

/// `ca revoke --device NAME`.
async fn revoke_device(
    conn: &ConnArgs,
    dir: &Path,
    device: &str,
    reason: &str,
) -> anyhow::Result<()> {
    let ca = signer(dir)?;
    let certs = issued::list(dir)?;
    let found: Vec<Target> = certs
        .iter()
        .filter(|c| c.is_for_device(device))
        .map(Target::from)
        .collect();
    if found.is_empty() {
        return Err(anyhow!(
            "no certificate issued by this CA is named `{device}` or `{device}-cli`; `mesh-cli ca certs` lists them ({})",
            issued::known_names(&certs)
        ));
    }
    send(conn, dir, &ca, &found, reason).await
}

/// The node the asked node knows whose id starts with `prefix`, when exactly one does.
async fn peer_by_prefix(conn: &ConnArgs, prefix: &str) -> anyhow::Result<Option<Target>> {
    let prefix = prefix.to_ascii_lowercase();
    if prefix.len() < 8 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    let peers = client
        .list_peers(pb::ListPeersRequest {})
        .await
        .map_err(|s| anyhow!("ListPeers on {}: {}", conn.node, s.message()))?
        .into_inner()
        .peers;
    let mut matches = peers
        .into_iter()
        .filter_map(|peer| peer.info)
        .filter(|info| info.id.starts_with(&prefix));
    match (matches.next(), matches.next()) {
        (Some(info), None) => Ok(Some(Target {
            id: NodeId::parse(&info.id)?,
            name: info.name,
        })),
        _ => Ok(None),
    }
}

/// Signs the revocation of each target and sends it to the node; marks it revoked in the
/// CA's records once the node took it.
async fn send(
    conn: &ConnArgs,
    dir: &Path,
    ca: &CaSigner,
    targets: &[Target],
    reason: &str,
) -> anyhow::Result<()> {
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    for target in targets {
        let signed = Revocation {
            id: target.id.clone(),
            name: target.name.clone(),
            revoked_at_ms: unix_ms(),
            reason: reason.to_owned(),
        }
        .sign(ca)?;
        let signed = pb::SignedRevocation {
            entry: signed.entry,
            signature: signed.signature,
        };
        let response = client
            .revoke(signed)
            .await
            .map_err(|s| anyhow!("Revoke on {}: {}", conn.node, s.message()))?
            .into_inner();
        issued::mark_revoked(dir, &target.id).with_context(|| {
            format!("note the revocation of {} in the CA's records", target.name)
        })?;
        let how = if response.new {
            "revoked"
        } else {
            "already revoked"
        };
        show!("{how} {} (id {})", target.name, target.id);
    }
    show!("every node refuses the revoked certificates within seconds of hearing of it");
    Ok(())
}
