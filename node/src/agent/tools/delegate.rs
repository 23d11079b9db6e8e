//! `delegate`: a sub-task on the mesh, placed like any submitted task, whose answer becomes the
//! tool's result. It counts as the tier it asks for, which may not exceed its task's.

use std::sync::{Arc, OnceLock};

use mesh_domain::{BoxFuture, Lineage, Requirements, Target, TaskSpec, Tier, ToolSpec};
use serde_json::{Value, json};

use crate::agent::tools::framework::{SubtaskError, Tool, ToolContext, ToolError, str_arg};

/// Runs the `delegate` tool's sub-tasks: places them like any submitted task and waits for the
/// outcome (a port: the task manager implements it).
pub trait SubtaskRunner: Send + Sync + std::fmt::Debug {
    /// Runs `spec` to an outcome: its output, or why it gave none.
    fn run_subtask(&self, spec: TaskSpec) -> BoxFuture<'static, Result<String, SubtaskError>>;
}

/// Where `delegate` finds its runner: connected once the task manager exists, since that needs
/// the tool table first.
pub(crate) type RunnerSlot = Arc<OnceLock<Arc<dyn SubtaskRunner>>>;

/// `delegate`: runs a sub-task on the mesh and returns its output.
#[derive(Debug)]
pub(crate) struct Delegate {
    pub(crate) runner: RunnerSlot,
}

fn tier_arg(args: &Value) -> Result<Tier, ToolError> {
    match args.get("tier").and_then(Value::as_str) {
        None => Ok(Tier::Read),
        Some(text) => Tier::parse(text).ok_or_else(|| {
            ToolError::Arguments(format!("`tier` is `{text}`: use read, write or shell"))
        }),
    }
}

impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Run a sub-task on the mesh (wherever it fits best) and get its answer. Name exactly one of role, model or persona.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string"},
                    "role": {"type": "string"},
                    "model": {"type": "string"},
                    "persona": {"type": "string"},
                    "tier": {"type": "string", "enum": ["read", "write", "shell"], "description": "default read; at most this task's tier"},
                    "on": {"type": "string", "description": "a node name, or a node id (at least its first 12 hex digits)"},
                },
                "required": ["prompt"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn effective_tier(&self, args: &Value) -> Tier {
        tier_arg(args).unwrap_or(Tier::Shell)
    }

    async fn call(&self, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let runner = self.runner.get().cloned().ok_or(ToolError::NotReady)?;
        let prompt = str_arg(args, "prompt")?.to_owned();
        let pick = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
        let target = match (pick("role"), pick("model"), pick("persona")) {
            (Some(r), None, None) => Target::Role(r),
            (None, Some(m), None) => Target::Model(m),
            (None, None, Some(p)) => Target::Persona(p),
            _ => {
                return Err(ToolError::Arguments(
                    "name exactly one of `role`, `model` or `persona`".into(),
                ));
            }
        };
        let tier = tier_arg(args)?;
        if tier > ctx.spec.tier {
            return Err(ToolError::Arguments(format!(
                "a sub-task may not ask for tier `{tier}`: this task runs at `{}`",
                ctx.spec.tier
            )));
        }
        let spec = TaskSpec {
            prompt,
            target,
            tier,
            timeout: ctx.spec.timeout,
            max_rounds: None,
            token_budget: ctx.spec.token_budget,
            require: Requirements {
                on: pick("on"),
                ..Default::default()
            },
            lineage: Lineage {
                task_id: None,
                parent_id: Some(ctx.task_id.clone()),
                origin: ctx.spec.lineage.origin.clone(),
                hops: ctx.spec.lineage.hops + 1,
                // A sub-task acts for whoever started its parent.
                started_by: ctx.spec.lineage.started_by.clone(),
                epoch: 0,
            },
            session: None,
            // The parent's evaluation scores the parent's answer, not each sub-task's.
            evaluate: None,
            tool: None,
        };
        Ok(runner.run_subtask(spec).await?)
    }
}
