//! What the front door refuses of what a web page can make a browser send, on every route
//! before the key check: a page the user opens may send the door requests (a `POST` of
//! `text/plain` needs no CORS preflight), or, after rebinding its own name to this machine
//! (DNS rebinding), read the answers too.
//!
//! [`Guard::check`] decides, from the request's headers alone:
//! - a request carrying an `Origin` (browsers send one on every cross-origin `POST`, and
//!   Chromium on every `fetch`) is refused unless the origin is in `http.allowed_origins`;
//!   the official SDKs and CLIs send none;
//! - on a door without keys, a `Host` that is not `localhost`, `127.0.0.1` or `[::1]` (or a
//!   name in `http.allowed_hosts`) is refused: a rebinding page names its own host. A request
//!   without `Host` is no browser's, and passes. A door with keys needs no such check: the
//!   page has no key;
//! - a `POST` whose body is not `application/json` is refused (415): the types a page may send
//!   without a preflight (`text/plain`, forms) are all other types.
//!
//! It only reads headers: who the caller is (the key) is `authorize`'s, what a key may do is
//! `api_keys`'.

use axum::http::{HeaderMap, Method, StatusCode, header};
use mesh_domain::{
    origin::{HostPort, host_port, origin},
    text::truncate,
};

use super::error::{ApiError, ErrorKind};

/// The host names a door without keys answers whatever its config: this machine's loopback.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Longest header value quoted back in a refusal.
const QUOTED: usize = 200;

/// The front door's allow lists (`http.allowed_hosts`, `http.allowed_origins`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Guard {
    /// Hosts answered besides [`LOOPBACK_HOSTS`] when the door has no keys.
    pub allowed_hosts: Vec<HostPort>,
    /// Origins whose requests are taken, in normal form.
    pub allowed_origins: Vec<String>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Blocked {
    /// An `Origin` not in `http.allowed_origins` (403).
    #[error(
        "requests from web pages are refused: Origin `{0}` is not in http.allowed_origins. List a page's origin there only when the page may use this front door (for example a web app served through a proxy of it); the front door sends no CORS headers"
    )]
    Origin(String),
    /// A `Host` this door without keys does not answer (403).
    #[error(
        "Host `{0}` is not a name of this front door: without keys it answers only localhost, 127.0.0.1 and [::1], so that a web page whose own name resolves to this machine (DNS rebinding) cannot use it. Add the name clients reach it by to http.allowed_hosts, or give the front door keys"
    )]
    Host(String),
    /// A `POST` body that is not JSON (415).
    #[error(
        "Content-Type `{0}` is not JSON: send the body with `Content-Type: application/json` (the other types are refused because any web page may send them without asking)"
    )]
    ContentType(String),
}

impl From<Blocked> for ApiError {
    fn from(blocked: Blocked) -> Self {
        let message = blocked.to_string();
        match blocked {
            Blocked::Origin(_) => {
                ApiError::new(StatusCode::FORBIDDEN, ErrorKind::Permission, message)
                    .with_code("origin_not_allowed")
            }
            Blocked::Host(_) => {
                ApiError::new(StatusCode::FORBIDDEN, ErrorKind::Permission, message)
                    .with_code("host_not_allowed")
            }
            Blocked::ContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorKind::InvalidRequest,
                message,
            )
            .with_code("unsupported_media_type"),
        }
    }
}

