//! Where a CA directory keeps its files, and how far back the certificates it issues are dated:
//! what the CA ([`crate::ca`]) writes and its record of issued certificates ([`crate::issued`])
//! reads back, so neither has to ask the other.

/// File names inside a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key; whoever holds it can add nodes to the mesh.
pub const CA_KEY_FILE: &str = "ca.key";

/// How far before its issue a certificate is valid from (seconds), so a peer whose clock runs
/// a little slow accepts it at once.
pub const BACKDATED_S: i64 = 3600;
