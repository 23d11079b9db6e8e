//! What every tool is: the [`Tool`] interface (name, description and argument schema, tier,
//! call), what a call knows about its task ([`ToolContext`]), why a call failed
//! ([`ToolError`]), and the output cap.
//!
//! Tools are written as iroh writes its `ProtocolHandler`: an implementor writes
//! `async fn call`, and the one blanket impl of [`DynTool`] boxes its future, so the tool table
//! can hold every tool as `Arc<dyn DynTool>`.
//!
//! Tier checks happen before a call, in the supervisor's hooks, not in the tools: a tool returns
//! text for the model, and a [`ToolError`] when the call failed (the model sees its `Display`,
//! and the supervisor counts the failure).

use std::{future::Future, path::Path};

pub(super) use mesh_domain::chat::MAX_TOOL_OUTPUT;
pub(crate) use mesh_domain::chat::cap_tool_output as cap;

use mesh_domain::{BoxFuture, EventKind, TaskError, TaskSpec, Tier, ToolSpec};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::{gateway::MeshDataError, mcp::McpError, task_handle::SubmitError};

/// A tool an agent can call. Implementors write `async fn call`; the tool table holds tools as
/// [`DynTool`].
pub trait Tool: Send + Sync + std::fmt::Debug {
    /// Name, description and argument schema.
    fn spec(&self) -> ToolSpec;
    /// Permission tier.
    fn tier(&self) -> Tier;
    /// Runs the tool with already-parsed JSON arguments.
    fn call(
        &self,
        args: &Value,
        ctx: &ToolContext,
    ) -> impl Future<Output = Result<String, ToolError>> + Send;
    /// The tier this call counts as (default: the tool's tier). `delegate` counts as the tier
    /// of the sub-task it asks for.
    fn effective_tier(&self, _args: &Value) -> Tier {
        self.tier()
    }
}

/// A [`Tool`] as a trait object: implemented once, for every tool, by boxing its `call`.
pub trait DynTool: Send + Sync + std::fmt::Debug {
    /// [`Tool::spec`].
    fn spec(&self) -> ToolSpec;
    /// [`Tool::tier`].
    fn tier(&self) -> Tier;
    /// [`Tool::call`], boxed.
    fn call<'a>(
        &'a self,
        args: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
    /// [`Tool::effective_tier`].
    fn effective_tier(&self, args: &Value) -> Tier;
}

impl<T: Tool> DynTool for T {
    fn spec(&self) -> ToolSpec {
        Tool::spec(self)
    }

    fn tier(&self) -> Tier {
        Tool::tier(self)
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(Tool::call(self, args, ctx))
    }

    fn effective_tier(&self, args: &Value) -> Tier {
        Tool::effective_tier(self, args)
    }
}

