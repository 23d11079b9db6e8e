//! The agent runtime: personas, the orchestrator loop (OpenAI tools loop), the supervisor hooks
//! and the tool table.
//!
//! [`AgentRuntime::run`] calls the task's model chain with the tools the task may use, runs the
//! tool calls the model makes, appends the results and repeats until the model answers without
//! tools. It is bounded by max rounds, a token budget (from the server's `usage`, estimated
//! when absent), and a context budget (the oldest tool results are shortened first when the
//! conversation nears the model's context window); the deadline and cancellation are enforced
//! by `tasks` around it. Every step is a typed event; the supervisor ([`hooks`]) decides from
//! those facts, never from message text. Every tool call the supervisor lets through passes
//! the node's approval gate (`approvals`) before it runs: a call the `[approval]` policy names
//! waits for a person's decision, and a denial is the call's result. This module does not
//! queue, persist or route tasks.

pub(crate) mod evaluate;
pub(crate) mod hooks;
pub(crate) mod replay;
pub(crate) mod tools;

#[cfg(test)]
pub(crate) use self::replay::NoJournal;
pub(crate) use self::replay::{Journal, JournalError};

use std::{collections::BTreeMap, sync::Arc};

use mesh_domain::{
    Answer, ChatRequest, ChatResponse, EventKind, Message, Role, Target, TaskError, TaskSpec, Tier,
    ToolCall, ToolChoice, ToolSpec, Usage,
    chat::estimate_prompt_tokens,
    journal::{MAX_STEP_OUTPUT, Step},
    keys::{SESSIONS, is_turn_name, turn_key},
    text::truncate,
};
use serde_json::Value;

use self::{
    hooks::{CallFacts, HookInput, Hooks, LoopState, Outcome, Stage, Verdict},
    replay::{Pending, interrupted, replay},
    tools::{ToolContext, ToolRegistry},
};
use tokio::sync::mpsc;

use crate::{
    approvals::{Approvals, Call as GatedCall},
    chat::{ChainObserver, fall_through},
    config::{PersonaConfig, TaskLimits},
    llm::{ChatModel, ModelError, ModelRegistry, delta_channel},
    memory::Memory,
};

/// Where a running task's events go (a port: the task manager records and broadcasts them).
pub(crate) trait EventSink: Send + Sync {
    /// The task's id.
    fn task_id(&self) -> &str;
    /// Records `kind` as the task's next event.
    fn emit(&self, kind: EventKind);
    /// Adds what a model call cost to what the task spent, which its `failed` event carries
    /// (a completed task's usage is its answer's).
    fn spend(&self, usage: Usage);
}

/// Most turns a session keeps: saving one more deletes the oldest (a turn is one record, so a
/// long session neither grows one record without bound nor loads an unbounded history).
pub(crate) const MAX_SESSION_TURNS: usize = 50;
/// The messages of one stored turn (or of a session's earlier single record).
fn decode_turn(session: &str, value: &[u8]) -> Result<Vec<Message>, TaskError> {
    serde_json::from_slice(value).map_err(|e| TaskError::Internal {
        message: format!("session `{session}` is not readable: {e}"),
    })
}

/// The `tool_choice` of a task's first round: the tool `spec.tool` names, which must be among
/// the tools the task is offered (`tools`, by its tier and persona), else the task fails
/// naming what it may call.
fn first_tool_choice(
    spec: &TaskSpec,
    tier: Tier,
    tools: &[ToolSpec],
) -> Result<Option<ToolChoice>, TaskError> {
    let Some(name) = &spec.tool else {
        return Ok(None);
    };
    if tools.iter().any(|t| t.name == *name) {
        return Ok(Some(ToolChoice::Function(name.clone())));
    }
    let offered: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    Err(TaskError::Gate {
        rule: "tool".into(),
        action: name.clone(),
        message: format!(
            "tool: `{name}` is not offered to this task (tier {tier}{}); it may call: {}. An MCP tool is offered while its node is up and the tier allows it (`mesh-cli status` lists them)",
            if matches!(spec.target, Target::Persona(_)) {
                " and its persona's tools"
            } else {
                ""
            },
            if offered.is_empty() {
                "none".to_owned()
            } else {
                offered.join(", ")
            }
        ),
    })
}

/// Share of the context window the conversation may fill before old tool results are shortened.
const CONTEXT_FILL: f64 = 0.75;
/// What a shortened tool result keeps.
const SHORTENED_KEEP: usize = 200;
/// Cap on tool output copied into events (the model still gets up to 64 KiB).
const EVENT_OUTPUT_CAP: usize = 4096;

/// What a task resolves to on this node.
#[derive(Debug)]
struct Plan {
    chain: Vec<Arc<dyn ChatModel>>,
    system: Option<String>,
    allowed_tools: Option<Vec<String>>,
    tier: Tier,
}

