//! MCP servers as tools, the client side: this node's `[[mcp]]` servers, kept connected, their
//! tools checked, advertised and called.
//!
//! [`McpHub`] owns one slot per configured server. Each server has a loop ([`McpHub::run`],
//! run under the node's supervisor as `mcp <name>`) that starts the server or connects to it
//! (`connect.rs`, rmcp over stdio or streamable HTTP), lists its tools (`schema.rs` checks
//! each: a tool whose name or schema does not pass is skipped with a warning), publishes them,
//! and lists them again every [`REFRESH_EVERY`] (so a server whose tools changed, or an HTTP
//! server that went away, is noticed). When the server exits or stops answering, the loop
//! returns an error: the supervisor names it in the node's health and starts it again after its
//! back-off; a successful start clears the reason. [`McpHub::call`] checks a call's arguments
//! against the tool's schema before the server sees them, bounds it by the server's
//! `timeout_s`, and turns the result into text for the model (cut to `MAX_TOOL_OUTPUT`).
//!
//! It must not decide who may call a tool (that is `admission`, before any call reaches it) or
//! know about other nodes (calls of a peer's tools go through the agent's tools and `rpc`).

mod connect;
pub(crate) mod schema;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, RwLock},
    time::Duration,
};

use mesh_domain::{
    McpToolInfo,
    chat::cap_tool_output,
    mcp::{MAX_ADVERTISED_BYTES, MAX_ADVERTISED_TOOLS, MAX_TOOLS_PER_SERVER},
    sync::RwLockExt,
};
use rmcp::{
    RoleClient,
    model::{
        CallToolRequestParams, CallToolResult, ContentBlock, PaginatedRequestParams,
        ResourceContents,
    },
    service::{Peer, ServiceError},
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::schema::{CheckedTool, check_arguments, check_tool};
use crate::{config::McpConfig, supervise::LoopHealth};

/// How long starting a server and its `initialize` may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `tools/list` page may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a connected server's tools are listed again.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// Most `tools/list` pages read from one server.
const MAX_PAGES: usize = 16;
/// How long a stopping stdio server gets to exit before its group is killed.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The name a server's loop runs under in the supervisor, and its health reason's.
pub(crate) fn loop_name(server: &str) -> String {
    format!("mcp {server}")
}

/// What one call returned, as text for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpOutput {
    /// The result's content as text, at most `MAX_TOOL_OUTPUT` bytes.
    pub text: String,
    /// The tool reported an error (MCP `isError`).
    pub is_error: bool,
}

/// Why a call did not run, or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// No MCP tool of that name runs on this node.
    #[error("no MCP tool `{0}` on this node")]
    NotFound(String),
    /// Its server is not connected (starting, or restarting after a failure).
    #[error("MCP server `{0}` is not connected now (starting or restarting); try again later")]
    Down(String),
    /// The arguments do not match the tool's input schema; the server never saw them.
    #[error("the arguments of `{tool}` do not match its input schema: {problem}")]
    InvalidArguments {
        /// The tool (namespaced).
        tool: String,
        /// What is wrong.
        problem: String,
    },
    /// No answer within the server's `timeout_s`.
    #[error("`{tool}` did not answer within {seconds} s")]
    Timeout { tool: String, seconds: u64 },
    /// The call failed (the server went away, answered with a protocol error, …).
    #[error("`{tool}` failed: {message}")]
    Failed {
        tool: String,
        /// What went wrong.
        message: String,
    },
}

/// A connected server's tools, by namespaced name.
#[derive(Debug)]
struct Live {
    /// Where requests go.
    peer: Peer<RoleClient>,
    tools: BTreeMap<String, CheckedTool>,
}

/// One configured server.
#[derive(Debug)]
struct Slot {
    config: McpConfig,
    /// Set while connected.
    live: RwLock<Option<Arc<Live>>>,
}

/// This node's MCP servers.
#[derive(Debug)]
pub struct McpHub {
    slots: Vec<Slot>,
    /// What the node advertises (`NodeInfo.mcp_tools`), published on every change.
    advertised: watch::Sender<Arc<[McpToolInfo]>>,
    /// Where a server that connected clears its loop's health reason.
    health: Arc<dyn LoopHealth>,
}

