//! Joining a mesh with a token: the token itself (made by whoever holds the CA key, checked by
//! an issuer node), and the joiner's side of redeeming it.
//!
//! A token, modelled on k3s's `K10<ca-hash>::<credentials>` tokens, reads
//! `agentmesh-join:<ca-sha256>:<id>.<role>.<expires>.<uses>.<mac>@<host>:<port>`:
//! the SHA-256 of the mesh CA certificate (the pin), the claims (a random id, the role the
//! certificate will have, the Unix second it expires, how many devices may use it), an
//! HMAC-SHA256 over the pin and the claims, and the issuer to redeem it at. The MAC key is
//! derived (HKDF-SHA256) from the CA private key, so `mesh-cli token create` stores nothing and
//! an issuer checks a token without any list of tokens; it only counts redemptions per id. The
//! claims are readable by anyone holding the token; the MAC is what makes it a secret.
//!
//! The joiner ([`redeem`]) asks the issuer for the CA without verifying the server, checks its
//! SHA-256 against the pin, reconnects verifying the server against that CA, and only then sends
//! the secret with a CSR for a key it generated itself. A server that is not the pinned mesh's
//! issuer never sees the secret.
//!
//! This module decides nothing about whether a token may still be used (the issuer does, with
//! its count) and never writes outside the files it is given.

use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_proto::v1 as pb;
use ring::{hkdf, hmac, rand::SecureRandom};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use sha2::{Digest, Sha256};

use crate::{
    CertRole, DialError, Dialer, MeshTls, TlsError, TlsFiles, bootstrap,
    ca::{KeyType, new_key_and_csr},
    deadline::{DEADLINES, within},
    pem::{read, write_new},
    tls,
};

/// What every token starts with.
pub const TOKEN_PREFIX: &str = "agentmesh-join:";
/// Longest token accepted (a real one is about 200 bytes).
pub const MAX_TOKEN_BYTES: usize = 512;
/// Longest secret part accepted by an issuer.
pub const MAX_SECRET_BYTES: usize = 256;
/// Largest CSR an issuer accepts (an Ed25519 one is about 300 bytes).
pub const MAX_CSR_BYTES: usize = 4096;
/// Longest life a token may be given.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most devices one token may join.
pub const MAX_USES: u32 = 100;
/// Longest issuer address (`host:port`) in a token.
const MAX_ISSUER_BYTES: usize = 255;
/// Bytes of randomness in a token id.
const ID_BYTES: usize = 8;

/// What a token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// Random hex id, under which the issuer counts redemptions.
    pub id: String,
    /// The role of the certificates it is redeemed for.
    pub role: CertRole,
    /// Unix second after which it is refused.
    pub expires: u64,
    /// How many times it may be redeemed.
    pub uses: u32,
}

/// The part of a token sent to the issuer: the claims and their MAC.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// What it grants.
    pub claims: Claims,
    mac: [u8; 32],
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The MAC is the secret; it never reaches a log.
        f.debug_struct("Secret")
            .field("claims", &self.claims)
            .finish_non_exhaustive()
    }
}

/// A whole join token: the CA pin, the secret, and where to redeem it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Hex SHA-256 of the mesh CA certificate (DER).
    pub ca_fingerprint: String,
    /// The claims and their MAC.
    pub secret: Secret,
    /// The issuer, `host:port`.
    pub issuer: String,
}

/// Errors reading, making or checking a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The text is not a token; says which part is wrong.
    #[error("malformed join token: {0}")]
    Malformed(String),
    /// The MAC does not match: not made with this CA's key, or altered.
    #[error(
        "this join token was not made with this mesh's CA key, or it was altered; create a new one with `mesh-cli token create` where the CA key is"
    )]
    Forged,
    /// A token may not live that long (or not at all).
    #[error("--ttl must be between 1 second and {} hours", MAX_TTL.as_secs() / 3600)]
    BadTtl,
    /// A token must be usable at least once and at most [`MAX_USES`] times.
    #[error("--uses must be between 1 and {MAX_USES}")]
    BadUses,
    /// The issuer address is not `host:port`.
    #[error(
        "--issuer `{0}` is not HOST:PORT (an address of a node with the CA key that the new device can reach)"
    )]
    BadIssuer(String),
    /// The token was to come from standard input, which could not be read.
    #[error("cannot read the join token from standard input: {0}")]
    Stdin(std::io::Error),
}

