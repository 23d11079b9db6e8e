//! The mesh's own certificate authority and mutual TLS for every connection, server and client.
//!
//! Trust is membership: a peer is accepted when its certificate chains to the mesh CA, and its
//! identity is its public key (see [`crate::identity`]), not the name or address it was dialed
//! at. So the client verifier checks the chain and ignores a name mismatch: a node found by mDNS
//! at 10.0.0.7 or a static peer named by IP is verified the same way, and discovery checks the
//! presented identity against what was advertised. This module does not decide who to dial or
//! what to do with a peer; it only makes and checks certificates and opens connections.
//!
//! Every rustls config here names the `ring` provider explicitly, so library users (tests, the
//! CLI) do not depend on a process-wide default being installed.

use std::{
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use mesh_domain::NodeId;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, ServerTlsConfig};

use crate::identity::CertIdentity;

/// File names inside a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key; whoever holds it can add nodes to the mesh.
pub const CA_KEY_FILE: &str = "ca.key";

/// How long a new CA is valid.
const CA_VALIDITY_DAYS: i64 = 3650;
/// How long an issued node or client certificate is valid.
const CERT_VALIDITY_DAYS: i64 = 825;

/// How long a connection attempt may take before the peer counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on every connection, so a peer that vanishes without closing its socket (power
/// loss, cable pulled) is noticed within interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The paths of the three PEM files a node or client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The mesh CA certificate.
    pub ca: PathBuf,
    /// This node's (or client's) certificate, issued by the CA.
    pub cert: PathBuf,
    /// The private key of `cert`.
    pub key: PathBuf,
}

/// Creates a new mesh CA in `dir`: `ca.pem` (share it with every node) and `ca.key` (keep it
/// private). Refuses to overwrite an existing CA, since that would orphan every issued cert.
pub fn ca_init(dir: &Path) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    fs::create_dir_all(dir).map_err(|e| TlsError::io("create", dir, e))?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name("agentmesh CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key)?;

    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    Ok((cert_path, key_path))
}

/// Issues `NAME.pem` / `NAME.key` in `dir`, signed by the CA in the same directory. The
/// certificate is valid as both server and client certificate; its SANs are `NAME`,
/// `localhost`, `127.0.0.1`, `::1` and every extra `sans` entry (IP or DNS name).
pub fn issue(dir: &Path, name: &str, sans: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    validate_cert_name(name)?;
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}.key"));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    let ca_pem = read(&dir.join(CA_CERT_FILE))?;
    let ca_key = KeyPair::from_pem(&read(&dir.join(CA_KEY_FILE))?).map_err(|e| TlsError::Pem {
        path: dir.join(CA_KEY_FILE),
        reason: e.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| TlsError::Pem {
        path: dir.join(CA_CERT_FILE),
        reason: e.to_string(),
    })?;

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(name);
    let mut all_sans: Vec<String> = vec![name.into(), "localhost".into(), "127.0.0.1".into()];
    all_sans.push("::1".into());
    all_sans.extend(sans.iter().cloned());
    all_sans.dedup();
    for san in &all_sans {
        let san = match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) if is_dns_name(san) => SanType::DnsName(
                san.clone()
                    .try_into()
                    .map_err(|_| TlsError::BadSan(san.clone()))?,
            ),
            Err(_) => return Err(TlsError::BadSan(san.clone())),
        };
        params.subject_alt_names.push(san);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    set_validity(&mut params, CERT_VALIDITY_DAYS);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    Ok((cert_path, key_path))
}

/// Loaded and checked TLS material of one node or client.
#[derive(Clone)]
pub struct MeshTls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    identity: CertIdentity,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for MeshTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshTls")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl MeshTls {
    /// Reads the three files and checks that the certificate was issued by the CA and matches
    /// the key, so a misconfigured node fails at start with the file to fix, not at first dial.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let ca_pem = read(&files.ca)?;
        let cert_pem = read(&files.cert)?;
        let key_pem = read(&files.key)?;

        let ca_certs = pem_certs(&files.ca, &ca_pem)?;
        let chain = pem_certs(&files.cert, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
            path: files.key.clone(),
            reason: e.to_string(),
        })?;
        let identity = CertIdentity::from_der(&chain[0]).map_err(|e| TlsError::Pem {
            path: files.cert.clone(),
            reason: e.to_string(),
        })?;

        let mut roots = RootCertStore::empty();
        for ca in ca_certs {
            roots.add(ca).map_err(|e| TlsError::Pem {
                path: files.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let verifier = MeshServerVerifier::new(Arc::new(roots))?;
        verifier.check_chain(&chain).map_err(|e| match e {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired
                | rustls::CertificateError::ExpiredContext { .. }
                | rustls::CertificateError::NotValidYet
                | rustls::CertificateError::NotValidYetContext { .. },
            ) => TlsError::OutOfDate {
                cert: files.cert.clone(),
                reason: e.to_string(),
            },
            e => TlsError::NotFromCa {
                cert: files.cert.clone(),
                ca: files.ca.clone(),
                reason: e.to_string(),
            },
        })?;

        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsError::KeyMismatch {
                path: files.key.clone(),
                reason: e.to_string(),
            })?;
        client.alpn_protocols = vec![b"h2".to_vec()];

        Ok(Self {
            ca_pem,
            cert_pem,
            key_pem,
            identity,
            client: Arc::new(client),
        })
    }

    /// Who this certificate says we are.
    pub fn identity(&self) -> &CertIdentity {
        &self.identity
    }

    /// The server side: our certificate, and client certificates required from the mesh CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(false)
    }

    /// A dialer that presents our certificate and accepts only servers from the mesh CA.
    pub fn dialer(&self) -> Dialer {
        Dialer::Tls(self.client.clone())
    }
}

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

