//! Draining this node (`mesh-cli drain`, and a stop with `node.drain_on_stop_s`): it takes no
//! new tasks or chats (the flag in its capabilities, which every node's router reads, and
//! admission refuses what another node still sends), offers its queued tasks to other nodes as
//! if they were submitted again, lets running ones finish and, at the timeout, ends those still
//! here: a task another node sent is handed back to it (`handed_over`: it runs it elsewhere, as
//! when a node is lost), one of this node's own is cancelled.
//!
//! It decides nothing about where a task goes (that is `admission`) and keeps nothing on disk:
//! a node that restarts comes back undrained.

use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use mesh_domain::{EventKind, TaskError, TaskSpec, TaskStatus, sync::MutexExt, time::now_ms};
use tokio_util::sync::CancellationToken;

use crate::{
    agent::EventSink,
    tasks::manager::{Inner, LiveTask, TaskManager, forward_task},
};

/// The reason a task still here when a drain's timeout passes ends with.
pub(crate) const DRAINED: &str = "the node was drained";
/// The reason a task another node sent ends with when this node stops draining and leaves.
const STOPPING: &str = "the node is shutting down";

/// Where a drain stands, as `Node.Drain` and `Node.Undrain` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainReport {
    /// This node's name.
    pub(crate) node: String,
    /// Whether it is draining now.
    pub(crate) draining: bool,
    /// Whether it was draining before.
    pub(crate) was_draining: bool,
    /// Tasks running here (its own passed to other nodes included).
    pub(crate) running: u32,
    /// Tasks queued here that no other node could take.
    pub(crate) queued: u32,
    /// Queued tasks passed to other nodes by this call.
    pub(crate) handed_off: u32,
    /// Unix ms when the tasks still here are ended; 0 when not draining.
    pub(crate) hand_over_at_ms: u64,
}

/// The pending timeout of a drain.
#[derive(Debug)]
struct Timer {
    /// Cancelled by `undrain`, a new drain or a stop.
    cancel: CancellationToken,
    /// Unix ms when it fires.
    at_ms: u64,
}

/// Drains this node's task manager and ends drains.
#[derive(Debug)]
pub(crate) struct Drain {
    tasks: TaskManager,
    timer: Mutex<Option<Timer>>,
}

impl Drain {
    /// Drains `tasks` when asked.
    pub(crate) fn new(tasks: TaskManager) -> Arc<Self> {
        Arc::new(Self {
            tasks,
            timer: Mutex::default(),
        })
    }

    /// Starts draining (or, draining already, offers the queued tasks again and restarts the
    /// timeout): no new work, queued tasks to other nodes where one can take them, and in
    /// `timeout` the tasks still here ended. Needs a Tokio runtime.
    pub(crate) fn drain(self: &Arc<Self>, timeout: Duration) -> DrainReport {
        let was_draining = self.tasks.inner.caps.set_draining(true);
        let handed_off = self.tasks.hand_off_queued();
        let cancel = CancellationToken::new();
        let at_ms = now_ms().saturating_add(timeout.as_millis() as u64);
        let replaced = self.timer.lock_unpoisoned().replace(Timer {
            cancel: cancel.clone(),
            at_ms,
        });
        if let Some(old) = replaced {
            old.cancel.cancel();
        }
        let tasks = self.tasks.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(timeout) => {
                    for task in tasks.inner.tasks_with(None) {
                        tasks.end_here(&task, DRAINED, true);
                    }
                }
            }
        });
        tracing::info!(
            handed_off,
            timeout_ms = timeout.as_millis() as u64,
            "draining: no new tasks or chats"
        );
        self.report(was_draining, handed_off)
    }

    /// Ends a drain: the node takes tasks and chats again.
    pub(crate) fn undrain(&self) -> DrainReport {
        let was_draining = self.tasks.inner.caps.set_draining(false);
        if let Some(timer) = self.timer.lock_unpoisoned().take() {
            timer.cancel.cancel();
        }
        if was_draining {
            tracing::info!("drain ended: taking tasks and chats again");
        }
        self.report(was_draining, 0)
    }

    /// Drains before the node stops, for at most `limit`: queued tasks go to other nodes where
    /// one can take them and the rest are handed back to their callers at once (as a stop
    /// without a drain does), running ones get until `limit` to finish, and then those another
    /// node sent are handed back to it. What is left of this node's own, the stop cancels.
    pub(crate) async fn before_stop(&self, limit: Duration) {
        self.tasks.inner.caps.set_draining(true);
        if let Some(timer) = self.timer.lock_unpoisoned().take() {
            timer.cancel.cancel();
        }
        self.tasks.hand_off_queued();
        for task in self.tasks.inner.tasks_with(Some(TaskStatus::Queued)) {
            self.tasks.end_here(&task, STOPPING, true);
        }
        let mut running = self.tasks.inner.running.subscribe();
        let _ = tokio::time::timeout(limit, running.wait_for(|n| *n == 0)).await;
        for task in self.tasks.inner.tasks_with(None) {
            self.tasks.end_here(&task, STOPPING, false);
        }
    }

    fn report(&self, was_draining: bool, handed_off: u32) -> DrainReport {
        let inner = &self.tasks.inner;
        DrainReport {
            node: inner.node.clone(),
            draining: inner.caps.draining(),
            was_draining,
            running: *inner.running.borrow(),
            queued: inner.queued.load(Ordering::SeqCst),
            handed_off,
            hand_over_at_ms: self.timer.lock_unpoisoned().as_ref().map_or(0, |t| t.at_ms),
        }
    }
}

