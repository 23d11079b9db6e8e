//! Join tokens: made by whoever holds the CA key, checked by an issuer node, carried by a
//! joining device to its issuer (see [`crate::client`] for the joiner's side).
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
//! This module decides nothing about whether a token may still be used (the issuer does, with
//! its count), and reads and writes no files.

use std::{
    fmt,
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_cert::{CaSigner, CertRole};
use ring::{hmac, rand::SecureRandom};

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
    /// The key of the CA `ca`.
    pub fn of(ca: &CaSigner) -> Self {
        let prk = ca.derive_key(b"agentmesh join token v1");
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
    ca: &CaSigner,
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
        secret: TokenKey::of(ca).mint(ca.fingerprint(), role, expires, uses)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::signer;

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
        TokenKey::of(&ca)
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
            TokenKey::of(&theirs).check(theirs.fingerprint(), &token.secret),
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
                    TokenKey::of(&ours).check(ours.fingerprint(), &secret),
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
}
