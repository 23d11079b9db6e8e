//! What a task asks for (shared by `run` and `cron add`), and `mesh-cli tasks`: list, show and
//! cancel tasks; how a task's events read for people.

use anyhow::anyhow;
use clap::{Args, Subcommand};
use mesh_domain::{
    Evaluation, TaskEvent,
    task::{check_attempts, check_threshold, check_tool_name},
};
use mesh_proto::{convert::tier_or_read, v1 as pb};
use pb::task_event::Kind;
use serde_json::{Value, json};

use crate::{ConnArgs, ago, channel, print_table, unix_ms};

/// What a task asks for: shared by `run` and `cron add` (which requires one of --role,
/// --model and --persona; `run` defaults to role `chat`).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").args(["role", "model", "persona"])))]
pub(crate) struct TaskArgs {
    /// Run on the model chain of this role (e.g. chat, coder).
    #[arg(long)]
    pub(crate) role: Option<String>,
    /// Run on this model.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Run as this persona (its role, system prompt, tools and tier cap).
    #[arg(long)]
    pub(crate) persona: Option<String>,
    /// Highest tool tier the task may use.
    #[arg(long, value_parser = ["read", "write", "shell"], default_value = "read")]
    tier: String,
    /// Deadline in seconds (default: the node's, 600).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u32>,
    /// Maximum model rounds (default: the node's, 10).
    #[arg(long)]
    max_rounds: Option<u32>,
    /// Token budget over all rounds (default: the node's).
    #[arg(long)]
    token_budget: Option<u64>,
    /// Require the node to have this: `gpu`.
    #[arg(long, value_parser = ["gpu"])]
    require: Vec<String>,
    /// Require a GPU with at least this much (free) VRAM, MiB.
    #[arg(long, value_name = "MB")]
    min_vram: Option<u64>,
    /// Require a node label, KEY=VALUE; repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Run only on this node: its name, or its id (whole, or its first 12 or more hex digits,
    /// as `mesh-cli status` shows them).
    #[arg(long, value_name = "NODE")]
    on: Option<String>,
    /// Have a model of this role (on whichever node serves it) score each answer from 0 to 1
    /// with a critique; below --threshold the task runs again with the critique, at most
    /// --attempts times, and the best-scoring answer is the output. The token budget and the
    /// deadline cover every attempt and evaluation together.
    #[arg(long, value_name = "ROLE")]
    evaluate: Option<String>,
    /// With --evaluate: the score an answer needs, 0 to 1 (default 0.8).
    #[arg(long, requires = "evaluate", value_parser = parse_threshold)]
    threshold: Option<f64>,
    /// With --evaluate: most attempts, the first included, 1 to 5 (default 3).
    #[arg(long, requires = "evaluate", value_parser = parse_attempts)]
    attempts: Option<u32>,
    /// Make the model call this tool in its first round (then it answers as it likes): a
    /// built-in (`list_nodes`) or an MCP tool anywhere in the fleet (`time__get_current_time`;
    /// `mesh-cli status` lists them). The task's --tier must allow it. Small models that never
    /// call tools by themselves (the embedded ones) call it this way.
    #[arg(long, value_name = "NAME", value_parser = parse_tool)]
    tool: Option<String>,
}

/// `--tool`: a tool name as the mesh names tools.
fn parse_tool(text: &str) -> Result<String, String> {
    check_tool_name(text)?;
    Ok(text.to_owned())
}

/// `--threshold`: a number from 0 to 1.
fn parse_threshold(text: &str) -> Result<f64, String> {
    let threshold: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number; give a score from 0 to 1, e.g. 0.8"))?;
    check_threshold(threshold)?;
    Ok(threshold)
}

