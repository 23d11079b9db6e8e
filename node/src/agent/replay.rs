//! The tools loop's journal: the [`Journal`] port (implemented by `tasks::journal`) that keeps
//! each step before the next starts, and [`replay`], which turns the steps a resumed task
//! continues from back into its conversation.
//!
//! Replay never runs a completed step again: a model answer and a tool result are given back
//! as they were recorded. A tool call whose intent was recorded without its result (the
//! executor was lost while it ran) is the ambiguous window: a call that only reads is run
//! again; one that may have changed something is not — the model is told it was interrupted
//! and may or may not have happened, and decides (a call it makes again is a new call, through
//! the approval gate like any other). A call the model made that never started is run.

use mesh_domain::{Answer, BoxFuture, Message, Role, TaskError, ToolCall, Usage, journal::Step};

/// Where a running task's steps are kept (a port: the task manager gives each run one).
pub(crate) trait Journal: Send + Sync {
    /// The steps of earlier epochs this run continues from, oldest first (none for a task
    /// that was not resumed).
    fn replayed(&self) -> &[Step];
    /// Records `step` before the loop goes on; with `confirm`, also waits until the node
    /// that would resume the task holds it (a step that may change something runs only then).
    fn append(&self, step: Step, confirm: bool) -> BoxFuture<'_, Result<(), JournalError>>;
}

/// Why a step could not be recorded: the run stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JournalError {
    /// The task was resumed elsewhere at a higher epoch: this node no longer runs it.
    #[error(
        "superseded: the task was resumed on {by} (epoch {current}) while this node ran epoch {epoch}; this node stops it"
    )]
    Superseded {
        /// This run's epoch.
        epoch: u32,
        /// The highest epoch known.
        current: u32,
        /// The node running it now.
        by: String,
    },
    /// The step could not be written here.
    #[error(
        "the task's journal could not be written ({0}); without it the task could not be resumed without repeating its steps, so it stops"
    )]
    Storage(String),
}

impl From<JournalError> for TaskError {
    fn from(error: JournalError) -> Self {
        match error {
            JournalError::Superseded { .. } => TaskError::Cancelled {
                reason: error.to_string(),
            },
            JournalError::Storage(_) => TaskError::Internal {
                message: error.to_string(),
            },
        }
    }
}

/// A journal that keeps nothing (unit tests of the tools loop).
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct NoJournal;

#[cfg(test)]
impl Journal for NoJournal {
    fn replayed(&self) -> &[Step] {
        &[]
    }

    fn append(&self, _step: Step, _confirm: bool) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The steps of one part of a journal (an evaluated task's attempt in progress) as the journal
/// a run replays; appends go to the whole journal.
pub(crate) struct Part<'a> {
    pub(crate) journal: &'a dyn Journal,
    pub(crate) replayed: &'a [Step],
}

impl Journal for Part<'_> {
    fn replayed(&self) -> &[Step] {
        self.replayed
    }

    fn append(&self, step: Step, confirm: bool) -> BoxFuture<'_, Result<(), JournalError>> {
        self.journal.append(step, confirm)
    }
}

/// A tool call of the last recorded model answer that has no recorded result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Pending {
    /// Never started: run it.
    NotStarted(ToolCall),
    /// Started and not finished when the executor was lost. `side_effects`: whether it may
    /// have changed something.
    Interrupted { call: ToolCall, side_effects: bool },
}

/// What the recorded steps give back to a resumed run.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Replayed {
    /// The conversation after the prompt: each model answer and each tool result.
    pub messages: Vec<Message>,
    /// What the recorded model calls cost.
    pub usage: Usage,
    /// Rounds done.
    pub rounds: u32,
    /// The calls of the last answer still to be dealt with, in the model's order.
    pub pending: Vec<Pending>,
    /// The answer, when the last model answer had no tool calls (or the task ended).
    pub answer: Option<Result<Answer, TaskError>>,
}

