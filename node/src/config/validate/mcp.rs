//! Checks `[[mcp]]`: each MCP server's name (the prefix of its tools' names, so it must keep
//! `<name>__<tool>` a valid OpenAI function name), how it is reached (a `command` with `args`
//! and `env`, or a `url`, never both), the tier its tools count as, the allow-list and the call
//! timeout. It must not start or connect to anything; the node does that at start.

use std::{collections::BTreeSet, time::Duration};

use mesh_domain::{
    Tier,
    mcp::{self, MAX_FUNCTION_NAME, MAX_SERVER_NAME},
};

use crate::config::{
    error::{ConfigError, Origin},
    raw::RawMcp,
    types::{McpConfig, McpTransport},
};

/// Most `[[mcp]]` entries a node takes.
pub(super) const MAX_MCP_SERVERS: usize = 16;
/// Default `[[mcp]] timeout_s`.
const DEFAULT_TIMEOUT_S: u64 = 60;
/// Largest `[[mcp]] timeout_s`.
const MAX_TIMEOUT_S: u64 = 600;
/// Most arguments and environment variables of one stdio server.
const MAX_ARGS: usize = 64;

/// Every `[[mcp]]` entry, in order; names are unique.
pub(super) fn servers(raw: Vec<RawMcp>, origin: &Origin) -> Result<Vec<McpConfig>, ConfigError> {
    if raw.len() > MAX_MCP_SERVERS {
        return Err(origin.invalid(
            "mcp",
            format!("has {} entries", raw.len()),
            &format!("use at most {MAX_MCP_SERVERS} MCP servers on one node"),
        ));
    }
    let mut names = BTreeSet::new();
    let mut servers = Vec::with_capacity(raw.len());
    for (i, entry) in raw.into_iter().enumerate() {
        let server = server(i, entry, origin)?;
        if !names.insert(server.name.clone()) {
            return Err(origin.invalid(
                &format!("mcp[{i}].name"),
                format!("`{}` is used by an earlier entry", server.name),
                "give each MCP server its own name: it prefixes its tools' names",
            ));
        }
        servers.push(server);
    }
    Ok(servers)
}

