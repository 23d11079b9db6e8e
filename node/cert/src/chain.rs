//! Whether a certificate chains to the mesh CA ([`MeshChain`]), and the crypto provider every
//! check here and in `mesh-tls` names explicitly, so library users (tests, the CLI) do not
//! depend on a process-wide default being installed.
//!
//! Trust is membership: a certificate is accepted when it chains to the mesh CA, and its holder's
//! identity is its public key (see [`crate::cert`]), not the name or address it was dialed at.
//! So the chain check ignores a name mismatch: a node found by mDNS at 10.0.0.7 or a static peer
//! named by IP is verified the same way, and discovery checks the presented identity against
//! what was advertised. What a verifier does beyond the chain (refusing revoked certificates,
//! naming a node of another mesh) is `mesh-tls`'s; this module only says whether the CA vouches.

use std::sync::Arc;

use rustls::{
    RootCertStore,
    client::{
        WebPkiServerVerifier,
        danger::{ServerCertVerified, ServerCertVerifier},
    },
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, ServerName, UnixTime},
};

use crate::TlsError;

/// The `ring` provider, named by every rustls configuration and verifier of the mesh.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// The mesh CA as a trust anchor for node certificates (server and client usage), checked
/// whatever name the certificate is presented under.
#[derive(Debug)]
pub struct MeshChain {
    inner: Arc<WebPkiServerVerifier>,
}

impl MeshChain {
    /// Checks chains against `roots` (the mesh CA).
    pub fn new(roots: Arc<RootCertStore>) -> Result<Self, TlsError> {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self { inner })
    }

    /// Checks a certificate and the ones after it (its chain, as a PEM file holds it) as of now.
    pub fn check_chain(&self, chain: &[CertificateDer<'static>]) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("agentmesh.invalid").expect("a valid DNS name literal");
        self.verify(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    /// Checks that a node certificate chains to the CA (issued by it directly) as of `now`.
    pub fn check_at(&self, cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("agentmesh.invalid").expect("a valid DNS name literal");
        self.verify(cert, &[], &name, &[], now).map(|_| ())
    }

    /// The chain against the mesh CA, whatever the name: a server verifier's first check, with
    /// the arguments rustls gives one.
    pub fn verify(
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

    /// The webpki verifier underneath, for the handshake signatures a server verifier checks
    /// after the chain.
    pub fn webpki(&self) -> &WebPkiServerVerifier {
        &self.inner
    }
}
