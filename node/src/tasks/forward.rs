//! Running a task on other nodes: the [`Forwarder`] port (implemented by `rpc` over
//! `Tasks.Submit`), and `forward`, which sends the task to each chosen node in turn, relays
//! its events and fails over to the next when a node is full or lost. A node is lost when its
//! stream breaks or membership says it is down; the task is then resumed on the next node from
//! its journal (`tasks::journal`): each attempt runs at a new epoch, leased by this node (the
//! origin) before it is sent, and replays the steps recorded before it instead of running
//! them again. A task without a journal here (one this node only relays for another node, which
//! leases it) is not moved once a tool that may have changed something ran.
//!
//! What other nodes relay is bounded: at most [`MAX_RELAYED_EVENTS`] events and
//! [`MAX_RELAYED_BYTES`] of them per task are recorded here; past that, one event says the rest
//! were cut, and the outcome is still recorded.
//!
//! It does not choose the nodes (that is `admission`) and keeps no task state of its own: what
//! it learns about the task goes through the `Journey` its manager gives it.

use std::{fmt, sync::Mutex, time::Duration};

use mesh_domain::{Answer, BoxFuture, EventKind, TaskError, TaskEvent, TaskSpec, sync::MutexExt};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    agent::EventSink,
    metrics::metrics,
    router::Destination,
    task_handle::TaskOutcome,
    tasks::journal::{Chain, Journals},
};

/// How often a node running a task is looked up in the membership while its events are
/// awaited: a stopped node keeps its connections open, so only membership says it is gone.
const MEMBERSHIP_CHECK: Duration = Duration::from_millis(500);

/// Re-routes after the first node at most this many times.
pub(crate) const MAX_FAILOVERS: u32 = 2;
/// Most events the nodes running a task may have this node record for it (every attempt
/// together; its outcome aside): a node at the other end cannot fill this node's disk.
pub(crate) const MAX_RELAYED_EVENTS: usize = 10_000;
/// Most bytes (as stored, JSON) of those events.
pub(crate) const MAX_RELAYED_BYTES: usize = 16 * 1024 * 1024;

/// What has been recorded of a task's relayed events, against the caps.
#[derive(Debug, Default)]
struct Relayed {
    events: usize,
    bytes: usize,
    /// Whether the cap was reached (and said so).
    cut: bool,
}

impl Relayed {
    /// Records `kind` through `sink` while within the caps; at the first event past them, one
    /// event that says the rest are cut instead, then nothing.
    fn relay(&mut self, sink: &dyn EventSink, node: &str, kind: EventKind) {
        if self.cut {
            return;
        }
        let size = serde_json::to_string(&kind).map_or(usize::MAX, |json| json.len());
        self.events += 1;
        self.bytes = self.bytes.saturating_add(size);
        if self.events <= MAX_RELAYED_EVENTS && self.bytes <= MAX_RELAYED_BYTES {
            sink.emit(kind);
            return;
        }
        self.cut = true;
        sink.emit(EventKind::Intervention {
            rule: "relayed_events_cut".into(),
            message: format!(
                "{node} sent more events than this node records for one task (at most {MAX_RELAYED_EVENTS} events and {MAX_RELAYED_BYTES} bytes): the rest are not recorded here; the task's outcome still is"
            ),
        });
    }
}

/// Why forwarding a task to one node did not produce an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// The node's queue is full (`RESOURCE_EXHAUSTED`): try the next.
    #[error("queue full: {0}")]
    Exhausted(String),
    /// The node refused the task or could not be reached: try the next.
    #[error("{0}")]
    Unavailable(String),
    /// The node refused the task for good (tier, hop limit, bad request).
    #[error("{0}")]
    Refused(String),
    /// The node took the task and then went away: its stream broke or fell silent before an
    /// outcome. The text says how, in words (the transport's own error is logged at debug).
    #[error("went away mid-task ({0})")]
    Lost(String),
}

impl ForwardError {
    /// This failure of the node named `node`, as one clause for people: `gpu went away
    /// mid-task (…)`, `gpu: queue full: …`.
    fn of(&self, node: &str) -> String {
        match self {
            Self::Lost(_) => format!("{node} {self}"),
            Self::Exhausted(_) | Self::Unavailable(_) | Self::Refused(_) => {
                format!("{node}: {self}")
            }
        }
    }
}

