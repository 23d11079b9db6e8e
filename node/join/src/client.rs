//! The joiner's side of a join token: redeeming it at its issuer ([`redeem`]) and storing what
//! it gives, for a node ([`join_node`]) or an operator's `mesh-cli` ([`join_client`]).
//!
//! The joiner asks the issuer for the CA without verifying the server, checks its SHA-256
//! against the token's pin, reconnects verifying the server against that CA, and only then
//! sends the secret with a CSR for a key it generated itself. A server that is not the pinned
//! mesh's issuer never sees the secret.
//!
//! This module never writes outside the files it is given, and deletes nothing.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use mesh_cert::{
    CertRole, TlsError,
    ca::{KeyType, new_key_and_csr},
    pem::{pem_certs, read, write_new},
};
use mesh_proto::v1 as pb;
use mesh_tls::{
    CertificateRefusal, DialError, Dialer, MeshTls, TlsFiles,
    deadline::{DEADLINES, within},
    verify::{any_server_client, pinned_server_client},
};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use sha2::{Digest, Sha256};

use crate::{
    bootstrap,
    token::{JoinToken, TokenError},
};

/// What a redeemed token gives: the CA, and a certificate for a key made here.
#[derive(Clone)]
pub struct Joined {
    /// The mesh CA certificate, PEM (the one the token pinned).
    pub ca_pem: String,
    /// The issued certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM; it was generated here and never sent.
    pub key_pem: String,
}

impl fmt::Debug for Joined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Joined").finish_non_exhaustive()
    }
}

/// Errors joining a mesh.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The token cannot be read.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The issuer cannot be reached.
    #[error("cannot reach the issuer named in the token: {0}")]
    Dial(#[from] DialError),
    /// The server's CA is not the one the token pins; the secret was not sent.
    #[error(
        "the node at {issuer} serves a CA whose SHA-256 is {served}, but the token pins {pinned}: it is not the issuer of this token's mesh (wrong address, or someone in between), so the token's secret was not sent"
    )]
    WrongCa {
        /// Where the token pointed.
        issuer: String,
        /// What the token pins.
        pinned: String,
        /// What the server sent.
        served: String,
    },
    /// The issuer answered with an error (its message says why).
    #[error("the issuer at {issuer} refused: {message}")]
    Refused {
        /// Where the token pointed.
        issuer: String,
        /// Its gRPC status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The token is for the other kind of certificate.
    #[error("this is a join token for a {role}; {hint}")]
    WrongRole {
        /// The token's role.
        role: CertRole,
        /// What to run instead.
        hint: &'static str,
    },
    /// The data dir already belongs to another mesh.
    #[error(
        "{} already holds the CA of another mesh (SHA-256 {held}); this token is for {pinned}: use another --data-dir, or remove {} to leave that mesh", dir.display(), dir.display()
    )]
    OtherMesh {
        /// The CA directory.
        dir: PathBuf,
        /// The fingerprint of the CA held there.
        held: String,
        /// The token's pin.
        pinned: String,
    },
    /// Certificates could not be made, checked or written.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Redeems `token` at its issuer for a certificate named `name`: fetches the CA unverified,
