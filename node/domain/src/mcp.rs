//! Tools from MCP servers as the mesh names and bounds them: an MCP tool is offered to models as
//! `<server>__<tool>` ([`tool_name`], [`split_tool_name`]), which must be a valid OpenAI function
//! name ([`is_function_name`]); [`McpToolInfo`] is how a node advertises one in its `NodeInfo`;
//! and the bounds every node applies to what it offers and accepts live here, once.

use std::sync::Arc;

use serde_json::Value;

use crate::tier::Tier;

/// What separates the server's name from the tool's in a namespaced name.
pub const SEPARATOR: &str = "__";
/// Longest `[[mcp]] name`.
pub const MAX_SERVER_NAME: usize = 32;
/// Longest function name OpenAI accepts, so the longest namespaced tool name.
pub const MAX_FUNCTION_NAME: usize = 64;
/// Longest tool description offered to a model or advertised (longer ones are cut).
pub const MAX_DESCRIPTION: usize = 1024;
/// Largest input schema (its JSON text) a tool may have; a tool with a larger one is skipped.
pub const MAX_SCHEMA_BYTES: usize = 8 * 1024;
/// Most tools taken from one MCP server (more are skipped, with a warning).
pub const MAX_TOOLS_PER_SERVER: usize = 64;
/// Most MCP tools one node advertises, and accepts in a peer's `NodeInfo`.
pub const MAX_ADVERTISED_TOOLS: usize = 128;
/// Most bytes of names, descriptions and schemas one node advertises in all, and accepts in a
/// peer's `NodeInfo` (every `NodeInfo` of the fleet travels in one `ListPeers` answer).
pub const MAX_ADVERTISED_BYTES: usize = 64 * 1024;
/// Largest arguments (their JSON text) of one MCP tool call.
pub const MAX_ARGUMENTS_BYTES: usize = 256 * 1024;

/// One MCP tool as a node advertises it to the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// `<server>__<tool>`: what models call it.
    pub name: String,
    /// What it does, for the model (at most [`MAX_DESCRIPTION`] bytes).
    pub description: String,
    /// JSON schema of its arguments (an object schema of at most [`MAX_SCHEMA_BYTES`]).
    pub input_schema: Arc<Value>,
    /// The tier a call counts as (`[[mcp]] tier` on the hosting node).
    pub tier: Tier,
}

impl McpToolInfo {
    /// Bytes it takes in an advertisement (name, description, schema text).
    pub fn advertised_bytes(&self) -> usize {
        self.name.len() + self.description.len() + self.input_schema.to_string().len()
    }
}

/// Whether `name` is a valid OpenAI function name: 1 to 64 ASCII letters, digits, `_` or `-`.
pub fn is_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FUNCTION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` may name an MCP server (`[[mcp]] name`): 1 to 32 ASCII letters, digits, `_`
/// or `-`, with no `__` and no `_` at the end, so a namespaced name splits at its first `__`
/// back into the server's and the tool's.
pub fn is_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVER_NAME
        && is_function_name(name)
        && !name.contains(SEPARATOR)
        && !name.ends_with('_')
}

/// `<server>__<tool>`, or `None` when that is no valid function name (a tool name with other
/// characters, or too long together).
pub fn tool_name(server: &str, tool: &str) -> Option<String> {
    let name = format!("{server}{SEPARATOR}{tool}");
    (is_server_name(server) && !tool.is_empty() && is_function_name(&name)).then_some(name)
}

/// The server's and the tool's part of a namespaced name; `None` for a name with no `__` (no
/// built-in tool has one).
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(server, tool)| !server.is_empty() && !tool.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_function_names_and_split_back_into_server_and_tool() {
        assert_eq!(
            tool_name("time", "get_current_time").as_deref(),
            Some("time__get_current_time")
        );
        assert_eq!(
            split_tool_name("time__get_current_time"),
            Some(("time", "get_current_time"))
        );
        // A tool whose own name starts with `_` still splits right.
        let odd = tool_name("a", "_x").expect("valid");
        assert_eq!(split_tool_name(&odd), Some(("a", "_x")));
        assert_eq!(split_tool_name("list_nodes"), None);
        assert_eq!(split_tool_name("__x"), None);
        // Characters OpenAI refuses, and names too long together.
        assert_eq!(tool_name("fs", "read.file"), None);
        assert_eq!(tool_name("fs", "read/file"), None);
        assert_eq!(tool_name("fs", ""), None);
        assert_eq!(tool_name("s", &"t".repeat(62)), None);
        assert!(tool_name("s", &"t".repeat(61)).is_some());
        for bad in ["", "a__b", "a_", "a b", "ä", &"s".repeat(33)] {
            assert!(!is_server_name(bad), "{bad:?}");
            assert_eq!(tool_name(bad, "t"), None, "{bad:?}");
        }
        for good in ["time", "home-assistant", "fs_2", "_x", "A-b_c"] {
            assert!(is_server_name(good), "{good:?}");
        }
        assert!(is_function_name("a-b_C9"));
        assert!(!is_function_name(&"a".repeat(65)));
    }
}
