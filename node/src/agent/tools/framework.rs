//! What every tool is: the [`Tool`] interface (name, description and argument schema, tier,
//! call), what a call knows about its task ([`ToolContext`]), and the output cap.
//!
//! Tier checks happen before a call, in the supervisor's hooks, not in the tools: a tool returns
//! text for the model, and `Err` when the call failed (the model sees the message, and the
//! supervisor counts the failure).

pub use mesh_domain::chat::MAX_TOOL_OUTPUT;
pub(crate) use mesh_domain::chat::cap_tool_output as cap;
use mesh_domain::{BoxFuture, EventKind, TaskSpec, Tier, ToolSpec};
use serde_json::Value;
use tokio::sync::mpsc;

pub trait Tool: Send + Sync + std::fmt::Debug {
    /// Name, description and argument schema.
    fn spec(&self) -> ToolSpec;
    /// Permission tier.
    fn tier(&self) -> Tier;
    /// Runs the tool with already-parsed JSON arguments.
    fn call<'a>(
        &'a self,
        args: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>>;
    /// The tier this call counts as (default: the tool's tier). `delegate` counts as the tier
    /// of the sub-task it asks for.
    fn effective_tier(&self, _args: &Value) -> Tier {
        self.tier()
    }
}

/// What a tool call knows about the task that makes it.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The task's id.
    pub task_id: String,
    /// The task's spec (tier, lineage, deadline).
    pub spec: TaskSpec,
    /// Where a tool reports what happens while it runs, as the task's events (a peer's
    /// approval of an MCP tool it hosts); `None` when nobody follows (the front door's MCP
    /// server).
    pub events: Option<mpsc::Sender<EventKind>>,
}

pub(crate) fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, String> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string argument `{name}`"))
}

#[cfg(test)]
pub(crate) mod test_support {
    use mesh_domain::{Target, TaskSpec};

    use super::ToolContext;

    /// The context of a read-tier task, for calling tools in tests.
    pub(crate) fn ctx() -> ToolContext {
        ToolContext {
            task_id: "t".into(),
            spec: TaskSpec::new("", Target::Role("chat".into())),
            events: None,
        }
    }
}
