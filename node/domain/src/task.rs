//! Tasks as the whole mesh sees them: what is asked ([`TaskSpec`], with its [`Lineage`] and
//! [`Requirements`]) and how it ends ([`Answer`] or [`TaskError`], its [`TaskStatus`]); what
//! happens on the way is in [`crate::event`]. Every node, the CLI and the wire contract share
//! these.

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{chat::Usage, id::NodeId, keys, target::Target, tier::Tier};

/// Longest prompt accepted.
pub const MAX_PROMPT_BYTES: usize = 256 * 1024;
/// Longest session name: each turn is stored under `<session>/<time>-<task id>`, which must
/// stay within a memory key's 512 bytes.
pub const MAX_SESSION_BYTES: usize = 256;
/// Longest deadline a task may ask for, in seconds.
pub const MAX_TIMEOUT_S: u32 = 86_400;
/// Most model rounds a task may ask for.
pub const MAX_ROUNDS: u32 = 1000;

/// Checks a task id that came from the network or from a store: a UUID in its canonical form
/// (36 lowercase characters with hyphens), as every node makes them, so an id can never carry a
/// separator or a NUL byte into the keys tasks and their events are stored under. The message
/// starts with `field`.
pub fn check_task_id(field: &str, id: &str) -> Result<(), String> {
    match uuid::Uuid::try_parse(id) {
        Ok(parsed) if parsed.hyphenated().to_string() == id => Ok(()),
        _ => Err(format!(
            "{field}: `{}` is not a task id; task ids are UUIDs such as `0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d` (`mesh-cli tasks` lists them)",
            crate::text::truncate(id, 80).escape_debug()
        )),
    }
}

/// A task as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// What to do.
    pub prompt: String,
    /// What runs it.
    pub target: Target,
    /// Highest tool tier.
    pub tier: Tier,
    /// Deadline from admission; `None` = the node's default.
    pub timeout: Option<Duration>,
    /// Max rounds; `None` = default.
    pub max_rounds: Option<u32>,
    /// Token budget; `None` = default.
    pub token_budget: Option<u64>,
    /// What the executing node must have (and `on`).
    #[serde(default)]
    pub require: Requirements,
    /// Where the task comes from.
    #[serde(default)]
    pub lineage: Lineage,
    /// Conversation session name.
    #[serde(default)]
    pub session: Option<String>,
    /// Have each answer scored by a model of another role, and run the task again below a
    /// threshold (`run --evaluate`); `None`: the first answer is the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluate: Option<Evaluation>,
    /// The tool the model must call in its first round (`run --tool`), by its full name
    /// (`time__get_current_time`); later rounds leave it to the model. `None`: the model
    /// chooses from the first round on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// What `--evaluate` asks: after each answer a model of `role` (wherever the mesh serves it)
/// scores it from 0 to 1 with a critique; below `threshold` the task runs again with the
/// critique, `attempts` times at most, and the best-scoring answer is the task's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The role whose model scores the answers.
    pub role: String,
    /// The score an answer needs to be accepted, 0 to 1.
    pub threshold: f64,
    /// Most attempts, the first included: 1 to [`Evaluation::MAX_ATTEMPTS`].
    pub attempts: u32,
}

impl Evaluation {
    /// The threshold when none is given.
    pub const DEFAULT_THRESHOLD: f64 = 0.8;
    /// The attempts when none are given.
    pub const DEFAULT_ATTEMPTS: u32 = 3;
    /// Most attempts a task may ask for: each one runs the whole task again.
    pub const MAX_ATTEMPTS: u32 = 5;

