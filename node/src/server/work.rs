//! Work: what runs here for the fleet. The models, the admission (the one door for every task
//! and chat), this node's MCP servers, the tool table, approvals, the agent runtime, chats, the
//! task manager and the scheduler.

use std::sync::Arc;

use mesh_domain::HealthStatus;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    error::StartError,
    fleet::{Fleet, Shared},
    health::HEALTH_CHECK_INTERVAL,
    identity::{self, NodeIdentity},
    loops::Loops,
};
use crate::{
    admission::Admission,
    agent::{AgentRuntime, hooks::Hooks, tools::ToolRegistry},
    approvals::Approvals,
    capabilities::Capabilities,
    chat::ChatService,
    config::{Config, ConfigError},
    cron::{ScheduleLimits, Scheduler},
    llm::ModelRegistry,
    mcp::{self, McpHub},
    rpc::{
        memory::RemoteMemory, models::RemoteModels, tasks::RemoteTasks, tools::RemoteToolsClient,
    },
    supervise::no_error,
    tasks::{Drain, TaskManager, TaskParts, journal::Journals},
};

/// What step 7 of start-up builds.
#[derive(Debug)]
pub(super) struct Work {
    pub(super) admission: Arc<Admission>,
    pub(super) mcp_hub: Arc<McpHub>,
    pub(super) approvals: Approvals,
    pub(super) chat: Arc<ChatService>,
    /// For `/metrics`: each model's decode speed, read at each scrape.
    pub(super) models: Arc<ModelRegistry>,
    pub(super) tasks: TaskManager,
    /// Drains the tasks (`Node.Drain`, and a stop with `node.drain_on_stop_s`).
    pub(super) drain: Arc<Drain>,
    /// Stops the task workers once running tasks are finished or cancelled.
    pub(super) task_stop: CancellationToken,
    pub(super) task_workers: JoinSet<()>,
}

/// Step 6: the model registry (a model this build cannot run is a `degraded` check), its speed
/// gauges followed by the capabilities, every model probed by the supervised `model prober`.
pub(super) fn models(
    config: &Config,
    caps: &Arc<Capabilities>,
    loops: &mut Loops,
) -> Arc<ModelRegistry> {
    let (models, skipped) = ModelRegistry::from_config(config);
    for (name, reason) in skipped {
        caps.set_check(
            &format!("model {name}"),
            Some((HealthStatus::Degraded, reason)),
        );
    }
    let models = Arc::new(models);
    caps.follow_model_speeds(models.speeds());
    // Probed at start and then with the other health checks, so a model server that comes up
    // later clears the node's `degraded` reason.
    let (probed, probe_caps) = (models.clone(), caps.clone());
    loops
        .supervisor
        .spawn("model prober", loops.leaving.clone(), move |stop| {
            no_error(probe_models(probed.clone(), probe_caps.clone(), stop))
        });
    models
}

