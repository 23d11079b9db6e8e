//! Names in the shared memory: which namespaces and keys are valid, and how large a value may
//! be. The memory, the wire contract (a task's session is a key) and the config (local
//! namespaces) all check names here. Also the keys of the system namespaces whose writer a key
//! names (a session's turns, a stored response, an approval, a node's key usage), which the
//! memory's writer rules read and the services that write them make.

use crate::{NodeId, id::is_tagged_by};

/// Longest namespace name.
pub const MAX_NAMESPACE: usize = 64;
/// Longest key.
pub const MAX_KEY: usize = 512;
/// Largest value.
pub const MAX_VALUE: usize = 1024 * 1024;

/// Namespace of the cron schedules (key: schedule name).
pub const CRON_SCHEDULES: &str = "cron";
/// Namespace of the cron firings (key: `schedule id/scheduled ms`).
pub const CRON_FIRINGS: &str = "cron_firings";
/// Namespace of the conversation sessions (key: [`turn_key`], one record per turn).
pub const SESSIONS: &str = "sessions";
/// Namespace of the certificates the mesh CA revoked (key: certificate id; value: the
/// CA-signed entry, written only through `Node.Revoke`).
pub const REVOCATIONS: &str = "revocations";
/// Namespace of the front door's stored Responses-API answers (key: response id; value: the
/// conversation up to and including that answer), for `previous_response_id` on any node.
pub const RESPONSES: &str = "responses";
/// Namespace of the front-door keys added at run time (key: the key's name; value: its
/// SHA-256 and policy, written only through `Keys.Add` and `Keys.Remove`).
pub const HTTP_KEYS: &str = "http_keys";
/// Namespace of the front-door keys' usage (key: `key name/UTC day/node id`; each node writes
/// only its own records).
pub const HTTP_KEY_USAGE: &str = "http_key_usage";
/// Namespace of the approval gates (key: approval id, the request and its outcome, written
/// only by the node running the task; `<approval id>/decision`, written only through
/// `Approvals.Decide`). An agent that could write here could approve its own calls.
pub const APPROVALS: &str = "approvals";
/// Namespace of the durable tasks' journals (keys and values: [`crate::journal`]): leases
/// written only by a task's origin, steps only by the executor of the current epoch.
pub const TASK_JOURNAL: &str = "task_journal";
/// Namespaces the node writes for itself, through its own services only: the cron schedules
/// and firings, the conversation sessions, the revocations, the stored responses, the
/// front-door keys and their usage, the approvals, and the task journals. Agents and clients may not write them.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    CRON_SCHEDULES,
    CRON_FIRINGS,
    SESSIONS,
    REVOCATIONS,
    RESPONSES,
    HTTP_KEYS,
    HTTP_KEY_USAGE,
    APPROVALS,
    TASK_JOURNAL,
];
/// System namespaces that callers may not read either (through `Memory.Get`/`List` or an
/// agent's memory tools): what they hold belongs to front-door clients (their conversations),
/// or is the keys' hashes and policies (shown without hashes through `Keys.List`), or a task's
/// prompts and tool outputs (shown to its watchers through `Tasks.Watch`), not to whoever
/// holds a certificate.
pub const PRIVATE_NAMESPACES: &[&str] = &[RESPONSES, HTTP_KEYS, TASK_JOURNAL];

/// Digits of a session turn's time: unix ms, zero-padded so turns sort by time.
const TURN_TIME_DIGITS: usize = 20;

/// The key of one turn of `session` in [`SESSIONS`], written by `writer`: `<session>/<unix ms,
/// 20 digits>-<task id>-<writer's short id>`. The task id keeps two turns of the same
/// millisecond apart; the writer's short id says which node may write the turn (see
/// [`is_turn_of`]).
pub fn turn_key(session: &str, at_ms: u64, task_id: &str, writer: &NodeId) -> String {
    format!(
        "{session}/{at_ms:0TURN_TIME_DIGITS$}-{task_id}-{}",
        writer.short()
    )
}

