//! `/mcp`'s wire shapes: the tools' names, their arguments as the types that read them (the
//! input schemas clients see are generated from these, so the two cannot disagree), checked
//! as the memory and a task from the network are, `run_task`'s structured answer, and
//! [`CallError`], the one mapping of a call that gave no answer to MCP.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use mesh_domain::{Requirements, Target, TaskSpec, Tier, keys};
use rmcp::{
    ErrorData,
    handler::server::common::schema_for_input,
    model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject},
    schemars::JsonSchema,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tools, by name.
pub(super) const RUN_TASK: &str = "run_task";
pub(super) const LIST_NODES: &str = "list_nodes";
pub(super) const MEMORY_GET: &str = "memory_get";
pub(super) const MEMORY_SEARCH: &str = "memory_search";
pub(super) const MEMORY_PUT: &str = "memory_put";
pub(super) const CRON_LIST: &str = "cron_list";

/// Why a call did not give its tool's answer. Each kind has one MCP form ([`CallError::respond`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum CallError {
    /// No tool of that name: a JSON-RPC "invalid params" error.
    #[error(
        "no tool `{0}` on this node; it serves run_task, list_nodes, memory_get, memory_search, memory_put and cron_list (tools/list)"
    )]
    UnknownTool(String),
    /// Arguments that do not fit the tool's schema or bounds: a JSON-RPC "invalid params"
    /// error naming the argument.
    #[error("{tool}: {problem}")]
    Arguments {
        /// The tool called.
        tool: &'static str,
        /// What is wrong, naming the argument.
        problem: String,
    },
    /// The call was refused (tier, key) or failed (the task, the memory): a tool result with
    /// `isError`, so the model calling it reads why.
    #[error("{0}")]
    Tool(String),
}

impl CallError {
    /// The one mapping to MCP: a protocol error for a call that cannot be made as written, an
    /// error result for one that was made and refused or failed.
    pub(super) fn respond(self) -> Result<CallToolResponse, ErrorData> {
        let message = self.to_string();
        match self {
            Self::UnknownTool(_) | Self::Arguments { .. } => {
                Err(ErrorData::invalid_params(message, None))
            }
            Self::Tool(_) => Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into()),
        }
    }
}

/// The tier a task asks for (`run_task`'s `tier`).
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(crate = "rmcp::schemars")]
pub(super) enum TierArg {
    /// Read-only tools (the default).
    #[default]
    Read,
    /// Tools that write memory or files.
    Write,
    /// Shell commands too.
    Shell,
}

impl From<TierArg> for Tier {
    fn from(tier: TierArg) -> Self {
        match tier {
            TierArg::Read => Tier::Read,
            TierArg::Write => Tier::Write,
            TierArg::Shell => Tier::Shell,
        }
    }
}

/// `run_task`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct RunTask {
    /// What to do.
    #[schemars(length(min = 1, max = 262144))]
    pub(super) prompt: String,
    /// The role that runs it (e.g. `coder`, `chat`). Give one of role, model or persona.
    pub(super) role: Option<String>,
    /// The model that runs it, by its name in the mesh.
    pub(super) model: Option<String>,
    /// The persona that runs it.
    pub(super) persona: Option<String>,
    /// The highest tool tier the task may use: `read` (default), `write` or `shell`; this
    /// node's `security.mcp_max_tier` caps it.
    #[serde(default)]
    pub(super) tier: TierArg,
    /// Seconds the task may run (default: the node's), at most 86400.
    pub(super) timeout_s: Option<u32>,
    /// Run it only on a node with a GPU.
    #[serde(default)]
    pub(super) gpu: bool,
    /// Run it only on a node with a GPU of at least this much free VRAM, MiB.
    pub(super) min_vram_mb: Option<u64>,
    /// Run it only on a node whose labels include these (at most 32).
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
    /// Run it only on this node: its name, or its id (whole, or the first 12 or more hex
    /// digits).
    pub(super) on: Option<String>,
}