/// Runs agent tasks on this node.
#[derive(Debug)]
pub struct AgentRuntime {
    /// Conversation sessions live in the replicated `sessions` namespace.
    memory: Arc<Memory>,
    models: Arc<ModelRegistry>,
    tools: Arc<ToolRegistry>,
    hooks: Hooks,
    personas: BTreeMap<String, PersonaConfig>,
    limits: TaskLimits,
    /// The approval gate every tool call passes; `None`: no call waits (tests).
    approvals: Option<Approvals>,
}

impl AgentRuntime {
    /// Builds the runtime.
    pub fn new(
        memory: Arc<Memory>,
        models: Arc<ModelRegistry>,
        tools: Arc<ToolRegistry>,
        hooks: Hooks,
        personas: Vec<PersonaConfig>,
        limits: TaskLimits,
    ) -> Self {
        Self {
            memory,
            models,
            tools,
            hooks,
            personas: personas.into_iter().map(|p| (p.name.clone(), p)).collect(),
            limits,
            approvals: None,
        }
    }

    /// The runtime with the node's approval gate: calls its policy names wait for a decision.
    #[must_use]
    pub fn with_approvals(mut self, approvals: Approvals) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// The tool table tasks here may use.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// Whether `spec` can run here (its role, model or persona exists).
    pub fn check(&self, spec: &TaskSpec) -> Result<(), TaskError> {
        self.plan(spec).map(|_| ())
    }

    fn plan(&self, spec: &TaskSpec) -> Result<Plan, TaskError> {
        let routing = |message: String| TaskError::Routing { message };
        match &spec.target {
            Target::Role(role) => Ok(Plan {
                chain: self.models.chain(role).ok_or_else(|| {
                    routing(format!("no model serves role `{role}` on this node"))
                })?,
                system: None,
                allowed_tools: None,
                tier: spec.tier,
            }),
            Target::Model(name) => Ok(Plan {
                chain: vec![
                    self.models
                        .model(name)
                        .ok_or_else(|| routing(format!("no model named `{name}` on this node")))?,
                ],
                system: None,
                allowed_tools: None,
                tier: spec.tier,
            }),
            Target::Persona(name) => {
                let persona = self
                    .personas
                    .get(name)
                    .ok_or_else(|| routing(format!("no persona named `{name}` on this node")))?;
                Ok(Plan {
                    chain: self.models.chain(&persona.role).ok_or_else(|| {
                        routing(format!(
                            "persona `{name}` uses role `{}`, which no model serves on this node",
                            persona.role
                        ))
                    })?,
                    system: Some(persona.system_prompt.clone()).filter(|s| !s.is_empty()),
                    allowed_tools: persona.tools.clone(),
                    tier: spec.tier.min(persona.max_tier),
                })
            }
        }
    }

    /// Runs the tools loop to an answer or a typed error, recording each step in `journal`
    /// (and continuing from the steps it holds), and keeps the turn in the task's session.
    pub(crate) async fn run(
        &self,
        spec: &TaskSpec,
        events: &dyn EventSink,
        journal: &dyn Journal,
    ) -> Result<Answer, TaskError> {
        let answer = self.attempt(spec, events, journal).await?;
        self.remember(spec, &answer.output, events).await;
        Ok(answer)
    }

    /// The token budget of `spec`: its own, or this node's default.
    fn token_budget(&self, spec: &TaskSpec) -> u64 {
        spec.token_budget.unwrap_or(self.limits.token_budget)
    }

