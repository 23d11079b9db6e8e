//! Mutual TLS with the mesh CA: loading and checking a node's (or client's) PEM files
//! ([`MeshTls`]), the server side (whose client verifier also refuses revoked certificates), and
//! the verifier every client uses.
//!
//! Trust is membership: a peer is accepted when its certificate chains to the mesh CA, and its
//! identity is its public key (see [`crate::cert`]), not the name or address it was dialed at.
//! So the client verifier checks the chain and ignores a name mismatch: a node found by mDNS at
//! 10.0.0.7 or a static peer named by IP is verified the same way, and discovery checks the
//! presented identity against what was advertised.
//!
//! Every rustls config here names the `ring` provider explicitly, so library users (tests, the
//! CLI) do not depend on a process-wide default being installed.

use std::{path::PathBuf, sync::Arc};

use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};

use crate::{
    CertRole, TlsError,
    cert::CertIdentity,
    dial::Dialer,
    origin::{OriginError, OriginSigner, OriginVerifier},
    pem::{pem_certs, read},
    revocation::RevokedSet,
};

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

/// Loaded and checked TLS material of one node or client.
#[derive(Clone)]
pub struct MeshTls {
    /// The key's PEM text, for the signer of our records.
    key_pem: String,
    /// Our certificate chain and its key, for the server side (`server_config`).
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    /// The mesh CA, which also vouches for the certificates of records' origins.
    roots: Arc<RootCertStore>,
    identity: CertIdentity,
    client: Arc<ClientConfig>,
    /// The certificates the mesh CA revoked, which our client verifier refuses; the node fills
    /// it (see [`crate::revocation`]).
    revoked: RevokedSet,
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

