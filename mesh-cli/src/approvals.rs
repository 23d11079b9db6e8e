//! `mesh-cli approvals`: tool calls waiting for a person, from any node of the mesh, and the
//! decision on one (also sent by the inline question `mesh-cli run` asks in a terminal). A
//! decision is the operator's own act: mesh-cli signs a statement of the call as the node shows
//! it and of the decision with the key of its certificate, and the node running the call
//! checks it.

use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Subcommand;
use mesh_cert::{OriginSigner, statement::sign};
use mesh_domain::statement::{ApprovalStatement, StatementKind};
use mesh_proto::{convert::tier_or_read, v1 as pb};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::{ConnArgs, ago, channel, print_table, signer, unix_ms};

/// How long a decision waits for the approval to reach the node asked (a call waiting on
/// another node replicates within a second or two).
const FETCH_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List tool calls waiting for approval on any node of the mesh (newest first); with
    /// --all, also the decided, expired and cancelled ones.
    Ls {
        /// Also the ones no longer pending.
        #[arg(long)]
        all: bool,
        /// Only this task's.
        #[arg(long, value_name = "TASK_ID")]
        task: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print JSON (`{"approvals": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting tool call: it runs. Needs an operator's client certificate that the
    /// node running the task lets run the call's tier (security.client_max_tier).
    Approve {
        /// The approval's id (from `approvals ls` or the task's events).
        id: String,
        /// Why, kept with the approval.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Deny a waiting tool call: it does not run, and the agent's model is told the reason.
    Deny {
        /// The approval's id (from `approvals ls` or the task's events).
        id: String,
        /// Why; the model sees it as the call's result.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

pub(crate) async fn run(conn: &ConnArgs, command: ApprovalsCommand) -> anyhow::Result<()> {
    let mut client = pb::approvals_client::ApprovalsClient::new(channel(conn).await?);
    let signer = match &command {
        ApprovalsCommand::Ls { .. } => None,
        ApprovalsCommand::Approve { .. } | ApprovalsCommand::Deny { .. } => signer(conn)?,
    };
    match command {
        ApprovalsCommand::Ls {
            all,
            task,
            limit,
            json,
        } => list(&mut client, all, task, limit, json).await,
        ApprovalsCommand::Approve { id, reason } => {
            let approval = decide(&mut client, signer.as_ref(), &id, true, reason).await?;
            show!(
                "approved {id}: task {} on {} may call `{}`",
                approval.task_id,
                approval.node,
                approval.tool
            );
            Ok(())
        }
        ApprovalsCommand::Deny { id, reason } => {
            let approval = decide(&mut client, signer.as_ref(), &id, false, reason).await?;
            show!(
                "denied {id}: task {} on {} may not call `{}`; its model is told why and goes on without it",
                approval.task_id,
                approval.node,
                approval.tool
            );
            Ok(())
        }
    }
}

/// Sends a decision, signed by `signer` (none with --insecure) as a statement of the call as
/// the node shows it; the error says why the node refused it.
pub(crate) async fn decide(
    client: &mut pb::approvals_client::ApprovalsClient<Channel>,
    signer: Option<&OriginSigner>,
    id: &str,
    approve: bool,
    reason: String,
) -> anyhow::Result<pb::Approval> {
    let grant = match signer {
        Some(signer) => {
            let approval = fetch(client, id).await?;
            let statement = ApprovalStatement {
                approval_id: approval.approval_id,
                task_id: approval.task_id,
                node_id: approval.node_id,
                tool: approval.tool,
                tier: tier_or_read(approval.tier),
                arguments_sha256: approval.arguments_sha256,
                expires_ms: approval.expires_at_ms,
                approve,
                reason: reason.clone(),
            };
            let signed = sign(
                signer,
                StatementKind::ApprovalDecision,
                serde_json::to_vec(&statement)?,
            )
            .context("sign the decision with mesh-cli's key")?;
            Some(pb::SignedStatement::from(&signed))
        }
        None => None,
    };
    client
        .decide(pb::DecideRequest {
            approval_id: id.to_owned(),
            approve,
            reason,
            grant,
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| anyhow!("{}", s.message()))
}

/// The approval `id` as the node shows it, waiting up to [`FETCH_WAIT`] for it to get there.
async fn fetch(
    client: &mut pb::approvals_client::ApprovalsClient<Channel>,
    id: &str,
) -> anyhow::Result<pb::Approval> {
    let deadline = tokio::time::Instant::now() + FETCH_WAIT;
    loop {
        let found = client
            .list(pb::ListApprovalsRequest {
                approval_id: id.to_owned(),
                ..Default::default()
            })
            .await
            .map_err(|s| anyhow!("{}", s.message()))?
            .into_inner()
            .approvals
            .pop();
        match found {
            Some(approval) => return Ok(approval),
            None if tokio::time::Instant::now() >= deadline => {
                return Err(anyhow!(
                    "no approval with id `{id}` on this node (`mesh-cli approvals ls` lists the pending ones)"
                ));
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn status_name(status: i32) -> &'static str {
    match pb::ApprovalStatus::try_from(status) {
        Ok(pb::ApprovalStatus::Pending) => "pending",
        Ok(pb::ApprovalStatus::Approved) => "approved",
        Ok(pb::ApprovalStatus::Denied) => "denied",
        Ok(pb::ApprovalStatus::Expired) => "expired",
        Ok(pb::ApprovalStatus::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

fn approval_json(a: &pb::Approval) -> Value {
    json!({
        "approval_id": a.approval_id,
        "task_id": a.task_id,
        "tool": a.tool,
        "arguments": a.arguments,
        "arguments_sha256": a.arguments_sha256,
        "tier": tier_or_read(a.tier).to_string(),
        "node": a.node,
        "node_id": a.node_id,
        "called_from": a.called_from,
        "created_at_ms": a.created_at_ms,
        "expires_at_ms": a.expires_at_ms,
        "status": status_name(a.status),
        "decided_by": a.decided_by,
        "decided_by_id": a.decided_by_id,
        "reason": a.reason,
        "decided_at_ms": a.decided_at_ms,
    })
}

async fn list(
    client: &mut pb::approvals_client::ApprovalsClient<Channel>,
    all: bool,
    task: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let approvals = client
        .list(pb::ListApprovalsRequest {
            all,
            task_id: task.unwrap_or_default(),
            limit,
            approval_id: String::new(),
        })
        .await
        .map_err(|s| anyhow!("{}", s.message()))?
        .into_inner()
        .approvals;
    if json {
        let list: Vec<Value> = approvals.iter().map(approval_json).collect();
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "approvals": list }))?
        );
        return Ok(());
    }
    if approvals.is_empty() {
        show!(
            "{}",
            if all {
                "no approvals"
            } else {
                "no tool calls are waiting for approval"
            }
        );
        return Ok(());
    }
    let now = unix_ms();
    let rows: Vec<[String; 8]> = approvals
        .iter()
        .map(|a| {
            let arguments: String = a.arguments.chars().take(48).collect();
            let when = match pb::ApprovalStatus::try_from(a.status) {
                Ok(pb::ApprovalStatus::Pending) => {
                    format!("expires in {}s", a.expires_at_ms.saturating_sub(now) / 1000)
                }
                _ if !a.decided_by.is_empty() => {
                    format!("{} by {}", ago(now, a.decided_at_ms), a.decided_by)
                }
                _ => ago(now, a.decided_at_ms),
            };
            let node = if a.called_from.is_empty() {
                a.node.clone()
            } else {
                format!("{} (for {})", a.node, a.called_from)
            };
            [
                a.approval_id.clone(),
                a.task_id.clone(),
                node,
                a.tool.clone(),
                arguments,
                tier_or_read(a.tier).to_string(),
                status_name(a.status).to_owned(),
                when,
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "TASK",
            "NODE",
            "TOOL",
            "ARGUMENTS",
            "TIER",
            "STATUS",
            "WHEN",
        ],
        &rows,
    );
    Ok(())
}