impl Claims {
    fn mac_input(&self, ca_fingerprint: &str) -> String {
        format!(
            "agentmesh-join-v1\n{ca_fingerprint}\n{}\n{}\n{}\n{}",
            self.id, self.role, self.expires, self.uses
        )
    }
}

/// The key tokens are authenticated with: HKDF-SHA256 of the CA private key, so only the CA's
/// holders can make a token, and an issuer checks one without storing anything.
pub struct TokenKey(hmac::Key);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey")
    }
}

impl TokenKey {
    /// Derives the key from the CA key (PKCS#8 DER).
    pub(crate) fn derive(ca_key_der: &[u8]) -> Self {
        let prk =
            hkdf::Salt::new(hkdf::HKDF_SHA256, b"agentmesh join token v1").extract(ca_key_der);
        let okm = prk
            .expand(&[b"hmac-sha256"], hmac::HMAC_SHA256)
            .expect("32 bytes is within HKDF-SHA256's output limit");
        Self(hmac::Key::from(okm))
    }

    /// A new secret granting `role` to `uses` devices until `expires` (Unix seconds), for the
    /// CA with this fingerprint.
    pub fn mint(
        &self,
        ca_fingerprint: &str,
        role: CertRole,
        expires: u64,
        uses: u32,
    ) -> Result<Secret, TokenError> {
        if !(1..=MAX_USES).contains(&uses) {
            return Err(TokenError::BadUses);
        }
        let mut id = [0u8; ID_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| TokenError::Malformed("the system RNG failed".into()))?;
        let claims = Claims {
            id: hex::encode(id),
            role,
            expires,
            uses,
        };
        let tag = hmac::sign(&self.0, claims.mac_input(ca_fingerprint).as_bytes());
        let mut mac = [0u8; 32];
        mac.copy_from_slice(tag.as_ref());
        Ok(Secret { claims, mac })
    }

    /// Whether `secret` was made with this key for the CA with this fingerprint (constant time).
    pub fn check(&self, ca_fingerprint: &str, secret: &Secret) -> Result<(), TokenError> {
        hmac::verify(
            &self.0,
            secret.claims.mac_input(ca_fingerprint).as_bytes(),
            &secret.mac,
        )
        .map_err(|_| TokenError::Forged)
    }
}

/// Makes a token for the CA in `ca` (its certificate and key): `role`, valid for `ttl`, for
/// `uses` devices, to be redeemed at `issuer` (`host:port`).
pub fn create_token(
    ca: &crate::ca::CaSigner,
    role: CertRole,
    ttl: Duration,
    uses: u32,
    issuer: &str,
) -> Result<JoinToken, TokenError> {
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(TokenError::BadTtl);
    }
    check_issuer(issuer).map_err(|_| TokenError::BadIssuer(issuer.to_owned()))?;
    let expires = unix_now() + ttl.as_secs().max(1);
    Ok(JoinToken {
        ca_fingerprint: ca.fingerprint().to_owned(),
        secret: ca.token_key().mint(ca.fingerprint(), role, expires, uses)?,
        issuer: issuer.to_owned(),
    })
}

/// A token argument that means "read the token from standard input" (`--join -`).
pub const FROM_STDIN: &str = "-";

/// The token `given` on a command line or in an environment variable; [`FROM_STDIN`] reads it
/// from `input` instead: its first line, at most [`MAX_TOKEN_BYTES`] and a line end. A token in
/// an argument shows in `ps` and the shell's history; one on standard input or in the
/// environment does not.
pub fn read_token(given: &str, input: impl std::io::BufRead) -> Result<JoinToken, TokenError> {
    use std::io::BufRead;
    if given != FROM_STDIN {
        return given.parse();
    }
    let mut line = String::new();
    input
        .take(MAX_TOKEN_BYTES as u64 + 2)
        .read_line(&mut line)
        .map_err(TokenError::Stdin)?;
    if line.trim().is_empty() {
        return Err(TokenError::Malformed(
            "standard input held no token; pipe in the one line `mesh-cli token create` printed"
                .into(),
        ));
    }
    line.parse()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn check_issuer(issuer: &str) -> Result<(), String> {
    if issuer.len() > MAX_ISSUER_BYTES {
        return Err(format!("is longer than {MAX_ISSUER_BYTES} bytes"));
    }
    let (host, port) = issuer.rsplit_once(':').ok_or("has no `:PORT` at its end")?;
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("has a port that is not 1-65535")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err("has a host that is neither an IP address nor a host name".into())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.claims;
        write!(
            f,
            "{}.{}.{}.{}.{}",
            c.id,
            c.role,
            c.expires,
            c.uses,
            hex::encode(self.mac)
        )
    }
}