/// Loads (or creates, on first start) the key that gives an insecure node a stable id.
pub fn insecure_identity(data_dir: &Path) -> Result<NodeId, TlsError> {
    let path = data_dir.join("insecure-node.key");
    let key = if path.exists() {
        KeyPair::from_pem(&read(&path)?).map_err(|e| TlsError::Pem {
            path: path.clone(),
            reason: e.to_string(),
        })?
    } else {
        let key = KeyPair::generate()?;
        write_new(&path, key.serialize_pem().as_bytes(), true)?;
        key
    };
    Ok(NodeId::from_spki_der(&key.subject_public_key_info()))
}

/// Checks a server's chain against the mesh CA, ignoring the name it was dialed by (see the
/// module docs for why).
#[derive(Debug)]
struct MeshServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl MeshServerVerifier {
    fn new(roots: Arc<RootCertStore>) -> Result<Self, TlsError> {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self { inner })
    }

    fn check_chain(&self, chain: &[CertificateDer<'static>]) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("agentmesh.invalid").expect("a valid DNS name literal");
        self.verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .map(|_| ())
    }
}

impl ServerCertVerifier for MeshServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki verifies the chain before the name, so a name error means the chain is good.
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
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

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "agentmesh");
    dn
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // Backdated an hour so a peer whose clock runs a little slow accepts it at once.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

fn validate_cert_name(name: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(TlsError::BadName(name.to_owned()))
    }
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'*')
        })
}

fn pem_certs(path: &Path, pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|e| TlsError::io("read", path, e))
}

fn write_new(path: &Path, contents: &[u8], private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options
        .open(path)
        .map_err(|e| TlsError::io("create", path, e))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| TlsError::io("write", path, e))
}

/// Errors making or loading certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Refused to overwrite existing key material.
    #[error("{} already exists; refusing to overwrite it (remove it first, or use another directory or name)", .0.display())]
    Exists(PathBuf),
    /// A PEM file did not contain what it should.
    #[error("{}: not a valid PEM file: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The node certificate has expired, or is not valid yet.
    #[error("{} is out of date ({reason}); issue a new one with `mesh-cli ca issue --dir <ca dir> --name <node>` (or check this machine's clock)", cert.display())]
    OutOfDate {
        /// The certificate.
        cert: PathBuf,
        /// What the verifier said.
        reason: String,
    },
    /// The node certificate was not issued by the configured CA.
    #[error("{} was not issued by the CA in {} ({reason}); issue it with `mesh-cli ca issue --dir <ca dir> --name <node>`", cert.display(), ca.display())]
    NotFromCa {
        /// The certificate.
        cert: PathBuf,
        /// The CA it should chain to.
        ca: PathBuf,
        /// What the verifier said.
        reason: String,
    },
    /// The key does not belong to the certificate.
    #[error("{} does not match its certificate: {reason}", path.display())]
    KeyMismatch {
        /// The key file.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// A certificate name that cannot be used as a file name and DNS label.
    #[error("invalid certificate name `{0}`: use 1-63 letters, digits, `-`, `_` or `.`")]
    BadName(String),
    /// A SAN that is neither an IP address nor a DNS name.
    #[error("invalid --san `{0}`: expected an IP address or a DNS name")]
    BadSan(String),
    /// Key generation or signing failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls rejected the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        Self::Config(e.to_string())
    }
}

impl TlsError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_load_and_carry_the_node_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca init");
        let (cert, key) = issue(dir.path(), "alpha", &["10.0.0.7".into()]).expect("issue");
        let tls = MeshTls::load(&TlsFiles {
            ca: dir.path().join(CA_CERT_FILE),
            cert,
            key,
        })
        .expect("load");
        assert_eq!(tls.identity().common_name.as_deref(), Some("alpha"));
    }

    #[test]
    fn ca_init_and_issue_refuse_to_overwrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("first init");
        assert!(matches!(ca_init(dir.path()), Err(TlsError::Exists(_))));
        issue(dir.path(), "alpha", &[]).expect("first issue");
        assert!(matches!(
            issue(dir.path(), "alpha", &[]),
            Err(TlsError::Exists(_))
        ));
    }

    #[test]
    fn a_certificate_from_another_ca_is_rejected_at_load() {
        let ours = tempfile::tempdir().expect("tempdir");
        let theirs = tempfile::tempdir().expect("tempdir");
        ca_init(ours.path()).expect("ca");
        ca_init(theirs.path()).expect("ca");
        let (cert, key) = issue(theirs.path(), "mallory", &[]).expect("issue");
        let err = MeshTls::load(&TlsFiles {
            ca: ours.path().join(CA_CERT_FILE),
            cert,
            key,
        })
        .expect_err("foreign certificate must not load");
        assert!(matches!(err, TlsError::NotFromCa { .. }), "{err}");
    }

    #[test]
    fn bad_names_and_sans_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        assert!(matches!(
            issue(dir.path(), "../evil", &[]),
            Err(TlsError::BadName(_))
        ));
        assert!(matches!(
            issue(dir.path(), "ok", &["bad san!".into()]),
            Err(TlsError::BadSan(_))
        ));
    }
}
