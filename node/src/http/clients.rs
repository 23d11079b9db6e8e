//! How the front door meets clients it did not write: request fields the mesh does not know
//! (`http.unknown_fields`), model names the fleet does not have (`http.model_aliases`), and
//! the `x-agentmesh-*` headers every dialect shares ([`failover`], [`dropped_header`]).
//!
//! Clients such as Claude Code and Codex send fields their vendor's API accepts and the mesh
//! has no use for, and add new ones with each release. By default such a field is accepted and
//! ignored, and said once per client and field at debug ([`Clients::ignored`]); with
//! `unknown_fields = "refuse"` it is a 400 naming it, which each dialect words as its API does
//! ([`Unknown`]). A field that would change the answer and cannot be honoured is refused either
//! way: that decision is each dialect's, field by field, never this module's. Model aliases map
//! a name no model or role of the fleet has to one it has ([`Clients::resolve`]), so a client
//! that insists on its vendor's model names reaches the fleet. It must not read request bodies
//! or place calls.

use std::{collections::HashSet, sync::Mutex};

use axum::http::{HeaderMap, HeaderValue, header};

use super::error::ApiError;
use crate::{
    config::{HttpConfig, ModelAlias, UnknownFields},
    gateway::Failover,
};

/// Most (client, field) pairs remembered as logged; past it the memory starts again, so a
/// client that makes up field names cannot make it grow.
const MAX_LOGGED: usize = 4096;
/// Most unknown fields one request's reading keeps, and most items one request logs; the rest
/// are still ignored.
pub(crate) const MAX_NOTED: usize = 32;
/// Longest client name kept (a `User-Agent` can be long).
const MAX_CLIENT_LEN: usize = 80;

/// The front door's settings for unknown fields and model names, and what it has logged.
#[derive(Debug)]
pub(crate) struct Clients {
    /// `http.unknown_fields`.
    unknown_fields: UnknownFields,
    /// `http.model_aliases`, most specific first.
    aliases: Vec<ModelAlias>,
    /// (client, field) pairs whose being ignored was logged, so it is said once, not per
    /// request.
    logged: Mutex<HashSet<(String, String)>>,
}

impl Clients {
    /// The settings of `http`.
    pub(crate) fn new(http: &HttpConfig) -> Self {
        Self {
            unknown_fields: http.unknown_fields,
            aliases: http.model_aliases.clone(),
            logged: Mutex::default(),
        }
    }

    /// A reading of one request under these settings.
    pub(crate) fn reading(&self) -> Unknown {
        Unknown::new(self.unknown_fields)
    }

    /// The model `asked` stands for: itself when `fleet_has` it (or no alias covers it), else
    /// the target of the most specific alias that covers it.
    pub(crate) fn resolve(&self, asked: &str, fleet_has: impl FnOnce(&str) -> bool) -> String {
        if self.aliases.is_empty() {
            return asked.to_owned();
        }
        let Some(alias) = alias_for(&self.aliases, asked) else {
            return asked.to_owned();
        };
        if fleet_has(asked) {
            return asked.to_owned();
        }
        tracing::debug!(asked, target = %alias.target, "model name mapped by http.model_aliases");
        alias.target.clone()
    }

    /// Says at debug, once per client and field, that `reading`'s unknown fields were ignored
    /// on `endpoint`.
    pub(crate) fn ignored(&self, client: &str, endpoint: &str, reading: &Unknown) {
        if reading.found.is_empty() || !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let fresh = self.first_time(client, &reading.found);
        if !fresh.is_empty() {
            tracing::debug!(
                client,
                endpoint,
                fields = %fresh.join(", "),
                "request fields the mesh does not use were ignored (http.unknown_fields = \"refuse\" answers them with a 400)"
            );
        }
    }

    /// Says at info, once per client and tool, that the `dropped` tools of a request to
    /// `endpoint` were not offered to the model.
    pub(crate) fn dropped_tools(&self, client: &str, endpoint: &str, dropped: &[String]) {
        if dropped.is_empty() {
            return;
        }
        let fresh = self.first_time(client, dropped);
        if !fresh.is_empty() {
            tracing::info!(
                client,
                endpoint,
                tools = %fresh.join(", "),
                "tools the fleet cannot run were not offered to the model (the answer's x-agentmesh-dropped-tools header names them)"
            );
        }
    }