    /// One run of the tools loop on `spec.prompt` (after the session's earlier turns, and the
    /// steps `journal` replays) to an answer or a typed error, each step recorded in `journal`;
    /// it saves nothing else (the evaluator loop runs several and keeps one).
    async fn attempt(
        &self,
        spec: &TaskSpec,
        events: &dyn EventSink,
        journal: &dyn Journal,
    ) -> Result<Answer, TaskError> {
        let plan = self.plan(spec)?;
        let max_rounds = spec.max_rounds.unwrap_or(self.limits.max_rounds);
        let budget = self.token_budget(spec);
        let tools = self.tools.specs(plan.tier, plan.allowed_tools.as_deref());
        let first_choice = first_tool_choice(spec, plan.tier, &tools)?;
        let window = plan
            .chain
            .iter()
            .map(|m| m.context_window())
            .min()
            .unwrap_or(8192);

        let mut messages = Vec::new();
        if let Some(system) = &plan.system {
            messages.push(Message::text(Role::System, system.clone()));
        }
        let history = match &spec.session {
            Some(session) => self.session_history(session)?,
            None => Vec::new(),
        };
        messages.extend(history);
        messages.push(Message::text(Role::User, spec.prompt.clone()));
        let mut state = LoopState {
            tier: Some(plan.tier),
            allowed_tools: plan.allowed_tools.clone(),
            ..LoopState::default()
        };
        let mut usage = Usage::default();
        // What tools report while they run (a peer's approval of a tool it hosts), emitted as
        // the task's events by `tool_call`, which drains it while each call runs.
        let (relay, mut relayed) = mpsc::channel(RELAYED_EVENTS);
        let ctx = ToolContext {
            task_id: events.task_id().to_owned(),
            spec: spec.clone(),
            events: Some(relay),
        };

        // A resumed run: what the steps recorded elsewhere did, given back as it was.
        let replayed = replay(journal.replayed());
        if let Some(answer) = replayed.answer {
            return answer;
        }
        messages.extend(replayed.messages);
        usage.add(replayed.usage);
        let mut interventions = Vec::new();
        for pending in replayed.pending {
            let (call, result) = match pending {
                Pending::Interrupted {
                    call,
                    side_effects: true,
                } => {
                    let told = interrupted(&call);
                    events.emit(EventKind::Warning {
                        message: format!("not run again after the resume: {told}"),
                    });
                    let step = Step::Result {
                        call_id: call.id.clone(),
                        ok: false,
                        output: told.clone(),
                    };
                    journal.append(step, false).await?;
                    (call, told)
                }
                Pending::Interrupted { call, .. } | Pending::NotStarted(call) => {
                    let result = self
                        .tool_call(
                            &ctx,
                            &call,
                            &mut state,
                            events,
                            &mut relayed,
                            &mut interventions,
                            journal,
                        )
                        .await?;
                    (call, result)
                }
            };
            messages.push(Message::tool_result(&call.id, result));
        }
        for message in interventions {
            messages.push(Message::text(Role::User, message));
        }

        for round in replayed.rounds + 1..=max_rounds {
            let shortened = compact(&mut messages, &tools, window);
            if shortened > 0 {
                tracing::debug!(
                    shortened,
                    "shortened old tool results to fit the context window"
                );
            }
            let request = ChatRequest {
                messages: messages.clone(),
                tools: tools.clone(),
                tool_choice: first_choice.clone().filter(|_| round == 1),
                ..Default::default()
            };
            let response = call_chain(&plan.chain, &request, round, events).await?;
            let spent = response.usage_or_estimate(&request);
            usage.add(spent);
            let step = Step::Model {
                round,
                content: response.content.clone(),
                tool_calls: response.tool_calls.clone(),
                usage: spent,
            };
            journal.append(step, false).await?;
            if usage.total() > budget {
                return Err(TaskError::Budget {
                    what: "tokens".into(),
                    limit: budget,
                    used: usage.total(),
                });
            }
            if response.tool_calls.is_empty() {
                return Ok(Answer {
                    output: response.content,
                    usage,
                    rounds: round,
                    executed_on: None,
                });
            }
            messages.push(Message {
                role: Role::Assistant,
                content: response.content.clone(),
                tool_calls: response.tool_calls.clone(),
                tool_call_id: None,
            });
            let mut interventions = Vec::new();
            for call in &response.tool_calls {
                let result = self
                    .tool_call(
                        &ctx,
                        call,
                        &mut state,
                        events,
                        &mut relayed,
                        &mut interventions,
                        journal,
                    )
                    .await?;
                messages.push(Message::tool_result(&call.id, result));
            }
            for message in interventions {
                messages.push(Message::text(Role::User, message));
            }
        }
        Err(TaskError::Budget {
            what: "rounds".into(),
            limit: u64::from(max_rounds),
            used: u64::from(max_rounds),
        })
    }

    /// Keeps `spec.prompt` and its answer `output` as the next turn of the task's session, if
    /// it has one.
    async fn remember(&self, spec: &TaskSpec, output: &str, events: &dyn EventSink) {
        let Some(session) = &spec.session else {
            return;
        };
        let turn = [
            Message::text(Role::User, spec.prompt.clone()),
            Message::text(Role::Assistant, output),
        ];
        // The answer is what the caller asked for: a turn that cannot be saved (a full disk,
        // an oversized answer) is a warning, not a failed task.
        if let Err(e) = self.save_turn(session, events.task_id(), &turn).await {
            tracing::warn!(session, error = %e, "save a session turn");
            events.emit(EventKind::Warning {
                message: format!(
                    "the answer was not saved to session `{session}` ({e}); the session's next turn will not see it"
                ),
            });
        }
    }

