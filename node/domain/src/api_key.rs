//! Front-door API keys as the fleet shares them: a key's name rules and its [`KeyPolicy`] (the
//! models and roles it may use and its [`KeyLimits`]). The config (`[[http.keys]]`), the
//! replicated memory (keys added with `mesh-cli keys add`), the wire contract and the node's
//! key registry all speak these types; checking a presented key and counting usage is the
//! node's (`api_keys`), not this file's.

use serde::{Deserialize, Serialize};

/// Longest key name.
pub const MAX_KEY_NAME: usize = 64;

/// The record in the `http_keys` namespace that says keys were added at run time (no key name
/// can be it): from then on every front door of the fleet needs a key, also once the keys are
/// removed, so revoking the last key never opens the door to everyone. It is never deleted.
pub const KEYS_REQUIRED: &str = "!required";

/// How far apart the time an operator signed a key ([`KeyStatement::signed_ms`]) and the stamp
/// of the record that stores it may be (10 minutes): a statement replayed later makes a record
/// stamped long ago, which loses to the key's removal.
pub const MAX_SIGNING_SKEW_MS: u64 = 10 * 60 * 1000;

/// A key added at run time, as the replicated memory stores it (JSON under the key's name in
/// `http_keys`): the hash and policy the node uses, and the operator's signed statement of
/// them, which every node checks before it stores the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeKey {
    /// The key's SHA-256, hex.
    pub sha256: String,
    /// What it may do.
    pub policy: KeyPolicy,
    /// When it was added (Unix ms).
    pub created_ms: u64,
    /// The operator's [`KeyStatement`] of name, hash and policy; `None` only in insecure mode,
    /// where nobody has a certificate.
    #[serde(default)]
    pub grant: Option<crate::statement::Signed>,
}

/// An operator adding a front-door key, signed as a
/// [`StatementKind::KeyAdd`](crate::statement::StatementKind::KeyAdd): its name, the SHA-256 of
/// the key (the key itself never leaves the operator's machine), its policy, and when it was
/// signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyStatement {
    /// The key's name.
    pub name: String,
    /// SHA-256 of the key, 64 hex digits.
    pub sha256: String,
    /// What the key may do.
    pub policy: KeyPolicy,
    /// When the operator signed it (Unix ms).
    pub signed_ms: u64,
}

/// What a key may do: which models and roles it may ask for, and how much.
///
/// Stored as JSON in the replicated memory; fields a newer node adds are ignored by an older
/// one (no `deny_unknown_fields`), so a mixed-version fleet still authenticates the key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicy {
    /// Models it may ask for by name. With `roles`, empty both: every model and role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Roles it may ask for (`role:NAME`). With `models`, empty both: every model and role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// Its budgets and rate limits.
    #[serde(default)]
    pub limits: KeyLimits,
    /// The `mcp` scope: whether it may use the front door's `/mcp` (tasks run by agents, the
    /// fleet, the shared memory's user namespaces). A key without it reaches models only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mcp: bool,
}

/// A key's budgets (tokens per UTC day and month) and rate limits (per calendar minute), summed
/// over the whole fleet. `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    /// Prompt plus completion tokens per UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_day: Option<u64>,
    /// Prompt plus completion tokens per UTC calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_month: Option<u64>,
    /// Requests per calendar minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Prompt plus completion tokens per calendar minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
}

impl KeyLimits {
    /// Whether any limit is set (a key without one is only counted).
    pub fn any(&self) -> bool {
        self.max_tokens_per_day.is_some()
            || self.max_tokens_per_month.is_some()
            || self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
    }
}

impl KeyPolicy {
    /// Whether the key may ask for `target`: a model by name, or `role:NAME`. A persona is a
    /// role's settings, so it is allowed only to a key that allows everything.
    pub fn allows(&self, target: &crate::Target) -> bool {
        if self.models.is_empty() && self.roles.is_empty() {
            return true;
        }
        match target {
            crate::Target::Model(name) => self.models.iter().any(|m| m == name),
            crate::Target::Role(name) => self.roles.iter().any(|r| r == name),
            crate::Target::Persona(_) => false,
        }
    }
}

/// Checks a key name: 1-64 letters, digits, `-`, `_`, `.` (it is a memory key and a label).
pub fn check_key_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_KEY_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "key name `{}`: use 1-{MAX_KEY_NAME} letters, digits, `-`, `_`, `.`",
            name.chars().take(80).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;

    #[test]
    fn a_policy_allows_what_it_lists_and_everything_when_it_lists_nothing() {
        let open = KeyPolicy::default();
        let listed = KeyPolicy {
            models: vec!["m1".into()],
            roles: vec!["coder".into()],
            ..KeyPolicy::default()
        };
        let cases = [
            (&open, Target::Model("any".into()), true),
            (&open, Target::Persona("p".into()), true),
            (&listed, Target::Model("m1".into()), true),
            (&listed, Target::Model("m2".into()), false),
            (&listed, Target::Role("coder".into()), true),
            (&listed, Target::Role("m1".into()), false),
            (&listed, Target::Persona("coder".into()), false),
        ];
        for (policy, target, expected) in cases {
            assert_eq!(policy.allows(&target), expected, "{target}");
        }
    }

    #[test]
    fn key_names_are_checked() {
        assert!(check_key_name("team-a.dev_1").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_key_name(bad).is_err(), "{bad}");
        }
    }
}
