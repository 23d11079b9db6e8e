//! Tasks on the wire: a submitted `TaskSpec` (its target, requirements, lineage, limits), its
//! status, its events and its errors.

use std::time::Duration;

use mesh_domain::{
    Evaluation, EventKind, Lineage, Principal, Requirements, Target, TaskError, TaskEvent,
    TaskSpec, TaskStatus, Tier, Usage, task::MAX_TIMEOUT_S,
};
use tonic::Status;

use crate::v1 as pb;

use super::check_len;

impl From<TaskStatus> for pb::TaskStatus {
    fn from(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Queued => pb::TaskStatus::Queued,
            TaskStatus::Running => pb::TaskStatus::Running,
            TaskStatus::Completed => pb::TaskStatus::Completed,
            TaskStatus::Failed => pb::TaskStatus::Failed,
            TaskStatus::InputRequired => pb::TaskStatus::InputRequired,
            TaskStatus::Cancelled => pb::TaskStatus::Cancelled,
        }
    }
}

impl From<&TaskError> for pb::TaskError {
    fn from(error: &TaskError) -> Self {
        Self {
            kind: error.kind().into(),
            message: error.to_string(),
            fields: error.fields().into_iter().collect(),
        }
    }
}

impl From<&Target> for pb::submit_request::Target {
    fn from(target: &Target) -> Self {
        match target {
            Target::Role(r) => Self::Role(r.clone()),
            Target::Model(m) => Self::Model(m.clone()),
            Target::Persona(p) => Self::Persona(p.clone()),
        }
    }
}

impl From<pb::submit_request::Target> for Target {
    fn from(target: pb::submit_request::Target) -> Self {
        match target {
            pb::submit_request::Target::Role(r) => Self::Role(r),
            pb::submit_request::Target::Model(m) => Self::Model(m),
            pb::submit_request::Target::Persona(p) => Self::Persona(p),
        }
    }
}

impl TryFrom<pb::SubmitRequest> for TaskSpec {
    type Error = Status;

    fn try_from(request: pb::SubmitRequest) -> Result<Self, Status> {
        let target = match request.target {
            Some(target) => Target::from(target),
            None => {
                return Err(Status::invalid_argument(
                    "target: set one of role, model or persona",
                ));
            }
        };
        let tier = match pb::Tier::try_from(request.tier) {
            Ok(pb::Tier::Unspecified | pb::Tier::Read) => Tier::Read,
            Ok(pb::Tier::Write) => Tier::Write,
            Ok(pb::Tier::Shell) => Tier::Shell,
            Err(_) => return Err(Status::invalid_argument("tier: unknown value")),
        };
        // Bounds that need no decoding first, so nothing oversized is copied.
        if request.timeout_s > MAX_TIMEOUT_S {
            return Err(Status::invalid_argument(format!(
                "timeout_s: at most {MAX_TIMEOUT_S}"
            )));
        }
        let require = request.require.unwrap_or_default();
        let lineage = request.lineage.unwrap_or_default();
        let spec = TaskSpec {
            prompt: request.prompt,
            target,
            tier,
            timeout: (request.timeout_s > 0)
                .then(|| Duration::from_secs(u64::from(request.timeout_s))),
            max_rounds: (request.max_rounds > 0).then_some(request.max_rounds),
            token_budget: (request.token_budget > 0).then_some(request.token_budget),
            require: Requirements {
                gpu: require.gpu,
                min_vram_mb: (require.min_vram_mb > 0).then_some(require.min_vram_mb),
                labels: require.labels.into_iter().collect(),
                on: Some(request.on).filter(|on| !on.is_empty()),
            },
            lineage: Lineage {
                task_id: Some(lineage.task_id).filter(|id| !id.is_empty()),
                parent_id: Some(lineage.parent_id).filter(|id| !id.is_empty()),
                origin: lineage.origin_node,
                hops: lineage.hops,
                started_by: lineage.started_by.map(Principal::try_from).transpose()?,
                epoch: lineage.epoch,
            },
            session: Some(request.session).filter(|s| !s.is_empty()),
            evaluate: request.evaluate.map(Evaluation::from),
            tool: Some(request.tool).filter(|t| !t.is_empty()),
        };
        spec.check().map_err(Status::invalid_argument)?;
        Ok(spec)
    }
}