    /// Those of `items` not yet logged for `client`, now remembered as logged.
    fn first_time<'a>(&self, client: &str, items: &'a [String]) -> Vec<&'a str> {
        let mut logged = self.logged.lock().expect("the log set is never poisoned");
        if logged.len() + items.len() > MAX_LOGGED {
            logged.clear();
        }
        items
            .iter()
            .take(MAX_NOTED)
            .filter(|item| logged.insert((client.to_owned(), (*item).clone())))
            .map(String::as_str)
            .collect()
    }
}

/// The most specific alias that covers `asked`.
fn alias_for<'a>(aliases: &'a [ModelAlias], asked: &str) -> Option<&'a ModelAlias> {
    aliases.iter().find(|alias| {
        if alias.prefix {
            asked.starts_with(&alias.pattern)
        } else {
            asked == alias.pattern
        }
    })
}

/// Who a request came from, for the log: its key's name (`key`), else its `User-Agent`.
pub(crate) fn client_name(key: Option<&str>, headers: &HeaderMap) -> String {
    let name = match key {
        Some(key) => format!("key {key}"),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("a client without User-Agent")
            .to_owned(),
    };
    mesh_domain::text::truncate(&name, MAX_CLIENT_LEN).to_owned()
}

/// The request header that turns failover off once text went out: `off` (`on`, the default,
/// keeps it).
pub(crate) const FAILOVER_HEADER: &str = "x-agentmesh-failover";

/// What a chat asked with `headers` does when the node serving it fails after passing text on:
/// a `streamed` answer continues on the next node from that text (the client has it already),
/// a whole one is asked again there; with [`FAILOVER_HEADER`] `off` it ends with the failure,
/// as a client that wants strict behaviour asks. Another value is a 400 naming the header.
pub(crate) fn failover(headers: &HeaderMap, streamed: bool) -> Result<Failover, ApiError> {
    let on = match headers.get(FAILOVER_HEADER).map(HeaderValue::to_str) {
        None => true,
        Some(Ok(value)) if value.trim().eq_ignore_ascii_case("on") => true,
        Some(Ok(value)) if value.trim().eq_ignore_ascii_case("off") => false,
        Some(value) => {
            let shown = value.map_or("(not text)", |v| mesh_domain::text::truncate(v, 64));
            return Err(ApiError::bad_request(format!(
                "{FAILOVER_HEADER}: `{shown}` is neither `on` nor `off` (`off` ends a chat whose node fails mid-answer instead of going on on the next node)"
            )));
        }
    };
    Ok(match (on, streamed) {
        (false, _) => Failover::Off,
        (true, true) => Failover::Continue,
        (true, false) => Failover::Whole,
    })
}

/// The response header naming a request's tools the model was not offered.
pub(crate) const DROPPED_TOOLS_HEADER: &str = "x-agentmesh-dropped-tools";

/// The [`DROPPED_TOOLS_HEADER`] naming the `dropped` tools (the first [`MAX_NOTED`], then how
/// many more), when there are any.
pub(crate) fn dropped_header(dropped: &[String]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if dropped.is_empty() {
        return headers;
    }
    let mut text = dropped[..dropped.len().min(MAX_NOTED)].join(", ");
    if dropped.len() > MAX_NOTED {
        text.push_str(&format!(", and {} more", dropped.len() - MAX_NOTED));
    }
    if let Ok(value) = HeaderValue::from_str(&text) {
        headers.insert(DROPPED_TOOLS_HEADER, value);
    }
    headers
}

/// How a dropped tool is named in the [`DROPPED_TOOLS_HEADER`] and the log: `kind`, and `name`
/// when it has one (`custom:apply_patch`, `web_search`), in printable ASCII and at most 64
/// characters.
pub(crate) fn dropped_name(kind: &str, name: Option<&str>) -> String {
    let text = match name {
        Some(name) => format!("{kind}:{name}"),
        None => kind.to_owned(),
    };
    text.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(64)
        .collect()
}

/// The unknown fields of one request, as its dialect's reading finds them.
#[derive(Debug)]
pub(crate) struct Unknown {
    policy: UnknownFields,
    /// Paths of the fields ignored so far (at most [`MAX_NOTED`]).
    found: Vec<String>,
}

impl Unknown {
    /// A reading under `policy`.
    pub(crate) fn new(policy: UnknownFields) -> Self {
        Self {
            policy,
            found: Vec::new(),
        }
    }

    /// Notes the unknown field at `path`: `Ok` when it is ignored, `Err` with the path when the
    /// policy refuses it (the dialect words the refusal as its API does).
    pub(crate) fn note(&mut self, path: String) -> Result<(), String> {
        match self.policy {
            UnknownFields::Refuse => Err(path),
            UnknownFields::Ignore => {
                if self.found.len() < MAX_NOTED {
                    self.found.push(path);
                }
                Ok(())
            }
        }
    }