fn server(i: usize, raw: RawMcp, origin: &Origin) -> Result<McpConfig, ConfigError> {
    let key = |field: &str| format!("mcp[{i}].{field}");
    if !mcp::is_server_name(&raw.name) {
        return Err(origin.invalid(
            &key("name"),
            format!("is `{}`", raw.name),
            &format!(
                "use 1 to {MAX_SERVER_NAME} ASCII letters, digits, `-` or `_`, without `__` and not ending in `_` (tools are named `<name>__<tool>`, which must be a valid function name)"
            ),
        ));
    }
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => {
            return Err(origin.invalid(
                &key("url"),
                "is set together with `command`".into(),
                "set `command` (a server started as a child process) or `url` (a streamable HTTP server), not both",
            ));
        }
        (None, None) => {
            return Err(origin.invalid(
                &key("command"),
                "is missing, and so is `url`".into(),
                "set `command` (with `args`) for a server started as a child process, or `url` for a streamable HTTP server",
            ));
        }
        (Some(command), None) => {
            if command.trim().is_empty() {
                return Err(origin.invalid(
                    &key("command"),
                    "is empty".into(),
                    "name the program that runs the MCP server, e.g. `uvx`",
                ));
            }
            if raw.args.len() > MAX_ARGS || raw.env.len() > MAX_ARGS {
                return Err(origin.invalid(
                    &key(if raw.args.len() > MAX_ARGS {
                        "args"
                    } else {
                        "env"
                    }),
                    "has too many entries".into(),
                    &format!("use at most {MAX_ARGS}"),
                ));
            }
            if let Some(bad) = raw
                .env
                .keys()
                .find(|k| k.is_empty() || k.contains(['=', '\0']))
            {
                return Err(origin.invalid(
                    &key("env"),
                    format!("has the variable name `{bad}`"),
                    "use names without `=`",
                ));
            }
            McpTransport::Stdio {
                command,
                args: raw.args,
                env: raw.env,
            }
        }
        (None, Some(url)) => {
            if !raw.args.is_empty() || !raw.env.is_empty() {
                return Err(origin.invalid(
                    &key(if raw.args.is_empty() { "env" } else { "args" }),
                    "is set for a server reached by `url`".into(),
                    "`args` and `env` are for a server started with `command`; remove them",
                ));
            }
            let rest = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|rest| rest.is_empty() || rest.starts_with('/')) {
                return Err(origin.invalid(
                    &key("url"),
                    format!("is `{url}`, not an http(s) URL"),
                    "use the server's streamable HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`",
                ));
            }
            McpTransport::Http { url }
        }
    };
    let tier = match raw.tier.as_deref() {
        None => Tier::Write,
        Some(text) => Tier::parse(text).ok_or_else(|| {
            origin.invalid(
                &key("tier"),
                format!("is `{text}`"),
                "use `read`, `write` or `shell`: the tier a call of its tools counts as",
            )
        })?,
    };
    if let Some(tools) = &raw.tools {
        if tools.len() > mcp::MAX_TOOLS_PER_SERVER {
            return Err(origin.invalid(
                &key("tools"),
                format!("lists {} tools", tools.len()),
                &format!("list at most {}", mcp::MAX_TOOLS_PER_SERVER),
            ));
        }
        for (t, tool) in tools.iter().enumerate() {
            if mcp::tool_name(&raw.name, tool).is_none() {
                return Err(origin.invalid(
                    &format!("mcp[{i}].tools[{t}]"),
                    format!("is `{tool}`, and `{}__{tool}` is no valid function name", raw.name),
                    &format!(
                        "list the tool's name on the server: together with the server's name it may have at most {MAX_FUNCTION_NAME} ASCII letters, digits, `_` or `-`"
                    ),
                ));
            }
        }
    }
    let timeout_s = raw.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
        return Err(origin.invalid(
            &key("timeout_s"),
            format!("is {timeout_s}"),
            &format!("use 1 to {MAX_TIMEOUT_S} seconds"),
        ));
    }
    Ok(McpConfig {
        name: raw.name,
        transport,
        tier,
        tools: raw.tools,
        timeout: Duration::from_secs(timeout_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::tests::{err, parse};

    #[test]
    fn stdio_and_http_servers_parse_with_their_defaults() {
        let config = parse(
            r#"
            [[mcp]]
            name = "time"
            command = "python3"
            args = ["-m", "mcp_server_time"]
            env = { TZ = "UTC" }
            tier = "read"
            tools = ["get_current_time"]

            [[mcp]]
            name = "home"
            url = "http://127.0.0.1:8000/mcp"
            timeout_s = 5
            "#,
        )
        .expect("valid");
        assert_eq!(config.mcp.len(), 2);
        let time = &config.mcp[0];
        assert_eq!(time.tier, Tier::Read);
        assert_eq!(time.timeout, Duration::from_secs(60));
        assert_eq!(
            time.tools.as_deref(),
            Some(&["get_current_time".into()][..])
        );
        assert_eq!(
            time.transport,
            McpTransport::Stdio {
                command: "python3".into(),
                args: vec!["-m".into(), "mcp_server_time".into()],
                env: [("TZ".to_owned(), "UTC".to_owned())].into(),
            }
        );
        let home = &config.mcp[1];
        assert_eq!(home.tier, Tier::Write, "the default tier");
        assert_eq!(home.tools, None);
        assert_eq!(home.timeout, Duration::from_secs(5));
        assert_eq!(
            home.transport,
            McpTransport::Http {
                url: "http://127.0.0.1:8000/mcp".into()
            }
        );
        assert!(parse("").expect("valid").mcp.is_empty());
    }

    #[test]
    fn every_invalid_mcp_value_names_its_key_and_the_file() {
        let stdio = |more: &str| format!("[[mcp]]\nname = \"s\"\ncommand = \"srv\"\n{more}");
        let cases = [
            (
                "[[mcp]]\nname = \"a__b\"\ncommand = \"x\"".to_owned(),
                "mcp[0].name",
            ),
            (
                "[[mcp]]\nname = \"a_\"\ncommand = \"x\"".to_owned(),
                "mcp[0].name",
            ),
            (
                "[[mcp]]\nname = \"has space\"\ncommand = \"x\"".to_owned(),
                "mcp[0].name",
            ),
            (
                format!("[[mcp]]\nname = \"{}\"\ncommand = \"x\"", "n".repeat(33)),
                "mcp[0].name",
            ),
            ("[[mcp]]\nname = \"s\"".to_owned(), "mcp[0].command"),
            (
                "[[mcp]]\nname = \"s\"\ncommand = \" \"".to_owned(),
                "mcp[0].command",
            ),
            (stdio("url = \"http://x/mcp\""), "mcp[0].url"),
            (
                "[[mcp]]\nname = \"s\"\nurl = \"ftp://x\"".to_owned(),
                "mcp[0].url",
            ),
            (
                "[[mcp]]\nname = \"s\"\nurl = \"http://\"".to_owned(),
                "mcp[0].url",
            ),
            (
                "[[mcp]]\nname = \"s\"\nurl = \"http://x/mcp\"\nargs = [\"-v\"]".to_owned(),
                "mcp[0].args",
            ),
            (stdio("env = { \"A=B\" = \"c\" }"), "mcp[0].env"),
            (stdio("tier = \"root\""), "mcp[0].tier"),
            (stdio("tools = [\"read.file\"]"), "mcp[0].tools[0]"),
            (
                stdio(&format!("tools = [\"ok\", \"{}\"]", "t".repeat(62))),
                "mcp[0].tools[1]",
            ),
            (stdio("timeout_s = 0"), "mcp[0].timeout_s"),
            (stdio("timeout_s = 601"), "mcp[0].timeout_s"),
            (format!("{}\n{}", stdio(""), stdio("")), "mcp[1].name"),
            (
                (0..=MAX_MCP_SERVERS)
                    .map(|i| format!("[[mcp]]\nname = \"s{i}\"\ncommand = \"x\"\n"))
                    .collect(),
                "mcp",
            ),
        ];
        for (text, key) in cases {
            let message = err(&text);
            assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
            assert!(message.contains("node.toml"), "{key}: {message}");
        }
        // An unknown key is refused by name, as everywhere.
        let message = err(&stdio("comand = \"x\""));
        assert!(message.contains("comand"), "{message}");
    }
}
