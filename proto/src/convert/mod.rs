//! Conversions between the wire types and the domain types of `mesh-domain`, in both
//! directions. Everything that comes from the network is bounded and checked here: a bad value
//! becomes `INVALID_ARGUMENT` with a message that starts with the field's name.

use mesh_domain::{
    CertRole, KeyLimits, KeyPolicy, NodeId, PeerState, Principal, Tier, statement::Signed,
};
use tonic::Status;

use crate::v1 as pb;

/// Limits on lists and strings inside `NodeInfo`.
const MAX_LIST: usize = 256;
const MAX_STRING: usize = 1024;

impl From<Tier> for pb::Tier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Read => pb::Tier::Read,
            Tier::Write => pb::Tier::Write,
            Tier::Shell => pb::Tier::Shell,
        }
    }
}

impl From<PeerState> for pb::PeerState {
    fn from(state: PeerState) -> Self {
        match state {
            PeerState::Up => pb::PeerState::Up,
            PeerState::Suspect => pb::PeerState::Suspect,
            PeerState::Down => pb::PeerState::Down,
            PeerState::Revoked => pb::PeerState::Revoked,
        }
    }
}

/// A tier from the wire where an unknown value must not fail (what a node advertises, what a
/// task record says): `read`, the least.
pub fn tier_or_read(tier: i32) -> Tier {
    match pb::Tier::try_from(tier) {
        Ok(pb::Tier::Shell) => Tier::Shell,
        Ok(pb::Tier::Write) => Tier::Write,
        _ => Tier::Read,
    }
}

/// A peer state from the wire; anything unknown counts as `down`.
pub fn peer_state(state: i32) -> PeerState {
    match pb::PeerState::try_from(state) {
        Ok(pb::PeerState::Up) => PeerState::Up,
        Ok(pb::PeerState::Suspect) => PeerState::Suspect,
        Ok(pb::PeerState::Revoked) => PeerState::Revoked,
        _ => PeerState::Down,
    }
}

impl From<&Principal> for pb::Principal {
    fn from(principal: &Principal) -> Self {
        Self {
            id: principal.id.to_string(),
            name: principal.name.clone(),
            role: match principal.role {
                None => pb::CertRole::Unspecified,
                Some(CertRole::Node) => pb::CertRole::Node,
                Some(CertRole::Client) => pb::CertRole::Client,
            } as i32,
        }
    }
}

impl TryFrom<pb::Principal> for Principal {
    type Error = Status;

    fn try_from(principal: pb::Principal) -> Result<Self, Status> {
        check_len("lineage.started_by.name", &principal.name, 63)?;
        Ok(Self {
            id: NodeId::parse(&principal.id)
                .map_err(|e| Status::invalid_argument(format!("lineage.started_by.id: {e}")))?,
            name: principal.name,
            role: match pb::CertRole::try_from(principal.role) {
                Ok(pb::CertRole::Node) => Some(CertRole::Node),
                Ok(pb::CertRole::Client) => Some(CertRole::Client),
                // Unknown values count as the least trusted: a legacy certificate.
                _ => None,
            },
        })
    }
}

impl From<&Signed> for pb::SignedStatement {
    fn from(signed: &Signed) -> Self {
        Self {
            statement: signed.statement.clone(),
            signature: signed.signature.clone(),
            certificate: signed.certificate.clone(),
        }
    }
}

/// Sizes are checked where the statement is verified (`mesh_cert::statement`).
impl From<pb::SignedStatement> for Signed {
    fn from(signed: pb::SignedStatement) -> Self {
        Self {
            statement: signed.statement,
            signature: signed.signature,
            certificate: signed.certificate,
        }
    }
}

impl From<&KeyPolicy> for pb::KeyPolicy {
    fn from(policy: &KeyPolicy) -> Self {
        let limits = policy.limits;
        Self {
            models: policy.models.clone(),
            roles: policy.roles.clone(),
            max_tokens_per_day: limits.max_tokens_per_day,
            max_tokens_per_month: limits.max_tokens_per_month,
            requests_per_minute: limits.requests_per_minute,
            tokens_per_minute: limits.tokens_per_minute,
            mcp: policy.mcp,
        }
    }
}

impl TryFrom<pb::KeyPolicy> for KeyPolicy {
    type Error = Status;

    /// Bounded like every list from the network; the policy's own rules (no empty name, no
    /// zero limit) are the node's key registry's.
    fn try_from(policy: pb::KeyPolicy) -> Result<Self, Status> {
        check_list("policy.models", &policy.models)?;
        check_list("policy.roles", &policy.roles)?;
        Ok(Self {
            models: policy.models,
            roles: policy.roles,
            limits: KeyLimits {
                max_tokens_per_day: policy.max_tokens_per_day,
                max_tokens_per_month: policy.max_tokens_per_month,
                requests_per_minute: policy.requests_per_minute,
                tokens_per_minute: policy.tokens_per_minute,
            },
            mcp: policy.mcp,
        })
    }
}

/// `INVALID_ARGUMENT` naming `field` when `value` is longer than `max` bytes.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        Err(Status::invalid_argument(format!(
            "{field}: {} bytes, at most {max} allowed",
            value.len()
        )))
    } else {
        Ok(())
    }
}

fn check_count(field: &str, count: usize) -> Result<(), Status> {
    if count > MAX_LIST {
        Err(Status::invalid_argument(format!(
            "{field}: {count} entries, at most {MAX_LIST} allowed"
        )))
    } else {
        Ok(())
    }
}

fn check_list(field: &str, values: &[String]) -> Result<(), Status> {
    check_count(field, values.len())?;
    values
        .iter()
        .try_for_each(|v| check_len(field, v, MAX_STRING))
}

mod chat;
mod node;
mod task;

#[cfg(test)]
mod tests;