    /// Scoring by `role` with the default threshold and attempts.
    pub fn new(role: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            threshold: Self::DEFAULT_THRESHOLD,
            attempts: Self::DEFAULT_ATTEMPTS,
        }
    }

    /// Checks the bounds; the message starts with the field (`evaluate.role`,
    /// `evaluate.threshold`, `evaluate.attempts`).
    pub fn check(&self) -> Result<(), String> {
        if self.role.trim().is_empty() {
            return Err("evaluate.role: must not be empty; name the role whose model scores the answers (e.g. `judge`)".into());
        }
        if self.role.len() > 63 {
            return Err(format!(
                "evaluate.role: {} bytes, at most 63 allowed",
                self.role.len()
            ));
        }
        check_threshold(self.threshold).map_err(|e| format!("evaluate.threshold: {e}"))?;
        check_attempts(self.attempts).map_err(|e| format!("evaluate.attempts: {e}"))
    }

    /// Whether `score` (`None`: unscored) is good enough to stop.
    pub fn passes(&self, score: Option<f64>) -> bool {
        score.is_some_and(|score| score >= self.threshold)
    }
}

/// Checks an evaluation threshold: a number from 0 to 1.
pub fn check_threshold(threshold: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&threshold) {
        Ok(())
    } else {
        Err(format!("{threshold} is not between 0 and 1"))
    }
}

/// Checks an evaluation's attempts: 1 to [`Evaluation::MAX_ATTEMPTS`].
pub fn check_attempts(attempts: u32) -> Result<(), String> {
    if (1..=Evaluation::MAX_ATTEMPTS).contains(&attempts) {
        Ok(())
    } else {
        Err(format!(
            "{attempts} is not between 1 and {} (each attempt runs the whole task again)",
            Evaluation::MAX_ATTEMPTS
        ))
    }
}

/// Checks the name of a tool a task demands (`run --tool`): a name as the mesh names tools.
pub fn check_tool_name(name: &str) -> Result<(), String> {
    if crate::mcp::is_function_name(name) {
        Ok(())
    } else {
        Err(format!(
            "`{}` is not a tool name (1 to 64 letters, digits, `_` or `-`, e.g. `time__get_current_time`); `mesh-cli status` lists the fleet's MCP tools",
            crate::text::truncate(name, 80).escape_debug()
        ))
    }
}

/// Where a task comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Lineage {
    /// Set when another node forwarded this very task: keep its id.
    pub task_id: Option<String>,
    /// The task that started this one as a sub-task.
    pub parent_id: Option<String>,
    /// The node the task (or its root) was first submitted to; empty = this node.
    pub origin: String,
    /// Forwards and sub-task levels so far.
    pub hops: u32,
    /// Who started the task (or its root), as the node it entered the mesh at read it from the
    /// certificate; `None` when unknown (insecure mode). A node that receives the task from
    /// another node may trust this claim only to lower what the task may do.
    #[serde(default)]
    pub started_by: Option<Principal>,
    /// The journal epoch a forwarded task runs at on the node it was sent to (0: not
    /// forwarded; the task runs at epoch 1). More than 1 resumes it from its journal.
    #[serde(default)]
    pub epoch: u32,
}

/// The holder of a certificate of the mesh, as a node saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The certificate's id (hash of its public key).
    pub id: NodeId,
    /// Its common name.
    pub name: String,
    /// What the certificate is for; `None` for a legacy certificate issued without a role.
    pub role: Option<CertRole>,
}

/// What a certificate of the mesh is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertRole {
    /// A device running `mesh-node`: it serves the mesh and calls other nodes.
    Node,
    /// An operator's `mesh-cli`: it calls nodes, and can never serve as one.
    Client,
}

impl fmt::Display for CertRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Node => "node",
            Self::Client => "client",
        })
    }
}

impl FromStr for CertRole {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "node" => Ok(Self::Node),
            "client" => Ok(Self::Client),
            other => Err(format!("role `{other}`: use `node` or `client`")),
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            Some(role) => write!(f, "{role} `{}` ({})", self.name, self.id.short()),
            None => write!(
                f,
                "legacy certificate `{}` ({})",
                self.name,
                self.id.short()
            ),
        }
    }
}

