//! `mesh-cli status` (also `--watch`, live from the node's `WatchPeers` stream), `nodes ls` and
//! `nodes show`: the fleet as the asked node sees it.

use std::io::{IsTerminal, Write};

use anyhow::anyhow;
use clap::Subcommand;
use mesh_proto::{convert::tier_or_read, v1 as pb};
use serde_json::{Value, json};

use crate::{ConnArgs, ago, channel, print_table, refused, unix_ms};

#[derive(Debug, Subcommand)]
pub(crate) enum NodesCommand {
    /// List every node the asked node knows, one line each: name, state, health, address,
    /// roles, load.
    Ls {
        /// Print JSON (`{"nodes": [...]}`, as `status --json`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show everything one node advertises.
    Show {
        /// The node's name (as `status` lists it).
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(conn: &ConnArgs, command: NodesCommand) -> anyhow::Result<()> {
    match command {
        NodesCommand::Ls { json } => ls(conn, json).await,
        NodesCommand::Show { name, json } => show(conn, &name, json).await,
    }
}

/// Every node the asked node knows, itself first, as `status --json` prints them.
pub(crate) async fn fleet(conn: &ConnArgs) -> anyhow::Result<Vec<Value>> {
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    let response = client
        .list_peers(pb::ListPeersRequest {})
        .await
        .map_err(|s| refused("ListPeers", &conn.node, &s))?
        .into_inner();
    Ok(fleet_json(&response, &conn.node))
}

/// The nodes of a `ListPeers` answer from the node at `addr`, itself first.
fn fleet_json(response: &pb::ListPeersResponse, addr: &str) -> Vec<Value> {
    let mut nodes = Vec::new();
    if let Some(own) = &response.node {
        let mut node = node_json(own, addr, "up", unix_ms(), "self");
        node["replication_lag"] = json!({"records": 0, "seconds": 0.0});
        nodes.push(node);
    }
    for peer in &response.peers {
        if let Some(info) = &peer.info {
            let state = mesh_proto::convert::peer_state(peer.state).as_str();
            let mut node = node_json(info, &peer.addr, state, peer.last_seen_ms, &peer.source);
            node["replication_lag"] = json!({
                "records": peer.lag_records,
                "seconds": peer.lag_ms as f64 / 1000.0,
            });
            nodes.push(node);
        }
    }
    nodes
}

/// Node id → name, for every node the asked node knows (revoked ones included).
pub(crate) async fn names(conn: &ConnArgs) -> anyhow::Result<Vec<(String, String)>> {
    Ok(fleet(conn)
        .await?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?.to_owned(), n["name"].as_str()?.to_owned())))
        .collect())
}

pub(crate) async fn status(conn: &ConnArgs, json: bool, watch: bool) -> anyhow::Result<()> {
    if watch {
        return watch_status(conn, json).await;
    }
    let nodes = fleet(conn).await?;
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "nodes": nodes }))?
        );
        return Ok(());
    }
    print_status(&nodes);
    Ok(())
}

/// `status --watch`: the view again at every change the node reports (`WatchPeers`), until
/// the node goes away or Ctrl-C. In a terminal the table is redrawn in place; otherwise each
/// new table is printed after a line with the time, only when something in it changed.
async fn watch_status(conn: &ConnArgs, json: bool) -> anyhow::Result<()> {
    let mut client = pb::node_client::NodeClient::new(channel(conn).await?);
    let mut stream = client
        .watch_peers(pb::WatchPeersRequest {})
        .await
        .map_err(|s| refused("WatchPeers", &conn.node, &s))?
        .into_inner();
    let terminal = std::io::stdout().is_terminal();
    let mut last = Vec::new();
    loop {
        let view = tokio::select! {
            next = stream.message() => next,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let view = match view {
            Ok(Some(view)) => view,
            Ok(None) => return Err(anyhow!("{} stopped (it is shutting down)", conn.node)),
            Err(s) => {
                return Err(anyhow!(
                    "{} went away: {}",
                    conn.node,
                    crate::status_words(&s)
                ));
            }
        };
        let nodes = fleet_json(&view, &conn.node);
        let mut out = std::io::stdout();
        if json {
            writeln!(out, "{}", json!({ "nodes": nodes }))?;
            out.flush()?;
            continue;
        }
        let rows = status_rows(&nodes);
        if terminal {
            // Home and clear: the table is redrawn where it was.
            write!(out, "\x1b[H\x1b[2J")?;
            writeln!(
                out,
                "the fleet as {} sees it, live (Ctrl-C stops)\n",
                conn.node
            )?;
        } else {
            // The last-seen column changes at every refresh; only a real change is news.
            let seen: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    row.iter()
                        .enumerate()
                        .filter(|(i, _)| *i != LAST_SEEN)
                        .map(|(_, c)| c.clone())
                        .collect()
                })
                .collect();
            if seen == last {
                continue;
            }
            last = seen;
            writeln!(out, "── {} ──", chrono::Local::now().format("%H:%M:%S"))?;
        }
        print_table(&STATUS_HEADER, &rows);
        out.flush()?;
    }
}

