//! Opening one MCP session with rmcp: a stdio server started as a child process (in its own
//! process group, with a cleared environment, its stderr copied into the node's log, its
//! messages bounded), or a streamable HTTP server. It keeps no state: the hub owns what it
//! returns, and dropping a [`Session`] ends the child and everything it started.

use std::{process::Stdio, sync::Arc};

use rmcp::{
    RoleClient, ServiceExt,
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, async_rw::AsyncRwTransport,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::io::AsyncReadExt;

use crate::{
    config::{McpConfig, McpTransport},
    process::ProcessGroup,
};

/// Largest message the node reads from an MCP server (a line on stdio, an event or a body over
/// HTTP): a tool's result is cut to 64 KiB for the model anyway.
pub(super) const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Longest line of a stdio server's stderr copied into the log.
const MAX_STDERR_LINE: usize = 1024;
/// The variables of the node's environment a stdio server gets (besides its `env`); no others,
/// so the node's secrets (model API keys) stay out of it.
const INHERITED_ENV: &[&str] = &[
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR",
];

/// An open MCP session, and for a stdio server its process.
#[derive(Debug)]
pub(super) struct Session {
    /// rmcp's client: requests go through its peer; it ends when the server goes away.
    pub(super) service: RunningService<RoleClient, ()>,
    /// The stdio server's process, killed with its group when this is dropped.
    pub(super) process: Option<ServerProcess>,
}

/// A stdio server's child process.
#[derive(Debug)]
pub(super) struct ServerProcess {
    /// The child (`kill_on_drop`); waited on to report how it ended.
    pub(super) child: tokio::process::Child,
    /// Its process group, killed on drop (a launcher such as `uvx` starts the server as its
    /// own child).
    _group: Option<ProcessGroup>,
}

/// Starts or connects to the server and runs MCP's `initialize`.
pub(super) async fn open(config: &McpConfig) -> Result<Session, String> {
    match &config.transport {
        McpTransport::Stdio { command, args, env } => {
            let mut child = tokio::process::Command::new(command)
                .args(args)
                .env_clear()
                .envs(
                    INHERITED_ENV
                        .iter()
                        .filter_map(|k| Some((k, std::env::var_os(k)?))),
                )
                .envs(env)
                .process_group(0)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start `{command}`: {e}"))?;
            let group = ProcessGroup::of(&child);
            let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                return Err("the child process has no stdin or stdout pipe".into());
            };
            if let Some(stderr) = child.stderr.take() {
                tokio::spawn(copy_stderr(config.name.clone(), stderr));
            }
            let process = ServerProcess {
                child,
                _group: group,
            };
            let transport = AsyncRwTransport::<RoleClient, _, _>::new(stdout, stdin)
                .with_max_line_length(MAX_MESSAGE_BYTES);
            let service =
                ().serve(transport)
                    .await
                    .map_err(|e| format!("`initialize` failed: {e}"))?;
            Ok(Session {
                service,
                process: Some(process),
            })
        }
        McpTransport::Http { url } => {
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(Arc::<str>::from(url.as_str()))
                    .max_sse_event_size(MAX_MESSAGE_BYTES)
                    .max_json_response_size(MAX_MESSAGE_BYTES),
            );
            let service = ()
                .serve(transport)
                .await
                .map_err(|e| format!("`initialize` at {url} failed: {e}"))?;
            Ok(Session {
                service,
                process: None,
            })
        }
    }
}

/// Copies a stdio server's stderr into the node's log, a line at a time (cut at
/// [`MAX_STDERR_LINE`] bytes), until it closes.
async fn copy_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    let emit = |line: &mut Vec<u8>| {
        let text = String::from_utf8_lossy(line);
        let text = mesh_domain::text::truncate(text.trim_end(), MAX_STDERR_LINE);
        if !text.is_empty() {
            tracing::info!(mcp = %server, "{text}");
        }
        line.clear();
    };
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        for &byte in &buf[..n] {
            if byte == b'\n' {
                emit(&mut line);
            } else if line.len() < MAX_STDERR_LINE {
                line.push(byte);
            }
        }
    }
    emit(&mut line);
}
