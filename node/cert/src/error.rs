//! The one error of making, loading and checking certificates and their files ([`TlsError`]),
//! shared by the CA, the PEM files, the TLS loader and the join protocol, so each names the file
//! and the fix the same way.

use std::{
    io,
    path::{Path, PathBuf},
};

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
    #[error("{} holds {max} records of issued certificates, none of them expired: the CA issues no more until some expire or are removed", dir.display())]
    RecordsFull {
        /// The CA directory.
        dir: PathBuf,
        /// How many records it keeps at most.
        max: usize,
    },
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
    /// A file that could not be `action`ed (read, written, created).
    pub fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}