const STATUS_HEADER: [&str; 12] = [
    "NAME",
    "ID",
    "ADDRESS",
    "STATE",
    "HEALTH",
    "ROLES",
    "MODELS",
    "GPUS",
    "LOAD",
    "LAST SEEN",
    "MEM LAG",
    "MCP TOOLS",
];
/// The column of [`STATUS_HEADER`] that changes with time alone.
const LAST_SEEN: usize = 9;

fn print_status(nodes: &[Value]) {
    print_table(&STATUS_HEADER, &status_rows(nodes));
}

fn status_rows(nodes: &[Value]) -> Vec<[String; 12]> {
    let now = unix_ms();
    nodes
        .iter()
        .map(|n| {
            [
                text(n, "name"),
                text(n, "id").chars().take(12).collect(),
                text(n, "addr"),
                text(n, "state"),
                health_cell(n),
                join(&n["roles"], |v| v.as_str().map(str::to_owned)),
                join(&n["models"], |m| m["name"].as_str().map(str::to_owned)),
                join(&n["gpus"], |g| {
                    Some(format!(
                        "{} ({} GiB)",
                        g["name"].as_str()?,
                        g["vram_mb"].as_u64()? / 1024
                    ))
                }),
                load_cell(n),
                ago(now, n["last_seen_ms"].as_u64().unwrap_or(0)),
                match n["replication_lag"]["records"].as_u64().unwrap_or(0) {
                    0 => "-".to_owned(),
                    records => format!(
                        "{records} rec, {:.0}s",
                        n["replication_lag"]["seconds"].as_f64().unwrap_or(0.0)
                    ),
                },
                match n["mcp_tools"].as_array().map_or(0, Vec::len) {
                    0 => "-".to_owned(),
                    count => count.to_string(),
                },
            ]
        })
        .collect()
}

/// `healthy`, or the status with each reason in short, `degraded: model qwen unreachable,
/// mdns disabled` (`nodes show` has them in full); `-` for a node that is not up, whose last
/// word on its health is old news.
fn health_cell(node: &Value) -> String {
    const MAX: usize = 64;
    if !is_live(node) {
        return "-".into();
    }
    let status = node["health"]["status"].as_str().unwrap_or("unknown");
    let reasons: Vec<String> = node["health"]["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(short_reason)
        .collect();
    if reasons.is_empty() {
        return status.to_owned();
    }
    let cell = format!("{status}: {}", reasons.join(", "));
    if cell.chars().count() <= MAX {
        return cell;
    }
    cell.chars().take(MAX - 1).collect::<String>() + "…"
}

/// A health reason (`component: what happened …`) as the component and the first word of
/// what happened: `model qwen: unreachable (connect …)` → `model qwen unreachable`.
fn short_reason(reason: &str) -> String {
    let Some((component, text)) = reason.split_once(": ") else {
        return reason.to_owned();
    };
    let word = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_end_matches(|c: char| !c.is_alphanumeric());
    if word.is_empty() {
        component.to_owned()
    } else {
        format!("{component} {word}")
    }
}

/// Whether `node` is up or suspect (draining and drained are up).
fn is_live(node: &Value) -> bool {
    matches!(
        node["state"].as_str(),
        Some("up" | "suspect" | "draining" | "drained")
    )
}

/// `2 running, 1 queued`; `-` for a node that is not up.
fn load_cell(node: &Value) -> String {
    if !is_live(node) {
        return "-".into();
    }
    format!(
        "{} running, {} queued",
        node["load"]["running"], node["load"]["queued"]
    )
}

async fn ls(conn: &ConnArgs, json: bool) -> anyhow::Result<()> {
    let nodes = fleet(conn).await?;
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "nodes": nodes }))?
        );
        return Ok(());
    }
    let rows: Vec<[String; 6]> = nodes
        .iter()
        .map(|n| {
            [
                text(n, "name"),
                text(n, "state"),
                health_cell(n),
                text(n, "addr"),
                join(&n["roles"], |v| v.as_str().map(str::to_owned)),
                load_cell(n),
            ]
        })
        .collect();
    print_table(
        &["NAME", "STATE", "HEALTH", "ADDRESS", "ROLES", "LOAD"],
        &rows,
    );
    Ok(())
}

