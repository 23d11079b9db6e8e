//! Approval gates: tool calls that wait for a person's decision before they run.
//!
//! [`ApprovalPolicy`] (pure) says which calls need approval: their tier, their tool's name, or their
//! MCP server (`<server>__<tool>`), as `[approval]` lists them. [`Approvals`] keeps the gated
//! calls in the replicated system namespace `approvals`, so every node lists them and takes a
//! decision for any of them:
//! - `<approval id>`: the [`Approval`], the request and what became of it, written only by the
//!   node running the call ([`Approvals::request`], then the outcome), whose short id ends the
//!   approval's id (the memory's writer rules refuse it from any other node);
//! - `<approval id>/decision`: a [`Decision`], written by the node that took
//!   `Approvals.Decide` ([`Approvals::decide`]), which replicates to the running node. It
//!   carries the decider's own act: an [`ApprovalStatement`] of the call as they were shown it
//!   and what they decided, signed with the key of their client certificate.
//!
//! The running node waits on a [`Pending`] ([`Pending::wait`]): it re-reads the decision each
//! time its memory changes (no polling) until the approval's timeout, when the call is denied.
//! Before it acts on a decision it checks the statement itself (chain to the mesh CA, client
//! role, not revoked, signature, and that it is about this very call: id, task, node, tool,
//! tier, SHA-256 of the full arguments, expiry); a decision that fails is ignored, not taken as
//! a denial (a forger must not be able to deny either), counted, and the call goes on waiting.
//! Who may decide is asked of `admission` ([`Admission::may_approve`]), both where the decision
//! is taken and where it is acted on. A `Pending` dropped before it is decided (the task was
//! cancelled, hit its deadline, the caller of `Tools.Call` went away, or the node stopped)
//! marks its approval cancelled. [`Approvals::gate`] is the whole wait as a tool call makes it:
//! asked, reported, decided, reported.
//!
//! This module does not run tools (that is `agent`, and `rpc::tools` for `Tools.Call`) and
//! speaks no protobuf (that is `rpc::approvals`); the task events it describes go where its
//! caller sends them.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use mesh_domain::{
    EventKind, Principal,
    id::tagged_uuid,
    keys::{APPROVALS, decision_key},
    statement::{ApprovalStatement, Signed, StatementKind},
    sync::MutexExt,
    text::truncate,
    time::now_ms,
};
use sha2::{Digest, Sha256};

use crate::{
    admission::{Admission, ApproverError},
    config::ApprovalConfig,
    memory::Memory,
    metrics::{labels, metrics},
};

mod record;