/// Step 7: the admission, the MCP hub (one supervised loop per server), the tool table (every
/// persona's tools checked against it), the approval gate, the agent runtime, chats and the
/// task manager, whose sub-tasks the `delegate` tool goes through.
pub(super) fn start(
    config: &Config,
    identity: &NodeIdentity,
    caps: &Arc<Capabilities>,
    fleet: &Fleet,
    shared: &Shared,
    models: Arc<ModelRegistry>,
    loops: &mut Loops,
) -> Result<Work, StartError> {
    let (peers, memory, channels) = (&fleet.peers, &shared.memory, &fleet.channels);
    // One door for every task and chat, whichever way it comes.
    let admission = Arc::new(
        Admission::new(caps.clone(), peers.clone(), config.client_max_tier)
            .with_mcp_max_tier(config.mcp_max_tier)
            .with_operators(identity::operators(config, identity)),
    );
    // This node's MCP servers, each kept connected by a supervised loop (restarted with
    // back-off, named in the health while down); their tools are advertised to the fleet.
    let mcp_hub = McpHub::new(config.mcp.clone(), caps.clone());
    caps.follow_mcp_tools(mcp_hub.advertised());
    for (index, name) in mcp_hub.servers().iter().enumerate() {
        let hub = mcp_hub.clone();
        loops.supervisor.spawn(
            &mcp::loop_name(name),
            loops.background.clone(),
            move |cancel| hub.clone().run(index, cancel),
        );
    }
    let tools = Arc::new(
        ToolRegistry::new(
            caps.clone(),
            peers.clone(),
            config.tool_roots.clone(),
            memory.clone(),
        )
        // The fleet's MCP tools: this node's, and its peers' through `Tools.Call`.
        .with_mcp(
            mcp_hub.clone(),
            peers.clone(),
            Arc::new(RemoteToolsClient::new(channels.clone())),
        ),
    );
    check_persona_tools(config, &tools)?;
    // Every tool call passes this gate; calls `[approval]` names wait for a person.
    let approvals = Approvals::new(
        memory.clone(),
        admission.clone(),
        config.name.clone(),
        config.approval.clone(),
        identity.secure(),
    );
    let runtime = Arc::new(
        AgentRuntime::new(
            memory.clone(),
            models.clone(),
            tools.clone(),
            Hooks::supervisor().map_err(|e| StartError::Hooks(e.to_string()))?,
            config.personas.clone(),
            config.tasks,
        )
        .with_approvals(approvals.clone()),
    );
    let chat = Arc::new(ChatService::new(
        models.clone(),
        admission.clone(),
        Arc::new(RemoteModels::new(channels.clone())),
    ));
    let task_stop = CancellationToken::new();
    let mut task_workers = JoinSet::new();
    let tasks = TaskManager::start(
        TaskParts {
            store: shared.store.clone(),
            runtime,
            chat: chat.clone(),
            limits: config.tasks,
            caps: caps.clone(),
            admission: admission.clone(),
            forwarder: Arc::new(RemoteTasks::new(channels.clone())),
            journals: Journals::new(
                memory.clone(),
                Arc::new(RemoteMemory::new(channels.clone(), identity.id.clone())),
                peers.clone(),
            ),
        },
        &mut task_workers,
        task_stop.clone(),
    );
    // The `delegate` tool's sub-tasks go through the same door as any task.
    tools.connect_subtasks(Arc::new(tasks.clone()));
    Ok(Work {
        admission,
        mcp_hub,
        approvals,
        chat,
        models,
        drain: Drain::new(tasks.clone()),
        tasks,
        task_stop,
        task_workers,
    })
}

/// The scheduler of step 8 (supervised as `scheduler`): schedules fire through the same door
/// as any task, and stop firing as the node starts leaving.
pub(super) fn scheduler(
    config: &Config,
    identity: &NodeIdentity,
    fleet: &Fleet,
    shared: &Shared,
    work: &Work,
    loops: &mut Loops,
) -> Arc<Scheduler> {
    let scheduler = Scheduler::new(
        shared.memory.clone(),
        fleet.peers.clone(),
        identity.id.clone(),
        config.name.clone(),
        config.remote_max_tier,
        ScheduleLimits {
            schedules: config.cron.max_schedules,
            schedules_per_creator: config.cron.max_schedules_per_creator,
            bytes: config.cron.max_bytes,
            bytes_per_creator: config.cron.max_bytes_per_creator,
        },
        Arc::new(work.tasks.clone()),
    );
    let looped = scheduler.clone();
    loops
        .supervisor
        .spawn("scheduler", loops.leaving.clone(), move |stop| {
            no_error(looped.clone().run(stop))
        });
    scheduler
}

/// Every tool a persona lists must be in the node's tool table.
fn check_persona_tools(config: &Config, tools: &ToolRegistry) -> Result<(), ConfigError> {
    for (i, persona) in config.personas.iter().enumerate() {
        for (t, tool) in persona.tools.iter().flatten().enumerate() {
            if !tools.may_list(tool) {
                return Err(ConfigError::Invalid {
                    origin: config.source.as_ref().map_or_else(
                        || "configuration".to_owned(),
                        |path| path.display().to_string(),
                    ),
                    key: format!("personas[{i}].tools[{t}]"),
                    problem: format!("names tool `{tool}`, which does not exist"),
                    fix: format!(
                        "use some of: {}, or an MCP tool's `<server>__<tool>`",
                        tools.names().join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Probes every model at start and then every [`HEALTH_CHECK_INTERVAL`], so a model server that
/// comes up later clears the node's `degraded` reason.
async fn probe_models(
    models: Arc<ModelRegistry>,
    caps: Arc<Capabilities>,
    stop: CancellationToken,
) {
    loop {
        for (name, result) in models.probe_all().await {
            caps.set_check(
                &format!("model {name}"),
                result
                    .err()
                    .map(|e| (HealthStatus::Degraded, format!("unreachable ({e})"))),
            );
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(HEALTH_CHECK_INTERVAL) => {}
        }
    }
}