impl Guard {
    /// Whether a request with `method` and `headers` may go on to the key check, on a door
    /// that has keys (`keyed`) or not.
    pub(crate) fn check(
        &self,
        method: &Method,
        headers: &HeaderMap,
        keyed: bool,
    ) -> Result<(), Blocked> {
        if let Some(value) = headers.get(header::ORIGIN) {
            let text = String::from_utf8_lossy(value.as_bytes());
            let allowed = origin(&text).is_some_and(|o| self.allowed_origins.contains(&o));
            if !allowed {
                return Err(Blocked::Origin(truncate(&text, QUOTED).to_owned()));
            }
        }
        if !keyed && let Some(value) = headers.get(header::HOST) {
            let text = String::from_utf8_lossy(value.as_bytes());
            if !host_port(&text).is_some_and(|host| self.answers(&host)) {
                return Err(Blocked::Host(truncate(&text, QUOTED).to_owned()));
            }
        }
        if method == Method::POST {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            // `application/json`, with parameters (`; charset=utf-8`) or not, in any case.
            let essence = content_type.split(';').next().unwrap_or_default().trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                let shown = if content_type.is_empty() {
                    "(none)"
                } else {
                    truncate(&content_type, QUOTED)
                };
                return Err(Blocked::ContentType(shown.to_owned()));
            }
        }
        Ok(())
    }

    /// Whether a door without keys answers requests for `host`.
    fn answers(&self, host: &HostPort) -> bool {
        LOOPBACK_HOSTS.contains(&host.host.as_str())
            || self.allowed_hosts.iter().any(|allowed| {
                allowed.host == host.host && allowed.port.is_none_or(|p| Some(p) == host.port)
            })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(name, HeaderValue::from_str(value).expect("header"));
        }
        headers
    }

    fn guard() -> Guard {
        Guard {
            allowed_hosts: vec![
                host_port("mesh-node").expect("host"),
                host_port("proxy.lan:8443").expect("host"),
            ],
            allowed_origins: vec![origin("https://chat.example.com").expect("origin")],
        }
    }

    const JSON: (header::HeaderName, &str) = (header::CONTENT_TYPE, "application/json");

    /// Headers sent, as (name, value).
    type Sent = Vec<(header::HeaderName, &'static str)>;

    /// What the official clients send passes: a loopback `Host`, JSON, no `Origin`; so does an
    /// allowed origin or host, and a door with keys takes any `Host`.
    #[test]
    fn what_clients_send_passes() {
        let guard = guard();
        for (method, sent, keyed) in [
            (
                Method::POST,
                vec![(header::HOST, "127.0.0.1:7780"), JSON],
                false,
            ),
            (
                Method::POST,
                vec![
                    (header::HOST, "localhost:7780"),
                    (header::CONTENT_TYPE, "Application/JSON; charset=utf-8"),
                ],
                false,
            ),
            (
                Method::POST,
                vec![(header::HOST, "[::1]:7780"), JSON],
                false,
            ),
            (Method::GET, vec![(header::HOST, "localhost")], false),
            (Method::GET, vec![], false),
            (
                Method::POST,
                vec![(header::HOST, "mesh-node:7780"), JSON],
                false,
            ),
            (
                Method::POST,
                vec![(header::HOST, "proxy.lan:8443"), JSON],
                false,
            ),
            (
                Method::POST,
                vec![(header::HOST, "gpu-box.lan:7780"), JSON],
                true,
            ),
            (
                Method::POST,
                vec![
                    (header::HOST, "localhost:7780"),
                    (header::ORIGIN, "https://chat.example.com"),
                    JSON,
                ],
                false,
            ),
        ] {
            assert_eq!(
                guard.check(&method, &headers(&sent), keyed),
                Ok(()),
                "{sent:?}"
            );
        }
    }

    /// Each request, which only `rule` can refuse, is refused by it with its status.
    fn refused_by(rule: &str, cases: Vec<(Method, Sent, bool)>) {
        let guard = guard();
        for (method, sent, keyed) in cases {
            let refused = guard
                .check(&method, &headers(&sent), keyed)
                .expect_err(rule);
            assert!(
                refused.to_string().starts_with(match rule {
                    "Origin" => "requests from web pages",
                    "Host" => "Host `",
                    _ => "Content-Type `",
                }),
                "{sent:?}: {refused}"
            );
            let status = ApiError::from(refused).status;
            let expected = if rule == "Content-Type" { 415 } else { 403 };
            assert_eq!(status.as_u16(), expected, "{sent:?}");
        }
    }

    /// Issue 26, item 3: a cross-site page's requests carry its `Origin`: refused, on a door
    /// with keys too (JSON, and a `Host` the door answers, so only this rule refuses them).
    #[test]
    fn a_cross_site_page_is_refused_by_its_origin() {
        refused_by(
            "Origin",
            vec![
                (
                    Method::POST,
                    vec![
                        (header::HOST, "localhost:7780"),
                        (header::ORIGIN, "https://evil.example"),
                        JSON,
                    ],
                    false,
                ),
                (
                    Method::POST,
                    vec![
                        (header::HOST, "gpu-box.lan:7780"),
                        (header::ORIGIN, "https://evil.example"),
                        JSON,
                    ],
                    true,
                ),
                (Method::GET, vec![(header::ORIGIN, "null")], false),
            ],
        );
    }

    /// Issue 26, item 3: a rebinding page is, to the browser, the door's own origin (no
    /// `Origin` on its reads), but its own name is in `Host`: refused on a door without keys.
    #[test]
    fn a_rebinding_page_is_refused_by_its_host() {
        refused_by(
            "Host",
            vec![
                (
                    Method::POST,
                    vec![(header::HOST, "evil.example:7780"), JSON],
                    false,
                ),
                (Method::GET, vec![(header::HOST, "evil.example")], false),
                (
                    Method::POST,
                    vec![(header::HOST, "proxy.lan:9999"), JSON],
                    false,
                ),
            ],
        );
    }

    /// Issue 26, item 3: the bodies a page may send without a CORS preflight (`text/plain`,
    /// forms) and a body of no type are refused with 415, on a door with keys too.
    #[test]
    fn a_post_that_is_not_json_is_refused_by_its_type() {
        refused_by(
            "Content-Type",
            vec![
                (
                    Method::POST,
                    vec![
                        (header::HOST, "localhost:7780"),
                        (header::CONTENT_TYPE, "text/plain"),
                    ],
                    false,
                ),
                (
                    Method::POST,
                    vec![
                        (header::HOST, "localhost:7780"),
                        (header::CONTENT_TYPE, "application/x-www-form-urlencoded"),
                    ],
                    true,
                ),
                (Method::POST, vec![(header::HOST, "localhost:7780")], false),
            ],
        );
    }
}
