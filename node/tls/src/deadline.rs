//! How long each gRPC call one node makes to another may take: one table ([`DEADLINES`]), so
//! every call has a deadline and none is an ad-hoc number. A peer that accepts a call and then
//! never answers (hung, or hostile) must not hold the caller's task, its memory or a watcher
//! forever: the HTTP/2 keepalive of [`crate::dial`] notices a peer that vanished, not one that
//! stays connected and silent.
//!
//! Deadlines are enforced on the caller's side ([`within`]), since a hostile peer would ignore a
//! `grpc-timeout` header; a call given up on is dropped, which resets its HTTP/2 stream, so an
//! honest peer stops working on it. This module decides nothing about retries or failover:
//! callers do.

use std::{future::Future, time::Duration};

use tonic::Status;

/// The deadline of each kind of call a node makes (see [`DEADLINES`] for the values and why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// A unary call with a small answer: `Node.ListPeers`, `Tasks.Cancel`, the join calls.
    pub unary: Duration,
    /// One `Memory.Sync` batch (an answer of up to 16 MiB).
    pub sync: Duration,
    /// One `Memory.Push` (at most 4,096 records).
    pub push: Duration,
    /// Opening a stream, until the peer's response headers: `Tasks.Submit`, `Models.Chat`,
    /// `Node.WatchInfo` (its hello).
    pub open: Duration,
    /// The longest a forwarded task's event stream may stay silent. A task may run far longer
    /// (its own deadline bounds it); this bounds a peer that stops sending while the stream
    /// stays open.
    pub task_idle: Duration,
    /// The longest a forwarded chat's stream may stay silent between two chunks.
    pub chat_idle: Duration,
    /// A whole forwarded chat, first byte to answer.
    pub chat: Duration,
    /// Each message of one `Tools.CallStream`: an MCP tool run on a peer, and before it the
    /// wait for the host's approval when its policy names the tool.
    pub tool: Duration,
}

/// The deadlines every node uses.
///
/// - `unary` 10 s and `open` 10 s: the answer (or the headers) needs no model and no disk scan,
///   so a peer that takes longer is as good as gone.
/// - `sync` 30 s: a batch is at most 16 MiB, read from the peer's store.
/// - `push` 10 s: a push is applied and flushed before it is answered.
/// - `task_idle` 600 s: a task's node sends an event at least at every model call, tool call and
///   result; a model call may take 120 s by default (`models.timeout_s`), a delegated sub-task
///   longer, so ten minutes of silence (the default task deadline) count as a lost node.
/// - `chat_idle` 150 s: longer than one model call's default timeout (120 s), before the first
///   chunk of a non-streaming model.
/// - `chat` 600 s: a chat falls through a chain of models, each with its own timeout.
/// - `tool` 630 s: longer than the longest call a host allows an MCP tool (`[[mcp]] timeout_s`,
///   at most 600 s), which the host enforces and answers with `UNAVAILABLE`, and than the
///   longest wait for its approval (`approval.timeout_s`, at most 540 s), after which the host
///   sends its decision.
pub const DEADLINES: Deadlines = Deadlines {
    unary: Duration::from_secs(10),
    sync: Duration::from_secs(30),
    push: Duration::from_secs(10),
    open: Duration::from_secs(10),
    task_idle: Duration::from_secs(600),
    chat_idle: Duration::from_secs(150),
    chat: Duration::from_secs(600),
    tool: Duration::from_secs(630),
};

impl Default for Deadlines {
    fn default() -> Self {
        DEADLINES
    }
}

/// Awaits `call` (a gRPC call, or the next message of a stream) for at most `limit`: still
/// unanswered then, it fails with `DEADLINE_EXCEEDED` naming `what` and the limit. The caller
/// enforces the deadline itself.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Status::deadline_exceeded(format!(
            "{what}: no answer within {} ms (the peer accepted the call but went silent)",
            limit.as_millis()
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_never_answers_fails_at_its_deadline_naming_it() {
        let status = within(
            Duration::from_millis(50),
            "Memory.Sync to alpha",
            std::future::pending::<Result<(), Status>>(),
        )
        .await
        .expect_err("a silent call fails");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(
            status
                .message()
                .starts_with("Memory.Sync to alpha: no answer within 50 ms")
        );
        let answered = within(Duration::from_secs(3), "x", async { Ok::<_, Status>(7) }).await;
        assert_eq!(answered.expect("answered"), 7);
    }
}
