//! agentmesh certificates: who a node or a client is, what the mesh CA issued and revoked, and
//! the signatures that say who wrote a record or made a statement.
//!
//! # Layout
//!
//! - [`cert`]: what a certificate says about who presents it ([`CertIdentity`]: node id,
//!   fingerprint, name, role, expiry).
//! - [`chain`]: whether a certificate chains to the mesh CA ([`MeshChain`]), whatever name it is
//!   presented under, and the crypto provider every check names.
//! - [`ca`]: the mesh's own certificate authority: `ca init`, `ca issue`, and the CA as a signer
//!   ([`CaSigner`]).
//! - [`issued`]: the CA's record of the certificates it issued (`mesh-cli ca certs`), and finding
//!   the ones a name, an id prefix or a device stands for (`mesh-cli ca revoke`).
//! - [`revocation`]: certificates the mesh CA revoked: the CA-signed entry (`mesh-cli ca
//!   revoke`) and the set every node checks certificates against ([`RevokedSet`]).
//! - [`origin`]: records that say who wrote them: signing this node's records with its key
//!   ([`OriginSigner`]) and verifying any record against its origin's certificate
//!   ([`OriginVerifier`]).
//! - [`statement`]: a person's signed acts: an operator's client certificate signs a statement
//!   (an approval decision, a front-door key) and any node checks it ([`StatementError`]).
//! - [`layout`]: the files of a CA directory; [`pem`]: reading and writing PEM files;
//!   [`error`]: [`TlsError`], naming the file.
//!
//! This crate has no async runtime and no network: it makes, reads and checks certificates,
//! keys and signatures. Loading a node's files into TLS configurations and dialing are
//! `mesh-tls`'s; joining with a token and the zero-config layout are `mesh-join`'s. It decides
//! nothing about what a peer may do.

pub mod ca;
pub mod cert;
pub mod chain;
pub mod error;
pub mod issued;
pub mod layout;
pub mod origin;
pub mod pem;
pub mod revocation;
pub mod statement;
#[cfg(test)]
mod test_support;

pub use ca::CaSigner;
pub use cert::CertIdentity;
pub use chain::MeshChain;
pub use error::TlsError;
pub use mesh_domain::CertRole;
pub use origin::{OriginError, OriginSigner, OriginVerifier};
pub use revocation::{Revocation, RevocationError, RevokedSet};
pub use statement::StatementError;
