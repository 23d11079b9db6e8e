//! `mesh-cli drain` and `mesh-cli undrain`: find the node named in the fleet the asked node
//! sees, and ask that node itself (`Node.Drain`, `Node.Undrain`). The node decides who may and
//! does the draining; this only prints.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use mesh_proto::v1 as pb;
use serde_json::json;

use crate::{ConnArgs, channel, nodes, refused, unix_ms};

/// `mesh-cli drain`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mesh-cli drain gpu-box                  drain it; running tasks get 10 minutes
  mesh-cli drain gpu-box --timeout 30s    hand over what still runs after 30 s
  mesh-cli drain gpu-box --timeout 0s     hand over every task at once
  mesh-cli status                         `draining` while work remains, then `drained`
  mesh-cli undrain gpu-box                take tasks and chats again")]
pub(crate) struct DrainArgs {
    /// The node to drain: its name, or its id (12 hex digits at least), as `mesh-cli status`
    /// lists it.
    #[arg(value_name = "NODE")]
    name: String,
    /// How long running tasks get to finish (`90s`, `10m`, `1h`; at most a week). Then a
    /// task another node sent is handed back to it, which runs it on another node; a task of
    /// the drained node's own is cancelled.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print JSON (`{"node", "state", "draining", "was_draining", "running", "queued",
    /// "handed_off", "hand_over_at_ms"}`) instead of text.
    #[arg(long)]
    json: bool,
}

/// `mesh-cli undrain`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  mesh-cli undrain gpu-box")]
pub(crate) struct UndrainArgs {
    /// The node: its name, or its id, as `mesh-cli status` lists it.
    #[arg(value_name = "NODE")]
    name: String,
    /// Print JSON (as `drain --json`) instead of text.
    #[arg(long)]
    json: bool,
}

/// The connection to the node named `node` in the fleet `conn`'s node sees: its address
/// there, so the request goes to the node itself.
async fn node_conn(conn: &ConnArgs, node: &str) -> anyhow::Result<ConnArgs> {
    let fleet = nodes::fleet(conn).await?;
    // A name first; else an id, or a prefix of one at least as long as the short id `status`
    // shows, that only one node's id starts with.
    let found = fleet
        .iter()
        .find(|n| n["name"].as_str() == Some(node))
        .or_else(|| {
            let mut by_id = fleet.iter().filter(|n| {
                node.len() >= 12 && n["id"].as_str().is_some_and(|id| id.starts_with(node))
            });
            by_id.next().filter(|_| by_id.next().is_none())
        });
    let Some(found) = found else {
        let known: Vec<&str> = fleet.iter().filter_map(|n| n["name"].as_str()).collect();
        return Err(anyhow!(
            "no node `{node}` in the fleet {} sees; it knows {}",
            conn.node,
            known.join(", ")
        ));
    };
    let addr = found["addr"].as_str().unwrap_or_default();
    if addr.is_empty()
        || !matches!(
            found["state"].as_str(),
            Some("up" | "suspect" | "draining" | "drained")
        )
    {
        return Err(anyhow!(
            "`{node}` is {} in the fleet {} sees: only a node that is up can be drained or undrained",
            found["state"].as_str().unwrap_or("unknown"),
            conn.node
        ));
    }
    let mut at = conn.clone();
    at.node = addr.to_owned();
    at.found = Some(format!(
        "`{node}` is at {addr} in the peer table of {}",
        conn.node
    ));
    Ok(at)
}

pub(crate) async fn drain(conn: &ConnArgs, args: DrainArgs) -> anyhow::Result<()> {
    let at = node_conn(conn, &args.name).await?;
    let answer = pb::node_client::NodeClient::new(channel(&at).await?)
        .drain(pb::DrainRequest {
            node: args.name.clone(),
            timeout_ms: u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
        })
        .await
        .map_err(|s| refused("Drain", &at.node, &s))?
        .into_inner();
    if args.json {
        return print_json(&answer);
    }
    let name = &answer.node;
    show!(
        "{name} is {}: it takes no new tasks or chats{}",
        state(&answer),
        if answer.was_draining {
            " (it was draining already; the timeout starts again)"
        } else {
            ""
        }
    );
    show!(
        "  queued tasks passed to other nodes: {}",
        answer.handed_off
    );
    show!(
        "  still there: {} running, {} queued",
        answer.running,
        answer.queued
    );
    if answer.running + answer.queued > 0 {
        // In whole seconds, rounded up: `10m` rather than `9m 59s` just after a 10-minute drain.
        let left_ms = answer.hand_over_at_ms.saturating_sub(unix_ms());
        show!(
            "  in {} the tasks still there end: one another node sent goes back to it, which runs it elsewhere; {name}'s own are cancelled",
            humantime::format_duration(Duration::from_secs(left_ms.div_ceil(1000)))
        );
    }
    show!(
        "`mesh-cli status` shows {name} `draining` while work remains, then `drained`; `mesh-cli undrain {name}` ends the drain"
    );
    Ok(())
}

pub(crate) async fn undrain(conn: &ConnArgs, args: UndrainArgs) -> anyhow::Result<()> {
    let at = node_conn(conn, &args.name).await?;
    let answer = pb::node_client::NodeClient::new(channel(&at).await?)
        .undrain(pb::UndrainRequest {
            node: args.name.clone(),
        })
        .await
        .map_err(|s| refused("Undrain", &at.node, &s))?
        .into_inner();
    if args.json {
        return print_json(&answer);
    }
    if answer.was_draining {
        show!("{} takes tasks and chats again", answer.node);
    } else {
        show!("{} was not draining; nothing changed", answer.node);
    }
    Ok(())
}

/// `draining`, `drained` or `up`, as `status` shows it.
fn state(answer: &pb::DrainAnswer) -> &'static str {
    nodes::drain_state(answer.draining, answer.running, answer.queued)
}

fn print_json(answer: &pb::DrainAnswer) -> anyhow::Result<()> {
    out!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "node": answer.node,
            "state": state(answer),
            "draining": answer.draining,
            "was_draining": answer.was_draining,
            "running": answer.running,
            "queued": answer.queued,
            "handed_off": answer.handed_off,
            "hand_over_at_ms": answer.hand_over_at_ms,
        }))?
    );
    Ok(())
}