/// `--attempts`: 1 to [`Evaluation::MAX_ATTEMPTS`].
fn parse_attempts(text: &str) -> Result<u32, String> {
    let attempts: u32 = text.parse().map_err(|_| {
        format!(
            "`{text}` is not a count; give 1 to {}",
            Evaluation::MAX_ATTEMPTS
        )
    })?;
    check_attempts(attempts)?;
    Ok(attempts)
}

impl TaskArgs {
    /// The `Submit` request for `prompt`.
    pub(crate) fn request(self, prompt: String, session: Option<String>) -> pb::SubmitRequest {
        use pb::submit_request::Target;
        let target = match (self.role, self.model, self.persona) {
            (Some(role), _, _) => Some(Target::Role(role)),
            (_, Some(model), _) => Some(Target::Model(model)),
            (_, _, Some(persona)) => Some(Target::Persona(persona)),
            (None, None, None) => None,
        };
        let tier = match self.tier.as_str() {
            "shell" => pb::Tier::Shell,
            "write" => pb::Tier::Write,
            _ => pb::Tier::Read,
        };
        pb::SubmitRequest {
            prompt,
            target,
            tier: tier as i32,
            timeout_s: self.timeout.unwrap_or(0),
            max_rounds: self.max_rounds.unwrap_or(0),
            token_budget: self.token_budget.unwrap_or(0),
            require: Some(pb::Requirements {
                gpu: self.require.iter().any(|r| r == "gpu"),
                min_vram_mb: self.min_vram.unwrap_or(0),
                labels: self.labels.into_iter().collect(),
            }),
            on: self.on.unwrap_or_default(),
            lineage: None,
            session: session.unwrap_or_default(),
            evaluate: self.evaluate.map(|role| pb::Evaluation {
                role,
                threshold: self.threshold,
                attempts: self.attempts,
            }),
            tool: self.tool.unwrap_or_default(),
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct TasksArgs {
    #[command(subcommand)]
    command: Option<TasksCommand>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// How many tasks to list.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Subcommand)]
enum TasksCommand {
    /// Show a task's events: model calls, tool calls and results, output, outcome.
    Show {
        /// Task id (from `run` or `tasks`).
        id: String,
        /// Print the events as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Follow a task to its end from any node: its events from the start, then new ones, then
    /// its answer (the node that started it need not be up: a node that neither started nor
    /// ran it tells the task from its journal). Exit 0 when it completed.
    ///
    /// Example: mesh-cli --node gpu-box:7700 tasks watch 0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d
    Watch {
        /// Task id (from `run`, `run --detach` or `tasks`).
        id: String,
        /// Print one JSON object when the task ends, as `run --json` does.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a queued or running task.
    Cancel {
        /// Task id.
        id: String,
    },
}

/// A failure already reported (on stdout by `run --json`, or on stderr as a task's outcome):
/// exit 1 without printing it again.
#[derive(Debug)]
pub(crate) struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the task failed")
    }
}

impl std::error::Error for Reported {}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// `tasks watch ID [--json]`: the task to follow and whether to print JSON, for `run::watch`
/// (which follows tasks for `run` too); `None` for the other `tasks` commands.
pub(crate) fn watched(args: &TasksArgs) -> Option<(String, bool)> {
    match &args.command {
        Some(TasksCommand::Watch { id, json }) => Some((id.clone(), *json)),
        _ => None,
    }
}

pub(crate) async fn tasks(conn: &ConnArgs, args: TasksArgs) -> anyhow::Result<()> {
    let mut client = pb::tasks_client::TasksClient::new(channel(conn).await?);
    match args.command {
        None => list(&mut client, args.json, args.limit).await,
        Some(TasksCommand::Show { id, json }) => show(&mut client, &id, json).await,
        // `main` sends it to `run::watch` (see `watched`): never here.
        Some(TasksCommand::Watch { id, .. }) => Err(anyhow!(
            "`tasks watch {id}` is followed by `run::watch`; this is a bug of mesh-cli"
        )),
        Some(TasksCommand::Cancel { id }) => {
            // The node answers once the task has ended (or after a few seconds): the status
            // after the cancel.
            let status = client
                .cancel(pb::CancelRequest {
                    task_id: id.clone(),
                })
                .await
                .map_err(|s| anyhow!("cancel {id}: {}", s.message()))?
                .into_inner()
                .status;
            show!("{id}: {}", status_name(status));
            Ok(())
        }
    }
}

pub(crate) type Client = pb::tasks_client::TasksClient<tonic::transport::Channel>;

async fn list(client: &mut Client, json: bool, limit: u32) -> anyhow::Result<()> {
    let tasks = client
        .list(pb::ListTasksRequest { limit })
        .await
        .map_err(|s| anyhow!("list tasks: {}", s.message()))?
        .into_inner()
        .tasks;
    let rows: Vec<Value> = tasks
        .iter()
        .map(|t| {
            json!({
                "task_id": t.task_id,
                "status": status_name(t.status),
                "target": t.target,
                "prompt": t.prompt,
                "created_at_ms": t.created_at_ms,
                "finished_at_ms": (t.finished_at_ms > 0).then_some(t.finished_at_ms),
                "executed_on": t.executed_on,
                "error": t.error.as_ref().map(|e| e.message.clone()),
                "parent_id": t.parent_id,
                "origin_node": t.origin_node,
                "hops": t.hops,
                "route": t.route,
                "evaluate": t.evaluate.as_ref().map(evaluation_json),
            })
        })
        .collect();
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "tasks": rows }))?
        );
        return Ok(());
    }
    let now = unix_ms();
    let table: Vec<[String; 6]> = rows
        .iter()
        .map(|t| {
            let text = |key: &str| t[key].as_str().unwrap_or_default().to_owned();
            let prompt: String = text("prompt").chars().take(40).collect();
            [
                text("task_id"),
                text("status"),
                text("target"),
                text("executed_on"),
                ago(now, t["created_at_ms"].as_u64().unwrap_or(0)),
                prompt.replace('\n', " "),
            ]
        })
        .collect();
    print_table(
        &["ID", "STATUS", "TARGET", "NODE", "CREATED", "PROMPT"],
        &table,
    );
    Ok(())
}

