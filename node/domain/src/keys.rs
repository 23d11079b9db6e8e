//! Names in the shared memory: which namespaces and keys are valid, and how large a value may
//! be. The memory, the wire contract (a task's session is a key) and the config (local
//! namespaces) all check names here.

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
/// Namespace of the conversation sessions (key: session name).
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
/// Namespaces the node writes for itself, through its own services only: the cron schedules
/// and firings, the conversation sessions, the revocations, the stored responses, the
/// front-door keys and their usage, and the approvals. Agents and clients may not write them.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    CRON_SCHEDULES,
    CRON_FIRINGS,
    SESSIONS,
    REVOCATIONS,
    RESPONSES,
    HTTP_KEYS,
    HTTP_KEY_USAGE,
    APPROVALS,
];
/// System namespaces that callers may not read either (through `Memory.Get`/`List` or an
/// agent's memory tools): what they hold belongs to front-door clients (their conversations),
/// or is the keys' hashes and policies (shown without hashes through `Keys.List`), not to
/// whoever holds a certificate.
pub const PRIVATE_NAMESPACES: &[&str] = &[RESPONSES, HTTP_KEYS];

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
