//! What happens to a task on the way, as its events report it: [`EventKind`] and the numbered
//! [`TaskEvent`] every node records, relays and streams to watchers. Every node, the CLI and
//! the wire contract share these.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{chat::Usage, task::TaskError};

/// What happened to a task: one step of its life, as its events report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A node admitted it.
    Accepted {
        /// Node that admitted it.
        node: String,
        /// Tasks ahead of it.
        queue_position: u32,
    },
    /// A worker picked it up.
    Started {
        /// Node running it.
        node: String,
    },
    /// A model call begins.
    ModelCall {
        /// The model called (its configured name).
        model: String,
        /// Loop round (1-based).
        round: u32,
        /// Attempt in the chain (1-based).
        attempt: u32,
    },
    /// A model call failed.
    ModelFailed {
        /// The model that failed.
        model: String,
        /// How it failed.
        error: String,
        /// Whether the next model is tried.
        falling_through: bool,
    },
    /// The model called a tool.
    ToolCalled {
        /// The model's id for the call.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The arguments as the model wrote them (JSON text, possibly malformed).
        arguments: String,
    },
    /// A tool call's result.
    ToolResult {
        /// The id of the call this answers.
        call_id: String,
        /// The tool's name.
        name: String,
        /// Whether the call succeeded.
        ok: bool,
        /// What the model sees.
        output: String,
        /// Consecutive failures of the tool.
        consecutive_failures: u32,
    },
    /// The supervisor spoke.
    Intervention {
        /// The supervisor's rule that spoke (`repeat`, `tier`, …).
        rule: String,
        /// Message added to the conversation.
        message: String,
    },
    /// Something went wrong that did not stop the task (its session turn was not saved).
    Warning {
        /// What went wrong, and what it means for the caller.
        message: String,
    },
    /// Streamed output.
    OutputDelta {
        /// The next piece of the answer.
        text: String,
    },
    /// The task completed with an answer.
    Completed {
        /// Final answer.
        output: String,
        /// Tokens used.
        usage: Usage,
        /// Node that ran it.
        executed_on: String,
        /// Rounds used.
        rounds: u32,
    },
    /// The task failed (or was cancelled, or passed its deadline).
    Failed {
        /// Why, as one typed error.
        error: TaskError,
        /// Tokens its model calls spent before it ended: what they reported, an estimate for
        /// a call that reported none, and for a call that failed or was cut off the estimate of
        /// its prompt. Budgets charge it (a failed task spent as much as its calls did).
        #[serde(default)]
        usage: Usage,
    },
    /// A tool call waits for a person's approval (the task is `input_required` until it is
    /// decided).
    ApprovalRequested {
        /// The approval's id, for `mesh-cli approvals approve ID`.
        approval_id: String,
        /// The tool called.
        tool: String,
        /// The call's arguments as the model wrote them (capped).
        arguments: String,
        /// The node the call waits on (the one running the task).
        node: String,
        /// When it is denied unless decided (unix ms).
        expires_at_ms: u64,
    },
    /// An approval was decided: approved or denied by a person, or denied because nobody
    /// decided in time.
    ApprovalDecided {
        /// The approval's id.
        approval_id: String,
        /// Whether the call runs.
        approved: bool,
        /// Who decided, as their certificate reads (`client `ada` (1a2b3c4d)`); empty when
        /// nobody did (a timeout).
        by: String,
        /// Why (the denier's reason, or the timeout); what the model is told when denied.
        reason: String,
    },
    /// An evaluator scored an attempt's answer (see [`Evaluation`]).
    Evaluated {
        /// The attempt scored (1-based).
        attempt: u32,
        /// From 0 to 1; `None` when the attempt is unscored (see `error`).
        score: Option<f64>,
        /// What the evaluator says could be better (empty when unscored).
        critique: String,
        /// The evaluator's model (its configured name on its node; empty when none answered).
        model: String,
        /// The node the evaluator ran on (empty when none answered).
        node: String,
        /// Why the attempt is unscored: the evaluator failed, or twice answered no valid score.
        error: Option<String>,
    },
    /// The task runs again because the previous answer was not good enough.
    AttemptStarted {
        /// This attempt (1-based; the first attempt has no such event).
        attempt: u32,
        /// Most attempts the task may take.
        attempts: u32,
        /// Why: the previous attempt's score against the threshold, or why it is unscored.
        reason: String,
    },
    /// Resumed on another node from its journal after the node running it was lost.
    Resumed {
        node: String,
        /// The first step that node runs itself; the ones before are replayed.
        from_step: u32,
        /// The journal epoch it runs at.
        epoch: u32,
        /// Why the previous node was left.
        reason: String,
    },
    /// Sent to another node.
    Delegated {
        node: String,
        /// 1-based; more than 1 is a failover.
        attempt: u32,
        /// Why the previous attempt ended.
        reason: String,
    },
}