async fn show(client: &mut Client, id: &str, json: bool) -> anyhow::Result<()> {
    let mut stream = client
        .watch(pb::WatchRequest {
            task_id: id.to_owned(),
            follow: false,
        })
        .await
        .map_err(|s| anyhow!("{}", s.message()))?
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream
        .message()
        .await
        .map_err(|s| anyhow!("{}", s.message()))?
    {
        events.push(event);
    }
    if json {
        let list: Vec<Value> = events
            .iter()
            .filter_map(|e| {
                let kind = e.kind.as_ref()?;
                let mut event = json!({"seq": e.seq, "at_ms": e.at_ms, "type": kind_name(kind), "text": describe(kind)});
                match kind {
                    Kind::Evaluated(evaluated) => event["evaluation"] = evaluated_json(evaluated),
                    Kind::AttemptStarted(a) => {
                        event["attempt"] = json!(a.attempt);
                        event["attempts"] = json!(a.attempts);
                        event["reason"] = json!(a.reason);
                    }
                    _ => {}
                }
                Some(event)
            })
            .collect();
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({"task_id": id, "events": list}))?
        );
        return Ok(());
    }
    show!("task {id}");
    let summary = client
        .list(pb::ListTasksRequest { limit: 1000 })
        .await
        .ok()
        .and_then(|r| r.into_inner().tasks.into_iter().find(|t| t.task_id == id));
    if let Some(t) = summary {
        show!("  status:   {}", status_name(t.status));
        show!("  target:   {} (tier {})", t.target, tier_or_read(t.tier));
        let origin = if t.origin_node.is_empty() {
            "this node".to_owned()
        } else {
            t.origin_node.clone()
        };
        show!(
            "  lineage:  origin {origin}, hops {}{}",
            t.hops,
            if t.parent_id.is_empty() {
                String::new()
            } else {
                format!(", parent {}", t.parent_id)
            }
        );
        if !t.route.is_empty() {
            show!("  route:    {}", t.route.join(" → "));
        }
        if let Some(e) = &t.evaluate {
            show!(
                "  evaluate: role {}, threshold {:.2}, at most {} attempts",
                e.role,
                e.threshold.unwrap_or(Evaluation::DEFAULT_THRESHOLD),
                e.attempts.unwrap_or(Evaluation::DEFAULT_ATTEMPTS)
            );
        }
        show!("  executed on: {}", t.executed_on);
    }
    let mut output = String::new();
    for kind in events.iter().filter_map(|e| e.kind.as_ref()) {
        match kind {
            Kind::OutputDelta(d) => output.push_str(&d.text),
            kind => {
                if let Some(line) = describe(kind) {
                    show!("  {line}");
                }
            }
        }
    }
    if !output.is_empty() {
        show!("output:\n{output}");
    }
    Ok(())
}

