//! The shapes a name and a peer address must have: node, model, role and persona names use the
//! characters of one DNS label, and a static peer is `host:port` with a port other than 0. Pure
//! predicates: they must not build errors, because only the caller knows which key it checks.

use std::net::SocketAddr;

use crate::config::defaults::MAX_NAME_LEN;

/// 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `-` or `_`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A tool name as OpenAI accepts one (`^[a-zA-Z0-9_-]{1,64}$`): the built-in tools' and MCP
/// tools' `<server>__<tool>`.
pub(super) fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An `IP:port` or `host:port` whose port is not 0; a host is a name without brackets, slashes
/// or spaces.
pub(super) fn is_host_port(text: &str) -> bool {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return addr.port() != 0;
    }
    match text.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(['[', ']', '/', ' '])
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        }
        None => false,
    }
}