impl TaskSpec {
    /// A task with only a prompt and a target: tier `read`, the node's default deadline and
    /// budgets, no requirements, submitted here (no lineage), no session.
    pub fn new(prompt: impl Into<String>, target: Target) -> Self {
        Self {
            prompt: prompt.into(),
            target,
            tier: Tier::Read,
            timeout: None,
            max_rounds: None,
            token_budget: None,
            require: Requirements::default(),
            lineage: Lineage::default(),
            session: None,
            evaluate: None,
            tool: None,
        }
    }
}

impl TaskSpec {
    /// Checks every bound a task must keep, as a node checks one from the network or from a
    /// stored schedule; the message starts with the offending field.
    pub fn check(&self) -> Result<(), String> {
        fn len(field: &str, value: &str, max: usize) -> Result<(), String> {
            if value.len() > max {
                return Err(format!(
                    "{field}: {} bytes, at most {max} allowed",
                    value.len()
                ));
            }
            Ok(())
        }
        if self.prompt.trim().is_empty() {
            return Err("prompt: must not be empty".into());
        }
        len("prompt", &self.prompt, MAX_PROMPT_BYTES)?;
        let kind = match self.target {
            Target::Role(_) => "role",
            Target::Model(_) => "model",
            Target::Persona(_) => "persona",
        };
        if self.target.name().is_empty() {
            return Err(format!("{kind}: must not be empty"));
        }
        len(kind, self.target.name(), 63)?;
        if self
            .timeout
            .is_some_and(|t| t.as_secs() > u64::from(MAX_TIMEOUT_S))
        {
            return Err(format!("timeout_s: at most {MAX_TIMEOUT_S}"));
        }
        if self.max_rounds.is_some_and(|r| r > MAX_ROUNDS) {
            return Err(format!("max_rounds: at most {MAX_ROUNDS}"));
        }
        if self.require.labels.len() > 32 {
            return Err("require.labels: at most 32".into());
        }
        for (k, v) in &self.require.labels {
            len("require.labels", k, 63)?;
            len("require.labels", v, 253)?;
        }
        // A node name (at most 63) or a node id (64 hex digits).
        len("on", self.require.on.as_deref().unwrap_or(""), 64)?;
        if let Some(id) = &self.lineage.task_id {
            check_task_id("lineage.task_id", id)?;
        }
        if let Some(id) = &self.lineage.parent_id {
            check_task_id("lineage.parent_id", id)?;
        }
        len("lineage.origin_node", &self.lineage.origin, 63)?;
        if let Some(by) = &self.lineage.started_by {
            len("lineage.started_by.name", &by.name, 63)?;
        }
        if let Some(session) = &self.session {
            keys::check_key(session).map_err(|e| format!("session: {e}"))?;
            len("session", session, MAX_SESSION_BYTES)?;
        }
        if let Some(evaluate) = &self.evaluate {
            evaluate.check()?;
        }
        if let Some(tool) = &self.tool {
            check_tool_name(tool).map_err(|e| format!("tool: {e}"))?;
        }
        Ok(())
    }
}

/// What a task needs from the node that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Requirements {
    /// At least one GPU.
    pub gpu: bool,
    /// A GPU with at least this much VRAM, MiB.
    pub min_vram_mb: Option<u64>,
    /// Labels that must match.
    pub labels: BTreeMap<String, String>,
    /// Only this node: its name, or its id or an id prefix (`router::requested` resolves it).
    pub on: Option<String>,
}

/// A finished task's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The final text.
    pub output: String,
    /// Tokens used over all rounds.
    pub usage: Usage,
    /// Rounds used.
    pub rounds: u32,
    /// The node that ran it, when not this one (delegated tasks).
    pub executed_on: Option<String>,
}

