//! agentmesh joining: how a new device gets into a mesh, and where a node keeps its identity.
//!
//! # Layout
//!
//! - [`token`]: join tokens, made and checked with a key derived from the CA key ([`JoinToken`],
//!   [`TokenKey`]).
//! - [`client`]: the joiner's side of redeeming a token: fetch the CA, check it against the
//!   token's pin, send a CSR, store what comes back ([`join_node`], [`join_client`]).
//! - [`bootstrap`]: the zero-config layout: the data dir, the CA a node creates there on first
//!   start with a certificate for the local `mesh-cli` (or the certificate it joined with), and
//!   where `mesh-cli` looks for its files.
//!
//! It builds on `mesh-cert` (the CA, certificates) and `mesh-tls` (dialing the issuer); the
//! issuer's side of a redemption is the node's (`mesh-node`'s `issuer`). Both `mesh-node` and
//! `mesh-cli` use it; it needs no C++ toolchain, no storage and no model backend.

pub mod bootstrap;
pub mod client;
#[cfg(test)]
mod test_support;
pub mod token;

pub use client::{JoinError, Joined, NodeJoin, join_client, join_node, redeem};
pub use token::{JoinToken, TokenError, TokenKey};
