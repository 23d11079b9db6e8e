//! Approval gates: tool calls that wait for a person's decision before they run.
//!
//! [`Policy`] (pure) says which calls need approval: their tier, their tool's name, or their
//! MCP server (`<server>__<tool>`), as `[approval]` lists them. [`Approvals`] keeps the gated
//! calls in the replicated system namespace `approvals`, so every node lists them and takes a
//! decision for any of them:
//! - `<approval id>`: the [`Approval`], the request and what became of it, written only by the
//!   node running the task ([`Approvals::request`], then the outcome);
//! - `<approval id>/decision`: a [`Decision`], written only by the node that took
//!   `Approvals.Decide` ([`Approvals::decide`]), which replicates to the running node.
//!
//! The running node waits on a [`Pending`] ([`Pending::wait`]): it re-reads the decision each
//! time its memory changes (no polling) until the approval's timeout, when the call is denied.
//! Who may decide is asked of `admission` ([`Admission::may_approve`]), both where the decision
//! is taken and where it is acted on. A `Pending` dropped before it is decided (the task was
//! cancelled, hit its deadline, or the node stopped) marks its approval cancelled.
//!
//! This module does not run tools or emit task events (that is `agent`), and speaks no
//! protobuf (that is `rpc::approvals`).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use mesh_domain::{Principal, Tier, keys::APPROVALS, sync::MutexExt, text::truncate, time::now_ms};
use serde::{Deserialize, Serialize};

use crate::{
    admission::{Admission, ApproverError},
    config::ApprovalConfig,
    memory::{Memory, MemoryError},
};

/// Longest arguments kept with an approval (and shown in its event); longer ones are cut.
pub const MAX_ARGUMENTS: usize = 4096;
/// Longest reason a decision may give.
pub const MAX_REASON: usize = 1024;
/// Most approvals `list` returns.
pub const MAX_LIST: usize = 1000;
/// Most entries of the namespace one listing or sweep reads.
const MAX_SCAN: usize = 8192;
/// Finished approvals each node keeps of its own; older ones are deleted as new ones come.
const MAX_KEPT: usize = 500;
/// How long a finished approval is kept at most.
const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// Which tool calls need approval on this node (`[approval]`). Pure.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    config: ApprovalConfig,
}

impl Policy {
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
    /// The tier the call counts as.
    pub tier: Tier,
    /// The node running the task, by name.
    pub node: String,
    /// The node running the task, by id.
    pub node_id: String,
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
}

/// A decision, as stored under `<approval id>/decision` by the node that took it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Whether the call may run.
    pub approved: bool,
    /// Who decided (`None` only in insecure mode, where callers have no certificates).
    pub by: Option<Principal>,
    /// Why.
    pub reason: String,
    /// When (unix ms).
    pub at_ms: u64,
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
        /// Its id.
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
    /// The memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// The key of an approval's decision.
fn decision_key(id: &str) -> String {
    format!("{id}/decision")
}

/// Checks an approval id from a caller: a canonical UUID, so it cannot name another key.
fn check_id(id: &str) -> Result<(), ApprovalError> {
    match uuid::Uuid::try_parse(id) {
        Ok(parsed) if parsed.hyphenated().to_string() == id => Ok(()),
        _ => Err(ApprovalError::Invalid(format!(
            "approval_id: `{}` is not an approval id; ids are UUIDs as `mesh-cli approvals ls` shows them",
            truncate(id, 80).escape_debug()
        ))),
    }
}

/// The approvals of this node and of the mesh (see the module docs).
#[derive(Debug, Clone)]
pub struct Approvals {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Where approvals and decisions are kept (namespace `approvals`, replicated).
    memory: Arc<Memory>,
    /// Decides who may approve.
    admission: Arc<Admission>,
    /// `[approval]`, which runtime settings change.
    policy: Mutex<Policy>,
    /// This node's name, written into its approvals.
    node: String,
    /// Whether callers present certificates (false in insecure mode: decisions carry no
    /// identity, and are taken as they come).
    tls: bool,
    /// The ids of this node's approvals still waiting, bounded by `approval.max_pending`.
    pending: Mutex<HashSet<String>>,
}