impl EventKind {
    /// Whether this is the last event of a task (completed or failed).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Completed { .. } | Self::Failed { .. })
    }
}

/// One line for a person following the task, after a mark that tells its kind at a glance
/// (`·` progress, `↪` sent elsewhere, `→`/`←` a tool call and its result, `!` trouble, `?`
/// waiting for a person, `★`/`↻` the evaluator, `✓`/`✗` the end; streamed text is `output:`,
/// no step): what `mesh-cli run` and `tasks show` print and the front door's MCP progress
/// says, so they cannot drift apart.
impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accepted {
                node,
                queue_position: 0,
            } => write!(f, "· accepted by {node}"),
            Self::Accepted {
                node,
                queue_position,
            } => write!(f, "· queued on {node} ({queue_position} ahead)"),
            Self::Started { node } => write!(f, "· running on {node}"),
            Self::Delegated {
                node,
                attempt: 0 | 1,
                ..
            } => write!(f, "↪ delegated to {node}"),
            Self::Delegated {
                node,
                attempt,
                reason,
            } => write!(f, "↪ re-routed to {node} (attempt {attempt}): {reason}"),
            Self::Resumed {
                node,
                from_step,
                epoch,
                reason,
            } => write!(
                f,
                "↻ resumed on {node} from step {from_step} (epoch {epoch}): {reason}"
            ),
            Self::ModelCall {
                model,
                round,
                attempt,
            } => write!(f, "· round {round}: {model} (attempt {attempt})"),
            Self::ModelFailed {
                model,
                error,
                falling_through,
            } => {
                let next = if *falling_through {
                    "; trying the next model"
                } else {
                    ""
                };
                write!(f, "! model {model} failed: {error}{next}")
            }
            Self::ToolCalled {
                name, arguments, ..
            } => write!(f, "→ {name} {arguments}"),
            Self::ToolResult {
                name,
                ok,
                output,
                consecutive_failures,
                ..
            } => {
                let first: String = output
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(120)
                    .collect();
                write!(f, "← {name} {}", if *ok { "ok" } else { "failed" })?;
                if *consecutive_failures > 0 {
                    write!(f, " ({consecutive_failures} failures in a row)")?;
                }
                write!(f, ": {first}")
            }
            Self::Intervention { rule, message } => write!(f, "! supervisor ({rule}): {message}"),
            Self::Warning { message } => write!(f, "! warning: {message}"),
            Self::OutputDelta { text } => write!(f, "output: {text}"),
            Self::Completed {
                executed_on,
                rounds,
                usage,
                ..
            } => write!(
                f,
                "✓ completed on {executed_on} in {rounds} round{} ({} tokens)",
                if *rounds == 1 { "" } else { "s" },
                usage.prompt_tokens + usage.completion_tokens
            ),
            Self::Failed {
                error: error @ TaskError::Cancelled { .. },
                ..
            } => write!(f, "✗ cancelled: {error}"),
            Self::Failed { error, .. } => write!(f, "✗ failed: {error}"),
            Self::ApprovalRequested {
                approval_id,
                tool,
                arguments,
                node,
                ..
            } => write!(
                f,
                "? approval {approval_id} asked: `{tool}` on {node} {arguments}"
            ),
            Self::ApprovalDecided {
                approval_id,
                approved,
                by,
                reason,
            } => {
                let mark = if *approved {
                    "✓ approved"
                } else {
                    "✗ denied"
                };
                write!(f, "{mark} {approval_id}")?;
                if !by.is_empty() {
                    write!(f, " by {by}")?;
                }
                if !reason.is_empty() {
                    write!(f, ": {reason}")?;
                }
                Ok(())
            }
            Self::Evaluated {
                attempt,
                score: Some(score),
                critique,
                model,
                node,
                ..
            } => write!(
                f,
                "★ attempt {attempt} scored {score:.2} by {model} on {node}: {critique}"
            ),
            Self::Evaluated { attempt, error, .. } => write!(
                f,
                "★ attempt {attempt} unscored: {}",
                error.as_deref().unwrap_or_default()
            ),
            Self::AttemptStarted {
                attempt,
                attempts,
                reason,
            } => write!(f, "↻ attempt {attempt} of {attempts}: {reason}"),
        }
    }
}

/// One event of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Task id.
    pub task_id: String,
    /// Sequence, from 0.
    pub seq: u64,
    /// Unix ms.
    pub at_ms: u64,
    pub kind: EventKind,
}
