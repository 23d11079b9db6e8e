//! The `agentmesh.v1.Approvals` service: translates the wire format for `approvals::Approvals`
//! and reads who calls. Who may decide is not decided here: `Approvals::decide` asks
//! `Admission::may_approve` (a client certificate allowed the call's tier) and checks the
//! caller's signed statement of the decision. Anyone with a certificate may list approvals. In
//! insecure mode there are no identities, and every caller may decide.

use mesh_domain::task::check_task_id;
use mesh_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::approvals::{Approval, ApprovalError, Approvals, Status as ApprovalStatus};

/// Most approvals `List` returns when the request does not say.
const DEFAULT_LIST: usize = 100;

/// The Approvals service.
#[derive(Debug, Clone)]
pub(crate) struct ApprovalsService {
    approvals: Approvals,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl ApprovalsService {
    /// Serves `approvals`.
    pub(crate) fn new(approvals: Approvals, tls: bool) -> Self {
        Self { approvals, tls }
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::approvals_server::ApprovalsServer<Self> {
        pb::approvals_server::ApprovalsServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES)
    }
}

/// Every approval error has one status code.
impl From<ApprovalError> for Status {
    fn from(error: ApprovalError) -> Self {
        let message = error.to_string();
        match error {
            ApprovalError::NotFound(_) => Status::not_found(message),
            ApprovalError::Settled { .. } => Status::failed_precondition(message),
            ApprovalError::Invalid(_) => Status::invalid_argument(message),
            ApprovalError::Full(_) => Status::resource_exhausted(message),
            ApprovalError::Approver(_) => Status::permission_denied(message),
            ApprovalError::Statement(_) => Status::invalid_argument(message),
            ApprovalError::Memory(memory) => memory.into(),
        }
    }
}

fn status_pb(status: ApprovalStatus) -> pb::ApprovalStatus {
    match status {
        ApprovalStatus::Pending => pb::ApprovalStatus::Pending,
        ApprovalStatus::Approved => pb::ApprovalStatus::Approved,
        ApprovalStatus::Denied => pb::ApprovalStatus::Denied,
        ApprovalStatus::Expired => pb::ApprovalStatus::Expired,
        ApprovalStatus::Cancelled => pb::ApprovalStatus::Cancelled,
    }
}

fn approval_pb(approval: &Approval) -> pb::Approval {
    pb::Approval {
        approval_id: approval.id.clone(),
        task_id: approval.task_id.clone(),
        tool: approval.tool.clone(),
        arguments: approval.arguments.clone(),
        arguments_sha256: approval.arguments_sha256.clone(),
        called_from: approval.called_from.clone(),
        tier: pb::Tier::from(approval.tier) as i32,
        node: approval.node.clone(),
        node_id: approval.node_id.clone(),
        created_at_ms: approval.created_ms,
        expires_at_ms: approval.expires_ms,
        status: status_pb(approval.status) as i32,
        decided_by: approval
            .decided_by
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        decided_by_id: approval
            .decided_by
            .as_ref()
            .map(|p| p.id.to_string())
            .unwrap_or_default(),
        reason: approval.reason.clone(),
        decided_at_ms: approval.decided_ms.unwrap_or(0),
    }
}

#[tonic::async_trait]
impl pb::approvals_server::Approvals for ApprovalsService {
    async fn list(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let request = request.into_inner();
        let task_id = Some(request.task_id).filter(|id| !id.is_empty());
        if let Some(id) = &task_id {
            check_task_id("task_id", id).map_err(Status::invalid_argument)?;
        }
        let limit = match request.limit {
            0 => DEFAULT_LIST,
            n => n as usize,
        };
        let approvals = if request.approval_id.is_empty() {
            self.approvals
                .list(request.all, task_id.as_deref(), limit)?
        } else {
            match self.approvals.get(&request.approval_id) {
                Ok(approval) => vec![approval],
                Err(ApprovalError::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            }
        };
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: approvals.iter().map(approval_pb).collect(),
        }))
    }

    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let by = if self.tls {
            Some(super::caller_identity(&request)?.principal())
        } else {
            None
        };
        let request = request.into_inner();
        let approval = self
            .approvals
            .decide(
                &request.approval_id,
                request.approve,
                by.clone(),
                &request.reason,
                request.grant.map(Into::into),
            )
            .await?;
        tracing::info!(
            approval = %approval.id,
            task = %approval.task_id,
            tool = %approval.tool,
            approve = request.approve,
            by = %by.map(|p| p.to_string()).unwrap_or_default(),
            "approval decided"
        );
        Ok(Response::new(approval_pb(&approval)))
    }
}