impl Approvals {
    /// Approvals kept in `memory`, for calls of tasks running on the node named `node`.
    pub fn new(
        memory: Arc<Memory>,
        admission: Arc<Admission>,
        node: String,
        config: ApprovalConfig,
        tls: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                memory,
                admission,
                policy: Mutex::new(Policy::new(config)),
                node,
                tls,
                pending: Mutex::default(),
            }),
        }
    }

    /// Which calls need approval here, now.
    pub fn policy(&self) -> Policy {
        self.inner.policy.lock_unpoisoned().clone()
    }

    /// Changes which calls need approval here (a runtime setting); calls already waiting keep
    /// the timeout they were given.
    pub fn set_policy(&self, config: ApprovalConfig) {
        *self.inner.policy.lock_unpoisoned() = Policy::new(config);
    }

    /// Asks for approval of a call of `tool` (counting as `tier`) by task `task_id`: stores the
    /// request, which replicates, and returns what to wait on. Refused when
    /// `approval.max_pending` calls wait here already.
    pub async fn request(
        &self,
        task_id: &str,
        tool: &str,
        arguments: &str,
        tier: Tier,
    ) -> Result<Pending, ApprovalError> {
        let policy = self.policy();
        let max = policy.config.max_pending;
        let id = uuid::Uuid::now_v7().to_string();
        {
            let mut pending = self.inner.pending.lock_unpoisoned();
            if pending.len() >= max {
                return Err(ApprovalError::Full(max));
            }
            pending.insert(id.clone());
        }
        // From here a drop of `Pending` frees the slot (and marks the record cancelled).
        let now = now_ms();
        let timeout = u64::try_from(policy.timeout().as_millis()).unwrap_or(u64::MAX);
        let mut pending = Pending {
            approvals: self.clone(),
            record: Approval {
                id,
                task_id: task_id.to_owned(),
                tool: truncate(tool, 64).to_owned(),
                arguments: truncate(arguments, MAX_ARGUMENTS).to_owned(),
                tier,
                node: self.inner.node.clone(),
                node_id: self.inner.memory.own_id().to_string(),
                created_ms: now,
                expires_ms: now.saturating_add(timeout),
                status: Status::Pending,
                decided_by: None,
                reason: String::new(),
                decided_ms: None,
            },
            settled: false,
        };
        self.sweep().await;
        self.store(&pending.record).await.inspect_err(|_| {
            // Nothing was stored: nothing to cancel.
            pending.settled = true;
            self.inner
                .pending
                .lock_unpoisoned()
                .remove(&pending.record.id);
        })?;
        Ok(pending)
    }

    /// Records a decision on approval `id` by `by` (`None` only in insecure mode), after
    /// checking that it is pending and that `by` may decide it. The node running the task
    /// acts on it once it replicates there.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        by: Option<Principal>,
        reason: &str,
    ) -> Result<Approval, ApprovalError> {
        check_id(id)?;
        if reason.len() > MAX_REASON {
            return Err(ApprovalError::Invalid(format!(
                "reason: {} bytes, at most {MAX_REASON}",
                reason.len()
            )));
        }
        let record = self
            .read(id)?
            .ok_or_else(|| ApprovalError::NotFound(id.to_owned()))?;
        if let Some(by) = &by {
            self.inner.admission.may_approve(by, record.tier)?;
        } else if self.inner.tls {
            return Err(ApproverError::NotAClient("no certificate".into()).into());
        }
        let status = record.status_at(now_ms());
        if status != Status::Pending {
            return Err(settled(&record, status));
        }
        if let Some(decision) = self.decision(id)? {
            return Err(ApprovalError::Settled {
                id: id.to_owned(),
                status: if decision.approved {
                    "approved"
                } else {
                    "denied"
                },
                by: decision.by.map(|p| format!(" by {p}")).unwrap_or_default(),
            });
        }
        let decision = Decision {
            approved: approve,
            by,
            reason: reason.to_owned(),
            at_ms: now_ms(),
        };
        let value = serde_json::to_vec(&decision)
            .map_err(|e| ApprovalError::Invalid(format!("encode the decision: {e}")))?;
        self.inner
            .memory
            .put(APPROVALS, &decision_key(id), Some(value))
            .await?;
        Ok(record)
    }

    /// Approvals newest first: only pending ones unless `all`, only `task_id`'s when given, at
    /// most `limit` (and [`MAX_LIST`]). A pending one past its expiry counts as expired.
    pub fn list(
        &self,
        all: bool,
        task_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let now = now_ms();
        let mut found: Vec<Approval> = self
            .records()?
            .into_iter()
            .filter(|a| all || a.status_at(now) == Status::Pending)
            .filter(|a| task_id.is_none_or(|t| a.task_id == t))
            .map(|mut a| {
                a.status = a.status_at(now);
                a
            })
            .collect();
        found.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
        found.truncate(limit.min(MAX_LIST));
        Ok(found)
    }

    /// Every approval record this node holds (decisions left out).
    fn records(&self) -> Result<Vec<Approval>, ApprovalError> {
        Ok(self
            .inner
            .memory
            .list(APPROVALS, "", MAX_SCAN)?
            .into_iter()
            .filter(|entry| !entry.key.contains('/'))
            .filter_map(|entry| serde_json::from_slice(&entry.record.value).ok())
            .collect())
    }

    /// The approval stored under `id`.
    fn read(&self, id: &str) -> Result<Option<Approval>, ApprovalError> {
        Ok(self
            .inner
            .memory
            .get(APPROVALS, id)?
            .filter(|r| !r.tombstone)
            .and_then(|r| serde_json::from_slice(&r.value).ok()))
    }

    /// The decision taken on `id`, if any.
    fn decision(&self, id: &str) -> Result<Option<Decision>, ApprovalError> {
        Ok(self
            .inner
            .memory
            .get(APPROVALS, &decision_key(id))?
            .filter(|r| !r.tombstone)
            .and_then(|r| serde_json::from_slice(&r.value).ok()))
    }

    async fn store(&self, record: &Approval) -> Result<(), ApprovalError> {
        let value = serde_json::to_vec(record)
            .map_err(|e| ApprovalError::Invalid(format!("encode the approval: {e}")))?;
        self.inner
            .memory
            .put(APPROVALS, &record.id, Some(value))
            .await?;
        Ok(())
    }

    /// Tidies this node's own approvals: one left pending by an earlier run of the node is
    /// cancelled; finished ones older than a week, or beyond the newest [`MAX_KEPT`], are
    /// deleted with their decisions. Failures are logged: the new request goes on.
    async fn sweep(&self) {
        let own = self.inner.memory.own_id().to_string();
        let records = match self.records() {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "read approvals to tidy them");
                return;
            }
        };
        let now = now_ms();
        let mut finished = Vec::new();
        for mut record in records.into_iter().filter(|r| r.node_id == own) {
            if record.status == Status::Pending {
                if self.inner.pending.lock_unpoisoned().contains(&record.id) {
                    continue;
                }
                record.status = Status::Cancelled;
                record.reason = "the node stopped while the call waited".into();
                record.decided_ms = Some(now);
                if let Err(e) = self.store(&record).await {
                    tracing::warn!(approval = %record.id, error = %e, "cancel an approval left pending");
                }
            }
            finished.push(record);
        }
        finished.sort_by_key(|r| std::cmp::Reverse(r.created_ms));
        let old = finished.iter().enumerate().filter(|(i, r)| {
            *i >= MAX_KEPT || r.decided_ms.unwrap_or(r.created_ms) + RETENTION_MS < now
        });
        for (_, record) in old {
            for key in [record.id.clone(), decision_key(&record.id)] {
                if let Err(e) = self.inner.memory.put(APPROVALS, &key, None).await {
                    tracing::warn!(approval = %record.id, error = %e, "delete an old approval");
                }
            }
        }
    }

    /// Stores what became of `pending`'s call and frees its slot.
    async fn settle(&self, record: &Approval) {
        if let Err(e) = self.store(record).await {
            tracing::warn!(approval = %record.id, error = %e, "record an approval's outcome");
        }
        self.inner.pending.lock_unpoisoned().remove(&record.id);
    }

    /// What to do with `decision` on this node: a denial stands whoever made it; an approval
    /// only from someone this node lets approve the call ([`Admission::may_approve`]).
    fn judge(&self, record: &Approval, decision: Decision) -> Outcome {
        let by = decision
            .by
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        if !decision.approved {
            return Outcome {
                approved: false,
                by,
                reason: decision.reason,
            };
        }
        let refused = match &decision.by {
            Some(principal) => self
                .inner
                .admission
                .may_approve(principal, record.tier)
                .err()
                .map(|e| e.to_string()),
            None if self.inner.tls => Some("the approval carries no certificate".into()),
            None => None,
        };
        match refused {
            Some(why) => Outcome {
                approved: false,
                by,
                reason: format!("an approval this node does not accept: {why}"),
            },
            None => Outcome {
                approved: true,
                by,
                reason: decision.reason,
            },
        }
    }
}

