//! What an approval is, apart from the store that keeps them: [`ApprovalPolicy`] (pure: which
//! calls need approval), the stored [`Approval`] and its [`Status`], a [`Decision`], the
//! [`Call`] a gate is asked for and its [`Outcome`], and [`ApprovalError`].

use std::time::Duration;

use mesh_domain::{
    Principal, Tier,
    statement::{ApprovalStatement, Signed},
    text::truncate,
};
use serde::{Deserialize, Serialize};

use crate::{admission::ApproverError, config::ApprovalConfig, memory::MemoryError};

/// Longest arguments kept with an approval (and shown in its event); longer ones are cut.
pub(crate) const MAX_ARGUMENTS: usize = 4096;
/// Longest reason a decision may give.
pub(crate) const MAX_REASON: usize = 1024;
/// Most approvals `list` returns.
pub(crate) const MAX_LIST: usize = 1000;
/// Most entries of the namespace one listing or sweep reads.
pub(super) const MAX_SCAN: usize = 8192;
/// Finished approvals each node keeps of its own; older ones are deleted as new ones come.
pub(super) const MAX_KEPT: usize = 500;
/// How long a finished approval is kept at most.
pub(super) const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// Which tool calls need approval on this node (`[approval]`). Pure.
#[derive(Debug, Clone, Default)]
pub struct ApprovalPolicy {
    pub(super) config: ApprovalConfig,
}

impl ApprovalPolicy {
    /// The policy `[approval]` describes.
    pub fn new(config: ApprovalConfig) -> Self {
        Self { config }
    }

    /// Whether a call of `tool` counting as `tier` must wait for approval: its tier is listed,
    /// or its name, or it is a tool of a listed MCP server (`<server>__<tool>`).
    pub fn needs(&self, tool: &str, tier: Tier) -> bool {
        self.config.tiers.contains(&tier)
            || self.config.tools.contains(tool)
            || self.config.servers.iter().any(|server| {
                tool.strip_prefix(server.as_str())
                    .and_then(|rest| rest.strip_prefix("__"))
                    .is_some_and(|name| !name.is_empty())
            })
    }

    /// How long a call waits for a decision.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }
}

/// What became of a gated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for a decision.
    Pending,
    /// Approved: the call ran.
    Approved,
    /// Denied by a person: the model was told why.
    Denied,
    /// Nobody decided in time: denied.
    Expired,
    /// The task ended while the call waited.
    Cancelled,
}

impl Status {
    /// `pending`, `approved`, `denied`, `expired`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One gated call, as stored under its id (written only by the node running the task).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Its id (a UUIDv7, so ids sort by time).
    pub id: String,
    /// The task that made the call.
    pub task_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments as the model wrote them, cut at [`MAX_ARGUMENTS`].
    pub arguments: String,
    /// SHA-256 (hex) of the full arguments, which a decider's statement names.
    #[serde(default)]
    pub arguments_sha256: String,
    /// The tier the call counts as.
    pub tier: Tier,
    /// The node running the call, by name.
    pub node: String,
    /// The node running the call, by id.
    pub node_id: String,
    /// Who asked this node to run the call through `Tools.Call`, as their certificate reads
    /// (the node of the calling task, or a client); empty for this node's own task.
    #[serde(default)]
    pub called_from: String,
    /// When it was asked for (unix ms).
    pub created_ms: u64,
    /// When it is denied unless decided (unix ms).
    pub expires_ms: u64,
    /// What became of it. A `pending` one past `expires_ms` is shown as `expired` (its node
    /// went away before it could say so).
    pub status: Status,
    /// Who decided; `None` while pending, on a timeout or a cancellation.
    pub decided_by: Option<Principal>,
    /// The decider's reason, or why it expired or was cancelled.
    pub reason: String,
    /// When it was decided, expired or cancelled (unix ms).
    pub decided_ms: Option<u64>,
}

impl Approval {
    /// Its status as of `now_ms`: a pending approval past its expiry is expired.
    pub fn status_at(&self, now_ms: u64) -> Status {
        match self.status {
            Status::Pending if now_ms > self.expires_ms => Status::Expired,
            status => status,
        }
    }

    /// What a person deciding this call signs: the call as it is stored, and the decision.
    pub fn statement(&self, approve: bool, reason: &str) -> ApprovalStatement {
        ApprovalStatement {
            approval_id: self.id.clone(),
            task_id: self.task_id.clone(),
            node_id: self.node_id.clone(),
            tool: self.tool.clone(),
            tier: self.tier,
            arguments_sha256: self.arguments_sha256.clone(),
            expires_ms: self.expires_ms,
            approve,
            reason: reason.to_owned(),
        }
    }
}

/// A decision, as stored under `<approval id>/decision` by the node that took it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Decision {
    /// Whether the call may run (as the node that took it read the statement).
    pub approved: bool,
    /// Who decided, as the node that took it read the caller's certificate (`None` only in
    /// insecure mode, where callers have no certificates). The running node believes the
    /// certificate in `grant`, not this.
    pub by: Option<Principal>,
    /// Why.
    pub reason: String,
    /// When (unix ms).
    pub at_ms: u64,
    /// The decider's [`ApprovalStatement`], signed with their client certificate's key; `None`
    /// only in insecure mode.
    #[serde(default)]
    pub grant: Option<Signed>,
}

/// A gated call, as the node that runs it asks for approval of it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The task that makes the call (the calling task's, for a `Tools.Call`).
    pub task_id: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// Its arguments, as the model wrote them.
    pub arguments: &'a str,
    /// The tier it counts as.
    pub tier: Tier,
    /// Who asked through `Tools.Call` (empty for this node's own task).
    pub called_from: &'a str,
}

/// How a gated call was decided, for the agent: the model sees the reason when denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the call runs.
    pub approved: bool,
    /// Who decided, as the certificate reads; empty when nobody did.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// Why an approval could not be asked for, listed or decided.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// No approval has this id (on this node's copy of the memory).
    #[error(
        "no approval with id `{0}` (`mesh-cli approvals ls` lists the pending ones; a new one may take a moment to reach this node)"
    )]
    NotFound(String),
    /// It is no longer pending.
    #[error("approval `{id}` is already {status}{by}")]
    Settled {
        id: String,
        /// What became of it.
        status: &'static str,
        /// ` by …` when someone decided.
        by: String,
    },
    /// A bad id or reason; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// Too many calls wait on this node already.
    #[error(
        "this node already has {0} tool calls waiting for approval (approval.max_pending); try again once some are decided"
    )]
    Full(usize),
    /// The caller may not decide.
    #[error(transparent)]
    Approver(#[from] ApproverError),
    /// The caller's signed statement is missing, does not verify, or is not about this call
    /// as this node holds it.
    #[error("{0}")]
    Statement(String),
    /// The memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// Checks an approval id from a caller: a canonical UUID, so it cannot name another key.
pub(super) fn check_id(id: &str) -> Result<(), ApprovalError> {
    match uuid::Uuid::try_parse(id) {
        Ok(parsed) if parsed.hyphenated().to_string() == id => Ok(()),
        _ => Err(ApprovalError::Invalid(format!(
            "approval_id: `{}` is not an approval id; ids are UUIDs as `mesh-cli approvals ls` shows them",
            truncate(id, 80).escape_debug()
        ))),
    }
}
