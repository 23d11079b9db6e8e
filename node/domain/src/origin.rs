//! Web origins and host names in the one form the front door compares them in: the config's
//! `http.allowed_origins` and `http.allowed_hosts` are read into it, and so are the `Origin`
//! and `Host` headers a request carries, so an entry matches exactly the requests it names.
//! Parsing only: what is allowed is the front door's.

use std::net::Ipv6Addr;

/// A host name and, when one was given, a port, lowercased (`localhost`, `10.0.0.5`,
/// `[::1]`, `mesh.example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The name or address; an IPv6 address in brackets.
    pub host: String,
    /// The port, when given.
    pub port: Option<u16>,
}

/// `text` as a `Host` header names a host (`name`, `name:port`, `[ipv6]`, `[ipv6]:port`), or
/// `None`: empty, with a scheme, user, path or spaces, a bad port or a bad IPv6 address.
pub fn host_port(text: &str) -> Option<HostPort> {
    let text = text.trim();
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        address.parse::<Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (format!("[{}]", address.to_ascii_lowercase()), port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        let name = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if !name {
            return None;
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            Some(port.parse::<u16>().ok()?)
        }
        Some(_) => return None,
        None => None,
    };
    Some(HostPort { host, port })
}

/// `text` as a browser writes an origin (`http://localhost:3000`, `https://chat.example.com`),
/// in normal form: scheme and host lowercased, the scheme's default port left out; `None` for
/// anything else (another scheme, a path, `null`, `*`).
pub fn origin(text: &str) -> Option<String> {
    let (scheme, rest) = text.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let HostPort { host, port } = host_port(rest)?;
    Some(match port {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_into_one_form_and_anything_else_is_none() {
        let hp = |host: &str, port: Option<u16>| {
            Some(HostPort {
                host: host.into(),
                port,
            })
        };
        assert_eq!(host_port("LocalHost:7780"), hp("localhost", Some(7780)));
        assert_eq!(host_port("127.0.0.1"), hp("127.0.0.1", None));
        assert_eq!(host_port("[::1]:7780"), hp("[::1]", Some(7780)));
        assert_eq!(host_port("[::1]"), hp("[::1]", None));
        assert_eq!(host_port("mesh.example.com"), hp("mesh.example.com", None));
        for bad in [
            "",
            ":80",
            "a:",
            "a:99999",
            "a:8x",
            "a b",
            "user@host",
            "host/path",
            "http://host",
            "[::g]",
            "[::1]x",
            "::1",
        ] {
            assert_eq!(host_port(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn origins_lose_case_and_default_ports_and_anything_else_is_none() {
        assert_eq!(
            origin("HTTP://LocalHost:3000").as_deref(),
            Some("http://localhost:3000")
        );
        assert_eq!(
            origin("https://chat.example.com:443").as_deref(),
            Some("https://chat.example.com")
        );
        assert_eq!(origin("http://[::1]:80").as_deref(), Some("http://[::1]"));
        for bad in [
            "null",
            "*",
            "localhost:3000",
            "file://",
            "chrome-extension://abc",
            "http://host/path",
            "http://user@host",
            "http://",
        ] {
            assert_eq!(origin(bad), None, "{bad:?}");
        }
    }
}
