//! Which node `mesh-cli` talks to and with which certificate: `--node` resolved to an address
//! (a node's name through the local node's peer table, a host without a port on the node's
//! default port), the dialer the flags or the files found ask for, and the channel.
//!
//! It decides nothing about what a command does; it only says, in words, why a node cannot be
//! reached or which certificate to get.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context, anyhow};
use clap::Args;
use mesh_cert::OriginSigner;
use mesh_join::bootstrap;
use mesh_proto::v1 as pb;
use mesh_tls::{Dialer, MeshTls, TlsFiles};

// The flags every command shares: which node, and the certificate to show it. (No doc comment:
// clap would read it as help text.)
#[derive(Debug, Clone, Args)]
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
    pub(crate) asked: Option<String>,
    /// The address `--node` resolved to (set by `main` before a command runs).
    #[arg(skip)]
    pub(crate) node: String,
    /// How `--node` was resolved when it named no address, for errors.
    #[arg(skip)]
    pub(crate) found: Option<String>,
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

/// The port a node listens on unless told otherwise (`node.listen`).
pub(crate) const DEFAULT_PORT: u16 = 7700;

/// What `--node` said, resolved: the address to dial and how it was found.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// `host:port` to dial.
    pub(crate) addr: String,
    /// Set when `--node` named no address: why this one (for errors when it does not answer).
    pub(crate) found: Option<String>,
}

