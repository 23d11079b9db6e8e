//! Opening gRPC channels to nodes: mTLS with the mesh CA (or plain TCP for `--insecure`), with
//! the connect timeout and HTTP/2 keepalive every connection of the mesh uses, and reporting
//! who answered, also when it is a node of another mesh ([`DialError::ForeignMesh`]).

use std::{
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use mesh_cert::CertIdentity;
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::verify::ForeignCertificate;

/// How long a connection attempt may take before the peer counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings while a call is under way, so a peer that vanishes in the middle of one (power
/// loss, cable pulled) is noticed within interval + timeout. An idle connection is not pinged:
/// membership (SWIM) watches the peers, and pinging every connection every second is what made
/// an idle fleet's cost grow with the square of its size.
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
            .keep_alive_while_idle(false)
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

impl Dialer {
    /// Why the node at `addr` refuses this dialer's certificate, if it does. With TLS 1.3 a
    /// server's verdict on the client's certificate (revoked, or of another CA) arrives only
    /// with its first answer, after the client's side of the handshake has finished, and a gRPC
    /// call then fails as merely "cancelled". This opens a connection of its own, sends the
    /// HTTP/2 preface and reads the first answer, to tell the caller what happened. `None` when
    /// the node answers normally, cannot be reached, or this dialer speaks plain TCP.
    pub async fn certificate_refusal(&self, addr: &str) -> Option<CertificateRefusal> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Self::Tls(config) = self else {
            return None;
        };
        let name = server_name(addr).ok()?;
        let connector = TlsConnector::from(config.clone());
        let attempt = async {
            let tcp = TcpStream::connect(addr).await?;
            let mut tls = connector.connect(name, tcp).await?;
            // The client preface and an empty SETTINGS frame: a server that accepts the
            // certificate answers with its own SETTINGS.
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                .await?;
            tls.flush().await?;
            let mut answer = [0u8; 64];
            tls.read(&mut answer).await.map(drop)
        };
        let error = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .ok()?
            .err()?;
        match error.get_ref()?.downcast_ref::<rustls::Error>()? {
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRevoked) => {
                Some(CertificateRefusal::Revoked)
            }
            rustls::Error::AlertReceived(alert) => {
                Some(CertificateRefusal::Other(format!("{alert:?}")))
            }
            _ => None,
        }
    }
}

/// Why a node refused a client's certificate after the handshake ([`Dialer::certificate_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateRefusal {
    /// The mesh CA revoked it (`mesh-cli ca revoke`).
    Revoked,
    /// Another TLS alert, named.
    Other(String),
}

impl std::fmt::Display for CertificateRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Revoked => f.write_str(
                "the node refuses this certificate: the mesh CA revoked it (`mesh-cli ca revoke`); \
                 get a new one (`mesh-cli token create --role client` where the CA key is, then \
                 `mesh-cli join TOKEN` here)",
            ),
            Self::Other(alert) => write!(
                f,
                "the node refuses this certificate (TLS alert {alert}); is it from this mesh's CA?"
            ),
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
    /// The server presented a certificate that is not from this mesh's CA: it is a node of
    /// another mesh.
    #[error("connect to {addr}: `{}` there belongs to another mesh (its certificate is not from this mesh's CA)", .presented.common_name.as_deref().unwrap_or("the node"))]
    ForeignMesh {
        /// The address dialed.
        addr: String,
        /// Who its certificate says it is.
        presented: CertIdentity,
    },
    /// TCP or TLS failed otherwise.
    #[error("connect to {0}: {1}")]
    Failed(String, String),
}

impl DialError {
    fn from_transport(addr: &str, error: &tonic::transport::Error) -> Self {
        // tonic wraps the connector's io::Error; walk the chain to tell "refused" apart.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        let mut detail = String::new();
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io.kind() == io::ErrorKind::ConnectionRefused {
                    return Self::Refused(addr.to_owned());
                }
                // An io::Error's `source` skips the error it wraps: look inside it too.
                if let Some(foreign) = io.get_ref().and_then(|inner| foreign_certificate(inner)) {
                    return Self::ForeignMesh {
                        addr: addr.to_owned(),
                        presented: foreign.presented.clone(),
                    };
                }
            }
            if let Some(foreign) = foreign_certificate(e) {
                return Self::ForeignMesh {
                    addr: addr.to_owned(),
                    presented: foreign.presented.clone(),
                };
            }
            detail = e.to_string();
            source = e.source();
        }
        Self::Failed(addr.to_owned(), detail)
    }
}

/// The [`ForeignCertificate`] the mesh verifier put in a handshake error, if `error` is one.
fn foreign_certificate<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e ForeignCertificate> {
    match error.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            other.0.downcast_ref::<ForeignCertificate>()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::{
        ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    };
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use mesh_cert::{CertRole, ca};

    use super::*;
    use crate::{MeshTls, TlsFiles};

    /// A node's files from the CA in `dir` (created on first use).
    fn node_files(dir: &std::path::Path, name: &str) -> TlsFiles {
        if !dir.join(ca::CA_CERT_FILE).exists() {
            ca::ca_init(dir).expect("CA");
        }
        let (cert, key) = ca::issue(dir, name, &[], CertRole::Node).expect("issue");
        TlsFiles {
            ca: dir.join(ca::CA_CERT_FILE),
            cert,
            key,
        }
    }

    /// A TLS server on loopback presenting `files`' certificate; it completes (or fails)
    /// handshakes and speaks nothing after them.
    async fn serve(files: &TlsFiles) -> (String, tokio::task::JoinHandle<()>) {
        let certs = CertificateDer::pem_file_iter(&files.cert)
            .expect("cert file")
            .collect::<Result<Vec<_>, _>>()
            .expect("cert pem");
        let key = PrivateKeyDer::from_pem_file(&files.key).expect("key pem");
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("server config");
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = acceptor.accept(tcp).await;
            }
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_server_of_another_ca_is_reported_as_another_mesh_with_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = node_files(&dir.path().join("ours"), "me");
        let dialer = MeshTls::load(&ours).expect("load").dialer();

        let stranger = node_files(&dir.path().join("theirs"), "stranger");
        let (addr, server) = serve(&stranger).await;
        match dialer.connect(&addr).await {
            Err(DialError::ForeignMesh {
                addr: at,
                presented,
            }) => {
                assert_eq!(at, addr);
                assert_eq!(presented.common_name.as_deref(), Some("stranger"));
                let err = DialError::ForeignMesh {
                    addr: at,
                    presented,
                };
                assert!(err.to_string().contains("belongs to another mesh"), "{err}");
            }
            other => panic!("expected ForeignMesh, got {other:?}"),
        }
        server.abort();

        // The control: a server of our own CA passes the certificate check (the connection then
        // fails for want of HTTP/2, which is not another mesh).
        let member = node_files(&dir.path().join("ours"), "member");
        let (addr, server) = serve(&member).await;
        let result = dialer.connect(&addr).await;
        assert!(
            !matches!(result, Err(DialError::ForeignMesh { .. })),
            "{result:?}"
        );
        server.abort();
    }
}
