//! Opening gRPC channels to nodes: mTLS with the mesh CA (or plain TCP for `--insecure`), with
//! the connect timeout and HTTP/2 keepalive every connection of the mesh uses, and reporting
//! who answered.

use std::{
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::cert::CertIdentity;

/// How long a connection attempt may take before the peer counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on every connection, so a peer that vanishes without closing its socket (power
/// loss, cable pulled) is noticed within interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Opens gRPC channels to peers: mTLS, or plain TCP in insecure mode.
#[derive(Clone)]
pub enum Dialer {
    /// mTLS with the mesh CA.
    Tls(Arc<ClientConfig>),
    /// Plain TCP (`--insecure`).
    Plain,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tls(_) => "Dialer::Tls",
            Self::Plain => "Dialer::Plain",
        })
    }
}

/// An open channel and who answered on it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The gRPC channel (HTTP/2 with keepalive).
    pub channel: Channel,
    /// The identity in the certificate the server presented; `None` in insecure mode.
    pub peer: Option<CertIdentity>,
}

impl Dialer {
    /// Connects to `addr` (`host:port`) and completes the TLS handshake, so a wrong CA or a dead
    /// peer is an error here rather than on the first call.
    pub async fn connect(&self, addr: &str) -> Result<Connection, DialError> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| DialError::BadAddress(addr.to_owned(), e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let target = addr.to_owned();
        match self {
            Self::Plain => {
                let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
                    .await
                    .map_err(|_| DialError::Timeout(target.clone()))?
                    .map_err(|e| DialError::from_transport(&target, &e))?;
                Ok(Connection {
                    channel,
                    peer: None,
                })
            }
            Self::Tls(config) => {
                let connector = TlsConnector::from(config.clone());
                let server_name = server_name(addr)?;
                let seen: Arc<Mutex<Option<CertIdentity>>> = Arc::default();
                let seen_in_connector = seen.clone();
                let service = tower::service_fn(move |_uri: tonic::codegen::http::Uri| {
                    let connector = connector.clone();
                    let server_name = server_name.clone();
                    let target = target.clone();
                    let seen = seen_in_connector.clone();
                    async move {
                        let tcp = TcpStream::connect(&target).await?;
                        tcp.set_nodelay(true)?;
                        let tls = connector.connect(server_name, tcp).await?;
                        let presented = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|certs| certs.first())
                            .and_then(|der| CertIdentity::from_der(der).ok());
                        if let Ok(mut slot) = seen.lock() {
                            *slot = presented;
                        }
                        Ok::<_, io::Error>(TokioIo::new(tls))
                    }
                });
                let channel =
                    tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect_with_connector(service))
                        .await
                        .map_err(|_| DialError::Timeout(addr.to_owned()))?
                        .map_err(|e| DialError::from_transport(addr, &e))?;
                let peer = seen.lock().ok().and_then(|slot| slot.clone());
                Ok(Connection { channel, peer })
            }
        }
    }
}

fn server_name(addr: &str) -> Result<ServerName<'static>, DialError> {
    let host = addr
        .rsplit_once(':')
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .ok_or_else(|| DialError::BadAddress(addr.into(), "expected host:port".into()))?;
    ServerName::try_from(host.to_owned())
        .or_else(|_| ServerName::try_from("agentmesh.invalid".to_owned()))
        .map_err(|e| DialError::BadAddress(addr.into(), e.to_string()))
}

/// Errors opening a connection to a peer.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The address is not `host:port`.
    #[error("invalid peer address `{0}`: {1}")]
    BadAddress(String, String),
    /// Nothing answered in time.
    #[error("connect to {0}: timed out")]
    Timeout(String),
    /// Nothing listens there (connection refused): the peer is down, not just slow.
    #[error("connect to {0}: connection refused")]
    Refused(String),
    /// TCP or TLS failed (for example a certificate from another CA).
    #[error("connect to {0}: {1}")]
    Failed(String, String),
}

impl DialError {
    fn from_transport(addr: &str, error: &tonic::transport::Error) -> Self {
        // tonic wraps the connector's io::Error; walk the chain to tell "refused" apart.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        let mut detail = String::new();
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<io::Error>()
                && io.kind() == io::ErrorKind::ConnectionRefused
            {
                return Self::Refused(addr.to_owned());
            }
            detail = e.to_string();
            source = e.source();
        }
        Self::Failed(addr.to_owned(), detail)
    }
}