    /// The fields ignored so far.
    #[cfg(test)]
    pub(crate) fn found(&self) -> &[String] {
        &self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Listen;

    /// A streamed answer continues, a whole one is asked again, `off` (any case) is strict,
    /// and another value is a 400 naming the header.
    #[test]
    fn the_failover_header_only_makes_a_chat_stricter() {
        let with = |value: Option<&str>, streamed| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(
                    FAILOVER_HEADER,
                    HeaderValue::from_str(value).expect("value"),
                );
            }
            failover(&headers, streamed).map_err(|e| e.message)
        };
        assert_eq!(with(None, true), Ok(Failover::Continue));
        assert_eq!(with(None, false), Ok(Failover::Whole));
        assert_eq!(with(Some("on"), true), Ok(Failover::Continue));
        assert_eq!(with(Some("Off"), true), Ok(Failover::Off));
        assert_eq!(with(Some("off"), false), Ok(Failover::Off));
        let refused = with(Some("sometimes"), true).expect_err("not on or off");
        assert!(
            refused.starts_with("x-agentmesh-failover: `sometimes`"),
            "{refused}"
        );
    }

    fn clients(aliases: &[(&str, bool, &str)]) -> Clients {
        Clients::new(&HttpConfig {
            listen: Listen {
                addr: "127.0.0.1:0".parse().expect("addr"),
                fallback: false,
            },
            api_keys: Vec::new(),
            keys: Vec::new(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            loopback_without_key: false,
            unknown_fields: UnknownFields::Ignore,
            model_aliases: aliases
                .iter()
                .map(|(pattern, prefix, target)| ModelAlias {
                    pattern: (*pattern).into(),
                    prefix: *prefix,
                    target: (*target).into(),
                })
                .collect(),
        })
    }

    #[test]
    fn an_alias_maps_only_names_the_fleet_does_not_have() {
        // As validation sorts them: most specific first.
        let clients = clients(&[
            ("claude-haiku-", true, "role:chat"),
            ("claude-", true, "role:coder"),
            ("gpt-4o", false, "qwen"),
        ]);
        let nothing = |_: &str| false;
        assert_eq!(clients.resolve("claude-sonnet-4-5", nothing), "role:coder");
        assert_eq!(clients.resolve("claude-haiku-4-5", nothing), "role:chat");
        assert_eq!(clients.resolve("gpt-4o", nothing), "qwen");
        assert_eq!(clients.resolve("gpt-4o-mini", nothing), "gpt-4o-mini");
        assert_eq!(clients.resolve("role:coder", nothing), "role:coder");
        // A name the fleet serves is its own.
        assert_eq!(
            clients.resolve("claude-local", |name| name == "claude-local"),
            "claude-local"
        );
    }

    /// A client that makes up new field names with every request grows the set of logged
    /// (client, field) pairs only to its bound: past it the set starts again.
    #[test]
    fn what_was_logged_is_remembered_within_a_bound() {
        let clients = clients(&[]);
        let fields: Vec<String> = (0..MAX_NOTED).map(|i| format!("f{i}")).collect();
        assert_eq!(clients.first_time("a", &fields).len(), MAX_NOTED);
        assert!(clients.first_time("a", &fields).is_empty(), "logged once");
        assert_eq!(clients.first_time("b", &fields[..1]).len(), 1, "per client");
        for round in 0..(2 * MAX_LOGGED / MAX_NOTED) {
            let fresh: Vec<String> = (0..MAX_NOTED).map(|i| format!("r{round}-{i}")).collect();
            clients.first_time("flood", &fresh);
            let held = clients.logged.lock().expect("lock").len();
            assert!(held <= MAX_LOGGED, "{held}");
        }
        let many: Vec<String> = (0..10 * MAX_NOTED).map(|i| format!("m{i}")).collect();
        assert_eq!(
            clients.first_time("c", &many).len(),
            MAX_NOTED,
            "at most per request"
        );
    }

    #[test]
    fn a_refusing_reading_hands_the_path_back_and_an_ignoring_one_keeps_a_bounded_list() {
        let mut refusing = Unknown::new(UnknownFields::Refuse);
        assert_eq!(
            refusing.note("client_metadata".into()),
            Err("client_metadata".into())
        );
        let mut ignoring = Unknown::new(UnknownFields::Ignore);
        for i in 0..100 {
            ignoring.note(format!("f{i}")).expect("ignored");
        }
        assert_eq!(ignoring.found().len(), MAX_NOTED);
    }
}
