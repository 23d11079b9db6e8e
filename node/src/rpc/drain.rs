//! `Node.Drain` and `Node.Undrain` (`mesh-cli drain`, `mesh-cli undrain`): checks the request
//! and who calls, and hands the drain to `tasks::Drain`. The admission policy decides who may
//! (`Admission::may_operate`: an operator of this node); in insecure mode there are no
//! identities, and every caller may.

use std::time::Duration;

use mesh_proto::{convert::check_len, v1 as pb};
use tonic::{Request, Response, Status};

use super::NodeService;
use crate::{admission::Operation, router::MIN_ID_PREFIX, tasks::DrainReport};

/// The longest timeout a drain may have: a week.
const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl NodeService {
    /// `Node.Drain`.
    pub(super) fn drain_call(
        &self,
        request: &Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        self.drain_operator(request)?;
        let asked = request.get_ref();
        self.is_me(&asked.node)?;
        let timeout = Duration::from_millis(asked.timeout_ms);
        if timeout > MAX_DRAIN_TIMEOUT {
            return Err(Status::invalid_argument(format!(
                "timeout_ms: {} ms is more than a week ({} ms)",
                asked.timeout_ms,
                MAX_DRAIN_TIMEOUT.as_millis()
            )));
        }
        let drain = self.drain.as_ref().ok_or_else(no_tasks)?;
        Ok(Response::new(answer(drain.drain(timeout))))
    }

    /// `Node.Undrain`.
    pub(super) fn undrain_call(
        &self,
        request: &Request<pb::UndrainRequest>,
    ) -> Result<Response<pb::DrainAnswer>, Status> {
        self.drain_operator(request)?;
        self.is_me(&request.get_ref().node)?;
        let drain = self.drain.as_ref().ok_or_else(no_tasks)?;
        Ok(Response::new(answer(drain.undrain())))
    }

    /// Refuses a caller who may not drain this node.
    fn drain_operator<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if !self.tls {
            return Ok(());
        }
        let admission = self.admission.as_ref().ok_or_else(no_tasks)?;
        let principal = super::caller_identity(request)?.principal();
        admission
            .may_operate(&principal, Operation::Drain)
            .map_err(|e| Status::permission_denied(e.to_string()))
    }

    /// Refuses a request that names another node: sent to the wrong address, it drains
    /// nothing.
    fn is_me(&self, node: &str) -> Result<(), Status> {
        if node.is_empty() {
            return Err(Status::invalid_argument(
                "node: name the node to drain (its name or id, as `mesh-cli status` lists it)",
            ));
        }
        check_len("node", node, 256)?;
        let (name, id) = (self.caps.name(), self.caps.id());
        if node == name || (node.len() >= MIN_ID_PREFIX && id.as_str().starts_with(node)) {
            return Ok(());
        }
        Err(Status::failed_precondition(format!(
            "this is node `{name}` ({}), not `{node}`: send the request to the node it names",
            id.short()
        )))
    }
}

/// A node built without a task manager (tests of other services) cannot drain.
fn no_tasks() -> Status {
    Status::unimplemented("this node runs no tasks, so it cannot drain")
}

fn answer(report: DrainReport) -> pb::DrainAnswer {
    pb::DrainAnswer {
        node: report.node,
        draining: report.draining,
        running: report.running,
        queued: report.queued,
        handed_off: report.handed_off,
        hand_over_at_ms: report.hand_over_at_ms,
        was_draining: report.was_draining,
    }
}