/// Whether `name` (what follows `<session>/`) is a turn's: 20 digits, `-`, then no `/` (so
/// the turns of a session named `a/b` are not read as `a`'s).
pub fn is_turn_name(name: &str) -> bool {
    name.len() > TURN_TIME_DIGITS + 1
        && name.as_bytes()[..TURN_TIME_DIGITS]
            .iter()
            .all(u8::is_ascii_digit)
        && name.as_bytes()[TURN_TIME_DIGITS] == b'-'
        && !name.contains('/')
}

/// Whether `key` of [`SESSIONS`] is a turn [`turn_key`] made for `writer`.
pub fn is_turn_of(key: &str, writer: &NodeId) -> bool {
    key.rsplit_once('/').is_some_and(|(session, name)| {
        !session.is_empty()
            && is_turn_name(name)
            && name
                .strip_suffix(writer.short())
                .is_some_and(|rest| rest.ends_with('-'))
    })
}

/// How a stored response's id starts.
pub const RESPONSE_ID_PREFIX: &str = "resp_";

/// A new id of a response stored by `writer` in [`RESPONSES`]: `resp_` and a UUIDv7 in hex whose
/// last 12 digits are the writer's short id ([`crate::id::tagged_uuid`]).
pub fn response_id(writer: &NodeId) -> String {
    format!(
        "{RESPONSE_ID_PREFIX}{}",
        crate::id::tagged_uuid(writer).simple()
    )
}

/// Whether `key` of [`RESPONSES`] is an id [`response_id`] made for `writer`.
pub fn is_response_of(key: &str, writer: &NodeId) -> bool {
    key.strip_prefix(RESPONSE_ID_PREFIX).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && is_tagged_by(hex, writer)
    })
}

/// The key of an approval's decision in [`APPROVALS`].
pub fn decision_key(approval_id: &str) -> String {
    format!("{approval_id}/decision")
}

/// Whether `key` of [`HTTP_KEY_USAGE`] is one of `writer`'s records (`<name>/<day>/<node id>`).
pub fn is_usage_of(key: &str, writer: &NodeId) -> bool {
    key.rsplit_once('/')
        .is_some_and(|(rest, node)| node == writer.as_str() && rest.contains('/'))
}

/// A namespace or key that is not valid; the message says what a valid one looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(pub String);

/// Checks a namespace name: 1-64 letters, digits, `-`, `_`, `.`.
pub fn check_namespace(ns: &str) -> Result<(), InvalidName> {
    let ok = !ns.is_empty()
        && ns.len() <= MAX_NAMESPACE
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(InvalidName(format!(
            "namespace `{}`: use 1-{MAX_NAMESPACE} letters, digits, `-`, `_`, `.`",
            ns.chars().take(80).collect::<String>()
        )))
    }
}

/// Checks a key: 1-512 bytes without NUL.
pub fn check_key(key: &str) -> Result<(), InvalidName> {
    if key.is_empty() || key.len() > MAX_KEY || key.contains('\0') {
        return Err(InvalidName(format!(
            "key: must be 1-{MAX_KEY} bytes without NUL"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_name_their_writer_name_no_other_node() {
        let writer = NodeId::from_spki_der(b"writer");
        let other = NodeId::from_spki_der(b"other");
        let turn = turn_key("ada/x", 1, "task", &writer);
        assert!(turn.starts_with("ada/x/00000000000000000001-task-"));
        assert!(is_turn_of(&turn, &writer));
        assert!(!is_turn_of(&turn, &other));
        assert!(
            !is_turn_of("ada", &writer),
            "the single record of an old session"
        );
        assert!(!is_turn_of(
            &format!("ada/0001-{}", writer.short()),
            &writer
        ));
        assert!(is_turn_name("00000000000000000001-task"));
        assert!(!is_turn_name("x/00000000000000000001-task"));
        assert!(!is_turn_name("0001-task"));

        let response = response_id(&writer);
        assert!(is_response_of(&response, &writer), "{response}");
        assert!(!is_response_of(&response, &other));
        assert!(!is_response_of(&format!("x{response}"), &writer));
        assert!(!is_response_of(
            &format!("resp_{}", writer.short()),
            &writer
        ));

        let usage = format!("k/2025-01-01/{writer}");
        assert!(is_usage_of(&usage, &writer));
        assert!(!is_usage_of(&usage, &other));
        assert!(!is_usage_of(&format!("k/{writer}"), &writer));
        assert_eq!(decision_key("a"), "a/decision");
    }
}