/// Sends a task to another node and streams back its events.
pub trait Forwarder: Send + Sync + fmt::Debug {
    /// Submits `spec` to the node at `addr`; the stream ends with its terminal event, or with an
    /// error when the connection breaks.
    fn forward(
        &self,
        addr: String,
        spec: TaskSpec,
    ) -> BoxFuture<'static, Result<mpsc::Receiver<Result<TaskEvent, ForwardError>>, ForwardError>>;
    /// Asks the node at `addr` to cancel task `task_id` (best effort).
    fn cancel(&self, addr: String, task_id: String) -> BoxFuture<'static, ()>;
}

/// The task being forwarded, as its manager tells it.
pub(crate) struct Journey<'a> {
    /// This node's name: the task's origin when it has none yet.
    pub node: &'a str,
    /// The task's id, which it keeps on every node.
    pub task_id: &'a str,
    /// What was asked.
    pub spec: &'a TaskSpec,
    /// When the task's deadline passes here.
    pub deadline: Instant,
    /// Where the relayed events go.
    pub events: &'a dyn EventSink,
    /// Records that the task is now sent to the node named so.
    pub routed: &'a (dyn Fn(&str) + Send + Sync),
    /// Whether a tool call (name, raw arguments) may have changed something.
    pub side_effects: &'a (dyn Fn(&str, &str) -> bool + Send + Sync),
    /// Whether the node named so is down in the membership (lost, though its stream may
    /// still be open).
    pub down: &'a (dyn Fn(&str) -> bool + Send + Sync),
    /// The task's journal, when it has one: a lost node's task is resumed from it. `None`: the
    /// task is not moved once a tool that may have changed something ran.
    pub journals: Option<&'a Journals>,
    /// The address of the node running the task now, so a cancel or deadline here stops it
    /// there too.
    pub current: &'a Mutex<Option<String>>,
    /// Cancelled once the task is stopped here (cancelled, or past its deadline): no further
    /// node is tried, while the one running it may still send its outcome (with what it spent).
    pub stop: &'a CancellationToken,
}