/// Whether `text` is `host:port` (an IPv6 address in brackets, or a name or IPv4 address
/// followed by `:` and a port number).
fn has_port(text: &str) -> bool {
    if text.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match text.rsplit_once(':') {
        Some((host, port)) => !host.contains(':') && port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// The local node: the address a zero-config node of this user wrote into its data dir
/// (`node.addr`, with a wildcard host made loopback), else `127.0.0.1:7700`.
pub(crate) fn local_node() -> String {
    let written = bootstrap::default_data_dir()
        .and_then(|dir| std::fs::read_to_string(dir.join("node.addr")).ok())
        .and_then(|text| text.trim().parse::<SocketAddr>().ok());
    match written {
        Some(mut addr) => {
            if addr.ip().is_unspecified() {
                addr.set_ip(if addr.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                });
            }
            addr.to_string()
        }
        None => format!("127.0.0.1:{DEFAULT_PORT}"),
    }
}

/// Resolves `--node`: none means the local node; `host:port` is dialed as it is; anything else
/// is a node's name as the local node knows it (its peer table, itself included), or else a
/// host on the default port.
pub(crate) async fn resolve(asked: Option<&str>, dialer: Option<&Dialer>) -> Resolved {
    let Some(asked) = asked else {
        return Resolved {
            addr: local_node(),
            found: None,
        };
    };
    if has_port(asked) {
        return Resolved {
            addr: asked.to_owned(),
            found: None,
        };
    }
    let local = local_node();
    let by_name = match dialer {
        Some(dialer) => named_in(dialer, &local, asked).await,
        None => Err("mesh-cli has no certificate to ask it with".to_owned()),
    };
    match by_name {
        Ok(addr) => Resolved {
            found: Some(format!(
                "`{asked}` is at {addr} in the peer table of the local node ({local})"
            )),
            addr,
        },
        Err(why) => Resolved {
            addr: format!("{asked}:{DEFAULT_PORT}"),
            found: Some(format!(
                "`{asked}` is not a node the local node ({local}) knows ({why}), so mesh-cli tried it as a host on port {DEFAULT_PORT}"
            )),
        },
    }
}

/// The address of the node named `name` in the view of the node at `local` (`ListPeers`),
/// or why there is none.
async fn named_in(dialer: &Dialer, local: &str, name: &str) -> Result<String, String> {
    let connection = dialer
        .connect(local)
        .await
        .map_err(|e| format!("it does not answer: {e}"))?;
    let view = pb::node_client::NodeClient::new(connection.channel)
        .list_peers(pb::ListPeersRequest {})
        .await
        .map_err(|s| format!("it does not list its peers: {}", s.message()))?
        .into_inner();
    if view.node.as_ref().is_some_and(|own| own.name == name) {
        return Ok(local.to_owned());
    }
    let mut known: Vec<String> = view.node.iter().map(|own| own.name.clone()).collect();
    for peer in view.peers {
        let Some(info) = peer.info else { continue };
        if info.name == name && !peer.addr.is_empty() {
            return Ok(peer.addr);
        }
        known.push(info.name);
    }
    Err(format!("it knows {}", known.join(", ")))
}

/// A channel to the node `conn` names.
pub(crate) async fn channel(conn: &ConnArgs) -> anyhow::Result<tonic::transport::Channel> {
    let dialer = dialer(conn)?;
    let connection = match dialer.connect(&conn.node).await {
        Ok(connection) => connection,
        // It answered, but mesh-cli's certificate is of another mesh: no point asking whether
        // it runs.
        Err(e @ mesh_tls::DialError::ForeignMesh { .. }) => {
            return Err(anyhow!(
                "{e}; to talk to it, use the files of its mesh: --ca, --cert and --key (or MESH_CA, MESH_CERT, MESH_KEY)"
            ));
        }
        Err(e) => {
            let how = conn
                .found
                .as_deref()
                .map(|found| format!("; {found}"))
                .unwrap_or_default();
            return Err(anyhow::Error::new(e).context(format!(
                "cannot reach a node at {} (is mesh-node running? set --node or MESH_NODE){how}",
                conn.node
            )));
        }
    };
    Ok(connection.channel)
}

/// The dialer the flags ask for. Without --ca/--cert/--key (or their `MESH_*` variables), the
/// first place of [`bootstrap::cli_file_places`] that holds a certificate.
pub(crate) fn dialer(conn: &ConnArgs) -> anyhow::Result<Dialer> {
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

/// The first of mesh-cli's places that holds a certificate. The error says how to get one: on
/// a device whose node joined with a token, from its issuer with `mesh-cli join`; elsewhere,
/// every place looked in and the ways to put one there.
fn found_cli_files() -> anyhow::Result<TlsFiles> {
    let places = bootstrap::cli_file_places();
    if let Some(files) = places.iter().find(|files| files.cert.exists()) {
        return Ok(files.clone());
    }
    if let Some(issuer) = joined_through() {
        return Err(anyhow!(
            "mesh-cli has no certificate on this device yet; this device's node joined the mesh through the issuer at {issuer}, which holds the mesh's CA key: \
             there, run `mesh-cli token create --role client`, then here `mesh-cli join TOKEN` (it writes {})",
            bootstrap::user_config_dir().map_or_else(
                || "mesh-cli's config dir".to_owned(),
                |dir| dir.display().to_string()
            )
        ));
    }
    let looked: Vec<String> = places
        .iter()
        .map(|files| format!("  {}", files.cert.display()))
        .collect();
    Err(anyhow!(
        "no client certificate; looked for one in:\n{}\n\
         to fix: with a client token from the mesh's issuer (`mesh-cli token create --role client` there), run `mesh-cli join TOKEN`; \
         or, where the mesh CA is, run `mesh-cli ca issue --dir <ca dir> --role client --name <you> --install` \
         (it writes the first place), or pass --ca, --cert and --key (or set MESH_CA, MESH_CERT, MESH_KEY), \
         or --insecure for a node started with --insecure",
        looked.join("\n")
    ))
}

/// The issuer the zero-config node of this user joined through, when it joined with a token
/// (its data dir holds the mesh's CA certificate without the key).
pub(crate) fn joined_through() -> Option<String> {
    let data_dir = bootstrap::default_data_dir()?;
    joined_at(&data_dir)
}

/// [`joined_through`] for the data dir `data_dir`.
pub(crate) fn joined_at(data_dir: &Path) -> Option<String> {
    if bootstrap::ca_key(data_dir).exists() {
        return None;
    }
    bootstrap::remembered_issuer(data_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_with_a_port_is_dialed_as_it_is_and_a_name_is_not() {
        for text in ["127.0.0.1:7700", "gpu-box.lan:7701", "[::1]:7700", "gpu:1"] {
            assert!(has_port(text), "{text}");
        }
        for text in [
            "gpu",
            "gpu-box.lan",
            "10.0.0.7",
            "::1",
            "gpu:port",
            "gpu:70000",
        ] {
            assert!(!has_port(text), "{text}");
        }
    }
}
