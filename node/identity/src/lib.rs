//! agentmesh identities: who a node or a client is, and how it proves it.
//!
//! # Layout
//!
//! - [`ca`]: the mesh's own certificate authority: `ca init`, `ca issue`, and the stable key of
//!   an `--insecure` node.
//! - [`cert`]: what a certificate says about who presents it ([`CertIdentity`]: node id,
//!   fingerprint, name, expiry).
//! - [`tls`]: loading and checking a node's or client's PEM files ([`MeshTls`]), and the
//!   verifier that accepts exactly the certificates of the mesh CA.
//! - [`origin`]: records that say who wrote them: signing this node's records with its key
//!   ([`OriginSigner`]) and verifying any record against its origin's certificate
//!   ([`OriginVerifier`]).
//! - [`statement`]: a person's signed acts: an operator's client certificate signs a statement
//!   (an approval decision, a front-door key) and any node checks it ([`StatementError`]).
//! - [`issued`]: the CA's record of the certificates it issued (`mesh-cli ca certs`), and finding
//!   the ones a name, an id prefix or a device stands for (`mesh-cli ca revoke`).
//! - [`revocation`]: certificates the mesh CA revoked: the CA-signed entry (`mesh-cli ca
//!   revoke`) and the set every node checks certificates against ([`RevokedSet`]).
//! - [`dial`]: opening gRPC channels to nodes over mTLS (or plain TCP) ([`Dialer`]).
//! - [`deadline`]: how long each call one node makes to another may take ([`deadline::DEADLINES`]).
//! - [`bootstrap`]: the zero-config layout: the data dir, and the CA a node creates there on
//!   first start with a certificate for the local `mesh-cli` (or the certificate it joined with).
//! - [`join`]: join tokens (made and checked with a key derived from the CA key) and the
//!   joiner's side of redeeming one: fetch the CA, check it against the token's pin, send a CSR.
//!
//! Both `mesh-node` and `mesh-cli` use this crate; it needs no C++ toolchain, no storage and no
//! model backend, so the CLI builds on its own. It decides nothing about what a peer may do.

pub mod bootstrap;
pub mod ca;
pub mod cert;
pub mod deadline;
pub mod dial;
pub mod issued;
pub mod join;
pub mod origin;
mod pem;
pub mod revocation;
pub mod statement;
pub mod tls;

use std::{
    io,
    path::{Path, PathBuf},
};

pub use cert::CertIdentity;
pub use dial::{CertificateRefusal, DialError, Dialer};
pub use mesh_domain::CertRole;
pub use origin::{OriginError, OriginSigner, OriginVerifier};
pub use revocation::{Revocation, RevocationError, RevokedSet};
pub use statement::StatementError;
pub use tls::{MeshTls, TlsFiles};

/// Installs the `ring` crypto provider as rustls's process default. Call once at the top of
/// `main`; library code names the provider explicitly and does not depend on it.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    #[error("{} is out of date ({reason}); issue a new one with `mesh-cli ca issue --role node --dir <ca dir> --name <node>` (or check this machine's clock)", cert.display())]
    OutOfDate {
        /// The certificate.
        cert: PathBuf,
        /// What the verifier said.
        reason: String,
    },
    /// The node certificate was not issued by the configured CA.
    #[error("{} was not issued by the CA in {} ({reason}); issue it with `mesh-cli ca issue --role node --dir <ca dir> --name <node>`", cert.display(), ca.display())]
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
    /// A certificate validity out of bounds.
    #[error("a certificate must be valid for 1 second to 825 days (--ttl), not {} s", .0.as_secs_f64())]
    BadValidity(std::time::Duration),
    /// A SAN that is neither an IP address nor a DNS name.
    #[error("invalid --san `{0}`: expected an IP address or a DNS name")]
    BadSan(String),
    /// A certificate signing request that cannot be parsed or whose signature is wrong.
    #[error("invalid certificate signing request: {0}")]
    BadCsr(String),
    /// A joined node's CA directory has no CA key and no certificate under the node's name.
    #[error("{} holds a mesh CA without its key (this node joined with a token) and no certificate for `{name}`: start with the name it joined as (--name), or join with a new token into another --data-dir", dir.display())]
    NoCaKey {
        /// The CA directory.
        dir: PathBuf,
        /// The name the node was started with.
        name: String,
    },
    /// The CA keeps as many records of issued certificates as it may.
    #[error("{} holds {} records of issued certificates, none of them expired: the CA issues no more until some expire or are removed", .0.display(), crate::issued::MAX_ISSUED)]
    RecordsFull(PathBuf),
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
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}