impl McpHub {
    /// A hub for `servers` (none connected until their loops run), reporting to `health`.
    pub fn new(servers: Vec<McpConfig>, health: Arc<dyn LoopHealth>) -> Arc<Self> {
        Arc::new(Self {
            slots: servers
                .into_iter()
                .map(|config| Slot {
                    config,
                    live: RwLock::default(),
                })
                .collect(),
            advertised: watch::Sender::new(Arc::default()),
            health,
        })
    }

    /// The configured servers' names, in config order (the index is what [`McpHub::run`]
    /// takes).
    pub fn servers(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.config.name.clone()).collect()
    }

    /// Follows what the node advertises.
    pub fn advertised(&self) -> watch::Receiver<Arc<[McpToolInfo]>> {
        self.advertised.subscribe()
    }

    /// Every tool of the connected servers, in config order (also those past the advertising
    /// bounds: this node offers them to its own tasks).
    pub fn tools(&self) -> Vec<McpToolInfo> {
        self.slots
            .iter()
            .filter_map(|slot| slot.live.read_unpoisoned().clone())
            .flat_map(|live| {
                live.tools
                    .values()
                    .map(|tool| tool.info.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The tool named `name` on a connected server here.
    pub fn tool(&self, name: &str) -> Option<McpToolInfo> {
        self.find(name)
            .map(|(_, live)| live.tools[name].info.clone())
    }

    /// The slot and live session holding `name`.
    fn find(&self, name: &str) -> Option<(&Slot, Arc<Live>)> {
        self.slots.iter().find_map(|slot| {
            let live = slot.live.read_unpoisoned().clone()?;
            live.tools.contains_key(name).then_some((slot, live))
        })
    }

    /// Calls the tool `name` with `arguments` (a JSON object), checked against its schema
    /// first, within its server's `timeout_s`.
    pub async fn call(&self, name: &str, arguments: &Value) -> Result<McpOutput, McpError> {
        let Some((slot, live)) = self.find(name) else {
            let server = mesh_domain::mcp::split_tool_name(name).map(|(server, _)| server);
            return Err(match server {
                Some(server) if self.slots.iter().any(|s| s.config.name == server) => {
                    McpError::Down(server.to_owned())
                }
                _ => McpError::NotFound(name.to_owned()),
            });
        };
        let tool = &live.tools[name];
        let Value::Object(object) = arguments else {
            return Err(McpError::InvalidArguments {
                tool: name.to_owned(),
                problem: "they are not a JSON object".into(),
            });
        };
        check_arguments(&tool.validator, arguments).map_err(|problem| {
            McpError::InvalidArguments {
                tool: name.to_owned(),
                problem,
            }
        })?;
        let params =
            CallToolRequestParams::new(tool.remote_name.clone()).with_arguments(object.clone());
        let timeout = slot.config.timeout;
        match tokio::time::timeout(timeout, live.peer.call_tool(params)).await {
            Err(_) => Err(McpError::Timeout {
                tool: name.to_owned(),
                seconds: timeout.as_secs(),
            }),
            Ok(Err(error)) => Err(McpError::Failed {
                tool: name.to_owned(),
                message: service_error(&error),
            }),
            Ok(Ok(result)) => Ok(output(result)),
        }
    }

    /// Keeps server `index` connected until `cancel`: starts or connects to it, lists and
    /// publishes its tools, lists them again every [`REFRESH_EVERY`]. Returns an error when the
    /// server cannot be started, exits or stops answering (the supervisor starts it again).
    pub async fn run(
        self: Arc<Self>,
        index: usize,
        cancel: CancellationToken,
    ) -> Result<(), String> {
        let Some(slot) = self.slots.get(index) else {
            return Err(format!("no MCP server number {index}"));
        };
        let name = slot.config.name.as_str();
        let session = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            opened = tokio::time::timeout(CONNECT_TIMEOUT, connect::open(&slot.config)) => {
                opened.map_err(|_| format!("no answer to `initialize` within {} s", CONNECT_TIMEOUT.as_secs()))??
            }
        };
        let connect::Session {
            service,
            mut process,
        } = session;
        let peer = service.peer().clone();
        let stop = service.cancellation_token();
        let mut warned = BTreeSet::new();
        let tools = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            listed = list_tools(&peer, &slot.config, &mut warned) => listed?,
        };
        tracing::info!(mcp = name, tools = tools.len(), "MCP server connected");
        self.install(
            slot,
            Some(Arc::new(Live {
                peer: peer.clone(),
                tools,
            })),
        );
        self.health.loop_failing(&loop_name(name), None);

        let waiting = service.waiting();
        tokio::pin!(waiting);
        let mut refresh = tokio::time::interval(REFRESH_EVERY);
        refresh.tick().await;
        let outcome = loop {
            let listed = tokio::select! {
                () = cancel.cancelled() => break Ok(()),
                quit = &mut waiting => {
                    break Err(match quit {
                        Ok(reason) => format!("the session ended ({reason:?})"),
                        Err(e) => format!("the session's task failed: {e}"),
                    });
                }
                _ = refresh.tick() => tokio::select! {
                    () = cancel.cancelled() => break Ok(()),
                    listed = list_tools(&peer, &slot.config, &mut warned) => listed,
                },
            };
            match listed {
                Ok(tools) => {
                    let changed = slot
                        .live
                        .read_unpoisoned()
                        .as_ref()
                        .is_none_or(|live| !same_tools(&live.tools, &tools));
                    if changed {
                        tracing::info!(
                            mcp = name,
                            tools = tools.len(),
                            "MCP server's tools changed"
                        );
                        self.install(
                            slot,
                            Some(Arc::new(Live {
                                peer: peer.clone(),
                                tools,
                            })),
                        );
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.install(slot, None);
        match outcome {
            Ok(()) => {
                // Stopping: close the session (a stdio server sees its stdin close and exits;
                // its group is killed when the process is dropped).
                stop.cancel();
                let _ = tokio::time::timeout(EXIT_WAIT, &mut waiting).await;
                Ok(())
            }
            Err(e) => {
                // A stdio server: say how it ended, if it did.
                let exit = match process.as_mut() {
                    Some(process) => {
                        match tokio::time::timeout(EXIT_WAIT, process.child.wait()).await {
                            Ok(Ok(status)) => Some(status.to_string()),
                            _ => None,
                        }
                    }
                    None => None,
                };
                Err(match exit {
                    Some(status) => format!("the server process exited ({status}); {e}"),
                    None => e,
                })
            }
        }
    }

    /// Sets a slot's session and publishes the advertisement again.
    fn install(&self, slot: &Slot, live: Option<Arc<Live>>) {
        *slot.live.write_unpoisoned() = live;
        self.advertised
            .send_replace(advertisement(&self.tools()).into());
    }
}

/// The tools a node advertises: in order, until [`MAX_ADVERTISED_TOOLS`] or
/// [`MAX_ADVERTISED_BYTES`]; those past either bound stay usable here only (logged).
fn advertisement(tools: &[McpToolInfo]) -> Vec<McpToolInfo> {
    let mut advertised = Vec::new();
    let mut bytes = 0;
    for tool in tools {
        let size = tool.advertised_bytes();
        if advertised.len() == MAX_ADVERTISED_TOOLS || bytes + size > MAX_ADVERTISED_BYTES {
            tracing::warn!(
                tool = %tool.name,
                "MCP tool not advertised to the fleet: this node's advertised tools are at their bounds ({MAX_ADVERTISED_TOOLS} tools, {MAX_ADVERTISED_BYTES} bytes); tasks on this node can still use it"
            );
            continue;
        }
        bytes += size;
        advertised.push(tool.clone());
    }
    advertised
}

/// Whether two listings offer the same tools (names, descriptions, schemas, tiers).
fn same_tools(a: &BTreeMap<String, CheckedTool>, b: &BTreeMap<String, CheckedTool>) -> bool {
    a.len() == b.len() && a.values().zip(b.values()).all(|(x, y)| x.info == y.info)
}

/// Lists a server's tools (page by page, at most [`MAX_PAGES`]), keeping those its allow-list
/// names that pass [`check_tool`], at most [`MAX_TOOLS_PER_SERVER`]. Each skipped tool is
/// warned about once per session (`warned` remembers).
async fn list_tools(
    peer: &Peer<RoleClient>,
    config: &McpConfig,
    warned: &mut BTreeSet<String>,
) -> Result<BTreeMap<String, CheckedTool>, String> {
    let server = config.name.as_str();
    let mut warn = |tool: &str, why: String| {
        if warned.len() < 4 * MAX_TOOLS_PER_SERVER && warned.insert(tool.to_owned()) {
            tracing::warn!(mcp = server, tool, "MCP tool skipped: {why}");
        }
    };
    let mut tools = BTreeMap::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params = cursor
            .take()
            .map(|cursor| PaginatedRequestParams::default().with_cursor(Some(cursor)));
        let page = tokio::time::timeout(LIST_TIMEOUT, peer.list_tools(params))
            .await
            .map_err(|_| {
                format!(
                    "no answer to `tools/list` within {} s",
                    LIST_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("`tools/list` failed: {}", service_error(&e)))?;
        for tool in page.tools {
            let name = tool.name.as_ref();
            if config
                .tools
                .as_ref()
                .is_some_and(|allowed| !allowed.iter().any(|a| a == name))
            {
                continue;
            }
            if tools.len() == MAX_TOOLS_PER_SERVER {
                warn(
                    name,
                    format!(
                        "the server has more than {MAX_TOOLS_PER_SERVER} tools; list the ones to use in `tools`"
                    ),
                );
                continue;
            }
            match check_tool(
                server,
                config.tier,
                name,
                tool.description.as_deref(),
                &tool.input_schema,
            ) {
                Ok(checked) => {
                    tools.insert(checked.info.name.clone(), checked);
                }
                Err(why) => warn(name, why),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    for wanted in config.tools.iter().flatten() {
        if !tools.values().any(|t| &t.remote_name == wanted) {
            warn(
                wanted,
                "`tools` lists it, but the server offers no usable tool of that name".into(),
            );
        }
    }
    Ok(tools)
}

/// A result's content as text for the model: text as it is, embedded text resources by their
/// text, other content named by its kind; the structured content when there is no other.
fn output(result: CallToolResult) -> McpOutput {
    let mut parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => {
                format!(
                    "[image, {}, {} bytes base64]",
                    image.mime_type,
                    image.data.len()
                )
            }
            ContentBlock::Audio(audio) => {
                format!(
                    "[audio, {}, {} bytes base64]",
                    audio.mime_type,
                    audio.data.len()
                )
            }
            ContentBlock::Resource(resource) => match &resource.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, blob, .. } => {
                    format!("[resource {uri}, {} bytes base64]", blob.len())
                }
                _ => "[a resource of a kind this node does not read]".into(),
            },
            ContentBlock::ResourceLink(link) => {
                format!("[resource link {} ({})]", link.uri, link.name)
            }
            _ => "[content of a kind this node does not read]".into(),
        })
        .collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    McpOutput {
        text: cap_tool_output(parts.join("\n")),
        is_error: result.is_error.unwrap_or(false),
    }
}

/// An rmcp error as one line.
fn service_error(error: &ServiceError) -> String {
    mesh_domain::text::truncate(&error.to_string(), 1000).to_owned()
}

#[cfg(test)]
mod tests {
    use mesh_domain::Tier;
    use serde_json::json;

    use super::*;

    fn info(name: &str, schema_bytes: usize) -> McpToolInfo {
        McpToolInfo {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object", "description": "x".repeat(schema_bytes)}).into(),
            tier: Tier::Write,
        }
    }

    #[test]
    fn the_advertisement_stops_at_its_bounds_in_order() {
        let many: Vec<McpToolInfo> = (0..MAX_ADVERTISED_TOOLS + 5)
            .map(|i| info(&format!("s__t{i}"), 0))
            .collect();
        let advertised = advertisement(&many);
        assert_eq!(advertised.len(), MAX_ADVERTISED_TOOLS);
        assert_eq!(advertised[0].name, "s__t0");
        let big: Vec<McpToolInfo> = (0..20).map(|i| info(&format!("s__b{i}"), 7000)).collect();
        let advertised = advertisement(&big);
        let bytes: usize = advertised.iter().map(McpToolInfo::advertised_bytes).sum();
        assert!(bytes <= MAX_ADVERTISED_BYTES, "{bytes}");
        assert_eq!(advertised.len(), 9);
    }

    #[test]
    fn results_become_text_and_errors_are_flagged() {
        let result = CallToolResult::error(vec![ContentBlock::text("no such zone")]);
        assert_eq!(
            output(result),
            McpOutput {
                text: "no such zone".into(),
                is_error: true
            }
        );
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("a"),
            ContentBlock::image("AAAA", "image/png"),
            ContentBlock::text("x".repeat(100_000)),
        ]);
        result.structured_content = Some(json!({"ignored": true}));
        let text = output(result).text;
        assert!(
            text.starts_with("a\n[image, image/png, 4 bytes base64]\nxxx"),
            "{}",
            &text[..60]
        );
        assert!(text.ends_with("[truncated]"));
        let mut result = CallToolResult::success(Vec::new());
        result.structured_content = Some(json!({"now": 1}));
        assert_eq!(output(result).text, r#"{"now":1}"#);
    }
}