/// The node `spec` came from when another node sent it here (that node holds its caller and
/// runs it elsewhere when this one hands it back); `None` for this node's own tasks, its
/// sub-tasks and its cron firings.
fn sender<'a>(spec: &'a TaskSpec, node: &str) -> Option<&'a str> {
    let origin = spec.lineage.origin.as_str();
    (spec.lineage.task_id.is_some() && !origin.is_empty() && origin != node).then_some(origin)
}

impl TaskManager {
    /// Offers every task queued here to the other nodes: one another node sent is handed
    /// back to it at once (its origin, which leases it, resumes it on its next node); one of
    /// this node's own is placed as if it were submitted again, this node excluded, and each
    /// one a node takes is forwarded there from here (its caller keeps following it here), the
    /// others stay queued. Returns how many went.
    fn hand_off_queued(&self) -> u32 {
        let inner = &self.inner;
        let mut handed_off = 0;
        for task in inner.tasks_with(Some(TaskStatus::Queued)) {
            if sender(&task.spec, &inner.node).is_some() {
                self.end_here(&task, &format!("{} is draining", inner.node), false);
                handed_off += 1;
                continue;
            }
            let exclude = [inner.node.as_str()];
            let candidates = match inner.admission.place_elsewhere(&task.spec, &exclude) {
                Ok(candidates) => candidates,
                Err(why) => {
                    tracing::info!(task_id = %task.id, %why, "draining: a queued task stays here");
                    continue;
                }
            };
            if !claim(inner, &task) {
                continue;
            }
            inner.queued.fetch_sub(1, Ordering::SeqCst);
            inner.running.send_modify(|n| *n += 1);
            inner.publish_load();
            inner.emitter(&task).emit(EventKind::Warning {
                message: format!(
                    "{} is draining: this task, queued there, is passed to another node",
                    inner.node
                ),
            });
            forward_task(inner.clone(), task, candidates);
            handed_off += 1;
        }
        handed_off
    }

    /// Ends `task`, still here, for `reason`: one another node sent is handed back to it; one of
    /// this node's own is cancelled when `own` says so, else left to the stop.
    fn end_here(&self, task: &LiveTask, reason: &str, own: bool) {
        let node = &self.inner.node;
        let error = match sender(&task.spec, node) {
            Some(_) => TaskError::HandedOver {
                node: node.clone(),
                reason: reason.to_owned(),
            },
            None if own => TaskError::Cancelled {
                reason: reason.to_owned(),
            },
            None => return,
        };
        tracing::info!(task_id = %task.id, %error, "draining: a task still here ends");
        self.stop(&task.id, error).ok();
    }
}

/// Takes a queued task out of the queue (the worker that pops it skips it): `false` when a
/// worker took it first, or it ended.
fn claim(inner: &Inner, task: &LiveTask) -> bool {
    let mut record = task.record.lock_unpoisoned();
    if record.status != TaskStatus::Queued {
        return false;
    }
    record.status = TaskStatus::Running;
    if let Err(e) = inner.history.put_record(&record) {
        tracing::error!(task = %task.id, error = %e, "record task start");
    }
    true
}

#[cfg(test)]
mod tests {
    use mesh_domain::{Lineage, Target};

    use super::*;

    fn spec(origin: &str, task_id: Option<&str>) -> TaskSpec {
        TaskSpec {
            lineage: Lineage {
                origin: origin.into(),
                task_id: task_id.map(Into::into),
                ..Lineage::default()
            },
            ..TaskSpec::new("hi", Target::Role("chat".into()))
        }
    }

    /// A task is handed back only to a node that sent it: not this node's own, nor its
    /// sub-tasks (no id of their own yet) or cron firings (an id, no origin).
    #[test]
    fn only_a_task_another_node_sent_has_a_sender() {
        assert_eq!(sender(&spec("a", Some("t")), "b"), Some("a"));
        assert_eq!(sender(&spec("b", Some("t")), "b"), None);
        assert_eq!(sender(&spec("a", None), "b"), None);
        assert_eq!(sender(&spec("", Some("t")), "b"), None);
    }
}