fn text(node: &Value, key: &str) -> String {
    node[key].as_str().unwrap_or_default().to_owned()
}

async fn show(conn: &ConnArgs, name: &str, json: bool) -> anyhow::Result<()> {
    let nodes = fleet(conn).await?;
    let Some(node) = nodes.iter().find(|n| n["name"] == name) else {
        let known: Vec<&str> = nodes.iter().filter_map(|n| n["name"].as_str()).collect();
        return Err(anyhow!(
            "no node named `{name}`; known nodes: {}",
            known.join(", ")
        ));
    };
    if json {
        out!("{}", serde_json::to_string_pretty(node)?);
        return Ok(());
    }
    let text = |key: &str| text(node, key);
    show!("name:       {}", text("name"));
    show!("id:         {}", text("id"));
    show!("address:    {}", text("addr"));
    show!(
        "state:      {} (last seen {})",
        text("state"),
        ago(unix_ms(), node["last_seen_ms"].as_u64().unwrap_or(0))
    );
    show!(
        "version:    {} (protocol {})",
        text("version"),
        node["protocol"]
    );
    show!(
        "health:     {}",
        node["health"]["status"].as_str().unwrap_or_default()
    );
    for reason in node["health"]["reasons"].as_array().into_iter().flatten() {
        show!("            - {}", reason.as_str().unwrap_or_default());
    }
    show!(
        "roles:      {}",
        join(&node["roles"], |v| v.as_str().map(str::to_owned))
    );
    show!(
        "labels:     {}",
        node["labels"]
            .as_object()
            .map(|m| m
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    show!("models:");
    for m in node["models"].as_array().into_iter().flatten() {
        show!(
            "  - {} ({} {})",
            m["name"].as_str().unwrap_or_default(),
            m["backend"].as_str().unwrap_or_default(),
            m["model"].as_str().unwrap_or_default()
        );
    }
    show!(
        "personas:   {}",
        join(&node["personas"], |p| Some(format!(
            "{} ({})",
            p["name"].as_str()?,
            p["role"].as_str()?
        )))
    );
    show!(
        "cpus:       {} (load {:.2})",
        node["cpu_count"],
        node["cpu_load"].as_f64().unwrap_or(0.0)
    );
    show!(
        "memory:     {} MiB available of {} MiB",
        node["memory_available_bytes"].as_u64().unwrap_or(0) >> 20,
        node["memory_total_bytes"].as_u64().unwrap_or(0) >> 20
    );
    show!("gpus:");
    for g in node["gpus"].as_array().into_iter().flatten() {
        show!(
            "  - {} {} MiB ({})",
            g["name"].as_str().unwrap_or_default(),
            g["vram_mb"],
            g["source"].as_str().unwrap_or_default()
        );
    }
    show!(
        "load:       {} running, {} queued",
        node["load"]["running"],
        node["load"]["queued"]
    );
    show!("remote tier: {}", text("remote_max_tier"));
    show!("mcp tools:");
    for tool in node["mcp_tools"].as_array().into_iter().flatten() {
        let description = tool["description"].as_str().unwrap_or_default();
        let first_line = description.lines().next().unwrap_or_default();
        show!(
            "  - {} ({}) {}",
            tool["name"].as_str().unwrap_or_default(),
            tool["tier"].as_str().unwrap_or_default(),
            first_line.chars().take(80).collect::<String>()
        );
    }
    Ok(())
}

fn node_json(
    info: &pb::NodeInfo,
    addr: &str,
    state: &str,
    last_seen_ms: u64,
    source: &str,
) -> Value {
    let resources = info.resources.clone().unwrap_or_default();
    let load = info.load.unwrap_or_default();
    let health = info.health.clone().unwrap_or_default();
    let state = match state {
        "up" if info.draining => drain_state(true, load.running, load.queued),
        other => other,
    };
    json!({
        "name": info.name,
        "id": info.id,
        "addr": addr,
        "state": state,
        "draining": info.draining,
        "source": source,
        "version": info.version,
        "protocol": info.protocol,
        "addrs": info.addrs,
        "roles": info.roles,
        "labels": info.labels,
        "models": info.models.iter().map(|m| json!({
            "name": m.name, "backend": m.backend, "model": m.model, "base_url": m.base_url,
            "tokens_per_s": m.tokens_per_s,
        })).collect::<Vec<_>>(),
        "role_chains": info.role_chains.iter().map(|c| (c.role.clone(), json!(c.models))).collect::<serde_json::Map<_, _>>(),
        "personas": info.personas.iter().map(|p| json!({"name": p.name, "role": p.role})).collect::<Vec<_>>(),
        "gpus": resources.gpus.iter().map(|g| json!({
            "name": g.name, "vram_mb": g.vram_mb, "vram_free_mb": g.vram_free_mb, "source": g.source,
        })).collect::<Vec<_>>(),
        "cpu_count": resources.cpu_count,
        "cpu_load": resources.cpu_load,
        "memory_total_bytes": resources.memory_total_bytes,
        "memory_available_bytes": resources.memory_available_bytes,
        "load": {
            "running": load.running,
            "queued": load.queued,
            "workers": load.workers,
            "queue_capacity": load.queue_capacity,
        },
        "health": {
            "status": match pb::HealthStatus::try_from(health.status) {
                Ok(pb::HealthStatus::Healthy) => "healthy",
                Ok(pb::HealthStatus::Degraded) => "degraded",
                _ => "unhealthy",
            },
            "reasons": health.reasons,
        },
        "remote_max_tier": tier_or_read(info.remote_max_tier).to_string(),
        "mcp_tools": info.mcp_tools.iter().map(|t| json!({
            "name": t.name,
            "description": t.description,
            "tier": tier_or_read(t.tier).to_string(),
            "input_schema": serde_json::from_str::<Value>(&t.input_schema).unwrap_or(Value::Null),
        })).collect::<Vec<_>>(),
        "cert_fingerprint": info.cert_fingerprint,
        "started_at_ms": info.started_at_ms,
        "last_seen_ms": last_seen_ms,
    })
}

/// The state of an up node as far as a drain goes: `draining` while it has tasks running or
/// queued, `drained` once it has none, `up` when it is not draining.
pub(crate) fn drain_state(draining: bool, running: u32, queued: u32) -> &'static str {
    match (draining, running + queued) {
        (false, _) => "up",
        (true, 0) => "drained",
        (true, _) => "draining",
    }
}

fn join(list: &Value, item: impl Fn(&Value) -> Option<String>) -> String {
    let items: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(item)
        .collect();
    if items.is_empty() {
        "-".into()
    } else {
        items.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_cell_names_every_reason_in_short_and_only_for_live_nodes() {
        let node = |state: &str, status: &str, reasons: &[&str]| json!({"state": state, "health": {"status": status, "reasons": reasons}});
        assert_eq!(health_cell(&node("up", "healthy", &[])), "healthy");
        assert_eq!(
            health_cell(&node(
                "up",
                "degraded",
                &[
                    "mdns: disabled; peers come from static_peers and membership",
                    "model qwen: unreachable (connect to 127.0.0.1:1: refused)",
                ]
            )),
            "degraded: mdns disabled, model qwen unreachable"
        );
        assert_eq!(health_cell(&node("down", "degraded", &["x: y"])), "-");
        let long = health_cell(&node("up", "degraded", &["a: b"; 20]));
        assert_eq!(long.chars().count(), 64, "{long}");
        assert!(long.ends_with('…'), "{long}");
        assert_eq!(health_cell(&node("draining", "healthy", &[])), "healthy");
    }

    /// Issue 30, item 5: a draining node is `draining` while work remains on it, `drained`
    /// once none does; in the table and in `--json` alike.
    #[test]
    fn a_draining_node_shows_draining_then_drained() {
        let info = |draining: bool, running: u32, queued: u32| pb::NodeInfo {
            name: "gpu".into(),
            draining,
            load: Some(pb::Load {
                running,
                queued,
                ..Default::default()
            }),
            ..Default::default()
        };
        let state = |info: &pb::NodeInfo, membership: &str| {
            node_json(info, "a:1", membership, 0, "static")["state"].clone()
        };
        assert_eq!(state(&info(false, 1, 0), "up"), "up");
        assert_eq!(state(&info(true, 1, 0), "up"), "draining");
        assert_eq!(state(&info(true, 0, 2), "up"), "draining");
        assert_eq!(state(&info(true, 0, 0), "up"), "drained");
        assert_eq!(state(&info(true, 1, 0), "down"), "down");
        let row = &status_rows(&[node_json(&info(true, 1, 0), "a:1", "up", 0, "static")])[0];
        assert_eq!(row[3], "draining");
        assert_eq!(row[8], "1 running, 0 queued");
    }
}