    /// The earlier turns of a session (user prompts and final answers), oldest first: the
    /// single record a session was before turns were kept apart (read, never rewritten), then
    /// one record per turn.
    fn session_history(&self, session: &str) -> Result<Vec<Message>, TaskError> {
        let read = |what: &str, e: &dyn std::fmt::Display| TaskError::Internal {
            message: format!("read session `{session}` ({what}): {e}"),
        };
        let mut messages = Vec::new();
        if let Some(record) = self
            .memory
            .get(SESSIONS, session)
            .map_err(|e| read("its earlier record", &e))?
            && !record.tombstone
        {
            messages = decode_turn(session, &record.value)?;
        }
        for (_, value) in self.session_turns(session)? {
            messages.extend(decode_turn(session, &value)?);
        }
        Ok(messages)
    }

    /// The session's turn records, oldest first: `(key, value)`.
    fn session_turns(&self, session: &str) -> Result<Vec<(String, Vec<u8>)>, TaskError> {
        let prefix = format!("{session}/");
        // A session named `a/b` shares the prefix `a/`: scan beyond the cap, keep only turns.
        let entries = self
            .memory
            .list(SESSIONS, &prefix, 4 * MAX_SESSION_TURNS)
            .map_err(|e| TaskError::Internal {
                message: format!("read session `{session}` (its turns): {e}"),
            })?;
        let mut turns: Vec<(String, Vec<u8>)> = entries
            .into_iter()
            .filter(|entry| entry.key.strip_prefix(&prefix).is_some_and(is_turn_name))
            .map(|entry| (entry.key, entry.record.value))
            .collect();
        turns.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(turns)
    }

    /// Saves one turn under its own key (concurrent turns on two nodes never overwrite each
    /// other), then deletes the oldest turns beyond [`MAX_SESSION_TURNS`].
    async fn save_turn(
        &self,
        session: &str,
        task_id: &str,
        turn: &[Message],
    ) -> Result<(), String> {
        let value = serde_json::to_vec(turn).map_err(|e| format!("encode the turn: {e}"))?;
        let key = turn_key(
            session,
            mesh_domain::time::now_ms(),
            task_id,
            self.memory.own_id(),
        );
        self.memory
            .put(SESSIONS, &key, Some(value))
            .await
            .map_err(|e| e.to_string())?;
        let turns = self.session_turns(session).map_err(|e| e.to_string())?;
        let excess = turns.len().saturating_sub(MAX_SESSION_TURNS);
        for (old, _) in turns.into_iter().take(excess) {
            self.memory
                .put(SESSIONS, &old, None)
                .await
                .map_err(|e| format!("trim the oldest turn: {e}"))?;
        }
        Ok(())
    }

