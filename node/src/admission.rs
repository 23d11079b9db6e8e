//! Admission: the one door every task and every chat goes through, whichever way it arrives
//! (gRPC `Tasks.Submit`, the front door, the `delegate` tool, a cron firing). It decides
//! whether a task may run at all (the hop limit, the tier this node allows its caller) and
//! where it runs (the router's ranking of this node and its peers, and the choice), and counts
//! the decision in the metrics. Edges map its typed errors to gRPC or HTTP once.
//!
//! It decides only: it runs, queues and forwards nothing (that is `tasks` and `chat`).

use std::sync::Arc;

use mesh_domain::{Requirements, Target, TaskSpec, Tier};

use crate::{
    capabilities::Capabilities,
    metrics::metrics,
    peers::PeerTable,
    router::{self, Placement, Ranked},
};

/// Most forwards and sub-task levels a task may go through.
pub const MAX_HOPS: u32 = 4;

/// Who started a task, as far as this node can tell: what it may ask of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A client talking to this node directly (`mesh-cli`); a task it says was forwarded or
    /// nested (hops above 0) counts as a peer's.
    Client,
    /// Another node of the mesh (its certificate is a peer's).
    Peer,
    /// A task running here, through the `delegate` tool.
    Subtask,
    /// A cron firing on this node (its task id is fixed so a second firing is a duplicate, but it
    /// is placed like a new task).
    Schedule,
}

/// Why a task or a chat may not run, or cannot run anywhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// It went through too many forwards or sub-task levels.
    #[error(
        "hop limit: this task has been forwarded or nested {hops} times (at most {MAX_HOPS}); a delegation loop?"
    )]
    HopLimit {
        /// Hops so far.
        hops: u32,
    },
    /// It asks this node for more than it allows its caller.
    #[error(
        "this node runs remote tasks up to tier `{cap}` and this one asks for `{asked}` (security.remote_max_tier)"
    )]
    TierCap {
        /// What this node allows.
        cap: Tier,
        /// What the task asks for.
        asked: Tier,
    },
    /// No node can run it; the message names every node and why.
    #[error("{0}")]
    Nowhere(String),
    /// A chat for a model or role that no node of the mesh serves.
    #[error("the model `{0}` does not exist on any node of the mesh; GET /v1/models lists them")]
    UnknownModel(String),
}

/// The door: this node's description and its view of the fleet.
#[derive(Debug)]
pub struct Admission {
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
}

impl Admission {
    /// Decides with this node's capabilities and peer table.
    pub fn new(caps: Arc<Capabilities>, peers: Arc<PeerTable>) -> Self {
        Self { caps, peers }
    }

    /// Every node ranked for a task, handed to `read` (what `--explain` shows).
    pub fn rank<R>(
        &self,
        target: &Target,
        tier: Tier,
        require: &Requirements,
        read: impl FnOnce(&[Ranked<'_>]) -> R,
    ) -> R {
        let (own, peers) = (self.caps.snapshot(), self.peers.snapshot());
        read(&router::rank_fleet(&own, &peers, target, tier, require))
    }

    /// Whether `spec`, started by `caller`, may run, and where.
    pub fn admit(&self, spec: &TaskSpec, caller: Caller) -> Result<Placement, AdmissionError> {
        if spec.lineage.hops > MAX_HOPS {
            return Err(AdmissionError::HopLimit {
                hops: spec.lineage.hops,
            });
        }
        let capped = match caller {
            Caller::Peer => true,
            Caller::Client => spec.lineage.hops > 0,
            Caller::Subtask | Caller::Schedule => false,
        };
        let cap = self.caps.snapshot().remote_max_tier;
        if capped && spec.tier > cap {
            return Err(AdmissionError::TierCap {
                cap,
                asked: spec.tier,
            });
        }
        let forwarded = caller != Caller::Schedule && spec.lineage.task_id.is_some();
        let choice = self.rank(&spec.target, spec.tier, &spec.require, |ranked| {
            router::choose(ranked, forwarded)
        });
        record("task", &choice);
        choice.map_err(AdmissionError::Nowhere)
    }

    /// Where a chat for `target` may run (read tier, no requirements): here or on the best peers.
    pub fn place_chat(&self, target: &Target) -> Result<Placement, AdmissionError> {
        let own = self.caps.snapshot();
        let peers = self.peers.snapshot();
        let ranked = router::rank_fleet(&own, &peers, target, Tier::Read, &Requirements::default());
        let choice = router::choose(&ranked, false);
        record("chat", &choice);
        choice.map_err(|why| {
            let known = std::iter::once(&own)
                .chain(peers.iter().map(|p| &p.info))
                .any(|info| match target {
                    Target::Model(m) => info.models.iter().any(|x| x.name == *m),
                    Target::Role(r) => info.role_chains.get(r).is_some_and(|ch| !ch.is_empty()),
                    Target::Persona(_) => false,
                });
            if known {
                AdmissionError::Nowhere(why)
            } else {
                AdmissionError::UnknownModel(target.model_id())
            }
        })
    }
}

/// Counts a placement decision (`kind`: `task` or `chat`) in the metrics.
fn record(kind: &str, choice: &Result<Placement, String>) {
    metrics().routed(
        kind,
        match choice {
            Ok(Placement::Local) => "local",
            Ok(Placement::Remote(_)) => "remote",
            Err(_) => "nowhere",
        },
    );
}