pub(crate) fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Accepted(_) => "accepted",
        Kind::Started(_) => "started",
        Kind::ModelCall(_) => "model_call",
        Kind::ModelFailed(_) => "model_failed",
        Kind::ToolCalled(_) => "tool_called",
        Kind::ToolResult(_) => "tool_result",
        Kind::Intervention(_) => "intervention",
        Kind::Warning(_) => "warning",
        Kind::OutputDelta(_) => "output_delta",
        Kind::Completed(_) => "completed",
        Kind::Failed(_) => "failed",
        Kind::Delegated(_) => "delegated",
        Kind::Resumed(_) => "resumed",
        Kind::ApprovalRequested(_) => "approval_requested",
        Kind::ApprovalDecided(_) => "approval_decided",
        Kind::Evaluated(_) => "evaluated",
        Kind::AttemptStarted(_) => "attempt_started",
    }
}

/// What a task asked of the evaluator loop, as `tasks --json` lists it.
pub(crate) fn evaluation_json(e: &pb::Evaluation) -> Value {
    json!({
        "role": e.role,
        "threshold": e.threshold.unwrap_or(Evaluation::DEFAULT_THRESHOLD),
        "attempts": e.attempts.unwrap_or(Evaluation::DEFAULT_ATTEMPTS),
    })
}

/// One evaluator verdict, as `run --json` and `tasks show --json` print it.
pub(crate) fn evaluated_json(e: &pb::Evaluated) -> Value {
    json!({
        "attempt": e.attempt,
        "score": e.score,
        "critique": e.critique,
        "model": e.model,
        "node": e.node,
        "error": (!e.error.is_empty()).then_some(&e.error),
    })
}

/// One line for a task event on stderr (`None` for events not worth a line): the event's own
/// words ([`EventKind`]'s `Display`, which the front door's MCP progress uses too).
pub(crate) fn describe(kind: &Kind) -> Option<String> {
    if matches!(kind, Kind::OutputDelta(_)) {
        return None;
    }
    let event = pb::TaskEvent {
        kind: Some(kind.clone()),
        ..Default::default()
    };
    Some(match TaskEvent::try_from(event) {
        Ok(event) => event.kind.to_string(),
        Err(refused) => format!("! an unreadable event: {}", refused.message()),
    })
}

fn status_name(status: i32) -> &'static str {
    match pb::TaskStatus::try_from(status) {
        Ok(pb::TaskStatus::Queued) => "queued",
        Ok(pb::TaskStatus::Running) => "running",
        Ok(pb::TaskStatus::Completed) => "completed",
        Ok(pb::TaskStatus::Failed) => "failed",
        Ok(pb::TaskStatus::InputRequired) => "input_required",
        Ok(pb::TaskStatus::Cancelled) => "cancelled",
        _ => "unknown",
    }
}