impl FromStr for Secret {
    type Err = TokenError;

    fn from_str(text: &str) -> Result<Self, TokenError> {
        let bad = |what: &str| TokenError::Malformed(what.to_owned());
        if text.len() > MAX_SECRET_BYTES {
            return Err(bad(&format!(
                "the secret is {} bytes, more than {MAX_SECRET_BYTES}",
                text.len()
            )));
        }
        let parts: Vec<&str> = text.split('.').collect();
        let [id, role, expires, uses, mac] = parts[..] else {
            return Err(bad(
                "the secret must have five parts separated by `.`: id.role.expires.uses.mac",
            ));
        };
        if id.len() != 2 * ID_BYTES || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(&format!("the id must be {} hex digits", 2 * ID_BYTES)));
        }
        let role: CertRole = role
            .parse()
            .map_err(|_| bad("the role must be `node` or `client`"))?;
        let expires: u64 = expires
            .parse()
            .map_err(|_| bad("the expiry must be a Unix time in seconds"))?;
        let uses: u32 = uses
            .parse()
            .map_err(|_| bad("the number of uses must be a whole number"))?;
        let mut raw = [0u8; 32];
        hex::decode_to_slice(mac, &mut raw).map_err(|_| bad("the MAC must be 64 hex digits"))?;
        Ok(Self {
            claims: Claims {
                id: id.to_ascii_lowercase(),
                role,
                expires,
                uses,
            },
            mac: raw,
        })
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TOKEN_PREFIX}{}:{}@{}",
            self.ca_fingerprint, self.secret, self.issuer
        )
    }
}

impl FromStr for JoinToken {
    type Err = TokenError;

