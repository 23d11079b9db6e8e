//! agentmesh mutual TLS: how a node or a client proves who it is on a connection, and how it
//! reaches another node.
//!
//! # Layout
//!
//! - [`creds`]: loading and checking a node's or client's PEM files ([`TlsFiles`], [`MeshTls`]),
//!   and the client and server TLS configurations made from them.
//! - [`verify`]: the verifiers: a server's certificate as every client checks it (the chain to
//!   the mesh CA whatever the name, revoked ones refused, a node of another mesh named), a
//!   client's as every server checks it, and the configurations of a device still joining.
//! - [`dial`]: opening gRPC channels to nodes over mTLS (or plain TCP) ([`Dialer`]).
//! - [`deadline`]: how long each call one node makes to another may take ([`deadline::DEADLINES`]).
//!
//! Certificates, the CA, revocations and signatures are `mesh-cert`'s, which this crate builds
//! on; joining with a token is `mesh-join`'s, which builds on this one. Both `mesh-node` and
//! `mesh-cli` use it; it needs no C++ toolchain, no storage and no model backend. It decides
//! nothing about what a peer may do.

pub mod creds;
pub mod deadline;
pub mod dial;
pub mod verify;

pub use creds::{MeshTls, TlsFiles};
pub use dial::{CertificateRefusal, DialError, Dialer};

/// Installs the `ring` crypto provider as rustls's process default. Call once at the top of
/// `main`; library code names the provider explicitly and does not depend on it.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
