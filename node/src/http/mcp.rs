//! The mesh as an MCP server: the front door's `/mcp`, streamable HTTP through rmcp's
//! [`StreamableHttpService`], stateless (each request stands alone; the node keeps no MCP
//! session, so no client can make it hold one). Its tools: `run_task` (a task of the mesh, its
//! events sent as MCP progress notifications when the client asks for progress; its answer in
//! the text part and, with task id, node, rounds and usage, in the structured part its output
//! schema declares), `list_nodes`, `memory_get`, `memory_search`, `memory_put` and
//! `cron_list`.
//!
//! It translates only. Who may call is the key middleware's (`http::authorize`, as for every
//! `/v1` route: no key on an open door, a known key with the `mcp` scope otherwise, decided by
//! `api_keys`); what a caller may do is decided
//! by `admission` (an `/mcp` caller is [`AdmissionCaller::FrontDoor`], capped by
//! `security.mcp_max_tier`) for every tool, by the tier the tool counts as, and by `api_keys`
//! for the model, role or persona of a `run_task` (a key's models and roles, its budgets).
//! Tasks run through the task manager, so they take the same admission, placement, forwarding,
//! approval gates and history as a task from `mesh-cli run`; the memory and fleet tools are the
//! agents' own (`agent::tools`), with their bounds and their refusal of the system namespaces.
//! It must not decide a tier itself, place or run a task, or touch the memory but through those
//! tools.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::http::request::Parts;
use mesh_domain::{
    EventKind, Message, Requirements, Role, Target, TaskEvent, TaskSpec, Tier, Usage,
    chat::prompt_token_bound,
    keys::{self, MAX_VALUE},
    text::truncate,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    handler::server::common::schema_for_input,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
        ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
    },
    schemars::JsonSchema,
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::door::FrontDoor;
use crate::{
    admission::Caller as AdmissionCaller,
    agent::tools::ToolContext,
    api_keys::{Ask, Charge},
    cron::owner_of,
    gateway::Caller,
    tasks::LookupError,
};

/// The tools, by name.
const RUN_TASK: &str = "run_task";
const LIST_NODES: &str = "list_nodes";
const MEMORY_GET: &str = "memory_get";
const MEMORY_SEARCH: &str = "memory_search";
const MEMORY_PUT: &str = "memory_put";
const CRON_LIST: &str = "cron_list";

