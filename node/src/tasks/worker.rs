//! The workers: each takes the next queued task, opens its journal (at the epoch its origin
//! leased it here, or leasing epoch 1 for a task of this node's own), runs it through the agent
//! runtime (or the evaluator) and records how it ended, with the one line logged for it.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use mesh_domain::{Answer, EventKind, TaskError, TaskStatus, sync::MutexExt};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    journal::TaskJournal,
    manager::{Inner, LiveTask},
};
use crate::agent::EventSink;

impl Inner {
    /// A worker: runs the tasks it takes from `queue` until `stop` or the queue closes.
    pub(super) async fn work(
        self: Arc<Self>,
        queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Arc<LiveTask>>>>,
        stop: CancellationToken,
    ) {
        let inner = self;
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                next = async { queue.lock().await.recv().await } => next,
            };
            let Some(task) = next else { return };
            {
                let mut record = task.record.lock_unpoisoned();
                if record.status != TaskStatus::Queued {
                    continue; // cancelled while queued
                }
                record.status = TaskStatus::Running;
                if let Err(e) = inner.history.put_record(&record) {
                    tracing::error!(task = %task.id, error = %e, "record task start");
                }
            }
            inner.queued.fetch_sub(1, Ordering::SeqCst);
            inner.running.send_modify(|n| *n += 1);
            inner.publish_load();

            let emitter = inner.emitter(&task);
            emitter.emit(EventKind::Started {
                node: inner.node.clone(),
            });
            let started = Instant::now();
            let lineage = &task.spec.lineage;
            let origin = if lineage.origin.is_empty() {
                inner.node.as_str()
            } else {
                lineage.origin.as_str()
            };
            let by = lineage
                .started_by
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), ToString::to_string);
            tracing::info!(task_id = %task.id, origin, by, target = %task.spec.target, "task started");
            let span = tracing::info_span!("task", task_id = %task.id, target = %task.spec.target);
            let run = async {
                let journal = open_journal(&inner, &task).await?;
                let result = match &task.spec.evaluate {
                    Some(evaluation) => {
                        inner
                            .evaluator
                            .run(&task.spec, evaluation, &emitter, &journal)
                            .await
                    }
                    None => inner.runtime.run(&task.spec, &emitter, &journal).await,
                };
                journal.end(&result).await;
                result
            };
            let result = tracing::Instrument::instrument(
                async {
                    tokio::select! {
                        () = task.cancel.cancelled() => Err(task.stop_error()),
                        () = tokio::time::sleep_until(task.deadline) => Err(TaskError::Deadline {
                            seconds: task.spec.timeout.unwrap_or(inner.limits.timeout).as_secs(),
                        }),
                        result = run => result,
                    }
                },
                span,
            )
            .await;
            log_end(&task, origin, started.elapsed(), &result);
            // `finish` before the running count drops, so shutdown waits for the record.
            inner.finish(&task, result);
            inner.running.send_modify(|n| *n -= 1);
            inner.publish_load();
        }
    }
}

/// The journal `task` runs with here: at the epoch its origin leased it to this node (a
/// forwarded task), or at epoch 1 leased by this node (its own task: it made the id).
async fn open_journal(inner: &Inner, task: &LiveTask) -> Result<TaskJournal, TaskError> {
    let epoch = task.spec.lineage.epoch.max(1);
    if inner.journals.is_own_task(&task.id) {
        let own = inner.journals.own_id().clone();
        inner
            .journals
            .lease(&task.id, 1, &own, &inner.node, &Default::default())
            .await
            .map_err(|e| TaskError::Internal {
                message: format!("record the task's lease: {e}"),
            })?;
    }
    Ok(inner.journals.open(&task.id, epoch).await?)
}

/// The one line the executing node logs when a task it ran ends: who asked, on which model,
/// how it ended, its tokens and how long it took.
fn log_end(task: &LiveTask, origin: &str, took: Duration, result: &Result<Answer, TaskError>) {
    let model = task.model.lock_unpoisoned().clone();
    let duration_ms = took.as_millis() as u64;
    match result {
        Ok(answer) => tracing::info!(
            task_id = %task.id,
            origin,
            model,
            outcome = "completed",
            tokens = answer.usage.prompt_tokens + answer.usage.completion_tokens,
            rounds = answer.rounds,
            duration_ms,
            "task ended"
        ),
        Err(error) => tracing::info!(
            task_id = %task.id,
            origin,
            model,
            outcome = TaskStatus::of_error(error).as_str(),
            error = %error,
            duration_ms,
            "task ended"
        ),
    }
}
