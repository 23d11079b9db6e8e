//! The agentmesh wire contract (`agentmesh.v1`): generated protobuf messages, gRPC clients and
//! servers, and the encoded file descriptor set that server reflection serves.
//!
//! This crate holds no behaviour. Conversions between these types and the node's domain types
//! live in `mesh-node`'s `rpc` module, so prost types never travel further than that.

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

/// Package `agentmesh.v1`.
pub mod v1 {
    tonic::include_proto!("agentmesh.v1");
}

/// Encoded `FileDescriptorSet` of every agentmesh proto file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agentmesh_descriptor.bin"));

/// Protocol major version; also the mDNS TXT `v` value.
pub const PROTOCOL_MAJOR: u32 = 1;