/// Most bytes of a task's answer sent back; the rest is cut, with a note (`tasks show` has it).
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Most bytes of one progress message (a tool's arguments or an output delta are cut).
const MAX_PROGRESS_MESSAGE: usize = 512;
/// Most schedules one `cron_list` answer carries.
const MAX_SCHEDULES_LISTED: usize = 1000;
/// Longest prompt of a schedule that `cron_list` shows (`mesh-cli cron ls --json` shows all).
const SCHEDULE_PROMPT_CHARS: usize = 200;

/// The `/mcp` service for `door`: stateless streamable HTTP, answers as server-sent events (so
/// progress reaches the client while a task runs), bodies bounded by `max_body`. rmcp's own
/// `Host` check is off: the front door's guard checks `Host`, `Origin` and the content type
/// of every route, this one included (`http::guard`).
pub(crate) fn service(
    door: Arc<FrontDoor>,
    max_body: usize,
) -> StreamableHttpService<MeshTools, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(false)
        .with_max_request_body_bytes(max_body)
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(MeshTools { door: door.clone() }),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The MCP server of one request: the front door's state.
#[derive(Debug, Clone)]
pub(crate) struct MeshTools {
    door: Arc<FrontDoor>,
}

/// Why a call did not give its tool's answer. Each kind has one MCP form ([`CallError::respond`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CallError {
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
    fn respond(self) -> Result<CallToolResponse, ErrorData> {
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
enum TierArg {
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
struct RunTask {
    /// What to do.
    #[schemars(length(min = 1, max = 262144))]
    prompt: String,
    /// The role that runs it (e.g. `coder`, `chat`). Give one of role, model or persona.
    role: Option<String>,
    /// The model that runs it, by its name in the mesh.
    model: Option<String>,
    /// The persona that runs it.
    persona: Option<String>,
    /// The highest tool tier the task may use: `read` (default), `write` or `shell`; this
    /// node's `security.mcp_max_tier` caps it.
    #[serde(default)]
    tier: TierArg,
    /// Seconds the task may run (default: the node's), at most 86400.
    timeout_s: Option<u32>,
    /// Run it only on a node with a GPU.
    #[serde(default)]
    gpu: bool,
    /// Run it only on a node with a GPU of at least this much free VRAM, MiB.
    min_vram_mb: Option<u64>,
    /// Run it only on a node whose labels include these (at most 32).
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Run it only on this node: its name, or its id (whole, or the first 12 or more hex
    /// digits).
    on: Option<String>,
}

impl RunTask {
    /// The task it asks for, checked as a task from the network is (the error names the
    /// argument).
    fn spec(self) -> Result<TaskSpec, String> {
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
struct MemoryGet {
    /// The namespace (a user namespace: the node's own are refused).
    namespace: String,
    /// The key.
    key: String,
}

/// `memory_put`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
struct MemoryPut {
    /// The namespace (a user namespace: the node's own are refused).
    namespace: String,
    /// The key.
    key: String,
    /// The value (text), at most 1 MiB.
    #[schemars(length(max = 1048576))]
    value: String,
}

/// `memory_search`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
struct MemorySearch {
    /// The namespace (a user namespace: the node's own are refused).
    namespace: String,
    /// Only keys starting with this.
    prefix: Option<String>,
    /// Only entries whose key or value contains this.
    contains: Option<String>,
    /// Continue after this key (a cut answer names it).
    after: Option<String>,
    /// Most entries (1–100, default 20).
    #[schemars(range(min = 1, max = 100))]
    limit: Option<u32>,
}

/// Arguments of the tools that take none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
struct NoArguments {}

/// Reads a call's arguments as `T`; the error names the tool and what is wrong.
fn arguments<T: for<'de> Deserialize<'de>>(
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
fn check_place(tool: &'static str, namespace: &str, key: Option<&str>) -> Result<(), CallError> {
    let invalid = |problem: String| CallError::Arguments { tool, problem };
    keys::check_namespace(namespace).map_err(|e| invalid(format!("namespace: {}", e.0)))?;
    if let Some(key) = key {
        keys::check_key(key).map_err(|e| invalid(format!("key: {}", e.0)))?;
    }
    Ok(())
}

/// Everything the client sees of an input schema: `T`'s, generated from the type that reads
/// the arguments (so the two cannot disagree).
fn input_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>().expect("an argument struct's schema is an object")
}

impl MeshTools {
    /// The tools, with their schemas and hints.
    fn tools(&self) -> Vec<Tool> {
        let description = |name: &str| {
            self.door
                .tools
                .get(name)
                .map(|tool| tool.spec().description)
                .unwrap_or_default()
        };
        let read_only = ToolAnnotations::default().read_only(true);
        vec![
            Tool::new(
                RUN_TASK,
                "Run a task on the mesh: an agent with the tools of its tier runs the prompt on the node that fits best (by role, model or persona, and the requirements) and the answer comes back. Progress (routing, model calls, tool calls) is sent as progress notifications when asked for.",
                input_schema::<RunTask>(),
            )
            .with_output_schema::<TaskAnswer>()
            .with_annotations(ToolAnnotations::default().read_only(false).destructive(false)),
            Tool::new(LIST_NODES, description(LIST_NODES), input_schema::<NoArguments>())
                .with_annotations(read_only.clone()),
            Tool::new(MEMORY_GET, description(MEMORY_GET), input_schema::<MemoryGet>())
                .with_annotations(read_only.clone()),
            Tool::new(
                MEMORY_SEARCH,
                description(MEMORY_SEARCH),
                input_schema::<MemorySearch>(),
            )
            .with_annotations(read_only.clone()),
            Tool::new(MEMORY_PUT, description(MEMORY_PUT), input_schema::<MemoryPut>())
                .with_annotations(ToolAnnotations::default().read_only(false).destructive(true)),
            Tool::new(
                CRON_LIST,
                "List the mesh's cron schedules: name, cron expression, time zone, what each firing runs, the node that fires it and when it fires next.",
                input_schema::<NoArguments>(),
            )
            .with_annotations(read_only),
        ]
    }

    /// Runs tool `name` with `args` for `caller`.
    async fn call(
        &self,
        name: &str,
        args: Option<&JsonObject>,
        caller: &Caller,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, CallError> {
        match name {
            RUN_TASK => {
                self.run_task(arguments(RUN_TASK, args)?, caller, context)
                    .await
            }
            CRON_LIST => {
                arguments::<NoArguments>(CRON_LIST, args)?;
                self.cron_list()
            }
            LIST_NODES => {
                arguments::<NoArguments>(LIST_NODES, args)?;
                self.agent_tool(LIST_NODES, json!({})).await
            }
            MEMORY_GET => {
                let a: MemoryGet = arguments(MEMORY_GET, args)?;
                check_place(MEMORY_GET, &a.namespace, Some(&a.key))?;
                let args = json!({"namespace": a.namespace, "key": a.key});
                self.agent_tool(MEMORY_GET, args).await
            }
            MEMORY_PUT => {
                let a: MemoryPut = arguments(MEMORY_PUT, args)?;
                check_place(MEMORY_PUT, &a.namespace, Some(&a.key))?;
                if a.value.len() > MAX_VALUE {
                    return Err(CallError::Arguments {
                        tool: MEMORY_PUT,
                        problem: format!(
                            "value: {} bytes, at most {MAX_VALUE} allowed",
                            a.value.len()
                        ),
                    });
                }
                let args = json!({"namespace": a.namespace, "key": a.key, "value": a.value});
                self.agent_tool(MEMORY_PUT, args).await
            }
            MEMORY_SEARCH => {
                let a: MemorySearch = arguments(MEMORY_SEARCH, args)?;
                check_place(MEMORY_SEARCH, &a.namespace, None)?;
                let invalid = |problem: String| CallError::Arguments {
                    tool: MEMORY_SEARCH,
                    problem,
                };
                let mut search = json!({"namespace": a.namespace});
                for (name, value) in [
                    ("prefix", a.prefix),
                    ("contains", a.contains),
                    ("after", a.after),
                ] {
                    if let Some(value) = value {
                        if value.len() > keys::MAX_KEY {
                            return Err(invalid(format!(
                                "{name}: at most {} bytes",
                                keys::MAX_KEY
                            )));
                        }
                        search[name] = json!(value);
                    }
                }
                if let Some(limit) = a.limit {
                    if !(1..=100).contains(&limit) {
                        return Err(invalid(format!("limit: {limit} is not between 1 and 100")));
                    }
                    search["limit"] = json!(limit);
                }
                self.agent_tool(MEMORY_SEARCH, search).await
            }
            other => Err(CallError::UnknownTool(truncate(other, 64).to_owned())),
        }
    }

    /// Whether this node lets an `/mcp` caller do something of `tier` (the one decision, in
    /// `admission`).
    fn allowed(&self, tier: Tier) -> Result<(), CallError> {
        self.door
            .admission
            .allows(tier, &AdmissionCaller::FrontDoor, None)
            .map_err(|e| CallError::Tool(e.to_string()))
    }

    /// Runs one of the agents' tools (`list_nodes` and the memory tools) with `args`, once the tier
    /// the tool table says the call counts as is allowed.
    async fn agent_tool(&self, name: &str, args: Value) -> Result<CallToolResult, CallError> {
        let tool = self
            .door
            .tools
            .get(name)
            .ok_or_else(|| CallError::UnknownTool(name.to_owned()))?;
        let tier = tool.effective_tier(&args);
        self.allowed(tier)?;
        let context = ToolContext {
            task_id: "mcp".into(),
            spec: TaskSpec {
                tier,
                ..TaskSpec::new(name, Target::Role("mcp".into()))
            },
            events: None,
        };
        let output = tool.call(&args, &context).await.map_err(CallError::Tool)?;
        Ok(CallToolResult::success(vec![ContentBlock::text(output)]))
    }

    /// `cron_list`: every schedule, as `mesh-cli cron ls` shows it.
    fn cron_list(&self) -> Result<CallToolResult, CallError> {
        self.allowed(Tier::Read)?;
        let schedules = self
            .door
            .scheduler
            .table()
            .schedules()
            .map_err(|e| CallError::Tool(format!("read the schedules: {e}")))?;
        let now = chrono::Utc::now().timestamp_millis();
        let live = self.door.scheduler.live();
        let listed: Vec<Value> = schedules
            .iter()
            .take(MAX_SCHEDULES_LISTED)
            .map(|stored| {
                let s = &stored.parsed.schedule;
                let next = stored.parsed.timetable.next_after(now);
                json!({
                    "name": s.name,
                    "schedule": s.expression,
                    "timezone": if s.timezone.is_empty() { "UTC" } else { s.timezone.as_str() },
                    "target": s.task.target.to_string(),
                    "prompt": s.task.prompt.chars().take(SCHEDULE_PROMPT_CHARS).collect::<String>(),
                    "tier": s.task.tier.to_string(),
                    "enabled": s.enabled,
                    "overlap": s.overlap.to_string(),
                    "owner": owner_of(s, &live).map(|node| node.name.as_str()),
                    "next_at_ms": next,
                    "created_on": s.created_on,
                    "held": stored.held,
                })
            })
            .collect();
        let mut answer = json!({ "schedules": listed });
        if schedules.len() > MAX_SCHEDULES_LISTED {
            answer["cut"] = json!(format!(
                "the first {MAX_SCHEDULES_LISTED} of {} schedules",
                schedules.len()
            ));
        }
        let mut result = CallToolResult::success(vec![ContentBlock::text(answer.to_string())]);
        result.structured_content = Some(answer);
        Ok(result)
    }

    /// `run_task`: admits the caller's key for the target (the task's token budget is what the
    /// key grants: at most `tasks.token_budget`, all of it reserved while the task runs),
    /// submits the task as an `/mcp` caller's, relays its events as progress (when the client
    /// gave a progress token) and answers with the task's answer. A client that cancels or goes
    /// away cancels the task. The key is charged what the task spent, however it ends
    /// ([`settle_from_outcome`]).
    async fn run_task(
        &self,
        args: RunTask,
        caller: &Caller,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, CallError> {
        let mut spec = args.spec().map_err(|problem| CallError::Arguments {
            tool: RUN_TASK,
            problem,
        })?;
        let door = &self.door;
        // Refused here, before a key's request is counted.
        self.allowed(spec.tier)?;
        let charge = match &caller.key {
            Some(grant) => {
                let asked = match &spec.target {
                    Target::Model(model) => model.clone(),
                    other => other.to_string(),
                };
                // The task's budget covers its prompt and every round after it.
                let prompt =
                    prompt_token_bound(&[Message::text(Role::User, spec.prompt.clone())], &[]);
                let ask = Ask {
                    prompt,
                    completion: Some(door.task_token_budget.saturating_sub(prompt)),
                    choices: 1,
                };
                let charge = door
                    .keys
                    .admit(grant, &asked, ask)
                    .await
                    .map_err(|refusal| CallError::Tool(refusal.to_string()))?;
                if charge.reserved() > 0 {
                    spec.token_budget = Some(charge.reserved());
                }
                Some(charge)
            }
            None => None,
        };
        let done = self.follow(spec, charge, context).await?;
        let mut text = truncate(&done.output, MAX_ANSWER_BYTES).to_owned();
        if text.len() < done.output.len() {
            text.push_str(&format!(
                "\n[cut at {MAX_ANSWER_BYTES} bytes: `mesh-cli tasks show {}` has the whole answer]",
                done.task_id
            ));
        }
        // The answer goes in both parts, as the MCP spec expects of a tool with an output
        // schema: Claude Code gives its model the structured part alone.
        let answer = TaskAnswer {
            answer: text.clone(),
            task_id: done.task_id,
            executed_on: done.executed_on,
            rounds: done.rounds,
            usage: TokenCounts {
                prompt_tokens: done.usage.prompt_tokens,
                completion_tokens: done.usage.completion_tokens,
            },
        };
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(
            serde_json::to_value(&answer)
                .map_err(|e| CallError::Tool(format!("encode the task's answer: {e}")))?,
        );
        Ok(result)
    }

    /// Submits `spec` and follows it to its end; `charge` is settled with what it spent.
    async fn follow(
        &self,
        spec: TaskSpec,
        charge: Option<Charge>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Done, CallError> {
        let tasks = &self.door.tasks;
        let id = match tasks.submit(spec, &AdmissionCaller::FrontDoor) {
            Ok(id) => id,
            Err(e) => {
                if let Some(charge) = charge {
                    // Nothing ran.
                    charge.settle(Usage::default()).await;
                }
                return Err(CallError::Tool(e.to_string()));
            }
        };
        if let Some(charge) = charge {
            // Apart from this call, which may end first (the client cancels or goes away).
            match tasks.watch(&id, true) {
                Ok(events) => {
                    tokio::spawn(settle_from_outcome(events, charge));
                }
                // Dropped: charged its whole reservation.
                Err(e) => {
                    tracing::warn!(task = %id, error = %e, "follow an /mcp task to charge its key")
                }
            }
        }
        // From here the task is the client's: it ends when the client stops waiting.
        let mut waiting = CancelOnDrop {
            tasks: tasks.clone(),
            id: Some(id.clone()),
        };
        let mut events = tasks
            .watch(&id, true)
            .map_err(|e: LookupError| CallError::Tool(format!("follow task {id}: {e}")))?;
        let progress = context.meta.get_progress_token();
        let mut step = 0u32;
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = context.ct.cancelled() => {
                    return Err(CallError::Tool(format!("task {id}: the MCP client cancelled the call")));
                }
            };
            let Some(event) = event else {
                return Err(CallError::Tool(format!(
                    "task {id}: its events ended without an answer (`mesh-cli tasks show {id}`)"
                )));
            };
            if event.kind.is_terminal() {
                waiting.id = None;
            }
            match event.kind {
                EventKind::Completed {
                    output,
                    usage,
                    executed_on,
                    rounds,
                } => {
                    return Ok(Done {
                        task_id: id.clone(),
                        output,
                        usage,
                        executed_on,
                        rounds,
                    });
                }
                EventKind::Failed { error, .. } => {
                    return Err(CallError::Tool(format!("task {id} failed: {error}")));
                }
                other => {
                    if let Some(token) = &progress {
                        step += 1;
                        let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                            .with_message(describe(&other));
                        // A client that stopped reading is noticed by the cancellation above.
                        let _ = context.peer.notify_progress(note).await;
                    }
                }
            }
        }
    }
}

/// Follows a task's `events` to its end and charges its key what it spent: a completed task
/// its usage, a failed or cancelled one the usage its `failed` event carries (what its model
/// calls reported, and the estimate of a call cut off). Events that end without an outcome
/// drop the charge, which charges its whole reservation.
async fn settle_from_outcome(mut events: tokio::sync::mpsc::Receiver<TaskEvent>, charge: Charge) {
    while let Some(event) = events.recv().await {
        match event.kind {
            EventKind::Completed { usage, .. } | EventKind::Failed { usage, .. } => {
                charge.settle(usage).await;
                return;
            }
            _ => {}
        }
    }
}

/// `run_task`'s structured result (its declared output schema).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct TaskAnswer {
    /// The task's answer, as the text part carries it (cut at 1 MiB, with a note).
    answer: String,
    /// The task's id (`mesh-cli tasks show <id>`).
    task_id: String,
    /// The node that ran it.
    executed_on: String,
    /// Model calls the agent made.
    rounds: u32,
    /// Tokens the task spent.
    usage: TokenCounts,
}

/// Tokens one task spent.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct TokenCounts {
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// A task's end, as `run_task` answers it.
struct Done {
    task_id: String,
    output: String,
    usage: Usage,
    executed_on: String,
    rounds: u32,
}

/// Cancels the task when the call that follows it ends first (the client cancelled, or went
/// away and the call was dropped).
struct CancelOnDrop {
    tasks: crate::tasks::TaskManager,
    /// The task, until it ended.
    id: Option<String>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self
                .tasks
                .cancel(&id, "the MCP client that started it stopped waiting");
        }
    }
}

/// One line of progress for an event that is not the task's end.
fn describe(kind: &EventKind) -> String {
    let text = match kind {
        EventKind::Accepted {
            node,
            queue_position,
        } => format!("accepted by {node} (queue position {queue_position})"),
        EventKind::Started { node } => format!("started on {node}"),
        EventKind::Delegated {
            node,
            attempt,
            reason,
        } => match attempt {
            1 => format!("sent to {node}"),
            n => format!("sent to {node} (attempt {n}: {reason})"),
        },
        EventKind::ModelCall {
            model,
            round,
            attempt,
        } => format!("round {round}: calling model {model} (attempt {attempt})"),
        EventKind::ModelFailed {
            model,
            error,
            falling_through,
        } => format!(
            "model {model} failed: {error}{}",
            if *falling_through {
                "; trying the next"
            } else {
                ""
            }
        ),
        EventKind::ToolCalled {
            name, arguments, ..
        } => format!("calling tool {name} {arguments}"),
        EventKind::ToolResult { name, ok, .. } => {
            format!("tool {name} {}", if *ok { "answered" } else { "failed" })
        }
        EventKind::ApprovalRequested {
            approval_id,
            tool,
            node,
            ..
        } => format!(
            "waiting for approval of {tool} on {node}: mesh-cli approvals approve {approval_id} (or deny {approval_id} --reason ...)"
        ),
        EventKind::ApprovalDecided {
            approved,
            by,
            reason,
            ..
        } => match (approved, by.is_empty()) {
            (true, _) => format!("approved by {by}"),
            (false, true) => format!("denied: {reason}"),
            (false, false) => format!("denied by {by}: {reason}"),
        },
        EventKind::Intervention { rule, message } => format!("supervisor ({rule}): {message}"),
        EventKind::Warning { message } => format!("warning: {message}"),
        EventKind::OutputDelta { text } => format!("output: {text}"),
        EventKind::Completed { executed_on, .. } => format!("completed on {executed_on}"),
        EventKind::Failed { error, .. } => format!("failed: {error}"),
        EventKind::Evaluated {
            attempt,
            score: Some(score),
            critique,
            ..
        } => format!("attempt {attempt} scored {score:.2}: {critique}"),
        EventKind::Evaluated { attempt, error, .. } => format!(
            "attempt {attempt} unscored: {}",
            error.as_deref().unwrap_or("no verdict")
        ),
        EventKind::AttemptStarted {
            attempt,
            attempts,
            reason,
        } => format!("attempt {attempt} of {attempts}: {reason}"),
    };
    truncate(&text, MAX_PROGRESS_MESSAGE).to_owned()
}

impl ServerHandler for MeshTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentmesh", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of an agentmesh fleet, served by node `{}`: run_task runs a prompt on the node that fits best and answers; list_nodes, memory_get/memory_search/memory_put (the fleet's shared memory) and cron_list (its schedules) read and write the fleet directly.",
                self.door.caps.snapshot().name
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The key middleware put it there; without it the request did not come through the
        // front door's router.
        let caller = context
            .extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("no authenticated caller", None))?;
        let outcome = self
            .call(
                request.name.as_ref(),
                request.arguments.as_ref(),
                &caller,
                &context,
            )
            .await;
        match outcome {
            Ok(result) => Ok(result.into()),
            Err(error) => error.respond(),
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::task::{MAX_PROMPT_BYTES, MAX_TIMEOUT_S};

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