/// checks it against the pin (refusing before the secret is sent when it differs), reconnects
/// verifying the server against it, and sends the secret and a CSR for a fresh key of
/// `key_type`.
pub async fn redeem(token: &JoinToken, name: &str, key_type: KeyType) -> Result<Joined, JoinError> {
    let (key, csr_pem) = new_key_and_csr(name, key_type)?;
    let refused = |status: tonic::Status| JoinError::Refused {
        issuer: token.issuer.clone(),
        code: status.code(),
        message: status.message().to_owned(),
    };

    let open = Dialer::Tls(any_server_client());
    let mut client = join_service(open.connect(&token.issuer).await?.channel);
    let limit = DEADLINES.unary;
    let ca_pem = within(limit, "Join.GetCa", client.get_ca(pb::GetCaRequest {}))
        .await
        .map_err(refused)?
        .into_inner()
        .ca_pem;
    let ca_der = first_cert(&ca_pem).ok_or_else(|| JoinError::WrongCa {
        issuer: token.issuer.clone(),
        pinned: token.ca_fingerprint.clone(),
        served: "(no certificate)".into(),
    })?;
    let served = hex::encode(Sha256::digest(&ca_der));
    if served != token.ca_fingerprint {
        return Err(JoinError::WrongCa {
            issuer: token.issuer.clone(),
            pinned: token.ca_fingerprint.clone(),
            served,
        });
    }

    // From here on the server must prove it holds a certificate of the pinned CA.
    let pinned = Dialer::Tls(pinned_server_client(ca_der)?);
    let mut client = join_service(pinned.connect(&token.issuer).await?.channel);
    let redeem = pb::RedeemRequest {
        secret: token.secret.to_string(),
        name: name.to_owned(),
        csr_pem,
    };
    let cert_pem = within(limit, "Join.Redeem", client.redeem(redeem))
        .await
        .map_err(refused)?
        .into_inner()
        .cert_pem;
    Ok(Joined {
        ca_pem,
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

fn join_service(
    channel: tonic::transport::Channel,
) -> pb::join_client::JoinClient<tonic::transport::Channel> {
    pb::join_client::JoinClient::new(channel).max_decoding_message_size(64 * 1024)
}

fn first_cert(pem: &str) -> Option<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

/// What [`join_node`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeJoin {
    /// The node got its certificate just now.
    Joined,
    /// The data dir already holds a certificate from the pinned CA; nothing was sent.
    AlreadyMember,
    /// The data dir held a certificate the mesh CA revoked (the issuer refused it): the node
    /// got a new one with the token; the revoked certificate and key were moved to these files.
    Rejoined {
        /// Where the revoked certificate and its key now are.
        set_aside: Vec<PathBuf>,
    },
}

/// Joins a node: redeems a `node` token for `name` and stores the CA, the certificate and the
/// key in the zero-config layout under `data_dir` (`<data_dir>/tls`, without a CA key), with the
/// issuer's address remembered as a peer to dial at every start. When the data dir already
/// holds a certificate for `name` from the pinned CA, it does nothing (so `--join` may stay in a
/// service's command line), unless the issuer refuses that certificate as revoked: then it
/// joins again, setting the revoked files aside. When it holds another mesh's CA, it refuses.
pub async fn join_node(
    data_dir: &Path,
    name: &str,
    token: &JoinToken,
) -> Result<NodeJoin, JoinError> {
    if token.secret.claims.role != CertRole::Node {
        return Err(JoinError::WrongRole {
            role: token.secret.claims.role,
            hint: "on the operator's machine run `mesh-cli join TOKEN` instead",
        });
    }
    let dir = bootstrap::tls_dir(data_dir);
    let files = bootstrap::files_of(&dir, name);
    if files.ca.exists() {
        let held = fingerprint_of(&files.ca)?;
        if held == token.ca_fingerprint {
            if files.cert.exists() {
                if !revoked_at(&files, &token.issuer).await {
                    return Ok(NodeJoin::AlreadyMember);
                }
                // Redeemed first: a failed redemption leaves the node as it was.
                let joined = redeem(token, name, KeyType::Ed25519).await?;
                let set_aside = set_aside(&files)?;
                store(&joined, &files)?;
                bootstrap::remember_issuer(data_dir, &token.issuer)?;
                return Ok(NodeJoin::Rejoined { set_aside });
            }
            return Err(TlsError::NoCaKey {
                dir,
                name: name.to_owned(),
            }
            .into());
        }
        return Err(JoinError::OtherMesh {
            dir,
            held,
            pinned: token.ca_fingerprint.clone(),
        });
    }
    let joined = redeem(token, name, KeyType::Ed25519).await?;
    std::fs::create_dir_all(&dir).map_err(|e| TlsError::io("create", &dir, e))?;
    store(&joined, &files)?;
    bootstrap::remember_issuer(data_dir, &token.issuer)?;
    Ok(NodeJoin::Joined)
}

/// Joins an operator's `mesh-cli`: redeems a `client` token for a key of `key_type` and writes
/// `ca.pem`, `mesh-cli.pem` and `mesh-cli.key` (readable by the owner only) into `config_dir`
/// (see [`bootstrap::user_cli_files`]). Refuses to overwrite any of them.
pub async fn join_client(
    config_dir: &Path,
    name: &str,
    token: &JoinToken,
    key_type: KeyType,
) -> Result<TlsFiles, JoinError> {
    if token.secret.claims.role != CertRole::Client {
        return Err(JoinError::WrongRole {
            role: token.secret.claims.role,
            hint: "on the new device run `mesh-node --join TOKEN` instead",
        });
    }
    let files = bootstrap::user_cli_files(config_dir);
    for path in [&files.ca, &files.cert, &files.key] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()).into());
        }
    }
    let joined = redeem(token, name, key_type).await?;
    std::fs::create_dir_all(config_dir).map_err(|e| TlsError::io("create", config_dir, e))?;
    store(&joined, &files)?;
    Ok(files)
}