impl RunTask {
    /// The task it asks for, checked as a task from the network is (the error names the
    /// argument).
    pub(super) fn spec(self) -> Result<TaskSpec, String> {
        let target = match (self.role, self.model, self.persona) {
            (Some(role), None, None) => Target::Role(role),
            (None, Some(model), None) => Target::Model(model),
            (None, None, Some(persona)) => Target::Persona(persona),
            _ => return Err("give exactly one of `role`, `model` or `persona`".into()),
        };
        if self.timeout_s == Some(0) {
            return Err("timeout_s: at least 1".into());
        }
        let spec = TaskSpec {
            tier: self.tier.into(),
            timeout: self.timeout_s.map(|s| Duration::from_secs(u64::from(s))),
            require: Requirements {
                gpu: self.gpu,
                min_vram_mb: self.min_vram_mb,
                labels: self.labels,
                on: self.on,
            },
            ..TaskSpec::new(self.prompt, target)
        };
        spec.check()?;
        Ok(spec)
    }
}

/// `memory_get`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct MemoryGet {
    /// The namespace (a user namespace: the node's own are refused).
    pub(super) namespace: String,
    pub(super) key: String,
}

/// `memory_put`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct MemoryPut {
    /// The namespace (a user namespace: the node's own are refused).
    pub(super) namespace: String,
    pub(super) key: String,
    /// The value (text), at most 1 MiB.
    #[schemars(length(max = 1048576))]
    pub(super) value: String,
}

/// `memory_search`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct MemorySearch {
    /// The namespace (a user namespace: the node's own are refused).
    pub(super) namespace: String,
    /// Only keys starting with this.
    pub(super) prefix: Option<String>,
    /// Only entries whose key or value contains this.
    pub(super) contains: Option<String>,
    /// Continue after this key (a cut answer names it).
    pub(super) after: Option<String>,
    /// Most entries (1–100, default 20).
    #[schemars(range(min = 1, max = 100))]
    pub(super) limit: Option<u32>,
}

/// Arguments of the tools that take none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct NoArguments {}

/// Reads a call's arguments as `T`; the error names the tool and what is wrong.
pub(super) fn arguments<T: for<'de> Deserialize<'de>>(
    tool: &'static str,
    arguments: Option<&JsonObject>,
) -> Result<T, CallError> {
    let value = Value::Object(arguments.cloned().unwrap_or_default());
    serde_json::from_value(value).map_err(|e| CallError::Arguments {
        tool,
        problem: e.to_string(),
    })
}

/// A namespace and a key as the memory takes them (its own checks, so the error names which).
pub(super) fn check_place(
    tool: &'static str,
    namespace: &str,
    key: Option<&str>,
) -> Result<(), CallError> {
    let invalid = |problem: String| CallError::Arguments { tool, problem };
    keys::check_namespace(namespace).map_err(|e| invalid(format!("namespace: {}", e.0)))?;
    if let Some(key) = key {
        keys::check_key(key).map_err(|e| invalid(format!("key: {}", e.0)))?;
    }
    Ok(())
}

/// Everything the client sees of an input schema: `T`'s, generated from the type that reads
/// the arguments (so the two cannot disagree).
pub(super) fn input_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>().expect("an argument struct's schema is an object")
}

/// `run_task`'s structured result (its declared output schema).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct TaskAnswer {
    /// The task's answer, as the text part carries it (cut at 1 MiB, with a note).
    pub(super) answer: String,
    /// The task's id (`mesh-cli tasks show <id>`).
    pub(super) task_id: String,
    /// The node that ran it.
    pub(super) executed_on: String,
    /// Model calls the agent made.
    pub(super) rounds: u32,
    /// Tokens the task spent.
    pub(super) usage: TokenCounts,
}

/// Tokens one task spent.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct TokenCounts {
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
}

#[cfg(test)]
mod tests {
    use mesh_domain::{
        Target,
        task::{MAX_PROMPT_BYTES, MAX_TIMEOUT_S},
    };
    use rmcp::model::CallToolResponse;
    use serde_json::json;