    /// Runs one tool call through the supervisor; returns what the model sees. What the tool
    /// reports while it runs (`relayed`: a peer's approval of an MCP tool it hosts) becomes
    /// the task's events. The call's intent is recorded in `journal` right before it runs
    /// (confirmed first when it may change something), and its result after.
    #[allow(clippy::too_many_arguments)]
    async fn tool_call(
        &self,
        ctx: &ToolContext,
        call: &ToolCall,
        state: &mut LoopState,
        events: &dyn EventSink,
        relayed: &mut mpsc::Receiver<EventKind>,
        interventions: &mut Vec<String>,
        journal: &dyn Journal,
    ) -> Result<String, TaskError> {
        events.emit(EventKind::ToolCalled {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
        // A tool without parameters is sometimes called with "" instead of "{}".
        let parsed: Option<Value> = if call.arguments.trim().is_empty() {
            Some(Value::Object(Default::default()))
        } else {
            serde_json::from_str(&call.arguments)
                .ok()
                .filter(Value::is_object)
        };
        let tool = self.tools.get(&call.name);
        let facts = CallFacts {
            name: &call.name,
            raw_arguments: &call.arguments,
            arguments: parsed.as_ref(),
            tool_tier: self.tools.call_tier(&call.name, parsed.as_ref()),
        };
        let before = self.hooks.run(
            Stage::BeforeTool,
            &HookInput {
                call: Some(&facts),
                outcome: None,
            },
            state,
        );
        let run = match before {
            Verdict::Fail(error) => return Err(error),
            Verdict::Refuse { rule, message } => {
                events.emit(EventKind::Intervention {
                    rule: rule.into(),
                    message: message.clone(),
                });
                Err(message)
            }
            Verdict::Intervene { rule, message } => {
                events.emit(EventKind::Intervention {
                    rule: rule.into(),
                    message: message.clone(),
                });
                interventions.push(message);
                Ok(())
            }
            Verdict::Continue => Ok(()),
        };
        // The gate: a call that would run and that the policy names waits for a decision.
        let run = match (
            run,
            &tool,
            parsed.as_ref(),
            facts.tool_tier,
            &self.approvals,
        ) {
            (Ok(()), Some(_), Some(_), Some(tier), Some(approvals))
                if approvals.policy().needs(&call.name, tier) =>
            {
                // The task is `input_required` while it waits; a cancellation or the
                // deadline drops the wait, which marks the approval cancelled.
                let call = GatedCall {
                    task_id: &ctx.task_id,
                    tool: &call.name,
                    arguments: &call.arguments,
                    tier,
                    called_from: "",
                };
                approvals.gate(call, &|kind| events.emit(kind)).await
            }
            (run, ..) => run,
        };
        let (ok, ran, output) = match (run, tool, parsed.as_ref()) {
            (Ok(()), Some(tool), Some(args)) => {
                let side_effects = self.tools.has_side_effects(&call.name, &call.arguments);
                let intent = Step::Intent {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    side_effects,
                };
                journal.append(intent, side_effects).await?;
                match relaying(tool.call(args, ctx), relayed, |kind| events.emit(kind)).await {
                    Ok(output) => (true, true, output),
                    Err(error) => (false, true, format!("error: {error}")),
                }
            }
            (Err(refusal), ..) => (false, false, refusal),
            // The gate refuses unknown tools and the guard malformed arguments before this.
            (Ok(()), ..) => (
                false,
                false,
                format!("Refused: cannot run `{}`.", call.name),
            ),
        };
        if let Verdict::Fail(error) = self.hooks.run(
            Stage::AfterTool,
            &HookInput {
                call: Some(&facts),
                outcome: Some(Outcome { ok, ran }),
            },
            state,
        ) {
            return Err(error);
        }
        let step = Step::Result {
            call_id: call.id.clone(),
            ok,
            output: truncate(&output, MAX_STEP_OUTPUT).to_owned(),
        };
        journal.append(step, false).await?;
        events.emit(EventKind::ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            ok,
            output: truncate(&output, EVENT_OUTPUT_CAP).to_owned(),
            consecutive_failures: state.failures.get(&call.name).copied().unwrap_or(0),
        });
        Ok(output)
    }
}

/// Most events a tool may have reported and the task not yet emitted; a tool reporting more
/// waits (a tool reports a couple per call).
const RELAYED_EVENTS: usize = 16;

/// Awaits `call`, handing what it sends on `relayed` meanwhile to `each` (a tool's reported
/// events, a model's text deltas), and what is left once it ends.
async fn relaying<T, I>(
    call: impl std::future::Future<Output = T>,
    relayed: &mut mpsc::Receiver<I>,
    mut each: impl FnMut(I),
) -> T {
    tokio::pin!(call);
    let result = loop {
        tokio::select! {
            result = &mut call => break result,
            Some(item) = relayed.recv() => each(item),
        }
    };
    while let Ok(item) = relayed.try_recv() {
        each(item);
    }
    result
}

/// Turns a chain's attempts and failures into task events.
struct ChainEvents<'a> {
    events: &'a dyn EventSink,
    round: u32,
}

impl ChainObserver for ChainEvents<'_> {
    fn attempt(&mut self, model: &str, attempt: u32) {
        self.events.emit(EventKind::ModelCall {
            model: model.to_owned(),
            round: self.round,
            attempt,
        });
    }

    fn failed(&mut self, model: &str, error: &ModelError, falling_through: bool) {
        self.events.emit(EventKind::ModelFailed {
            model: model.to_owned(),
            error: error.to_string(),
            falling_through,
        });
    }
}

/// Passes a chain's text on as task events, and charges the call to the task once: what the
/// model reported (or an estimate, [`CallCharge::settle`]), or, when every model failed or
/// the call was cut off (the task cancelled or past its deadline while it ran: the future is
/// dropped), the estimate of its prompt and of the text it streamed. A server that read the
/// prompt spent it whether or not it answered, and a client cannot spend unseen by stopping
/// its task before the answer comes.
struct CallCharge<'a> {
    events: &'a dyn EventSink,
    /// The estimate of the call's prompt until the call is settled (then `None`).
    unsettled_prompt: Option<u64>,
    /// Bytes of text streamed so far.
    streamed: usize,
}

impl CallCharge<'_> {
    /// Text the model produced, in order.
    fn delta(&mut self, text: String) {
        self.streamed += text.len();
        self.events.emit(EventKind::OutputDelta { text });
    }

    /// Charges the call what it cost.
    fn settle(&mut self, usage: Usage) {
        self.unsettled_prompt = None;
        self.events.spend(usage);
    }
}

impl Drop for CallCharge<'_> {
    fn drop(&mut self) {
        if let Some(prompt_tokens) = self.unsettled_prompt.take() {
            self.events.spend(Usage {
                prompt_tokens,
                completion_tokens: mesh_domain::chat::estimate_text_tokens(self.streamed),
            });
        }
    }
}

