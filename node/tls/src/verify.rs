//! The verifiers of the mesh's TLS: a server's certificate as every client checks it
//! ([`MeshServerVerifier`]: the chain to the mesh CA whatever the name, revoked certificates
//! refused, and a node of another mesh named), a client's as every server checks it
//! ([`MeshClientVerifier`]), and the two client configurations of a device that is joining and
//! has no certificate yet ([`pinned_server_client`], [`any_server_client`]).
//!
//! The chain itself is checked by [`mesh_cert::MeshChain`]; what to do with a verified peer is
//! the caller's.

use std::sync::Arc;

use mesh_cert::{CertIdentity, MeshChain, RevokedSet, TlsError, chain::provider};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
    server::danger::{ClientCertVerified, ClientCertVerifier},
};

/// A client without a certificate that accepts only servers whose chain leads to `ca`: how a
/// joining device talks to the issuer once it has checked the CA against its token's pin.
pub fn pinned_server_client(ca: CertificateDer<'static>) -> Result<Arc<ClientConfig>, TlsError> {
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

/// A client without a certificate that accepts any server certificate. For one call only,
/// `Join.GetCa`, whose answer the joiner checks against its token's pin before it sends anything
/// else (`mesh-join`); nothing else may dial with it.
pub fn any_server_client() -> Arc<ClientConfig> {
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

/// Checks a server's chain against the mesh CA, ignoring the name it was dialed by (see
/// [`mesh_cert::chain`] for why).
#[derive(Debug)]
pub(crate) struct MeshServerVerifier {
    chain: MeshChain,
    /// Certificates refused although they chain to the CA (none for the pinned joiner).
    revoked: Option<RevokedSet>,
}

impl MeshServerVerifier {
    pub(crate) fn new(roots: Arc<RootCertStore>) -> Result<Self, TlsError> {
        Ok(Self {
            chain: MeshChain::new(roots)?,
            revoked: None,
        })
    }

    /// Also refuses every certificate in `revoked`.
    pub(crate) fn refusing(mut self, revoked: RevokedSet) -> Self {
        self.revoked = Some(revoked);
        self
    }

    /// The chain of a certificate file as of now (see [`MeshChain::check_chain`]).
    pub(crate) fn check_chain(
        &self,
        chain: &[CertificateDer<'static>],
    ) -> Result<(), rustls::Error> {
        self.chain.check_chain(chain)
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
        match self
            .chain
            .verify(end_entity, intermediates, server_name, ocsp_response, now)
        {
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
        self.chain
            .webpki()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain
            .webpki()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.webpki().supported_verify_schemes()
    }
}

/// Checks a client's chain against the mesh CA (webpki's client verifier, which also decides
/// whether a certificate is required), then refuses a certificate the mesh CA revoked: the
/// handshake fails with the `certificate_revoked` alert, so a revoked device never gets a
/// connection to make calls on.
#[derive(Debug)]
pub(crate) struct MeshClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// Shared with the node, which adds to it as it learns revocations.
    revoked: RevokedSet,
}

impl MeshClientVerifier {
    /// webpki's client verifier `inner` (built on the mesh CA), also refusing `revoked`.
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, revoked: RevokedSet) -> Self {
        Self { inner, revoked }
    }
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