/// What an approval is told when it is no longer pending.
fn settled(record: &Approval, status: Status) -> ApprovalError {
    ApprovalError::Settled {
        id: record.id.clone(),
        status: status.as_str(),
        by: record
            .decided_by
            .as_ref()
            .map(|p| format!(" by {p}"))
            .unwrap_or_default(),
    }
}

/// A call waiting for approval on this node. Dropped before it is decided (the task was
/// cancelled or hit its deadline), it marks its approval cancelled.
#[derive(Debug)]
pub struct Pending {
    approvals: Approvals,
    record: Approval,
    /// Whether its outcome is stored (nothing left to do on drop).
    settled: bool,
}

impl Pending {
    /// The approval as stored.
    pub fn approval(&self) -> &Approval {
        &self.record
    }

    /// Waits for a decision or the timeout, stores the outcome and returns it. It re-reads the
    /// decision whenever the memory changes (a local decision, or one replicated from another
    /// node), and not otherwise.
    pub async fn wait(mut self) -> Outcome {
        let approvals = self.approvals.clone();
        let mut changes = approvals.inner.memory.changes();
        let left = self.record.expires_ms.saturating_sub(now_ms());
        let expiry = tokio::time::Instant::now() + Duration::from_millis(left);
        let outcome = loop {
            changes.borrow_and_update();
            match approvals.decision(&self.record.id) {
                Ok(Some(decision)) => {
                    let by = decision.by.clone();
                    let outcome = approvals.judge(&self.record, decision);
                    self.record.status = if outcome.approved {
                        Status::Approved
                    } else {
                        Status::Denied
                    };
                    self.record.decided_by = by;
                    break outcome;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(approval = %self.record.id, error = %e, "read an approval's decision")
                }
            }
            let expired = tokio::select! {
                changed = changes.changed() => {
                    // An error: the memory is gone, so no decision can come any more.
                    if changed.is_err() {
                        tokio::time::sleep_until(expiry).await;
                    }
                    changed.is_err()
                }
                () = tokio::time::sleep_until(expiry) => true,
            };
            if expired {
                let seconds = self
                    .record
                    .expires_ms
                    .saturating_sub(self.record.created_ms)
                    / 1000;
                self.record.status = Status::Expired;
                break Outcome {
                    approved: false,
                    by: String::new(),
                    reason: format!(
                        "nobody approved the call within {seconds} s (approval.timeout_s on {})",
                        self.record.node
                    ),
                };
            }
        };
        self.record.reason.clone_from(&outcome.reason);
        self.record.decided_ms = Some(now_ms());
        self.settled = true;
        // On a task of its own: a task cancelled meanwhile must not leave the record pending
        // and its slot taken.
        let record = self.record.clone();
        let _ = tokio::spawn(async move { approvals.settle(&record).await }).await;
        outcome
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut record = self.record.clone();
        record.status = Status::Cancelled;
        record.reason = "the task ended while the call waited".into();
        record.decided_ms = Some(now_ms());
        let approvals = self.approvals.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { approvals.settle(&record).await });
            }
            Err(_) => {
                approvals.inner.pending.lock_unpoisoned().remove(&record.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::{CertRole, NodeId};

    use super::*;
    use crate::{
        capabilities::test_support::test_capabilities,
        memory::{MemoryOptions, test_support},
    };

    /// Approvals on a fresh memory, for a node whose `client_max_tier` is `write`; the temp
    /// dir holds the memory.
    fn approvals(config: ApprovalConfig) -> (tempfile::TempDir, Approvals) {
        let (dir, memory) =
            test_support::open_memory(&test_support::id("approvals-me"), MemoryOptions::default());
        let admission = Arc::new(Admission::new(
            test_capabilities(),
            Arc::default(),
            Tier::Write,
        ));
        let approvals = Approvals::new(memory, admission, "me".into(), config, true);
        (dir, approvals)
    }

    fn who(name: &str, role: CertRole) -> Principal {
        Principal {
            id: NodeId::from_spki_der(name.as_bytes()),
            name: name.into(),
            role: Some(role),
        }
    }

    /// The stored approval `id`, as `list` shows it.
    fn shown(approvals: &Approvals, id: &str) -> Approval {
        approvals
            .list(true, None, MAX_LIST)
            .expect("list")
            .into_iter()
            .find(|a| a.id == id)
            .expect("listed")
    }

    #[tokio::test]
    async fn an_approval_by_a_client_lets_the_call_run_and_is_recorded() {
        let (_dir, approvals) = approvals(ApprovalConfig::default());
        let pending = approvals
            .request("task", "file_write", r#"{"path": "x"}"#, Tier::Write)
            .await
            .expect("asked");
        let id = pending.approval().id.clone();
        assert_eq!(approvals.list(false, None, 10).expect("list").len(), 1);
        assert_eq!(
            approvals.list(false, Some("other task"), 10).expect("list"),
            []
        );
        let waiting = tokio::spawn(pending.wait());
        let ada = who("ada", CertRole::Client);
        approvals
            .decide(&id, true, Some(ada.clone()), "looks fine")
            .await
            .expect("decided");
        let outcome = waiting.await.expect("waited");
        assert!(outcome.approved, "{outcome:?}");
        assert!(outcome.by.contains("client `ada`"), "{outcome:?}");
        let stored = shown(&approvals, &id);
        assert_eq!(stored.status, Status::Approved);
        assert_eq!(stored.decided_by, Some(ada.clone()));
        assert_eq!(stored.reason, "looks fine");
        assert!(approvals.list(false, None, 10).expect("list").is_empty());
        let again = approvals.decide(&id, false, Some(ada), "").await;
        assert!(
            matches!(again, Err(ApprovalError::Settled { .. })),
            "{again:?}"
        );
    }

    #[tokio::test]
    async fn a_node_or_a_client_below_the_calls_tier_may_not_decide() {
        let (_dir, approvals) = approvals(ApprovalConfig::default());
        let shell = approvals
            .request("task", "shell_exec", "{}", Tier::Shell)
            .await
            .expect("asked");
        let id = shell.approval().id.clone();
        for (by, approve) in [
            (Some(who("laptop", CertRole::Node)), true),
            (Some(who("laptop", CertRole::Node)), false),
            // This node's client_max_tier is `write`: its clients may not approve `shell`.
            (Some(who("ada", CertRole::Client)), true),
            (None, true),
        ] {
            let refused = approvals.decide(&id, approve, by.clone(), "").await;
            assert!(
                matches!(refused, Err(ApprovalError::Approver(_))),
                "{by:?}: {refused:?}"
            );
        }
        assert!(approvals.decision(&id).expect("read").is_none());
        assert_eq!(shown(&approvals, &id).status, Status::Pending);
        let unknown = uuid::Uuid::now_v7().to_string();
        let missing = approvals.decide(&unknown, true, None, "").await;
        assert!(
            matches!(missing, Err(ApprovalError::NotFound(_))),
            "{missing:?}"
        );
        let long = approvals
            .decide(&id, false, None, &"x".repeat(MAX_REASON + 1))
            .await;
        assert!(matches!(long, Err(ApprovalError::Invalid(_))), "{long:?}");
    }

    /// The running node checks the approver again before a call runs: an approval written
    /// straight into the namespace in a node's name (by a compromised node, say) is a denial.
    #[tokio::test]
    async fn the_running_node_refuses_an_approval_whose_approver_may_not_approve() {
        let (_dir, approvals) = approvals(ApprovalConfig::default());
        let pending = approvals
            .request("task", "file_write", "{}", Tier::Write)
            .await
            .expect("asked");
        let id = pending.approval().id.clone();
        let forged = Decision {
            approved: true,
            by: Some(who("rogue", CertRole::Node)),
            reason: String::new(),
            at_ms: now_ms(),
        };
        approvals
            .inner
            .memory
            .put(
                APPROVALS,
                &decision_key(&id),
                Some(serde_json::to_vec(&forged).expect("json")),
            )
            .await
            .expect("written");
        let outcome = pending.wait().await;
        assert!(!outcome.approved, "{outcome:?}");
        assert!(outcome.reason.contains("client certificate"), "{outcome:?}");
        assert_eq!(shown(&approvals, &id).status, Status::Denied);
    }

    #[tokio::test]
    async fn an_undecided_call_expires_and_a_dropped_one_is_cancelled_and_frees_its_slot() {
        let (_dir, approvals) = approvals(ApprovalConfig {
            timeout: Duration::from_millis(200),
            max_pending: 1,
            ..ApprovalConfig::default()
        });
        let first = approvals
            .request("task", "file_write", "{}", Tier::Write)
            .await
            .expect("asked");
        let full = approvals
            .request("task", "file_write", "{}", Tier::Write)
            .await;
        assert!(matches!(full, Err(ApprovalError::Full(1))), "{full:?}");
        let expired = first.approval().id.clone();
        let outcome = first.wait().await;
        assert!(!outcome.approved);
        assert!(outcome.reason.contains("approval.timeout_s"), "{outcome:?}");
        assert_eq!(shown(&approvals, &expired).status, Status::Expired);

        let dropped = approvals
            .request("task", "file_write", "{}", Tier::Write)
            .await
            .expect("the expired call's slot is free");
        let id = dropped.approval().id.clone();
        drop(dropped);
        // The drop hands the record's update to a task of its own: poll for it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while shown(&approvals, &id).status != Status::Cancelled
            || !approvals.inner.pending.lock_unpoisoned().is_empty()
        {
            assert!(tokio::time::Instant::now() < deadline, "never cancelled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(approvals.list(false, None, 10).expect("list").is_empty());
        approvals
            .request("task", "file_write", "{}", Tier::Write)
            .await
            .expect("the cancelled call's slot is free");
    }

    fn policy(tiers: &[Tier], tools: &[&str], servers: &[&str]) -> Policy {
        Policy::new(ApprovalConfig {
            tiers: tiers.iter().copied().collect(),
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
            ..ApprovalConfig::default()
        })
    }

    #[test]
    fn a_call_needs_approval_by_its_tier_its_name_or_its_mcp_server() {
        use Tier::{Read, Shell, Write};
        let none = policy(&[], &[], &[]);
        let shell = policy(&[Shell], &[], &[]);
        let named = policy(&[], &["file_write", "time__now"], &[]);
        let git = policy(&[], &[], &["git"]);
        // (policy, tool, tier, needs approval)
        let cases = [
            (&none, "shell_exec", Shell, false),
            (&shell, "shell_exec", Shell, true),
            (&shell, "file_write", Write, false),
            // Only the listed tier, not the ones below it.
            (&shell, "file_read", Read, false),
            // A delegation counts as the tier it asks for.
            (&shell, "delegate", Shell, true),
            (&named, "file_write", Write, true),
            (&named, "time__now", Read, true),
            (&named, "time__later", Read, false),
            (&named, "memory_put", Write, false),
            (&git, "git__commit", Write, true),
            (&git, "git__status", Read, true),
            // The prefix must be the whole server name, then `__`, then a tool.
            (&git, "github__issues", Read, false),
            (&git, "git_commit", Read, false),
            (&git, "git__", Read, false),
            (&git, "git", Read, false),
        ];
        for (policy, tool, tier, expected) in cases {
            assert_eq!(
                policy.needs(tool, tier),
                expected,
                "{tool} at {tier} with {policy:?}"
            );
        }
    }

    #[test]
    fn a_pending_approval_past_its_expiry_reads_as_expired() {
        let approval = Approval {
            id: uuid::Uuid::now_v7().to_string(),
            task_id: "t".into(),
            tool: "shell_exec".into(),
            arguments: "{}".into(),
            tier: Tier::Shell,
            node: "n".into(),
            node_id: "x".into(),
            created_ms: 10,
            expires_ms: 20,
            status: Status::Pending,
            decided_by: None,
            reason: String::new(),
            decided_ms: None,
        };
        assert_eq!(approval.status_at(20), Status::Pending);
        assert_eq!(approval.status_at(21), Status::Expired);
        let denied = Approval {
            status: Status::Denied,
            ..approval
        };
        assert_eq!(denied.status_at(21), Status::Denied);
    }

    #[test]
    fn only_a_canonical_uuid_is_an_approval_id() {
        assert!(check_id(&uuid::Uuid::now_v7().to_string()).is_ok());
        for bad in [
            "",
            "x",
            "../decision",
            "0192C5D2-7E4F-7A3B-9C1D-2E3F4A5B6C7D",
        ] {
            assert!(
                matches!(check_id(bad), Err(ApprovalError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