/// Unset threshold and attempts take the defaults; the bounds are [`Evaluation::check`]'s (run
/// by [`TaskSpec::check`]), so an explicit 0 attempts is refused rather than defaulted.
impl From<pb::Evaluation> for Evaluation {
    fn from(evaluation: pb::Evaluation) -> Self {
        Self {
            role: evaluation.role,
            threshold: evaluation
                .threshold
                .unwrap_or(Evaluation::DEFAULT_THRESHOLD),
            attempts: evaluation.attempts.unwrap_or(Evaluation::DEFAULT_ATTEMPTS),
        }
    }
}

impl From<&Evaluation> for pb::Evaluation {
    fn from(evaluation: &Evaluation) -> Self {
        Self {
            role: evaluation.role.clone(),
            threshold: Some(evaluation.threshold),
            attempts: Some(evaluation.attempts),
        }
    }
}

impl From<&TaskEvent> for pb::TaskEvent {
    fn from(event: &TaskEvent) -> Self {
        use pb::task_event::Kind;
        let kind = match &event.kind {
            EventKind::Accepted {
                node,
                queue_position,
            } => Kind::Accepted(pb::Accepted {
                node: node.clone(),
                queue_position: *queue_position,
            }),
            EventKind::Started { node } => Kind::Started(pb::Started { node: node.clone() }),
            EventKind::ModelCall {
                model,
                round,
                attempt,
            } => Kind::ModelCall(pb::ModelCall {
                model: model.clone(),
                round: *round,
                attempt: *attempt,
            }),
            EventKind::ModelFailed {
                model,
                error,
                falling_through,
            } => Kind::ModelFailed(pb::ModelFailed {
                model: model.clone(),
                error: error.clone(),
                falling_through: *falling_through,
            }),
            EventKind::ToolCalled {
                call_id,
                name,
                arguments,
            } => Kind::ToolCalled(pb::ToolCalled {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            EventKind::ToolResult {
                call_id,
                name,
                ok,
                output,
                consecutive_failures,
            } => Kind::ToolResult(pb::ToolResult {
                call_id: call_id.clone(),
                name: name.clone(),
                ok: *ok,
                output: output.clone(),
                consecutive_failures: *consecutive_failures,
            }),
            EventKind::Intervention { rule, message } => Kind::Intervention(pb::Intervention {
                rule: rule.clone(),
                message: message.clone(),
            }),
            EventKind::Warning { message } => Kind::Warning(pb::Warning {
                message: message.clone(),
            }),
            EventKind::OutputDelta { text } => {
                Kind::OutputDelta(pb::OutputDelta { text: text.clone() })
            }
            EventKind::Completed {
                output,
                usage,
                executed_on,
                rounds,
            } => Kind::Completed(pb::Completed {
                output: output.clone(),
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
                executed_on: executed_on.clone(),
                rounds: *rounds,
            }),
            EventKind::Failed { error, usage } => Kind::Failed(pb::Failed {
                error: Some(pb::TaskError::from(error)),
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
            }),
            EventKind::ApprovalRequested {
                approval_id,
                tool,
                arguments,
                node,
                expires_at_ms,
            } => Kind::ApprovalRequested(pb::ApprovalRequested {
                approval_id: approval_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                node: node.clone(),
                expires_at_ms: *expires_at_ms,
            }),
            EventKind::ApprovalDecided {
                approval_id,
                approved,
                by,
                reason,
            } => Kind::ApprovalDecided(pb::ApprovalDecided {
                approval_id: approval_id.clone(),
                approved: *approved,
                by: by.clone(),
                reason: reason.clone(),
            }),
            EventKind::Evaluated {
                attempt,
                score,
                critique,
                model,
                node,
                error,
            } => Kind::Evaluated(pb::Evaluated {
                attempt: *attempt,
                score: *score,
                critique: critique.clone(),
                model: model.clone(),
                node: node.clone(),
                error: error.clone().unwrap_or_default(),
            }),
            EventKind::AttemptStarted {
                attempt,
                attempts,
                reason,
            } => Kind::AttemptStarted(pb::AttemptStarted {
                attempt: *attempt,
                attempts: *attempts,
                reason: reason.clone(),
            }),
            EventKind::Delegated {
                node,
                attempt,
                reason,
            } => Kind::Delegated(pb::Delegated {
                node: node.clone(),
                attempt: *attempt,
                reason: reason.clone(),
            }),
            EventKind::Resumed {
                node,
                from_step,
                epoch,
                reason,
            } => Kind::Resumed(pb::Resumed {
                node: node.clone(),
                from_step: *from_step,
                epoch: *epoch,
                reason: reason.clone(),
            }),
        };
        Self {
            task_id: event.task_id.clone(),
            seq: event.seq,
            at_ms: event.at_ms,
            kind: Some(kind),
        }
    }
}

impl From<&TaskSpec> for pb::SubmitRequest {
    fn from(spec: &TaskSpec) -> Self {
        use pb::submit_request::Target as T;
        Self {
            prompt: spec.prompt.clone(),
            target: Some(T::from(&spec.target)),
            tier: pb::Tier::from(spec.tier) as i32,
            timeout_s: spec
                .timeout
                .map(|t| t.as_secs().clamp(1, u64::from(MAX_TIMEOUT_S)) as u32)
                .unwrap_or(0),
            max_rounds: spec.max_rounds.unwrap_or(0),
            token_budget: spec.token_budget.unwrap_or(0),
            require: Some(pb::Requirements {
                gpu: spec.require.gpu,
                min_vram_mb: spec.require.min_vram_mb.unwrap_or(0),
                labels: spec.require.labels.clone().into_iter().collect(),
            }),
            on: spec.require.on.clone().unwrap_or_default(),
            lineage: Some(pb::Lineage {
                task_id: spec.lineage.task_id.clone().unwrap_or_default(),
                parent_id: spec.lineage.parent_id.clone().unwrap_or_default(),
                origin_node: spec.lineage.origin.clone(),
                hops: spec.lineage.hops,
                started_by: spec.lineage.started_by.as_ref().map(pb::Principal::from),
                epoch: spec.lineage.epoch,
            }),
            session: spec.session.clone().unwrap_or_default(),
            evaluate: spec.evaluate.as_ref().map(pb::Evaluation::from),
            tool: spec.tool.clone().unwrap_or_default(),
        }
    }
}

/// A task event from another node, checked like any network input.
impl TryFrom<pb::TaskEvent> for TaskEvent {
    type Error = Status;

    fn try_from(event: pb::TaskEvent) -> Result<Self, Status> {
        use pb::task_event::Kind;
        const TEXT: usize = 256 * 1024;
        let text = |field: &str, value: String| check_len(field, &value, TEXT).map(|()| value);
        let kind = match event
            .kind
            .ok_or_else(|| Status::invalid_argument("kind: missing"))?
        {
            Kind::Accepted(a) => EventKind::Accepted {
                node: text("accepted.node", a.node)?,
                queue_position: a.queue_position,
            },
            Kind::Started(s) => EventKind::Started {
                node: text("started.node", s.node)?,
            },
            Kind::ModelCall(m) => EventKind::ModelCall {
                model: text("model_call.model", m.model)?,
                round: m.round,
                attempt: m.attempt,
            },
            Kind::ModelFailed(m) => EventKind::ModelFailed {
                model: text("model_failed.model", m.model)?,
                error: text("model_failed.error", m.error)?,
                falling_through: m.falling_through,
            },
            Kind::ToolCalled(t) => EventKind::ToolCalled {
                call_id: text("tool_called.call_id", t.call_id)?,
                name: text("tool_called.name", t.name)?,
                arguments: text("tool_called.arguments", t.arguments)?,
            },
            Kind::ToolResult(t) => EventKind::ToolResult {
                call_id: text("tool_result.call_id", t.call_id)?,
                name: text("tool_result.name", t.name)?,
                ok: t.ok,
                output: text("tool_result.output", t.output)?,
                consecutive_failures: t.consecutive_failures,
            },
            Kind::Intervention(i) => EventKind::Intervention {
                rule: text("intervention.rule", i.rule)?,
                message: text("intervention.message", i.message)?,
            },
            Kind::Warning(w) => EventKind::Warning {
                message: text("warning.message", w.message)?,
            },
            Kind::OutputDelta(d) => EventKind::OutputDelta {
                text: text("output_delta.text", d.text)?,
            },
            Kind::Completed(c) => EventKind::Completed {
                output: text("completed.output", c.output)?,
                usage: c
                    .usage
                    .map(|u| Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                    })
                    .unwrap_or_default(),
                executed_on: text("completed.executed_on", c.executed_on)?,
                rounds: c.rounds,
            },
            Kind::Failed(f) => EventKind::Failed {
                error: task_error_from_wire(f.error.unwrap_or_default()),
                usage: f
                    .usage
                    .map(|u| Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                    })
                    .unwrap_or_default(),
            },
            Kind::ApprovalRequested(a) => EventKind::ApprovalRequested {
                approval_id: text("approval_requested.approval_id", a.approval_id)?,
                tool: text("approval_requested.tool", a.tool)?,
                arguments: text("approval_requested.arguments", a.arguments)?,
                node: text("approval_requested.node", a.node)?,
                expires_at_ms: a.expires_at_ms,
            },
            Kind::ApprovalDecided(a) => EventKind::ApprovalDecided {
                approval_id: text("approval_decided.approval_id", a.approval_id)?,
                approved: a.approved,
                by: text("approval_decided.by", a.by)?,
                reason: text("approval_decided.reason", a.reason)?,
            },
            Kind::Evaluated(e) => EventKind::Evaluated {
                attempt: e.attempt,
                score: match e.score {
                    Some(score) if !(0.0..=1.0).contains(&score) => {
                        return Err(Status::invalid_argument(format!(
                            "evaluated.score: {score} is not between 0 and 1"
                        )));
                    }
                    score => score,
                },
                critique: text("evaluated.critique", e.critique)?,
                model: text("evaluated.model", e.model)?,
                node: text("evaluated.node", e.node)?,
                error: Some(text("evaluated.error", e.error)?).filter(|e| !e.is_empty()),
            },
            Kind::AttemptStarted(a) => EventKind::AttemptStarted {
                attempt: a.attempt,
                attempts: a.attempts,
                reason: text("attempt_started.reason", a.reason)?,
            },
            Kind::Delegated(d) => EventKind::Delegated {
                node: text("delegated.node", d.node)?,
                attempt: d.attempt,
                reason: text("delegated.reason", d.reason)?,
            },
            Kind::Resumed(r) => EventKind::Resumed {
                node: text("resumed.node", r.node)?,
                from_step: r.from_step,
                epoch: r.epoch,
                reason: text("resumed.reason", r.reason)?,
            },
        };
        Ok(Self {
            task_id: event.task_id,
            seq: event.seq,
            at_ms: event.at_ms,
            kind,
        })
    }
}

/// Rebuilds a task error from its wire form (kind + fields); unknown kinds become `internal`.
fn task_error_from_wire(error: pb::TaskError) -> TaskError {
    let mut fields: serde_json::Map<String, serde_json::Value> = error
        .fields
        .into_iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            (k, value)
        })
        .collect();
    fields.insert("kind".into(), serde_json::Value::String(error.kind));
    serde_json::from_value(serde_json::Value::Object(fields)).unwrap_or(TaskError::Internal {
        message: error.message,
    })
}
