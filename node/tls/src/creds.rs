//! A node's or client's credentials: loading and checking its three PEM files ([`TlsFiles`],
//! [`MeshTls`]), and the TLS configurations made from them: the client side every dial uses and
//! the server side, whose client verifier also refuses revoked certificates. The verifiers
//! themselves are [`crate::verify`]'s.
//!
//! Every rustls config here names the `ring` provider explicitly, so library users (tests, the
//! CLI) do not depend on a process-wide default being installed.

use std::{path::PathBuf, sync::Arc};

use mesh_cert::{
    CertIdentity, CertRole, OriginError, OriginSigner, OriginVerifier, RevokedSet, TlsError,
    chain::provider,
    pem::{pem_certs, read},
};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::WebPkiClientVerifier,
};

use crate::{
    dial::Dialer,
    verify::{MeshClientVerifier, MeshServerVerifier},
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

    /// Signs this node's replicated records with its key (see [`mesh_cert::origin`]).
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
        let verifier = MeshClientVerifier::new(inner, self.revoked.clone());
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

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use mesh_cert::ca::{
        CA_CERT_FILE, CA_KEY_FILE, CaSigner, ED25519_PKCS8_V1_PREFIX, KeyType, ca_init, issue,
        issue_with, new_key_and_csr,
    };
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;

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

    /// The DER of the PEM private key in `path`.
    fn key_der(path: &Path) -> Vec<u8> {
        use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
        let pem = read(path).expect("key file");
        PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .expect("a PEM private key")
            .secret_der()
            .to_vec()
    }

    /// The version of a PKCS#8 `PrivateKeyInfo` (0: v1, 1: v2), the INTEGER after the outer
    /// SEQUENCE's header.
    fn pkcs8_version(der: &[u8]) -> u8 {
        let header = match der[1] {
            short if short < 0x80 => 2,
            long => 2 + usize::from(long & 0x7f),
        };
        assert_eq!(
            der[header..header + 2],
            [0x02, 0x01],
            "an INTEGER of one byte"
        );
        der[header + 2]
    }

    /// Regression (issue 26): Ed25519 keys were written as PKCS#8 v2 (with the public key), which
    /// OpenSSL 3.0, Python's `ssl` and grpcio cannot read. Every key written now is v1: version
    /// 0, and for Ed25519 exactly the 48 bytes of RFC 8410's form; and it still loads here.
    #[test]
    fn issued_keys_are_pkcs8_v1_and_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        let (ed_cert, ed_key) = issue(dir.path(), "alpha", &[], CertRole::Node).expect("ed25519");
        let der = key_der(&ed_key);
        assert_eq!(der.len(), 48, "{der:02x?}");
        assert_eq!(der[..16], ED25519_PKCS8_V1_PREFIX, "{der:02x?}");
        let (p_cert, p_key) =
            issue_with(dir.path(), "beta", &[], CertRole::Client, KeyType::P256).expect("p256");
        let (_, csr) = new_key_and_csr("gamma", KeyType::Ed25519).expect("csr");
        assert!(csr.contains("CERTIFICATE REQUEST"));
        for (key, cert) in [(&ed_key, &ed_cert), (&p_key, &p_cert)] {
            assert_eq!(pkcs8_version(&key_der(key)), 0, "{}", key.display());
            let tls = MeshTls::load(&TlsFiles {
                ca: dir.path().join(CA_CERT_FILE),
                cert: cert.clone(),
                key: key.clone(),
            })
            .expect("loads");
            tls.origin_signer()
                .expect("signs records")
                .sign(b"x")
                .expect("sign");
        }
        let ca_der = key_der(&dir.path().join(CA_KEY_FILE));
        assert_eq!(pkcs8_version(&ca_der), 0, "the CA key is v1 too");
    }

    /// Keys written as PKCS#8 v2 before issue 26 still load, for TLS and for signing records:
    /// nothing already stored is lost.
    #[test]
    fn a_key_written_as_pkcs8_v2_still_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        let old = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ring's v2 key");
        assert_eq!(pkcs8_version(&old.serialize_der()), 1, "v2 as before");
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "old");
        let csr = params
            .serialize_request(&old)
            .expect("csr")
            .pem()
            .expect("pem");
        let ca = CaSigner::load(
            &dir.path().join(CA_CERT_FILE),
            &dir.path().join(CA_KEY_FILE),
        )
        .expect("ca");
        let files = TlsFiles {
            ca: dir.path().join(CA_CERT_FILE),
            cert: dir.path().join("old.pem"),
            key: dir.path().join("old.key"),
        };
        fs::write(
            &files.cert,
            ca.sign_csr(&csr, "old", CertRole::Node).expect("sign"),
        )
        .expect("write");
        fs::write(&files.key, old.serialize_pem()).expect("write");
        let tls = MeshTls::load(&files).expect("a v2 key loads");
        tls.server_config(false).expect("serves with it");
        tls.origin_signer()
            .expect("signs records")
            .sign(b"x")
            .expect("sign");
    }
}