    use super::*;

    fn run(args: Value) -> Result<TaskSpec, String> {
        let args: RunTask = serde_json::from_value(args).map_err(|e| e.to_string())?;
        args.spec()
    }

    /// Every refusal of `run_task`'s arguments names the argument; a valid call is the task it
    /// says.
    #[test]
    fn run_task_arguments_are_checked_and_refusals_name_the_argument() {
        let spec = run(json!({
            "prompt": "hi", "role": "coder", "tier": "write", "timeout_s": 30,
            "gpu": true, "min_vram_mb": 8000, "labels": {"site": "home"}, "on": "gpu",
        }))
        .expect("valid");
        assert_eq!(spec.target, Target::Role("coder".into()));
        assert_eq!(spec.tier, Tier::Write);
        assert_eq!(spec.timeout, Some(Duration::from_secs(30)));
        assert!(spec.require.gpu);
        assert_eq!(spec.require.on.as_deref(), Some("gpu"));
        assert_eq!(
            run(json!({"prompt": "hi", "model": "m"})).map(|s| s.tier),
            Ok(Tier::Read)
        );
        let big = "x".repeat(MAX_PROMPT_BYTES + 1);
        let many: BTreeMap<String, String> =
            (0..=32).map(|i| (format!("k{i}"), "v".into())).collect();
        let refused = [
            (json!({"role": "chat"}), "missing field `prompt`"),
            (json!({"prompt": "hi"}), "exactly one of"),
            (
                json!({"prompt": "hi", "role": "a", "model": "b"}),
                "exactly one of",
            ),
            (json!({"prompt": " ", "role": "chat"}), "prompt:"),
            (json!({"prompt": big, "role": "chat"}), "prompt:"),
            (
                json!({"prompt": "hi", "role": "chat", "tier": "root"}),
                "unknown variant `root`",
            ),
            (
                json!({"prompt": "hi", "role": "chat", "timeout_s": MAX_TIMEOUT_S + 1}),
                "timeout_s:",
            ),
            (
                json!({"prompt": "hi", "role": "chat", "timeout_s": 0}),
                "timeout_s:",
            ),
            (
                json!({"prompt": "hi", "role": "chat", "labels": many}),
                "require.labels: at most 32",
            ),
            (
                json!({"prompt": "hi", "role": "chat", "colour": "red"}),
                "unknown field `colour`",
            ),
        ];
        for (args, expected) in refused {
            let error = run(args.clone()).expect_err(&args.to_string());
            assert!(error.contains(expected), "{args}: {error}");
        }
    }

    /// The schemas clients see come from the types that read the arguments: `run_task` needs a
    /// prompt and refuses unknown arguments.
    #[test]
    fn schemas_come_from_the_argument_types() {
        let schema = input_schema::<RunTask>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["prompt"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        assert!(schema["properties"]["tier"].is_object(), "{schema:?}");
        let none = input_schema::<NoArguments>();
        assert_eq!(none["type"], "object");
        // run_task declares what its structured part holds: the answer first of all.
        let output = rmcp::handler::server::tool::schema_for_output::<TaskAnswer>();
        assert_eq!(output["type"], "object");
        let required = output["required"].as_array().expect("required fields");
        for field in ["answer", "task_id", "executed_on", "rounds", "usage"] {
            assert!(required.contains(&json!(field)), "{field}: {output:?}");
        }
    }

    #[test]
    fn bad_arguments_are_protocol_errors_and_refusals_are_tool_errors() {
        let protocol = CallError::Arguments {
            tool: MEMORY_PUT,
            problem: "key: empty".into(),
        }
        .respond()
        .expect_err("invalid params");
        assert_eq!(protocol.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert_eq!(protocol.message, "memory_put: key: empty");
        let Ok(CallToolResponse::Complete(result)) = CallError::Tool("refused".into()).respond()
        else {
            panic!("a tool error is a result");
        };
        assert_eq!(result.is_error, Some(true));
    }
}