/// Runs a task on other nodes: forwards it to each candidate in turn, relaying its events,
/// until one gives an outcome. A broken stream or a full queue moves on to the next candidate
/// (at most [`MAX_FAILOVERS`] times after the first), unless a side-effecting tool already ran.
pub(crate) async fn forward(
    journey: Journey<'_>,
    candidates: Vec<Destination>,
    forwarder: &dyn Forwarder,
) -> Result<Answer, TaskError> {
    let mut spec = journey.spec.clone();
    spec.lineage.task_id = Some(journey.task_id.to_owned());
    spec.lineage.hops = spec.lineage.hops.saturating_add(1);
    if spec.lineage.origin.is_empty() {
        spec.lineage.origin = journey.node.to_owned();
    }
    let mut failures: Vec<String> = Vec::new();
    let mut relayed = Relayed::default();
    let mut left_untried = false;
    // Whether the last attempt ended with its node lost mid-task (the next one resumes).
    let mut lost_last = false;
    for (index, Destination { name, addr }) in candidates.into_iter().enumerate() {
        let attempt = index as u32 + 1;
        if journey.stop.is_cancelled() {
            break;
        }
        if attempt > MAX_FAILOVERS + 1 {
            left_untried = true;
            break;
        }
        let remaining = journey.deadline.saturating_duration_since(Instant::now());
        spec.timeout = Some(remaining.max(Duration::from_secs(1)));
        let reason = failures.last().cloned().unwrap_or_default();
        if let Some(journals) = journey.journals {
            let chain = journal_chain(journals, journey.task_id)?;
            let from_step = chain.steps.len() as u32 + 1;
            let Some(id) = journals.id_of(&name) else {
                failures.push(format!("{name}: not known to this node's membership"));
                continue;
            };
            journals
                .lease(journey.task_id, attempt, &id, &name, &chain)
                .await
                .map_err(|e| TaskError::Internal {
                    message: format!("record the task's lease to {name}: {e}"),
                })?;
            spec.lineage.epoch = attempt;
            if lost_last {
                metrics().tasks_resumed.inc();
                journey.events.emit(EventKind::Resumed {
                    node: name.clone(),
                    from_step,
                    epoch: attempt,
                    reason: reason.clone(),
                });
            }
        }
        if !lost_last || journey.journals.is_none() {
            journey.events.emit(EventKind::Delegated {
                node: name.clone(),
                attempt,
                reason,
            });
        }
        lost_last = false;
        (journey.routed)(&name);
        *journey.current.lock_unpoisoned() = Some(addr.clone());
        let mut stream = match forwarder.forward(addr.clone(), spec.clone()).await {
            Ok(stream) => stream,
            Err(ForwardError::Refused(why)) => {
                return Err(TaskError::Routing {
                    message: format!("{name} refused the task: {why}"),
                });
            }
            Err(e) => {
                failures.push(e.of(&name));
                continue;
            }
        };
        let mut side_effect: Option<String> = None;
        let mut check = tokio::time::interval(MEMBERSHIP_CHECK);
        let lost = loop {
            let next = tokio::select! {
                next = stream.recv() => next,
                _ = check.tick() => {
                    if (journey.down)(&name) {
                        break ForwardError::Lost("the membership says it is down".into());
                    }
                    continue;
                }
            };
            let event = match next {
                Some(Ok(event)) => event,
                Some(Err(e)) => break e,
                None => {
                    break ForwardError::Lost("its event stream ended without an outcome".into());
                }
            };
            match TaskOutcome::of(event.kind) {
                // What the node spent is this task's, whatever its outcome.
                Ok(TaskOutcome::Completed {
                    output,
                    usage,
                    executed_on,
                    rounds,
                }) => {
                    journey.events.spend(usage);
                    return Ok(Answer {
                        output,
                        usage,
                        rounds,
                        executed_on: Some(executed_on),
                    });
                }
                // A drained node gave the task back: as when a node is lost, the next one runs it.
                Ok(TaskOutcome::Failed {
                    error: TaskError::HandedOver { reason, .. },
                    usage,
                }) => {
                    journey.events.spend(usage);
                    break ForwardError::Unavailable(format!("handed the task over: {reason}"));
                }
                Ok(TaskOutcome::Failed { error, usage }) => {
                    journey.events.spend(usage);
                    return Err(error);
                }
                // The executing node's own admission is not news to our caller.
                Err(EventKind::Accepted { .. }) => {}
                Err(kind) => {
                    if let EventKind::ToolCalled {
                        name: tool,
                        arguments,
                        ..
                    } = &kind
                        && (journey.side_effects)(tool, arguments)
                    {
                        side_effect = Some(tool.clone());
                    }
                    relayed.relay(journey.events, &name, kind);
                }
            }
        };
        let Some(journals) = journey.journals else {
            if let Some(tool) = side_effect {
                return Err(TaskError::Routing {
                    message: format!(
                        "{} after running `{tool}` (its side effects may have happened), and the task has no journal to resume it from, so it is not run again elsewhere",
                        lost.of(&name)
                    ),
                });
            }
            failures.push(lost.of(&name));
            continue;
        };
        // The lost node may have finished, its outcome recorded before its stream broke.
        let chain = journal_chain(journals, journey.task_id)?;
        if let Some(outcome) = ended(&chain, &name) {
            return outcome;
        }
        if chain.full() {
            return Err(TaskError::Routing {
                message: format!(
                    "{}; the task's journal reached its cap, so it cannot be resumed without repeating steps",
                    lost.of(&name)
                ),
            });
        }
        lost_last = true;
        failures.push(lost.of(&name));
    }
    Err(TaskError::Routing {
        message: no_outcome(failures, left_untried),
    })
}

/// The task's journal as this node holds it.
fn journal_chain(journals: &Journals, task_id: &str) -> Result<Chain, TaskError> {
    journals
        .chain(task_id, None)
        .map_err(|e| TaskError::Internal {
            message: format!("read the task's journal: {e}"),
        })
}

/// The outcome the journal holds, when the node named `node` recorded one.
fn ended(chain: &Chain, node: &str) -> Option<Result<Answer, TaskError>> {
    match chain.done()? {
        mesh_domain::journal::Step::Done {
            output,
            error,
            usage,
            rounds,
        } => Some(match error {
            Some(error) => Err(error.clone()),
            None => Ok(Answer {
                output: output.clone().unwrap_or_default(),
                usage: *usage,
                rounds: *rounds,
                executed_on: Some(node.to_owned()),
            }),
        }),
        _ => None,
    }
}