        let revoked = RevokedSet::new(&ca_certs);
        let mut roots = RootCertStore::empty();
        for ca in ca_certs {
            roots.add(ca).map_err(|e| TlsError::Pem {
                path: files.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = MeshServerVerifier::new(roots.clone())?.refusing(revoked.clone());
        // A node certificate must be good for both ends of a connection; a client certificate
        // for the client end only (it has no server-auth usage).
        let checked = match identity.role {
            Some(CertRole::Client) => {
                WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?
                    .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
                    .map(|_| ())
            }
            _ => verifier.check_chain(&chain),
        };
        checked.map_err(|e| match e {
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
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| TlsError::KeyMismatch {
                path: files.key.clone(),
                reason: e.to_string(),
            })?;
        client.alpn_protocols = vec![b"h2".to_vec()];

        Ok(Self {
            key_pem,
            chain,
            key: Arc::new(key),
            roots,
            identity,
            client: Arc::new(client),
            revoked,
        })
    }

    /// The certificates revoked in this mesh: shared with the dialer's verifier, so adding one
    /// refuses it on every later dial.
    pub fn revoked(&self) -> &RevokedSet {
        &self.revoked
    }

    /// Signs this node's replicated records with its key (see [`crate::origin`]).
    pub fn origin_signer(&self) -> Result<OriginSigner, OriginError> {
        OriginSigner::new(&self.key_pem, self.chain[0].to_vec())
    }

    /// Verifies records' signatures against origin certificates from this mesh's CA.
    pub fn origin_verifier(&self) -> Result<OriginVerifier, TlsError> {
        OriginVerifier::new(self.roots.clone(), self.revoked.clone())
    }

    /// Who this certificate says we are.
    pub fn identity(&self) -> &CertIdentity {
        &self.identity
    }

    /// The server side: our certificate, and client certificates from the mesh CA that it has
    /// not revoked. An issuer (`certless_join`) also completes the handshake with a caller that
    /// presents no certificate, so a joining device can reach `Join`; a certificate that is
    /// presented must still chain to the mesh CA and not be revoked, and the node's certificate
    /// gate refuses every other service to a caller without one.
    pub fn server_config(&self, certless_join: bool) -> Result<Arc<ServerConfig>, TlsError> {
        let builder = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider());
        let builder = if certless_join {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        let inner = builder
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let verifier = MeshClientVerifier {
            inner,
            revoked: self.revoked.clone(),
        };
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("server certificate: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// A dialer that presents our certificate and accepts only servers from the mesh CA.
    pub fn dialer(&self) -> Dialer {
        Dialer::Tls(self.client.clone())
    }
}

/// A client without a certificate that accepts only servers whose chain leads to `ca`: how a
/// joining device talks to the issuer once it has checked the CA against its token's pin.
pub(crate) fn pinned_server_client(
    ca: CertificateDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add(ca)?;
    let verifier = MeshServerVerifier::new(Arc::new(roots))?;
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(client))
}

/// A client without a certificate that accepts any server certificate. Used for one call only,
/// `Join.GetCa`, whose answer the joiner checks against its token's pin before it sends anything
/// else (see [`crate::join`]).
pub(crate) fn any_server_client() -> Arc<ClientConfig> {
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(client)
}

/// Accepts any server certificate, but still checks that the server holds its key (the
/// handshake signatures), so the connection is at least private to whoever answered.
#[derive(Debug)]
struct AnyServer;

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Checks a server's chain against the mesh CA, ignoring the name it was dialed by (see the
/// module docs for why).
#[derive(Debug)]
pub(crate) struct MeshServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    /// Certificates refused although they chain to the CA (none for the pinned joiner).
    revoked: Option<RevokedSet>,
}

impl MeshServerVerifier {
    pub(crate) fn new(roots: Arc<RootCertStore>) -> Result<Self, TlsError> {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self {
            inner,
            revoked: None,
        })
    }

    /// Also refuses every certificate in `revoked`.
    pub(crate) fn refusing(mut self, revoked: RevokedSet) -> Self {
        self.revoked = Some(revoked);
        self
    }

    fn check_chain(&self, chain: &[CertificateDer<'static>]) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("agentmesh.invalid").expect("a valid DNS name literal");
        self.verify_chain(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    /// Checks that a node certificate chains to the CA (issued by it directly) as of `now`.
    pub(crate) fn check_at(
        &self,
        cert: &CertificateDer<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("agentmesh.invalid").expect("a valid DNS name literal");
        self.verify_server_cert(cert, &[], &name, &[], now)
            .map(|_| ())
    }

    /// The chain against the mesh CA, whatever the name.
    fn verify_chain(
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
}

/// A server presented a well-formed certificate that does not chain to the mesh CA: its
/// holder belongs to another mesh. Carried inside the handshake's error to the dialer, which
/// reports it as [`crate::DialError::ForeignMesh`] (a node then tells its operator how to bring
/// the other node in).
#[derive(Debug, thiserror::Error)]
#[error("certificate of `{}` is not from this mesh's CA ({cause})", .presented.common_name.as_deref().unwrap_or("?"))]
pub(crate) struct ForeignCertificate {
    /// Who the certificate says its holder is.
    pub(crate) presented: CertIdentity,
    /// What the chain check said (an unknown issuer, or a signature the CA did not make).
    cause: rustls::CertificateError,
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
        match self.verify_chain(end_entity, intermediates, server_name, ocsp_response, now) {
            // Another CA's certificate (all our CAs share the subject `agentmesh CA`, so a
            // foreign one can also fail as a bad signature): say who presented it. The TLS alert
            // becomes `certificate_unknown` instead of `unknown_ca`; the connection fails the same.
            Ok(verified) => match &self.revoked {
                Some(revoked)
                    if CertIdentity::from_der(end_entity)
                        .is_ok_and(|presented| revoked.contains(&presented.id)) =>
                {
                    Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::Revoked,
                    ))
                }
                _ => Ok(verified),
            },
            Err(rustls::Error::InvalidCertificate(
                cause @ (rustls::CertificateError::UnknownIssuer
                | rustls::CertificateError::BadSignature),
            )) => match CertIdentity::from_der(end_entity) {
                Ok(presented) => Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::Other(rustls::OtherError(Arc::new(
                        ForeignCertificate { presented, cause },
                    ))),
                )),
                Err(_) => Err(rustls::Error::InvalidCertificate(cause)),
            },
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

/// Checks a client's chain against the mesh CA (webpki's client verifier, which also decides
/// whether a certificate is required), then refuses a certificate the mesh CA revoked: the
/// handshake fails with the `certificate_revoked` alert, so a revoked device never gets a
/// connection to make calls on.
#[derive(Debug)]
struct MeshClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// Shared with the node, which adds to it as it learns revocations.
    revoked: RevokedSet,
}

impl ClientCertVerifier for MeshClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        match CertIdentity::from_der(end_entity) {
            Ok(presented) if self.revoked.contains(&presented.id) => Err(
                rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked),
            ),
            _ => Ok(verified),
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

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        CertRole,
        ca::{CA_CERT_FILE, ca_init, issue},
    };
    #[test]
    fn issued_certificates_load_and_carry_the_node_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca init");
        let (cert, key) =
            issue(dir.path(), "alpha", &["10.0.0.7".into()], CertRole::Node).expect("issue");
        let tls = MeshTls::load(&TlsFiles {
            ca: dir.path().join(CA_CERT_FILE),
            cert,
            key,
        })
        .expect("load");
        assert_eq!(tls.identity().common_name.as_deref(), Some("alpha"));
    }

    #[test]
    fn issued_certificates_say_their_role() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca init");
        for (name, role) in [("node-a", CertRole::Node), ("operator", CertRole::Client)] {
            let (cert, key) = issue(dir.path(), name, &[], role).expect("issue");
            let tls = MeshTls::load(&TlsFiles {
                ca: dir.path().join(CA_CERT_FILE),
                cert,
                key,
            })
            .expect("load");
            assert_eq!(tls.identity().role, Some(role), "{name}");
        }
    }

    #[test]
    fn a_certificate_from_another_ca_is_rejected_at_load() {
        let ours = tempfile::tempdir().expect("tempdir");
        let theirs = tempfile::tempdir().expect("tempdir");
        ca_init(ours.path()).expect("ca");
        ca_init(theirs.path()).expect("ca");
        let (cert, key) = issue(theirs.path(), "mallory", &[], CertRole::Node).expect("issue");
        let err = MeshTls::load(&TlsFiles {
            ca: ours.path().join(CA_CERT_FILE),
            cert,
            key,
        })
        .expect_err("foreign certificate must not load");
        assert!(matches!(err, TlsError::NotFromCa { .. }), "{err}");
    }
}