/// Why a task failed: one hierarchy, with the fields of each kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskError {
    /// Every model tried failed.
    #[error("model {name} failed: {message} (attempts: {})", attempts.join("; "))]
    Model {
        /// The last model tried.
        name: String,
        /// One line per attempt: `model: error`.
        attempts: Vec<String>,
        /// The last error.
        message: String,
    },
    /// A supervisor rule stopped the task.
    #[error("{message}")]
    Gate {
        /// The rule, e.g. `repeat`.
        rule: String,
        /// The action it stopped.
        action: String,
        message: String,
    },
    /// A budget ran out.
    #[error("budget exhausted: {used} {what} used of {limit}")]
    Budget {
        /// `tokens` or `rounds`.
        what: String,
        limit: u64,
        /// What was used.
        used: u64,
    },
    /// Something on the wire or from the model was malformed.
    #[error("{message}")]
    Protocol {
        /// What was malformed, and where.
        message: String,
    },
    /// Nothing can run the task.
    #[error("{message}")]
    Routing {
        /// Why no node could, naming the nodes.
        message: String,
    },
    /// Cancelled by a caller or by shutdown.
    #[error("cancelled: {reason}")]
    Cancelled {
        /// By whom.
        reason: String,
    },
    /// The deadline passed.
    #[error("deadline of {seconds} s exceeded")]
    Deadline { seconds: u64 },
    /// A bug or a local failure (disk).
    #[error("internal error: {message}")]
    Internal { message: String },
    /// The node running it was drained (or stopped) and gave it back to the node it came from,
    /// which runs it on another node as when a node is lost.
    #[error("{node} handed the task over: {reason}")]
    HandedOver {
        /// The node that gave it back.
        node: String,
        /// Why (`the node was drained`).
        reason: String,
    },
}

impl TaskError {
    /// The kind name, as on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Model { .. } => "model",
            Self::Gate { .. } => "gate",
            Self::Budget { .. } => "budget",
            Self::Protocol { .. } => "protocol",
            Self::Routing { .. } => "routing",
            Self::Cancelled { .. } => "cancelled",
            Self::Deadline { .. } => "deadline",
            Self::Internal { .. } => "internal",
            Self::HandedOver { .. } => "handed_over",
        }
    }

    /// The kind's fields as strings (for the wire and for display).
    pub fn fields(&self) -> BTreeMap<String, String> {
        let value = serde_json::to_value(self).unwrap_or_default();
        value
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k != "kind")
            .map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect()
    }
}

/// Lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for a worker.
    Queued,
    /// A worker (or another node) is running it.
    Running,
    /// Finished with an answer.
    Completed,
    /// Finished with an error.
    Failed,
    /// Running, but paused until a person approves or denies a tool call (the A2A term).
    InputRequired,
    /// Ended because someone cancelled it (a caller, or the node shutting down), not because
    /// it failed: its terminal event is `failed` with a `cancelled` error.
    Cancelled,
}

