//! The agentmesh wire contract (`agentmesh.v1`): generated protobuf messages, gRPC clients and
//! servers, the encoded file descriptor set that server reflection serves, and the conversions
//! between these messages and the shared domain types of `mesh-domain` ([`convert`]).
//!
//! This crate holds no behaviour: a node's `rpc` module and `mesh-cli` convert at their edges,
//! so prost types travel no further than those.

pub mod convert;

/// Package `agentmesh.v1`.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod v1 {
    tonic::include_proto!("agentmesh.v1");
}

/// Encoded `FileDescriptorSet` of every agentmesh proto file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agentmesh_descriptor.bin"));

/// Protocol major version; also the mDNS TXT `v` value.
pub const PROTOCOL_MAJOR: u32 = 1;