/// Why a tool call failed. Its `Display` is what the model reads (after `error: `), so each
/// variant says what went wrong in words the model can act on.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments are missing, of the wrong type or out of range; the text names which.
    #[error("{0}")]
    Arguments(String),
    /// A path the call names may not be used: outside the roots, not a plain path, no roots.
    #[error("{0}")]
    Path(String),
    /// Reading, writing or running something failed (`what`: `cannot read /ws/a.txt`).
    #[error("{what}: {source}")]
    Io {
        /// The action, with what it acted on.
        what: String,
        source: std::io::Error,
    },
    /// The tool ran and reports a failure in its own words: a command's non-zero exit (its
    /// exit code and output), an MCP tool's error result, a peer's refusal.
    #[error("{0}")]
    Failed(String),
    /// A command ran out of time and was killed.
    #[error("timed out after {0} s (the command was killed)")]
    TimedOut(u64),
    /// A memory tool's refusal or failure.
    #[error(transparent)]
    Memory(#[from] MeshDataError),
    /// `delegate`'s sub-task gave no answer.
    #[error(transparent)]
    Subtask(#[from] SubtaskError),
    /// `delegate` was called before the task manager was connected.
    #[error("the mesh is not ready yet")]
    NotReady,
    /// An MCP tool of this node's own servers failed.
    #[error(transparent)]
    Mcp(#[from] McpError),
    /// No up node offers the MCP tool now.
    #[error("no node of the mesh offers `{0}` now")]
    NoHost(String),
    /// Every node offering the MCP tool was unreachable (`reasons`: `addr: why` each).
    #[error("no node offering `{name}` could be reached: {}", reasons.join("; "))]
    Unreachable { name: String, reasons: Vec<String> },
}

/// Why a sub-task gave no answer. Its `Display` reaches the model as `delegate`'s error.
#[derive(Debug, thiserror::Error)]
pub enum SubtaskError {
    /// The task manager did not take it.
    #[error(transparent)]
    Refused(#[from] SubmitError),
    /// It ran and failed (or was cancelled, or ran out of time).
    #[error("sub-task {id} failed: {error}")]
    Failed { id: String, error: TaskError },
    /// Its events ended before its outcome.
    #[error("sub-task {id} ended without an outcome")]
    NoOutcome { id: String },
}

impl ToolError {
    /// Io failure of `what` on `path`: `cannot read /ws/a.txt: …`.
    pub(crate) fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let what = format!("{what} {}", path.display());
        move |source| Self::Io { what, source }
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

pub(crate) fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::Arguments(format!("missing string argument `{name}`")))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::{DynTool, test_support::ctx, *};
    use crate::agent::tools::{
        delegate::{Delegate, RunnerSlot, SubtaskRunner},
        fs::FileRead,
        roots::test_support::roots,
    };

    /// Fails every sub-task as cancelled.
    #[derive(Debug)]
    struct Cancelling;

    impl SubtaskRunner for Cancelling {
        fn run_subtask(&self, _: TaskSpec) -> BoxFuture<'static, Result<String, SubtaskError>> {
            Box::pin(async {
                Err(SubtaskError::Failed {
                    id: "t9".into(),
                    error: TaskError::Cancelled {
                        reason: "by alice".into(),
                    },
                })
            })
        }
    }

    /// What the model reads of a failed call (the loop writes `error: {ToolError}`) is the text
    /// the tools gave as a `String` before their errors were typed, through the boxed table.
    #[tokio::test]
    async fn a_failed_call_reaches_the_model_in_the_same_words_through_the_table() {
        let (dir, roots) = roots();
        let read: Arc<dyn DynTool> = Arc::new(FileRead { roots });
        let said = |e: ToolError| format!("error: {e}");
        let missing = read.call(&json!({}), &ctx()).await.expect_err("no path");
        assert_eq!(said(missing), "error: missing string argument `path`");
        let absent = read
            .call(&json!({"path": "absent.txt"}), &ctx())
            .await
            .expect_err("no file");
        let path = dir
            .path()
            .canonicalize()
            .expect("tmp")
            .join("ws/absent.txt");
        assert_eq!(
            said(absent),
            format!(
                "error: cannot read {}: No such file or directory (os error 2)",
                path.display()
            )
        );

        let slot = RunnerSlot::default();
        let delegate: Arc<dyn DynTool> = Arc::new(Delegate {
            runner: slot.clone(),
        });
        let args = json!({"prompt": "p", "role": "chat"});
        let unready = delegate.call(&args, &ctx()).await.expect_err("no runner");
        assert_eq!(said(unready), "error: the mesh is not ready yet");
        slot.set(Arc::new(Cancelling)).expect("first runner");
        let failed = delegate.call(&args, &ctx()).await.expect_err("cancelled");
        assert_eq!(
            said(failed),
            "error: sub-task t9 failed: cancelled: by alice"
        );
        let both = delegate
            .call(&json!({"prompt": "p", "role": "a", "model": "b"}), &ctx())
            .await
            .expect_err("two targets");
        assert_eq!(
            said(both),
            "error: name exactly one of `role`, `model` or `persona`"
        );
    }
}
