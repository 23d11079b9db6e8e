//! Who a front-door request is: [`authorize`] finds the key a request presents (as
//! `Authorization: Bearer <key>` or Anthropic's `x-api-key`), refuses a missing or unknown one
//! when the door has keys (a program of this machine passes without one under
//! `http.loopback_without_key`, [`from_this_machine`]), refuses `/mcp` to a key without the
//! `mcp` scope, and hands the gateway the [`DoorCaller`] it found. Which key may do what is
//! `api_keys`' to decide; this module only reads the request.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::Next,
    response::Response,
};

use super::{
    door::FrontDoor,
    error::{ApiError, ErrorKind},
};
use crate::gateway::DoorCaller;

/// Where the MCP server is.
pub(super) const MCP_PATH: &str = "/mcp";

/// Lets a request with a known key through (any request when no keys are set, or from this
/// machine with `http.loopback_without_key`), with the [`DoorCaller`] it found for the gateway;
/// `/mcp` only with a key that may use it ([`crate::api_keys::KeyGrant::may_use_mcp`]).
pub(super) async fn authorize(
    State(door): State<Arc<FrontDoor>>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if !door
        .keys
        .required_from(from_this_machine(&request))
        .map_err(keys_unavailable)?
    {
        request.extensions_mut().insert(DoorCaller::default());
        return Ok(next.run(request).await);
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    let grant = match presented {
        Some(key) => door.keys.authenticate(key).map_err(keys_unavailable)?,
        None => None,
    };
    match grant {
        Some(grant) => {
            if request.uri().path() == MCP_PATH {
                grant.may_use_mcp().map_err(ApiError::from_refusal)?;
            }
            request
                .extensions_mut()
                .insert(DoorCaller { key: Some(grant) });
            Ok(next.run(request).await)
        }
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Authentication,
            "missing or unknown API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`) with a key of the mesh (http.api_keys, [[http.keys]], or one made by `mesh-cli keys add`)",
        )
        .with_code("invalid_api_key")),
    }
}

/// A 503: the keys could not be read (the memory they are kept in failed).
pub(super) fn keys_unavailable(error: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Unavailable,
        format!("cannot read the front door's keys: {error}"),
    )
}

/// Whether `request` comes from a program of this machine, as `http.loopback_without_key`
/// needs: its connection's peer address is loopback (`serve` records it), and it names a
/// loopback host and no other origin, so a web page that rebinds its own name to 127.0.0.1, or
/// a browser sending another site's request, does not pass.
fn from_this_machine(request: &Request) -> bool {
    let loopback_host = |host: &str| {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.to_canonical().is_loopback())
    };
    let header = |name: header::HeaderName| {
        request
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap_or_default())
    };
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .is_some_and(|peer| peer.0.ip().to_canonical().is_loopback());
    let host = header(header::HOST)
        .and_then(|host| host.parse::<axum::http::uri::Authority>().ok())
        .is_some_and(|authority| loopback_host(authority.host()));
    let origin = header(header::ORIGIN).is_none_or(|origin| {
        origin
            .parse::<axum::http::Uri>()
            .ok()
            .and_then(|uri| uri.host().map(loopback_host))
            .unwrap_or(false)
    });
    peer && host && origin
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case, RFC 9110).
pub(super) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `http.loopback_without_key` lets in programs of this machine only: a loopback peer
    /// naming a loopback host, and no other site's origin (a page that rebinds its name to
    /// 127.0.0.1 names its own host; a browser sends the other site's `Origin`).
    #[test]
    fn only_a_loopback_caller_naming_a_loopback_host_and_origin_is_from_this_machine() {
        let request = |peer: Option<&str>, host: Option<&str>, origin: Option<&str>| {
            let mut builder = axum::http::Request::builder().uri("/v1/models");
            if let Some(host) = host {
                builder = builder.header(header::HOST, host);
            }
            if let Some(origin) = origin {
                builder = builder.header(header::ORIGIN, origin);
            }
            let mut request = builder.body(axum::body::Body::empty()).expect("request");
            if let Some(peer) = peer {
                let peer: std::net::SocketAddr = peer.parse().expect("addr");
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
            }
            request
        };
        let local = Some("127.0.0.1:50000");
        for (peer, host, origin, expected) in [
            (local, Some("127.0.0.1:7780"), None, true),
            (
                local,
                Some("localhost:7780"),
                Some("http://localhost:3000"),
                true,
            ),
            (Some("[::1]:50000"), Some("[::1]:7780"), None, true),
            (local, Some("rebound.example:7780"), None, false),
            (
                local,
                Some("127.0.0.1:7780"),
                Some("https://evil.example"),
                false,
            ),
            (local, Some("127.0.0.1:7780"), Some("null"), false),
            (local, None, None, false),
            (Some("10.0.0.2:50000"), Some("127.0.0.1:7780"), None, false),
            (None, Some("127.0.0.1:7780"), None, false),
        ] {
            assert_eq!(
                from_this_machine(&request(peer, host, origin)),
                expected,
                "{peer:?} {host:?} {origin:?}"
            );
        }
    }

    #[test]
    fn the_bearer_token_is_read_in_any_case_of_the_scheme() {
        assert_eq!(bearer("Bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("bearer sk-one"), Some("sk-one"));
        assert_eq!(bearer("BEARER  sk-one "), Some("sk-one"));
        assert_eq!(bearer("Basic sk-one"), None);
        assert_eq!(bearer("sk-one"), None);
    }
}