/// Calls the chain in order until one model answers; transient failures fall through.
async fn call_chain(
    chain: &[Arc<dyn ChatModel>],
    request: &ChatRequest,
    round: u32,
    events: &dyn EventSink,
) -> Result<ChatResponse, TaskError> {
    let mut charge = CallCharge {
        events,
        unsettled_prompt: Some(estimate_prompt_tokens(&request.messages, &request.tools)),
        streamed: 0,
    };
    let (deltas, mut text) = delta_channel();
    let mut observer = ChainEvents { events, round };
    let call = fall_through(chain, request, &deltas, &mut observer);
    let answered = relaying(call, &mut text, |text| charge.delta(text)).await;
    if let Ok(response) = &answered {
        charge.settle(response.usage_or_estimate(request));
    }
    // A failure is charged as `charge` is dropped.
    drop(charge);
    answered.map_err(|failure| match failure.last() {
        Some((name, error)) => TaskError::Model {
            name: name.clone(),
            attempts: failure
                .attempts
                .iter()
                .map(|(model, error)| format!("{model}: {error}"))
                .collect(),
            message: error.to_string(),
        },
        None => TaskError::Routing {
            message: "the model chain is empty".into(),
        },
    })
}

/// Shortens the oldest tool results until the conversation fits in `CONTEXT_FILL` of the
/// window; returns how many were shortened. Pure, so it is tested directly.
fn compact(messages: &mut [Message], tools: &[ToolSpec], window: usize) -> usize {
    let limit = (window as f64 * CONTEXT_FILL) as usize;
    let mut shortened = 0;
    for i in 0..messages.len() {
        if estimate_prompt_tokens(messages, tools) <= limit as u64 {
            break;
        }
        let message = &mut messages[i];
        if message.role == Role::Tool && message.content.len() > SHORTENED_KEEP + 64 {
            let kept = truncate(&message.content, SHORTENED_KEEP).to_owned();
            message.content =
                format!("{kept}\n[older tool output shortened to fit the context window]");
            shortened += 1;
        }
    }
    shortened
}

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, sync::Mutex};

    use mesh_domain::{BoxFuture, sync::MutexExt};

    use super::*;
    use crate::{
        capabilities::test_support::test_capabilities, memory::MemoryOptions, storage::SledStore,
    };

    /// A model that answers from a script, one response per call.
    #[derive(Debug)]
    struct Scripted(Mutex<VecDeque<ChatResponse>>);

    impl ChatModel for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }

        fn context_window(&self) -> usize {
            8192
        }

        fn chat<'a>(
            &'a self,
            _request: &'a ChatRequest,
            deltas: &'a crate::llm::Deltas,
        ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
            Box::pin(async move {
                let response = self
                    .0
                    .lock_unpoisoned()
                    .pop_front()
                    .ok_or_else(|| ModelError::Protocol("the script ran out".into()))?;
                if !response.content.is_empty() {
                    let _ = deltas.send(response.content.clone()).await;
                }
                Ok(response)
            })
        }

        fn probe(&self) -> BoxFuture<'_, Result<(), ModelError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Collects a task's events, and what it spent.
    #[derive(Debug, Default)]
    struct VecSink(Mutex<Vec<EventKind>>, Mutex<Usage>);

    impl EventSink for VecSink {
        fn task_id(&self) -> &str {
            "task"
        }

        fn emit(&self, kind: EventKind) {
            self.0.lock_unpoisoned().push(kind);
        }

        fn spend(&self, usage: Usage) {
            self.1.lock_unpoisoned().add(usage);
        }
    }

    /// Issue 26, item 4: a task that failed was charged nothing, though its model calls had
    /// spent tokens. What each call reported is charged as it ends, and a call that fails is
    /// charged the estimate of its prompt: the task's spending is known however it ends.
    #[tokio::test]
    async fn a_failing_task_is_charged_its_calls_and_the_failed_call_its_prompt() {
        let mut first = tool_call("list_nodes", "{}");
        first.usage = Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
        });
        // The script then runs out: the second call fails.
        let (_dir, runtime) = runtime(vec![first]);
        let events = VecSink::default();
        let spec = TaskSpec::new("how many nodes?", Target::Role("chat".into()));
        runtime
            .run(&spec, &events, &NoJournal)
            .await
            .expect_err("the model failed");
        let spent = *events.1.lock_unpoisoned();
        assert_eq!(spent.completion_tokens, 5, "{spent:?}");
        assert!(
            spent.prompt_tokens > 10,
            "the failed call's prompt: {spent:?}"
        );
    }

    /// A model call cut off (the task cancelled while it ran: its future dropped) is charged
    /// the estimate of its prompt and of the text it streamed; a settled one only what it
    /// reported.
    #[test]
    fn a_call_cut_off_is_charged_its_prompt_and_streamed_text() {
        let events = VecSink::default();
        let mut call = CallCharge {
            events: &events,
            unsettled_prompt: Some(40),
            streamed: 0,
        };
        call.delta("12345678".into());
        drop(call);
        let spent = *events.1.lock_unpoisoned();
        assert_eq!((spent.prompt_tokens, spent.completion_tokens), (40, 2));
        let mut settled = CallCharge {
            events: &events,
            unsettled_prompt: Some(40),
            streamed: 0,
        };
        settled.settle(Usage {
            prompt_tokens: 1,
            completion_tokens: 1,
        });
        drop(settled);
        assert_eq!(events.1.lock_unpoisoned().total(), 44);
    }

    fn tool_call(name: &str, arguments: &str) -> ChatResponse {
        ChatResponse {
            tool_calls: vec![ToolCall {
                id: format!("call-{name}"),
                name: name.into(),
                arguments: arguments.into(),
            }],
            ..ChatResponse::default()
        }
    }

    fn answer(text: &str) -> ChatResponse {
        ChatResponse {
            content: text.into(),
            ..ChatResponse::default()
        }
    }

    /// A runtime whose role `chat` is served by `script`; the temp dir holds its memory.
    fn runtime(script: Vec<ChatResponse>) -> (tempfile::TempDir, AgentRuntime) {
        runtime_with_floor(script, 0)
    }

    /// [`runtime`] on a store that refuses writes when its disk has less than `min_free`
    /// bytes free (0: no floor).
    fn runtime_with_floor(
        script: Vec<ChatResponse>,
        min_free: u64,
    ) -> (tempfile::TempDir, AgentRuntime) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path().join("db")).expect("db"))
            .with_floor(dir.path().to_owned(), min_free);
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(mesh_cert::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_cert::OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        let models = ModelRegistry::new(
            vec![Arc::new(Scripted(Mutex::new(script.into())))],
            [("chat".to_owned(), vec!["scripted".to_owned()])].into(),
        );
        let tools = ToolRegistry::new(
            test_capabilities(),
            Arc::default(),
            vec![dir.path().join("ws")],
            memory.clone(),
        );
        let runtime = AgentRuntime::new(
            memory,
            Arc::new(models),
            Arc::new(tools),
            Hooks::supervisor().expect("hooks"),
            Vec::new(),
            TaskLimits::default(),
        );
        (dir, runtime)
    }

    #[tokio::test]
    async fn a_tool_call_runs_and_its_result_goes_back_to_the_model() {
        let (_dir, runtime) = runtime(vec![tool_call("list_nodes", "{}"), answer("one node")]);
        let events = VecSink::default();
        let spec = TaskSpec::new("how many nodes?", Target::Role("chat".into()));
        let done = runtime
            .run(&spec, &events, &NoJournal)
            .await
            .expect("completes");
        assert_eq!((done.output.as_str(), done.rounds), ("one node", 2));
        let events = events.0.into_inner().expect("events");
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| match e {
                EventKind::ModelCall { .. } => "model",
                EventKind::ToolCalled { .. } => "called",
                EventKind::ToolResult { ok: true, .. } => "ok",
                EventKind::OutputDelta { .. } => "delta",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["model", "called", "ok", "model", "delta"]);
        let EventKind::ToolResult { output, .. } = &events[2] else {
            panic!("not a tool result: {:?}", events[2]);
        };
        assert!(output.contains("\"name\":\"me\""), "{output}");
    }

    #[tokio::test]
    async fn a_call_above_the_tasks_tier_is_refused_and_the_model_is_told() {
        let (_dir, runtime) = runtime(vec![
            tool_call("shell_exec", r#"{"command": "true"}"#),
            answer("could not"),
        ]);
        let events = VecSink::default();
        let spec = TaskSpec::new("run it", Target::Role("chat".into()));
        runtime
            .run(&spec, &events, &NoJournal)
            .await
            .expect("completes");
        let events = events.0.into_inner().expect("events");
        assert!(
            events.iter().any(|e| matches!(
                e,
                EventKind::ToolResult { name, ok: false, .. } if name == "shell_exec"
            )),
            "{events:?}"
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EventKind::Intervention { rule, .. } if rule == "tier")),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn the_same_call_over_and_over_is_stopped_as_a_loop() {
        let (_dir, runtime) = runtime(vec![tool_call("list_nodes", "{}"); 5]);
        let events = VecSink::default();
        let spec = TaskSpec::new("loop", Target::Role("chat".into()));
        let error = runtime
            .run(&spec, &events, &NoJournal)
            .await
            .expect_err("stopped");
        assert!(
            matches!(&error, TaskError::Gate { rule, .. } if rule == "repeat"),
            "{error:?}"
        );
    }

    /// Collects a task's events, under a task id of its own.
    #[derive(Debug)]
    struct Turn(String, Mutex<Vec<EventKind>>);

    impl EventSink for Turn {
        fn task_id(&self) -> &str {
            &self.0
        }

        fn emit(&self, kind: EventKind) {
            self.1.lock_unpoisoned().push(kind);
        }

        fn spend(&self, _usage: Usage) {}
    }

    fn session_spec(prompt: &str) -> TaskSpec {
        TaskSpec {
            session: Some("ada".into()),
            ..TaskSpec::new(prompt, Target::Role("chat".into()))
        }
    }

    /// Issue 16, point 6: a session was one record rewritten whole by every turn, so it grew
    /// until it no longer fit and two nodes' turns overwrote each other. Each turn is now its
    /// own record, the oldest beyond [`MAX_SESSION_TURNS`] are deleted, and a session stored
    /// the old way is still read (first).
    #[tokio::test]
    async fn each_turn_is_its_own_record_the_oldest_are_trimmed_and_an_old_session_still_reads() {
        let turns = MAX_SESSION_TURNS + 2;
        let mut script: Vec<ChatResponse> =
            (0..turns).map(|i| answer(&format!("answer {i}"))).collect();
        script.push(answer("another session's"));
        let (_dir, runtime) = runtime(script);
        let old = vec![
            Message::text(Role::User, "before turns were records"),
            Message::text(Role::Assistant, "kept"),
        ];
        runtime
            .memory
            .put(
                SESSIONS,
                "ada",
                Some(serde_json::to_vec(&old).expect("json")),
            )
            .await
            .expect("an old single-record session");
        for i in 0..turns {
            let sink = Turn(uuid::Uuid::now_v7().to_string(), Mutex::default());
            runtime
                .run(&session_spec(&format!("prompt {i}")), &sink, &NoJournal)
                .await
                .expect("completes");
        }
        // A session named `ada/x` shares the prefix `ada/` but not the turns.
        let other = Turn(uuid::Uuid::now_v7().to_string(), Mutex::default());
        let spec = TaskSpec {
            session: Some("ada/x".into()),
            ..TaskSpec::new("x", Target::Role("chat".into()))
        };
        runtime
            .run(&spec, &other, &NoJournal)
            .await
            .expect("completes");
        let stored = runtime.session_turns("ada").expect("turns");
        assert_eq!(stored.len(), MAX_SESSION_TURNS);
        let history = runtime.session_history("ada").expect("history");
        let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(texts.len(), 2 + 2 * MAX_SESSION_TURNS);
        assert_eq!(texts[..2], ["before turns were records", "kept"]);
        // The two oldest turns were trimmed; the rest are in order.
        assert_eq!(texts[2..4], ["prompt 2", "answer 2"]);
        let last = format!("answer {}", turns - 1);
        assert_eq!(texts.last(), Some(&last.as_str()));
        assert_eq!(runtime.session_history("ada/x").expect("history").len(), 2);
    }

    /// Issue 16, point 6: a turn that cannot be saved (here the disk is below the node's
    /// free-space floor) failed the whole task, answer and all; now the answer comes, with a
    /// warning event saying the turn was not saved.
    #[tokio::test]
    async fn an_answer_is_returned_with_a_warning_when_its_turn_cannot_be_saved() {
        let (_dir, runtime) = runtime_with_floor(vec![answer("still here")], u64::MAX / 2);
        let sink = Turn(uuid::Uuid::now_v7().to_string(), Mutex::default());
        let done = runtime
            .run(&session_spec("hello"), &sink, &NoJournal)
            .await
            .expect("the answer comes");
        assert_eq!(done.output, "still here");
        let events = sink.1.into_inner().expect("events");
        let warning = events
            .iter()
            .find_map(|e| match e {
                EventKind::Warning { message } => Some(message.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no warning: {events:?}"));
        assert!(warning.contains("session `ada`"), "{warning}");
        assert!(warning.contains("min_free_disk"), "{warning}");
    }

    #[test]
    fn compaction_shortens_the_oldest_tool_results_first_and_only_as_needed() {
        let big = "x".repeat(4000);
        let mut messages = vec![
            Message::text(Role::User, "task"),
            Message::tool_result("1", big.clone()),
            Message::tool_result("2", big.clone()),
            Message::tool_result("3", big.clone()),
        ];
        // 3 × 4000 chars ≈ 3000 tokens; a 3000-token window fits 2250, so one result must go.
        let shortened = compact(&mut messages, &[], 3000);
        assert_eq!(shortened, 1);
        assert!(messages[1].content.contains("shortened"));
        assert_eq!(messages[2].content, big);
        assert_eq!(messages[3].content, big);
        // Nothing to do when it fits.
        assert_eq!(compact(&mut messages, &[], 100_000), 0);
    }
}