pub(crate) use self::record::{
    Approval, ApprovalError, ApprovalPolicy, Call, Decision, MAX_ARGUMENTS, MAX_LIST, MAX_REASON,
    Outcome, Status,
};
use self::record::{MAX_KEPT, MAX_SCAN, RETENTION_MS, check_id};

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
    policy: Mutex<ApprovalPolicy>,
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
                policy: Mutex::new(ApprovalPolicy::new(config)),
                node,
                tls,
                pending: Mutex::default(),
            }),
        }
    }

    /// Which calls need approval here, now.
    pub fn policy(&self) -> ApprovalPolicy {
        self.inner.policy.lock_unpoisoned().clone()
    }

    /// Changes which calls need approval here (a runtime setting); calls already waiting keep
    /// the timeout they were given.
    pub fn set_policy(&self, config: ApprovalConfig) {
        *self.inner.policy.lock_unpoisoned() = ApprovalPolicy::new(config);
    }

    /// Asks for approval of `call`: stores the request, which replicates, and returns what to
    /// wait on. Refused when `approval.max_pending` calls wait here already.
    pub async fn request(&self, call: Call<'_>) -> Result<Pending, ApprovalError> {
        let policy = self.policy();
        let max = policy.config.max_pending;
        let own = self.inner.memory.own_id();
        // Its id names this node: no other node can write at it (the memory's writer rules).
        let id = tagged_uuid(own).to_string();
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
                task_id: call.task_id.to_owned(),
                tool: truncate(call.tool, 64).to_owned(),
                arguments: truncate(call.arguments, MAX_ARGUMENTS).to_owned(),
                arguments_sha256: hex::encode(Sha256::digest(call.arguments.as_bytes())),
                tier: call.tier,
                node: self.inner.node.clone(),
                node_id: own.to_string(),
                called_from: truncate(call.called_from, 256).to_owned(),
                created_ms: now,
                expires_ms: now.saturating_add(timeout),
                status: Status::Pending,
                decided_by: None,
                reason: String::new(),
                decided_ms: None,
            },
            settled: false,
            ignored: None,
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

    /// Asks for approval of `call` and waits for the decision, reporting both as task events
    /// (`ApprovalRequested`, `ApprovalDecided`) to `report`: `Ok` when approved, else what the
    /// model is told (`denied: …`). Dropping the returned future (the task was cancelled or
    /// hit its deadline, a `Tools.Call` caller went away) marks the approval cancelled.
    pub async fn gate(
        &self,
        call: Call<'_>,
        report: &(dyn Fn(EventKind) + Sync),
    ) -> Result<(), String> {
        let pending = self
            .request(call)
            .await
            .map_err(|e| format!("denied: {e}"))?;
        let approval = pending.approval();
        report(EventKind::ApprovalRequested {
            approval_id: approval.id.clone(),
            tool: approval.tool.clone(),
            arguments: approval.arguments.clone(),
            node: approval.node.clone(),
            expires_at_ms: approval.expires_ms,
        });
        let approval_id = approval.id.clone();
        let outcome = pending.wait().await;
        report(EventKind::ApprovalDecided {
            approval_id,
            approved: outcome.approved,
            by: outcome.by,
            reason: outcome.reason.clone(),
        });
        if outcome.approved {
            Ok(())
        } else if outcome.reason.is_empty() {
            Err("denied: a person refused this call".into())
        } else {
            Err(format!("denied: {}", outcome.reason))
        }
    }

    /// Records a decision on approval `id` by `by` (`None` only in insecure mode), after
    /// checking that it is pending, that `by` may decide it, and that `grant` is `by`'s own
    /// signed statement of this decision on this call as this node holds it. The node running
    /// the call checks the statement again before it acts on it.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        by: Option<Principal>,
        reason: &str,
        grant: Option<Signed>,
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
        // A decision the running node would ignore (not a person's signed act on this call)
        // settles nothing.
        if let Some((_, decision)) = self.decision(id)?
            && self.judge(&record, decision.clone()).is_ok()
        {
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
        let grant = match (by.as_ref(), grant) {
            (Some(by), Some(grant)) => {
                let signer = self
                    .inner
                    .memory
                    .verify_statement(StatementKind::ApprovalDecision, &grant, now_ms())
                    .map_err(|e| ApprovalError::Statement(format!("statement: {e}")))?;
                if signer.id != by.id {
                    return Err(ApprovalError::Statement(
                        "statement: signed with another certificate than the one this call comes with; sign your own decision".into(),
                    ));
                }
                let statement: ApprovalStatement =
                    grant.parse().map_err(ApprovalError::Statement)?;
                if statement != record.statement(approve, reason) {
                    return Err(ApprovalError::Statement(format!(
                        "statement: it is not this decision on approval `{id}` as this node holds it (the call's id, task, node, tool, tier, arguments or expiry, or the decision and reason, differ); fetch the approval again and sign what it shows"
                    )));
                }
                Some(grant)
            }
            (Some(_), None) => {
                return Err(ApprovalError::Statement(
                    "statement: a decision must be signed with the decider's own client key (mesh-cli approvals approve/deny does it; upgrade an older mesh-cli)".into(),
                ));
            }
            (None, _) => None,
        };
        let decision = Decision {
            approved: approve,
            by,
            reason: reason.to_owned(),
            at_ms: now_ms(),
            grant,
        };
        let value = serde_json::to_vec(&decision)
            .map_err(|e| ApprovalError::Invalid(format!("encode the decision: {e}")))?;
        self.inner
            .memory
            .put(APPROVALS, &decision_key(id), Some(value))
            .await?;
        Ok(record)
    }

    /// The approval `id`, as this node holds it.
    pub fn get(&self, id: &str) -> Result<Approval, ApprovalError> {
        check_id(id)?;
        let now = now_ms();
        self.read(id)?
            .map(|mut approval| {
                approval.status = approval.status_at(now);
                approval
            })
            .ok_or_else(|| ApprovalError::NotFound(id.to_owned()))
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

    /// The decision taken on `id`, if any, with the stamp of the record that holds it.
    fn decision(&self, id: &str) -> Result<Option<(u64, Decision)>, ApprovalError> {
        Ok(self
            .inner
            .memory
            .get(APPROVALS, &decision_key(id))?
            .filter(|r| !r.tombstone)
            .and_then(|r| Some((r.hlc, serde_json::from_slice(&r.value).ok()?))))
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

    /// What to do with `decision` on `record`'s call, here: `Err` (the reason it is counted
    /// under, and why) when the decider's signed statement is missing, does not verify, or is
    /// not about this very call (the call goes on waiting); else a denial stands, and an
    /// approval only from someone this node lets approve the call
    /// ([`Admission::may_approve`]). In insecure mode nobody signs: decisions are taken as
    /// they come.
    fn judge(
        &self,
        record: &Approval,
        decision: Decision,
    ) -> Result<(Outcome, Option<Principal>), (&'static str, String)> {
        let (by, approved, reason) = if self.inner.tls {
            let grant = decision
                .grant
                .ok_or(("unsigned", "it carries no signed statement".to_owned()))?;
            let signer = self
                .inner
                .memory
                .verify_statement(StatementKind::ApprovalDecision, &grant, now_ms())
                .map_err(|e| (e.reason(), e.to_string()))?;
            let statement: ApprovalStatement = grant.parse().map_err(|e| ("malformed", e))?;
            if statement != record.statement(statement.approve, &statement.reason) {
                return Err((
                    "mismatch",
                    format!("{signer} signed a decision on another call"),
                ));
            }
            (Some(signer), statement.approve, statement.reason)
        } else {
            (decision.by, decision.approved, decision.reason)
        };
        let name = by.as_ref().map(ToString::to_string).unwrap_or_default();
        if !approved {
            let outcome = Outcome {
                approved: false,
                by: name,
                reason,
            };
            return Ok((outcome, by));
        }
        let refused = by.as_ref().and_then(|principal| {
            self.inner
                .admission
                .may_approve(principal, record.tier)
                .err()
                .map(|e| e.to_string())
        });
        let outcome = match refused {
            Some(why) => Outcome {
                approved: false,
                by: name,
                reason: format!("an approval this node does not accept: {why}"),
            },
            None => Outcome {
                approved: true,
                by: name,
                reason,
            },
        };
        Ok((outcome, by))
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
    /// The stamp of the last decision record ignored, so it is counted and logged once, not at
    /// every change of the memory.
    ignored: Option<u64>,
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
                Ok(Some((stamp, _))) if self.ignored == Some(stamp) => {}
                Ok(Some((stamp, decision))) => match approvals.judge(&self.record, decision) {
                    Ok((outcome, by)) => {
                        self.record.status = if outcome.approved {
                            Status::Approved
                        } else {
                            Status::Denied
                        };
                        self.record.decided_by = by;
                        break outcome;
                    }
                    Err((reason, why)) => {
                        self.ignored = Some(stamp);
                        metrics()
                            .approval_decisions_ignored
                            .get_or_create(&labels(&[("reason", reason)]))
                            .inc();
                        tracing::warn!(approval = %self.record.id, reason, %why, "ignored a decision on an approval: the call goes on waiting for one its decider signed");
                    }
                },
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
    use mesh_cert::{CertIdentity, OriginSigner, statement::sign};
    use mesh_domain::{CertRole, Tier};

    use super::*;
    use crate::{capabilities::test_support::test_capabilities, memory::test_support::CaMesh};

    /// Approvals on the memory of a node of a mesh with a CA, whose `client_max_tier` is
    /// `write`; the mesh holds the memory and issues the people who decide.
    fn approvals(config: ApprovalConfig) -> (CaMesh, Approvals) {
        let mesh = CaMesh::new("approvals-me");
        let admission = Arc::new(Admission::new(
            test_capabilities(),
            Arc::default(),
            Tier::Write,
        ));
        let approvals = Approvals::new(mesh.memory.clone(), admission, "me".into(), config, true);
        (mesh, approvals)
    }

    /// A new member of `mesh`, and who its certificate says it is.
    fn member(mesh: &CaMesh, name: &str, role: CertRole) -> (OriginSigner, Principal) {
        let signer = mesh.member(name, role);
        let who = CertIdentity::from_der(signer.certificate())
            .expect("certificate")
            .principal();
        (signer, who)
    }

    /// `by`'s signed statement of `approve` on `approval` with `reason`.
    fn grant(by: &OriginSigner, approval: &Approval, approve: bool, reason: &str) -> Signed {
        let statement = approval.statement(approve, reason);
        sign(
            by,
            StatementKind::ApprovalDecision,
            serde_json::to_vec(&statement).expect("json"),
        )
        .expect("sign")
    }

    /// A call of `tool` at `tier` by task `task`, from this node's own task.
    fn call<'a>(tool: &'a str, arguments: &'a str, tier: Tier) -> Call<'a> {
        Call {
            task_id: "task",
            tool,
            arguments,
            tier,
            called_from: "",
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

    /// Writes `decision` on approval `id` straight into this node's memory, as a replicated
    /// record would arrive had the writer rules let it through.
    async fn write_decision(approvals: &Approvals, id: &str, decision: &Decision) {
        approvals
            .inner
            .memory
            .put(
                APPROVALS,
                &decision_key(id),
                Some(serde_json::to_vec(decision).expect("json")),
            )
            .await
            .expect("written");
    }

    fn ignored(reason: &str) -> u64 {
        metrics()
            .approval_decisions_ignored
            .get_or_create(&labels(&[("reason", reason)]))
            .get()
    }

    #[tokio::test]
    async fn an_approval_by_a_client_lets_the_call_run_and_is_recorded() {
        let (mesh, approvals) = approvals(ApprovalConfig::default());
        let arguments = format!(
            r#"{{"path": "x", "text": "{}"}}"#,
            "y".repeat(2 * MAX_ARGUMENTS)
        );
        let pending = approvals
            .request(call("file_write", &arguments, Tier::Write))
            .await
            .expect("asked");
        let record = pending.approval().clone();
        let id = record.id.clone();
        assert!(
            mesh_domain::id::is_tagged_by(&id, approvals.inner.memory.own_id()),
            "its id names this node: {id}"
        );
        assert_eq!(record.arguments.len(), MAX_ARGUMENTS, "cut");
        assert_eq!(
            record.arguments_sha256,
            hex::encode(Sha256::digest(arguments.as_bytes())),
            "the hash is of the full arguments"
        );
        assert_eq!(approvals.list(false, None, 10).expect("list").len(), 1);
        assert_eq!(
            approvals.list(false, Some("other task"), 10).expect("list"),
            []
        );
        let waiting = tokio::spawn(pending.wait());
        let (ada_key, ada) = member(&mesh, "ada", CertRole::Client);
        let signed = grant(&ada_key, &record, true, "looks fine");
        approvals
            .decide(&id, true, Some(ada.clone()), "looks fine", Some(signed))
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
        let again = approvals
            .decide(
                &id,
                false,
                Some(ada),
                "",
                Some(grant(&ada_key, &record, false, "")),
            )
            .await;
        assert!(
            matches!(again, Err(ApprovalError::Settled { .. })),
            "{again:?}"
        );
    }

    #[tokio::test]
    async fn a_node_or_a_client_below_the_calls_tier_may_not_decide() {
        let (mesh, approvals) = approvals(ApprovalConfig::default());
        let shell = approvals
            .request(call("shell_exec", "{}", Tier::Shell))
            .await
            .expect("asked");
        let record = shell.approval().clone();
        let id = record.id.clone();
        let (laptop_key, laptop) = member(&mesh, "laptop", CertRole::Node);
        let (ada_key, ada) = member(&mesh, "ada", CertRole::Client);
        for (by, key, approve) in [
            (Some(laptop.clone()), &laptop_key, true),
            (Some(laptop), &laptop_key, false),
            // This node's client_max_tier is `write`: its clients may not approve `shell`.
            (Some(ada), &ada_key, true),
            (None, &ada_key, true),
        ] {
            let signed = grant(key, &record, approve, "");
            let refused = approvals
                .decide(&id, approve, by.clone(), "", Some(signed))
                .await;
            assert!(
                matches!(refused, Err(ApprovalError::Approver(_))),
                "{by:?}: {refused:?}"
            );
        }
        assert!(approvals.decision(&id).expect("read").is_none());
        assert_eq!(shown(&approvals, &id).status, Status::Pending);
        let unknown = uuid::Uuid::now_v7().to_string();
        let missing = approvals.decide(&unknown, true, None, "", None).await;
        assert!(
            matches!(missing, Err(ApprovalError::NotFound(_))),
            "{missing:?}"
        );
        let long = approvals
            .decide(&id, false, None, &"x".repeat(MAX_REASON + 1), None)
            .await;
        assert!(matches!(long, Err(ApprovalError::Invalid(_))), "{long:?}");
    }

    /// Issue 26, item 1: `Approvals.Decide` takes only the caller's own signed statement of this
    /// very decision on this very call.
    #[tokio::test]
    async fn a_decision_must_come_with_the_callers_own_statement_of_it() {
        let (mesh, approvals) = approvals(ApprovalConfig::default());
        let pending = approvals
            .request(call("file_write", r#"{"path": "x"}"#, Tier::Write))
            .await
            .expect("asked");
        let record = pending.approval().clone();
        let id = record.id.clone();
        let (ada_key, ada) = member(&mesh, "ada", CertRole::Client);
        let (bob_key, _) = member(&mesh, "bob", CertRole::Client);
        let other_call = Approval {
            arguments_sha256: hex::encode(Sha256::digest(b"{}")),
            ..record.clone()
        };
        for (what, signed) in [
            ("no statement", None),
            ("another person's", Some(grant(&bob_key, &record, true, ""))),
            ("a denial", Some(grant(&ada_key, &record, false, ""))),
            (
                "another reason",
                Some(grant(&ada_key, &record, true, "other")),
            ),
            (
                "other arguments",
                Some(grant(&ada_key, &other_call, true, "")),
            ),
        ] {
            let refused = approvals
                .decide(&id, true, Some(ada.clone()), "", signed)
                .await;
            assert!(
                matches!(refused, Err(ApprovalError::Statement(_))),
                "{what}: {refused:?}"
            );
        }
        assert!(approvals.decision(&id).expect("read").is_none());
        drop(pending);
    }

    /// Issue 26, item 1: the running node acts only on a decision whose signed statement it
    /// verifies itself. A decision written into the namespace by a node (the forgery of the
    /// issue: any node certificate could push one naming any client) is ignored and counted,
    /// not taken as a denial, and the call waits on; a person's signed denial stands, and
    /// their signed approval counts only from someone this node lets approve the call.
    #[tokio::test]
    async fn the_running_node_ignores_a_decision_it_cannot_verify_and_waits_for_a_signed_one() {
        let (mesh, approvals) = approvals(ApprovalConfig::default());
        let pending = approvals
            .request(call("file_write", "{}", Tier::Write))
            .await
            .expect("asked");
        let record = pending.approval().clone();
        let id = record.id.clone();
        let mut waiting = tokio::spawn(pending.wait());
        let (rogue_key, _) = member(&mesh, "rogue", CertRole::Node);
        let (ada_key, ada) = member(&mesh, "ada", CertRole::Client);
        let forged = |grant: Option<Signed>| Decision {
            approved: true,
            by: Some(ada.clone()),
            reason: String::new(),
            at_ms: now_ms(),
            grant,
        };
        let elsewhere = Approval {
            id: tagged_uuid(approvals.inner.memory.own_id()).to_string(),
            ..record.clone()
        };
        let mut altered = grant(&ada_key, &record, false, "");
        altered.statement = serde_json::to_vec(&record.statement(true, "")).expect("json");
        for (reason, decision) in [
            ("unsigned", forged(None)),
            (
                "certificate",
                forged(Some(grant(&rogue_key, &record, true, ""))),
            ),
            (
                "mismatch",
                forged(Some(grant(&ada_key, &elsewhere, true, ""))),
            ),
            ("signature", forged(Some(altered))),
        ] {
            let before = ignored(reason);
            write_decision(&approvals, &id, &decision).await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while ignored(reason) == before {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{reason}: not counted"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(!waiting.is_finished(), "{reason}: the call still waits");
            assert_eq!(shown(&approvals, &id).status, Status::Pending, "{reason}");
        }
        // The ignored decisions settle nothing: Ada (who may approve `write` here) decides,
        // and her signed approval runs the call.
        approvals
            .decide(
                &id,
                true,
                Some(ada.clone()),
                "fine",
                Some(grant(&ada_key, &record, true, "fine")),
            )
            .await
            .expect("decided over the ignored ones");
        let outcome = (&mut waiting).await.expect("waited");
        assert!(outcome.approved, "{outcome:?}");
        assert_eq!(shown(&approvals, &id).decided_by, Some(ada.clone()));

        // A person whose certificate may not approve `shell` here: a denial, as before.
        let shell = approvals
            .request(call("shell_exec", "{}", Tier::Shell))
            .await
            .expect("asked");
        let record = shell.approval().clone();
        write_decision(
            &approvals,
            &record.id,
            &forged(Some(grant(&ada_key, &record, true, ""))),
        )
        .await;
        let outcome = shell.wait().await;
        assert!(!outcome.approved, "{outcome:?}");
        assert!(outcome.reason.contains("does not accept"), "{outcome:?}");
    }

    /// `--insecure`: nobody has a certificate, so decisions are taken as they come, unsigned.
    #[tokio::test]
    async fn in_insecure_mode_a_decision_needs_no_signature() {
        let (_dir, memory) = crate::memory::test_support::open_memory(
            &crate::memory::test_support::id("approvals-insecure"),
            crate::memory::MemoryOptions::default(),
        );
        let admission = Arc::new(Admission::new(
            test_capabilities(),
            Arc::default(),
            Tier::Write,
        ));
        let approvals = Approvals::new(
            memory,
            admission,
            "me".into(),
            ApprovalConfig::default(),
            false,
        );
        let pending = approvals
            .request(call("file_write", "{}", Tier::Write))
            .await
            .expect("asked");
        let id = pending.approval().id.clone();
        let waiting = tokio::spawn(pending.wait());
        approvals
            .decide(&id, true, None, "ok", None)
            .await
            .expect("decided");
        let outcome = waiting.await.expect("waited");
        assert!(outcome.approved, "{outcome:?}");
        assert_eq!(shown(&approvals, &id).status, Status::Approved);
    }

    #[tokio::test]
    async fn an_undecided_call_expires_and_a_dropped_one_is_cancelled_and_frees_its_slot() {
        let (_mesh, approvals) = approvals(ApprovalConfig {
            timeout: Duration::from_millis(200),
            max_pending: 1,
            ..ApprovalConfig::default()
        });
        let first = approvals
            .request(call("file_write", "{}", Tier::Write))
            .await
            .expect("asked");
        let full = approvals
            .request(call("file_write", "{}", Tier::Write))
            .await;
        assert!(matches!(full, Err(ApprovalError::Full(1))), "{full:?}");
        let expired = first.approval().id.clone();
        let outcome = first.wait().await;
        assert!(!outcome.approved);
        assert!(outcome.reason.contains("approval.timeout_s"), "{outcome:?}");
        assert_eq!(shown(&approvals, &expired).status, Status::Expired);

        let dropped = approvals
            .request(call("file_write", "{}", Tier::Write))
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
            .request(call("file_write", "{}", Tier::Write))
            .await
            .expect("the cancelled call's slot is free");
    }

    fn policy(tiers: &[Tier], tools: &[&str], servers: &[&str]) -> ApprovalPolicy {
        ApprovalPolicy::new(ApprovalConfig {
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
            arguments_sha256: String::new(),
            tier: Tier::Shell,
            node: "n".into(),
            node_id: "x".into(),
            called_from: String::new(),
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