impl TaskStatus {
    /// `queued`, `running`, `completed`, `failed`, `input_required`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::InputRequired => "input_required",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the task has ended (completed, failed or cancelled).
    pub fn finished(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The status a task ends with when it ends with `error`: `cancelled` for a cancellation,
    /// else `failed`.
    pub fn of_error(error: &TaskError) -> Self {
        match error {
            TaskError::Cancelled { .. } => Self::Cancelled,
            _ => Self::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventKind;

    /// An event is one line however its parts read (a tool's output of many lines shows its
    /// first), with the words `mesh-cli` users and the README know.
    #[test]
    fn an_event_reads_as_one_line() {
        let result = EventKind::ToolResult {
            call_id: "c".into(),
            name: "shell_exec".into(),
            ok: false,
            output: "first\nsecond".into(),
            consecutive_failures: 2,
        };
        assert_eq!(
            result.to_string(),
            "← shell_exec failed (2 failures in a row): first"
        );
        let done = EventKind::Completed {
            output: "x".into(),
            usage: Usage {
                prompt_tokens: 20,
                completion_tokens: 3,
            },
            executed_on: "gpu".into(),
            rounds: 1,
        };
        assert_eq!(
            done.to_string(),
            "✓ completed on gpu in 1 round (23 tokens)"
        );
        let failover = EventKind::Delegated {
            node: "gpu2".into(),
            attempt: 2,
            reason: "gpu1 went away".into(),
        };
        assert_eq!(
            failover.to_string(),
            "↪ re-routed to gpu2 (attempt 2): gpu1 went away"
        );
    }

    /// Regression (issue 16): task ids from the network were only length-checked, so one could
    /// carry a separator or a NUL byte into the keys of the task history.
    #[test]
    fn only_a_canonical_uuid_is_a_task_id() {
        let good = "0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d";
        assert_eq!(check_task_id("task_id", good), Ok(()));
        for bad in [
            "",
            "t1",
            "0192C5D2-7E4F-7A3B-9C1D-2E3F4A5B6C7D",
            "0192c5d27e4f7a3b9c1d2e3f4a5b6c7d",
            "{0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d}",
            "urn:uuid:0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d",
            "0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d/1",
            "0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7\0",
        ] {
            let error = check_task_id("task_id", bad).expect_err(bad);
            assert!(error.starts_with("task_id: "), "{error}");
        }
        let long = "x".repeat(10_000);
        assert!(check_task_id("task_id", &long).expect_err("long").len() < 300);
    }

    #[test]
    fn an_evaluation_is_checked_field_by_field_and_passes_at_its_threshold() {
        let good = Evaluation::new("judge");
        assert_eq!((good.threshold, good.attempts), (0.8, 3));
        assert_eq!(good.check(), Ok(()));
        for (bad, field) in [
            (
                Evaluation {
                    role: " ".into(),
                    ..good.clone()
                },
                "evaluate.role",
            ),
            (
                Evaluation {
                    role: "r".repeat(64),
                    ..good.clone()
                },
                "evaluate.role",
            ),
            (
                Evaluation {
                    threshold: 1.5,
                    ..good.clone()
                },
                "evaluate.threshold",
            ),
            (
                Evaluation {
                    threshold: -0.1,
                    ..good.clone()
                },
                "evaluate.threshold",
            ),
            (
                Evaluation {
                    threshold: f64::NAN,
                    ..good.clone()
                },
                "evaluate.threshold",
            ),
            (
                Evaluation {
                    attempts: 0,
                    ..good.clone()
                },
                "evaluate.attempts",
            ),
            (
                Evaluation {
                    attempts: Evaluation::MAX_ATTEMPTS + 1,
                    ..good.clone()
                },
                "evaluate.attempts",
            ),
        ] {
            let error = bad.check().expect_err(field);
            assert!(error.starts_with(&format!("{field}: ")), "{error}");
            // A task carrying it is refused the same way (a stored schedule's, a peer's).
            let spec = TaskSpec {
                evaluate: Some(bad),
                ..TaskSpec::new("x", Target::Role("chat".into()))
            };
            assert!(spec.check().expect_err(field).starts_with(field));
        }
        for edge in [0.0, 1.0] {
            let evaluation = Evaluation {
                threshold: edge,
                ..good.clone()
            };
            assert_eq!(evaluation.check(), Ok(()));
        }
        assert!(good.passes(Some(0.8)));
        assert!(good.passes(Some(1.0)));
        assert!(!good.passes(Some(0.79)));
        // An unscored answer never passes, whatever the threshold.
        assert!(!good.passes(None));
        let zero = Evaluation {
            threshold: 0.0,
            ..good
        };
        assert!(zero.passes(Some(0.0)));
        assert!(!zero.passes(None));
    }

    #[test]
    fn task_errors_expose_their_kind_and_fields() {
        let error = TaskError::Budget {
            what: "tokens".into(),
            limit: 100,
            used: 150,
        };
        assert_eq!(error.kind(), "budget");
        let fields = error.fields();
        assert_eq!(fields["limit"], "100");
        assert_eq!(fields["used"], "150");
        assert_eq!(fields["what"], "tokens");
        let model = TaskError::Model {
            name: "b".into(),
            attempts: vec!["a: down".into(), "b: down".into()],
            message: "down".into(),
        };
        assert!(model.to_string().contains("a: down; b: down"));
        assert_eq!(model.fields()["attempts"], r#"["a: down","b: down"]"#);
    }
}