/// Why no node gave the task an outcome, the last failure first: `gpu went away mid-task (…);
/// no other node could take the task over`.
fn no_outcome(mut failures: Vec<String>, left_untried: bool) -> String {
    let Some(last) = failures.pop() else {
        return "no node could take the task".into();
    };
    let rest = if left_untried {
        format!(
            "the task was tried on {} nodes, the most it is",
            MAX_FAILOVERS + 1
        )
    } else {
        "no other node could take the task over".into()
    };
    if failures.is_empty() {
        format!("{last}; {rest}")
    } else {
        format!("{last}; before it, {}; {rest}", failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::{Target, Usage};

    use super::*;

    /// A node that relays `count` events of `size` bytes each for any task, then completes it.
    #[derive(Debug)]
    struct Flood {
        count: usize,
        size: usize,
    }

    impl Forwarder for Flood {
        fn forward(
            &self,
            _addr: String,
            spec: TaskSpec,
        ) -> BoxFuture<'static, Result<mpsc::Receiver<Result<TaskEvent, ForwardError>>, ForwardError>>
        {
            let (count, size) = (self.count, self.size);
            Box::pin(async move {
                let (tx, rx) = mpsc::channel(64);
                let task_id = spec.lineage.task_id.unwrap_or_default();
                tokio::spawn(async move {
                    let event = |seq: usize, kind: EventKind| TaskEvent {
                        task_id: task_id.clone(),
                        seq: seq as u64,
                        at_ms: 0,
                        kind,
                    };
                    for seq in 0..count {
                        let text = "x".repeat(size);
                        if tx
                            .send(Ok(event(seq, EventKind::OutputDelta { text })))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    let done = EventKind::Completed {
                        output: "done".into(),
                        usage: Usage::default(),
                        executed_on: "hostile".into(),
                        rounds: 1,
                    };
                    let _ = tx.send(Ok(event(count, done))).await;
                });
                Ok(rx)
            })
        }

        fn cancel(&self, _addr: String, _task_id: String) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    #[derive(Default)]
    struct Recorded(Mutex<Vec<EventKind>>);

    impl EventSink for Recorded {
        fn task_id(&self) -> &str {
            "task"
        }

        fn emit(&self, kind: EventKind) {
            self.0.lock_unpoisoned().push(kind);
        }

        fn spend(&self, _usage: Usage) {}
    }

    /// Issue 16, point 3: a node that relays an endless or huge stream of events for a task
    /// forwarded to it makes this node record at most the caps, then one event saying the rest
    /// were cut; the task still ends with the outcome that node sent.
    #[tokio::test]
    async fn a_remote_that_floods_events_is_recorded_up_to_the_caps_and_the_outcome_still_counts() {
        let floods = [
            (MAX_RELAYED_EVENTS + 500, 1),
            (8, MAX_RELAYED_BYTES / 4),
            (MAX_RELAYED_EVENTS / 2, 10),
        ];
        for (count, size) in floods {
            let sink = Recorded::default();
            let spec = TaskSpec::new("hi", Target::Model("m".into()));
            let current = Mutex::new(None);
            let answer = forward(
                Journey {
                    node: "victim",
                    task_id: "task",
                    spec: &spec,
                    deadline: Instant::now() + Duration::from_secs(60),
                    events: &sink,
                    routed: &|_| {},
                    side_effects: &|_, _| false,
                    down: &|_| false,
                    journals: None,
                    current: &current,
                    stop: &CancellationToken::new(),
                },
                vec![Destination {
                    name: "hostile".into(),
                    addr: "127.0.0.1:1".into(),
                }],
                &Flood { count, size },
            )
            .await
            .expect("the task completes with the outcome the node sent");
            assert_eq!(answer.output, "done");
            let recorded = sink.0.into_inner().expect("lock");
            let relayed: Vec<_> = recorded
                .iter()
                .filter(|k| matches!(k, EventKind::OutputDelta { .. }))
                .collect();
            let bytes: usize = recorded
                .iter()
                .map(|k| serde_json::to_string(k).expect("json").len())
                .sum();
            assert!(
                relayed.len() <= MAX_RELAYED_EVENTS,
                "{count}x{size}: {}",
                relayed.len()
            );
            assert!(
                bytes <= MAX_RELAYED_BYTES + 4096,
                "{count}x{size}: {bytes} bytes"
            );
            let cut = recorded
                .iter()
                .filter(|k| matches!(k, EventKind::Intervention { rule, .. } if rule == "relayed_events_cut"))
                .count();
            let over = count > MAX_RELAYED_EVENTS || count * size > MAX_RELAYED_BYTES;
            assert_eq!(
                cut,
                usize::from(over),
                "{count}x{size}: one cut event when over"
            );
            if !over {
                assert_eq!(
                    relayed.len(),
                    count,
                    "{count}x{size}: all kept under the caps"
                );
            }
        }
    }
}
