//! The node's background work and the tokens that stop it: what every step of start-up spawns
//! into, and what [`super::Node::shutdown`] stops, in its order.

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::supervise::Supervisor;

/// The node's background work, and the tokens that stop it in [`super::Node::shutdown`]'s order.
#[derive(Debug)]
pub(super) struct Loops {
    /// Ends served `WatchInfo` streams: peers see us leave before anything else stops.
    pub(super) leaving: CancellationToken,
    /// Stops discovery (mDNS goodbye) and membership sessions.
    pub(super) background: CancellationToken,
    /// Stops the gRPC server (graceful drain).
    pub(super) serve: CancellationToken,
    /// Every long-running loop, restarted when it fails (so none dies silently).
    pub(super) supervisor: Supervisor,
    /// The front door's server (it owns its listener, so it is not restarted).
    pub(super) background_tasks: JoinSet<()>,
}
