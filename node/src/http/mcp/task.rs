//! `run_task`: a task of the mesh started for an `/mcp` caller and followed to its end. The
//! caller's key is reserved by the gateway first; the task is submitted to the task manager as
//! a front-door caller's (the same admission, placement, forwarding, approval gates and
//! history as a task from `mesh-cli run`), its events relayed as MCP progress when the client
//! asks, and a client that cancels or goes away cancels the task.

use mesh_domain::{EventKind, TaskSpec, Usage, text::truncate};
use rmcp::{
    RoleServer,
    model::{CallToolResult, ContentBlock, ProgressNotificationParam},
    service::RequestContext,
};

use super::{
    MeshTools,
    wire::{CallError, RUN_TASK, RunTask, TaskAnswer, TokenCounts},
};
use crate::{
    admission::Caller,
    api_keys::Charge,
    gateway::{DoorCaller, settle_from_outcome},
    tasks::{LookupError, TaskManager, TaskOutcome},
};

/// Most bytes of a task's answer sent back; the rest is cut, with a note (`tasks show` has it).
pub(super) const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Most bytes of one progress message (a tool's arguments or an output delta are cut).
const MAX_PROGRESS_MESSAGE: usize = 512;

impl MeshTools {
    /// `run_task`: has the gateway reserve the caller's key for the target (the task's token
    /// budget is what the key grants: at most `tasks.token_budget`, all of it reserved while the
    /// task runs), submits the task as an `/mcp` caller's, relays its events as progress (when
    /// the client gave a progress token) and answers with the task's answer. A client that
    /// cancels or goes away cancels the task. The key is charged what the task spent, however
    /// it ends ([`settle_from_outcome`]).
    pub(super) async fn run_task(
        &self,
        args: RunTask,
        caller: &DoorCaller,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, CallError> {
        let mut spec = args.spec().map_err(|problem| CallError::Arguments {
            tool: RUN_TASK,
            problem,
        })?;
        // Refused here, before a key's request is counted.
        self.allowed(spec.tier)?;
        let charge = self
            .door
            .gateway
            .reserve_task(caller, &mut spec)
            .await
            .map_err(|refusal| CallError::Tool(refusal.to_string()))?;
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
        let id = match tasks.submit(spec, &Caller::FrontDoor) {
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
            match tasks.follow(&id) {
                Ok(task) => {
                    tokio::spawn(settle_from_outcome(task, charge));
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
        let mut task = tasks
            .follow(&id)
            .map_err(|e: LookupError| CallError::Tool(format!("follow task {id}: {e}")))?;
        let progress = context.meta.get_progress_token();
        let mut step = 0u32;
        loop {
            let event = tokio::select! {
                event = task.progress() => event,
                () = context.ct.cancelled() => {
                    return Err(CallError::Tool(format!("task {id}: the MCP client cancelled the call")));
                }
            };
            let Some(event) = event else { break };
            if let Some(token) = &progress {
                step += 1;
                let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_message(describe(&event.kind));
                // A client that stopped reading is noticed by the cancellation above.
                let _ = context.peer.notify_progress(note).await;
            }
        }
        let outcome = task.outcome().await;
        if outcome.is_some() {
            // It ended: nothing is left to cancel.
            waiting.id = None;
        }
        match outcome {
            Some(TaskOutcome::Completed {
                output,
                usage,
                executed_on,
                rounds,
            }) => Ok(Done {
                task_id: id,
                output,
                usage,
                executed_on,
                rounds,
            }),
            Some(TaskOutcome::Failed { error, .. }) => {
                Err(CallError::Tool(format!("task {id} failed: {error}")))
            }
            None => Err(CallError::Tool(format!(
                "task {id}: its events ended without an answer (`mesh-cli tasks show {id}`)"
            ))),
        }
    }
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
    tasks: TaskManager,
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

/// One line of progress for an event that is not the task's end: the event's own words, as
/// `mesh-cli` shows them.
fn describe(kind: &EventKind) -> String {
    truncate(&kind.to_string(), MAX_PROGRESS_MESSAGE).to_owned()
}