/// Whether the node at `issuer` refuses the certificate in `files` as revoked. It proves
/// itself a member of the mesh first (the dialer checks its certificate against the CA), so a
/// stranger cannot make a node give up its certificate; unreachable is not revoked.
async fn revoked_at(files: &TlsFiles, issuer: &str) -> bool {
    let Ok(tls) = MeshTls::load(files) else {
        return false;
    };
    tls.dialer().certificate_refusal(issuer).await == Some(CertificateRefusal::Revoked)
}

/// Moves a revoked certificate and its key out of the way (`NAME.pem.revoked`, or
/// `NAME.pem.revoked-N` when that is taken), keeping them: nothing is deleted.
fn set_aside(files: &TlsFiles) -> Result<Vec<PathBuf>, TlsError> {
    let mut moved = Vec::new();
    for path in [&files.cert, &files.key] {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".revoked");
        let mut aside = PathBuf::from(aside);
        for n in 2.. {
            if !aside.exists() {
                break;
            }
            let mut numbered = path.as_os_str().to_owned();
            numbered.push(format!(".revoked-{n}"));
            aside = PathBuf::from(numbered);
        }
        std::fs::rename(path, &aside).map_err(|e| TlsError::io("set aside", path, e))?;
        moved.push(aside);
    }
    Ok(moved)
}

/// Writes the files (the key readable by its owner only) and checks that they load: the
/// certificate chains to the CA and matches the key. A CA certificate already there is kept
/// (a node joining again holds the same one).
fn store(joined: &Joined, files: &TlsFiles) -> Result<(), TlsError> {
    if !files.ca.exists() {
        write_new(&files.ca, joined.ca_pem.as_bytes(), false)?;
    }
    write_new(&files.key, joined.key_pem.as_bytes(), true)?;
    write_new(&files.cert, joined.cert_pem.as_bytes(), false)?;
    MeshTls::load(files).map(|_| ())
}

/// Hex SHA-256 of the first certificate in a PEM file.
pub fn fingerprint_of(path: &Path) -> Result<String, TlsError> {
    let pem = read(path)?;
    let der = pem_certs(path, &pem)?.swap_remove(0);
    Ok(hex::encode(Sha256::digest(&der)))
}

#[cfg(test)]
mod tests {
    use mesh_cert::ca::CA_CERT_FILE;

    use super::*;
    use crate::test_support::signer;

    #[test]
    fn a_signed_csr_gets_the_role_and_name_the_issuer_gives_and_the_callers_key() {
        let (dir, ca) = signer();
        let (key, csr) = new_key_and_csr("laptop", KeyType::Ed25519).expect("csr");
        let cert_pem = ca.sign_csr(&csr, "laptop", CertRole::Client).expect("sign");
        let files = TlsFiles {
            ca: dir.path().join(CA_CERT_FILE),
            cert: dir.path().join("laptop.pem"),
            key: dir.path().join("laptop.key"),
        };
        std::fs::write(&files.cert, cert_pem).expect("write");
        std::fs::write(&files.key, key.serialize_pem()).expect("write");
        let tls = MeshTls::load(&files).expect("chains to the CA and matches the key");
        assert_eq!(tls.identity().role, Some(CertRole::Client));
        assert_eq!(tls.identity().common_name.as_deref(), Some("laptop"));
        assert!(matches!(
            ca.sign_csr(
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                "x",
                CertRole::Node
            ),
            Err(TlsError::BadCsr(_))
        ));
    }
}