/// Rebuilds a run from its recorded steps (see the module docs).
pub(crate) fn replay(steps: &[Step]) -> Replayed {
    let mut out = Replayed::default();
    // The calls of the latest model answer, and which have an intent or a result.
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut intents: Vec<(String, bool)> = Vec::new();
    let mut results: Vec<String> = Vec::new();
    for step in steps {
        match step {
            Step::Model {
                round,
                content,
                tool_calls,
                usage,
            } => {
                out.rounds = *round;
                out.usage.add(*usage);
                if tool_calls.is_empty() {
                    out.answer = Some(Ok(Answer {
                        output: content.clone(),
                        usage: out.usage,
                        rounds: *round,
                        executed_on: None,
                    }));
                }
                out.messages.push(Message {
                    role: Role::Assistant,
                    content: content.clone(),
                    tool_calls: tool_calls.clone(),
                    tool_call_id: None,
                });
                calls.clone_from(tool_calls);
                intents.clear();
                results.clear();
            }
            Step::Intent {
                call_id,
                side_effects,
                ..
            } => intents.push((call_id.clone(), *side_effects)),
            Step::Result {
                call_id, output, ..
            } => {
                results.push(call_id.clone());
                out.messages
                    .push(Message::tool_result(call_id, output.clone()));
            }
            Step::Done {
                output,
                error,
                usage,
                rounds,
            } => {
                out.answer = Some(match (output, error) {
                    (_, Some(error)) => Err(error.clone()),
                    (output, None) => Ok(Answer {
                        output: output.clone().unwrap_or_default(),
                        usage: *usage,
                        rounds: *rounds,
                        executed_on: None,
                    }),
                });
            }
            Step::Base { .. } | Step::Full | Step::Evaluated { .. } => {}
        }
    }
    out.pending = calls
        .into_iter()
        .filter(|call| !results.contains(&call.id))
        .map(|call| match intents.iter().find(|(id, _)| *id == call.id) {
            Some((_, side_effects)) => Pending::Interrupted {
                call,
                side_effects: *side_effects,
            },
            None => Pending::NotStarted(call),
        })
        .collect();
    out
}

/// What the model is told of a call that may have changed something and was interrupted.
pub(crate) fn interrupted(call: &ToolCall) -> String {
    format!(
        "interrupted: the node running this call (`{}` with arguments {}) was lost before it reported a result; the previous executor may or may not have done this. Check before doing it again; calling it again is a new call.",
        call.name, call.arguments
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        }
    }

    fn model(round: u32, calls: Vec<ToolCall>) -> Step {
        Step::Model {
            round,
            content: String::new(),
            tool_calls: calls,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 1,
            },
        }
    }

    fn intent(id: &str, side_effects: bool) -> Step {
        Step::Intent {
            call_id: id.into(),
            name: "t".into(),
            arguments: "{}".into(),
            side_effects,
        }
    }

    fn result(id: &str) -> Step {
        Step::Result {
            call_id: id.into(),
            ok: true,
            output: format!("out {id}"),
        }
    }

    /// Completed steps come back as recorded; of the last answer's calls, one interrupted
    /// after its intent and one never started are told apart.
    #[test]
    fn completed_steps_are_given_back_and_unfinished_calls_told_apart() {
        let steps = [
            model(1, vec![call("a", "shell_exec")]),
            intent("a", true),
            result("a"),
            model(2, vec![call("b", "shell_exec"), call("c", "file_read")]),
            intent("b", true),
        ];
        let replayed = replay(&steps);
        assert_eq!(replayed.rounds, 2);
        assert_eq!(replayed.usage.total(), 22);
        assert_eq!(replayed.messages.len(), 3, "{:?}", replayed.messages);
        assert_eq!(replayed.messages[1].content, "out a");
        assert_eq!(
            replayed.pending,
            [
                Pending::Interrupted {
                    call: call("b", "shell_exec"),
                    side_effects: true
                },
                Pending::NotStarted(call("c", "file_read")),
            ]
        );
        assert!(replayed.answer.is_none());
    }

    /// A task whose last recorded answer had no tool calls, or that ended, is not run again.
    #[test]
    fn an_answer_or_an_end_in_the_journal_is_the_outcome() {
        let mut last = model(3, vec![]);
        if let Step::Model { content, .. } = &mut last {
            *content = "done".into();
        }
        let replayed = replay(&[model(1, vec![call("a", "x")]), result("a"), last]);
        let answer = replayed.answer.expect("answered").expect("ok");
        assert_eq!((answer.output.as_str(), answer.rounds), ("done", 3));
        assert!(replayed.pending.is_empty());
        let ended = replay(&[Step::Done {
            output: None,
            error: Some(TaskError::Cancelled { reason: "x".into() }),
            usage: Usage::default(),
            rounds: 1,
        }]);
        assert!(matches!(
            ended.answer,
            Some(Err(TaskError::Cancelled { .. }))
        ));
    }
}
