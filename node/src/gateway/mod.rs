//! The front door's core: what a front-door request does, whichever API dialect it came in
//! through, and with no HTTP type in sight. A chat is a [`Call`], checked, admitted against the
//! caller's key, placed by the mesh router and run here or on peers ([`Gateway::start`]), its
//! answer one stream of [`Event`]s; embeddings take the same way ([`Gateway::embed`]); each
//! run's key is reserved before it and charged what it spent after (`charge`); the Responses
//! API's stored conversations are kept per key, expire and are swept
//! ([`conversations`]). For `/mcp` it decides whether a front-door caller may do something of
//! a tier ([`Gateway::allow`]), reserves a task's key budget and settles it from the task's
//! outcome, and reaches the fleet's node list and shared memory through the [`MeshData`] port,
//! which the agents' data tools implement. Every refusal and failure is one [`GatewayError`].
//!
//! `http` sits above it: routes, authentication (which finds the [`DoorCaller`]), the guard, and
//! one folder per dialect that translates its wire shapes to and from these types and maps a
//! [`GatewayError`] to its error shape. This module must not know a status code, a header or a
//! JSON shape of any API.

mod call;
mod caller;
mod charge;
pub(crate) mod conversations;
mod data;
mod error;
mod mesh;
mod service;

pub(crate) use self::call::Call;
pub(crate) use self::{
    call::{Event, Run, total_usage},
    caller::DoorCaller,
    charge::settle_from_outcome,
    conversations::{Keeper, sweep_loop},
    data::{DataTool, MemoryQuery, MeshData, MeshDataError},
    error::GatewayError,
    service::{Gateway, GatewayParts},
};
pub(crate) use crate::chat::Failover;