    fn from_str(text: &str) -> Result<Self, TokenError> {
        let bad = |what: String| TokenError::Malformed(what);
        let text = text.trim();
        if text.len() > MAX_TOKEN_BYTES {
            return Err(bad(format!(
                "it is {} bytes, more than the {MAX_TOKEN_BYTES} a token can have; copy the one line `mesh-cli token create` printed",
                text.len()
            )));
        }
        let rest = text.strip_prefix(TOKEN_PREFIX).ok_or_else(|| {
            bad(format!(
                "it does not start with `{TOKEN_PREFIX}`; create one with `mesh-cli token create` where the CA key is"
            ))
        })?;
        let (body, issuer) = rest
            .rsplit_once('@')
            .ok_or_else(|| bad("it has no `@HOST:PORT` of the issuer at its end".into()))?;
        check_issuer(issuer).map_err(|e| bad(format!("the issuer `{issuer}` {e}")))?;
        let (fingerprint, secret) = body
            .split_once(':')
            .ok_or_else(|| bad("it has no `:` between the CA fingerprint and the secret".into()))?;
        if fingerprint.len() != 64 || !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(
                "the CA fingerprint must be 64 hex digits (a SHA-256)".into()
            ));
        }
        Ok(Self {
            ca_fingerprint: fingerprint.to_ascii_lowercase(),
            secret: secret.parse()?,
            issuer: issuer.to_owned(),
        })
    }
}

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

    let open = Dialer::Tls(tls::any_server_client());
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
    let pinned = Dialer::Tls(tls::pinned_server_client(ca_der)?);
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
    tls.dialer().certificate_refusal(issuer).await == Some(crate::CertificateRefusal::Revoked)
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
    let der = crate::pem::pem_certs(path, &pem)?.swap_remove(0);
    Ok(hex::encode(Sha256::digest(&der)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{CA_CERT_FILE, CA_KEY_FILE, CaSigner, ca_init};

    fn signer() -> (tempfile::TempDir, CaSigner) {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        let signer = CaSigner::load(
            &dir.path().join(CA_CERT_FILE),
            &dir.path().join(CA_KEY_FILE),
        )
        .expect("load ca");
        (dir, signer)
    }

    #[test]
    fn a_token_reads_back_as_written_and_checks_with_its_ca() {
        let (_dir, ca) = signer();
        let token = create_token(
            &ca,
            CertRole::Node,
            Duration::from_secs(3600),
            2,
            "10.0.0.7:7700",
        )
        .expect("token");
        let text = token.to_string();
        assert!(text.starts_with("agentmesh-join:"), "{text}");
        assert!(text.len() < 250, "{} bytes: {text}", text.len());
        let back: JoinToken = text.parse().expect("parse");
        assert_eq!(back, token);
        assert_eq!(back.secret.claims.uses, 2);
        ca.token_key()
            .check(ca.fingerprint(), &back.secret)
            .expect("genuine");
    }

    #[test]
    fn a_token_is_refused_by_another_ca_and_when_any_claim_is_changed() {
        let (_a, ours) = signer();
        let (_b, theirs) = signer();
        let token = create_token(&ours, CertRole::Client, Duration::from_secs(60), 1, "h:1")
            .expect("token");
        assert!(matches!(
            theirs
                .token_key()
                .check(theirs.fingerprint(), &token.secret),
            Err(TokenError::Forged)
        ));
        let text = token.secret.to_string();
        let claims = &token.secret.claims;
        for altered in [
            text.replace(".client.", ".node."),
            text.replace(
                &format!(".{}.", claims.expires),
                &format!(".{}.", claims.expires + 1),
            ),
            text.replace(".1.", ".9."),
        ] {
            assert_ne!(altered, text);
            let secret: Secret = altered.parse().expect("still well-formed");
            assert!(
                matches!(
                    ours.token_key().check(ours.fingerprint(), &secret),
                    Err(TokenError::Forged)
                ),
                "{altered}"
            );
        }
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        let fp = "a".repeat(64);
        let secret = format!("{}.node.1.1.{}", "0".repeat(16), "b".repeat(64));
        let cases = [
            ("K10abc::server:xyz".to_owned(), "does not start with"),
            (format!("agentmesh-join:{fp}:{secret}"), "no `@HOST:PORT`"),
            (format!("agentmesh-join:{fp}:{secret}@host"), "no `:PORT`"),
            (format!("agentmesh-join:{fp}:{secret}@host:0"), "port"),
            (format!("agentmesh-join:abc:{secret}@h:1"), "64 hex digits"),
            (format!("agentmesh-join:{fp}{secret}@h:1"), "no `:` between"),
            (format!("agentmesh-join:{fp}:a.b@h:1"), "five parts"),
            (
                format!(
                    "agentmesh-join:{fp}:{}",
                    secret.replace("node", "root") + "@h:1"
                ),
                "`node` or `client`",
            ),
            (
                format!(
                    "agentmesh-join:{fp}:{}",
                    secret.replace(".1.1.", ".x.1.") + "@h:1"
                ),
                "Unix time",
            ),
            (
                format!("agentmesh-join:{fp}:{}@h:1", &secret[..secret.len() - 2]),
                "MAC",
            ),
            ("x".repeat(600), "more than the 512"),
        ];
        for (text, expected) in cases {
            let err = text.parse::<JoinToken>().expect_err(&text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn tokens_are_bounded_in_life_and_uses() {
        let (_dir, ca) = signer();
        for (ttl, uses) in [
            (0, 1),
            (MAX_TTL.as_secs() + 1, 1),
            (60, 0),
            (60, MAX_USES + 1),
        ] {
            assert!(
                create_token(&ca, CertRole::Node, Duration::from_secs(ttl), uses, "h:1").is_err(),
                "ttl {ttl} uses {uses}"
            );
        }
        assert!(matches!(
            create_token(&ca, CertRole::Node, Duration::from_secs(60), 1, "no-port"),
            Err(TokenError::BadIssuer(_))
        ));
    }

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
