//! The mesh as an MCP server: the front door's `/mcp`, streamable HTTP through rmcp's
//! [`StreamableHttpService`], stateless (each request stands alone; the node keeps no MCP
//! session, so no client can make it hold one). Its tools: `run_task` (a task of the mesh, its
//! events sent as MCP progress notifications when the client asks for progress; its answer in
//! the text part and, with task id, node, rounds and usage, in the structured part its output
//! schema declares; `task`), `list_nodes`, `memory_get`, `memory_search`, `memory_put` and
//! `cron_list`. The arguments' and answers' shapes are in `wire`.
//!
//! It translates only. Who may call is the key middleware's (`http::auth`, as for every `/v1`
//! route: no key on an open door, a known key with the `mcp` scope otherwise, decided by
//! `api_keys`); what a caller may do is decided by the gateway (`gateway::Gateway::allow`:
//! `admission`, for which an `/mcp` caller is a front-door caller capped by
//! `security.mcp_max_tier`) for every tool, by the tier the tool counts as, and by the
//! caller's key for the model, role or persona of a `run_task` (its models and roles, its
//! budgets). Tasks run through the task manager, so they take the same admission, placement,
//! forwarding, approval gates and history as a task from `mesh-cli run`; the node list and the
//! memory are the agents' own data tools, reached through the gateway's `MeshData` port, with
//! their bounds and their refusal of the system namespaces. It must not decide a tier itself,
//! place or run a task, or touch the memory.

mod task;
mod wire;

use std::sync::Arc;

use axum::http::request::Parts;
use mesh_domain::{
    Tier,
    keys::{self, MAX_VALUE},
    text::truncate,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
        Tool, ToolAnnotations,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde_json::{Value, json};

use self::wire::{
    CRON_LIST, CallError, LIST_NODES, MEMORY_GET, MEMORY_PUT, MEMORY_SEARCH, MemoryGet, MemoryPut,
    MemorySearch, NoArguments, RUN_TASK, RunTask, TaskAnswer, arguments, check_place, input_schema,
};
use super::door::FrontDoor;
use crate::{
    cron::owner_of,
    gateway::{DataTool, DoorCaller, GatewayError, MemoryQuery},
};

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

impl MeshTools {
    /// The tools, with their schemas and hints.
    fn tools(&self) -> Vec<Tool> {
        let description = |tool: DataTool| self.door.gateway.describe(tool);
        let read_only = ToolAnnotations::default().read_only(true);
        vec![
            Tool::new(
                RUN_TASK,
                "Run a task on the mesh: an agent with the tools of its tier runs the prompt on the node that fits best (by role, model or persona, and the requirements) and the answer comes back. Progress (routing, model calls, tool calls) is sent as progress notifications when asked for.",
                input_schema::<RunTask>(),
            )
            .with_output_schema::<TaskAnswer>()
            .with_annotations(ToolAnnotations::default().read_only(false).destructive(false)),
            Tool::new(LIST_NODES, description(DataTool::ListNodes), input_schema::<NoArguments>())
                .with_annotations(read_only.clone()),
            Tool::new(MEMORY_GET, description(DataTool::MemoryGet), input_schema::<MemoryGet>())
                .with_annotations(read_only.clone()),
            Tool::new(
                MEMORY_SEARCH,
                description(DataTool::MemorySearch),
                input_schema::<MemorySearch>(),
            )
            .with_annotations(read_only.clone()),
            Tool::new(MEMORY_PUT, description(DataTool::MemoryPut), input_schema::<MemoryPut>())
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
        caller: &DoorCaller,
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
                data_answer(self.door.gateway.list_nodes())
            }
            MEMORY_GET => {
                let a: MemoryGet = arguments(MEMORY_GET, args)?;
                check_place(MEMORY_GET, &a.namespace, Some(&a.key))?;
                data_answer(self.door.gateway.memory_get(&a.namespace, &a.key))
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
                data_answer(
                    self.door
                        .gateway
                        .memory_put(&a.namespace, &a.key, &a.value)
                        .await,
                )
            }
            MEMORY_SEARCH => {
                let a: MemorySearch = arguments(MEMORY_SEARCH, args)?;
                check_place(MEMORY_SEARCH, &a.namespace, None)?;
                let invalid = |problem: String| CallError::Arguments {
                    tool: MEMORY_SEARCH,
                    problem,
                };
                for (name, value) in [
                    ("prefix", &a.prefix),
                    ("contains", &a.contains),
                    ("after", &a.after),
                ] {
                    if value
                        .as_ref()
                        .is_some_and(|value| value.len() > keys::MAX_KEY)
                    {
                        return Err(invalid(format!("{name}: at most {} bytes", keys::MAX_KEY)));
                    }
                }
                if let Some(limit) = a.limit
                    && !(1..=100).contains(&limit)
                {
                    return Err(invalid(format!("limit: {limit} is not between 1 and 100")));
                }
                let query = MemoryQuery {
                    namespace: a.namespace,
                    prefix: a.prefix.unwrap_or_default(),
                    contains: a.contains.unwrap_or_default(),
                    after: a.after.unwrap_or_default(),
                    limit: a.limit.map(u64::from),
                };
                data_answer(self.door.gateway.memory_search(&query))
            }
            other => Err(CallError::UnknownTool(truncate(other, 64).to_owned())),
        }
    }

    /// `admission`).
    fn allowed(&self, tier: Tier) -> Result<(), CallError> {
        self.door
            .gateway
            .allow(tier)
            .map_err(|e| CallError::Tool(e.to_string()))
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
}

/// A data tool's answer as an MCP result; a refusal or failure is an error result, in the
/// tool's words.
fn data_answer(answer: Result<String, GatewayError>) -> Result<CallToolResult, CallError> {
    let output = answer.map_err(|e| CallError::Tool(e.to_string()))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(output)]))
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
            .and_then(|parts| parts.extensions.get::<DoorCaller>())
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
