//! `[[http.keys]]`: named front-door keys, each known by its SHA-256 or by a key file, with the
//! models and roles it may use and its budgets and rate limits. Reading a key file (and checking
//! its mode) is the key registry's, when the node starts: config reads no secrets.

use std::collections::BTreeSet;

use mesh_domain::{KeyLimits, KeyPolicy, api_key::check_key_name};

use crate::config::{
    error::{ConfigError, Origin},
    raw::RawHttpKey,
    types::{HttpKey, KeySecret},
};

/// Checks every `[[http.keys]]` entry; errors name the entry (`http.keys[i]`, with its name when
/// it has a valid one) and the field.
pub(super) fn http_keys(
    raw: Vec<RawHttpKey>,
    origin: &Origin,
) -> Result<Vec<HttpKey>, ConfigError> {
    let mut names = BTreeSet::new();
    let mut keys = Vec::with_capacity(raw.len());
    for (i, entry) in raw.into_iter().enumerate() {
        let at = |field: &str| format!("http.keys[{i}].{field}");
        check_key_name(&entry.name).map_err(|problem| {
            origin.invalid(
                &at("name"),
                format!("is not valid ({problem})"),
                "give every [[http.keys]] entry a name like `team-a`: usage and limits are counted per name",
            )
        })?;
        let named = |field: &str| format!("http.keys[{i}] (`{}`).{field}", entry.name);
        if !names.insert(entry.name.clone()) {
            return Err(origin.invalid(
                &named("name"),
                "is used by an earlier entry".into(),
                "give each key its own name",
            ));
        }
        let secret = match (entry.key_sha256, entry.key_file) {
            (Some(hash), None) => KeySecret::Sha256(parse_sha256(&hash).ok_or_else(|| {
                origin.invalid(
                    &named("key_sha256"),
                    "is not 64 hex digits".into(),
                    "write the key's SHA-256 in hex, e.g. the first word of `printf %s \"$KEY\" | sha256sum`",
                )
            })?),
            (None, Some(path)) => KeySecret::File(path),
            (Some(_), Some(_)) => {
                return Err(origin.invalid(
                    &named("key_sha256"),
                    "is set together with key_file".into(),
                    "keep one: the key's hash (key_sha256) or a file holding the key (key_file)",
                ));
            }
            (None, None) => {
                return Err(origin.invalid(
                    &named("key_sha256"),
                    "is missing (and so is key_file)".into(),
                    "set key_sha256 to the key's SHA-256 (`printf %s \"$KEY\" | sha256sum`) or key_file to a file (mode 0600) holding the key",
                ));
            }
        };
        for (field, list) in [("models", &entry.models), ("roles", &entry.roles)] {
            if let Some(j) = list.iter().position(|name| name.trim().is_empty()) {
                return Err(origin.invalid(
                    &named(&format!("{field}[{j}]")),
                    "is empty".into(),
                    "list names, or leave both models and roles out to allow everything",
                ));
            }
        }
        let limits = KeyLimits {
            max_tokens_per_day: entry.max_tokens_per_day,
            max_tokens_per_month: entry.max_tokens_per_month,
            requests_per_minute: entry.requests_per_minute,
            tokens_per_minute: entry.tokens_per_minute,
        };
        for (field, value) in [
            ("max_tokens_per_day", limits.max_tokens_per_day),
            ("max_tokens_per_month", limits.max_tokens_per_month),
            ("requests_per_minute", limits.requests_per_minute),
            ("tokens_per_minute", limits.tokens_per_minute),
        ] {
            if value == Some(0) {
                return Err(origin.invalid(
                    &named(field),
                    "is 0, which would refuse every request".into(),
                    "leave it out for no limit, or remove the key to refuse it",
                ));
            }
        }
        keys.push(HttpKey {
            name: entry.name,
            secret,
            policy: KeyPolicy {
                models: entry.models,
                roles: entry.roles,
                limits,
                mcp: entry.mcp,
            },
        });
    }
    Ok(keys)
}

/// 32 bytes from 64 hex digits (either case).
fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text.trim()).ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use crate::config::validate::tests::{err, parse};

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn keys_are_read_with_their_policies() {
        let http = parse(&format!(
            "[[http.keys]]\nname = \"team-a\"\nkey_sha256 = \"{HASH}\"\nmodels = [\"m1\"]\nmax_tokens_per_day = 1000\nrequests_per_minute = 5\n\n[[http.keys]]\nname = \"bot\"\nkey_file = \"bot.key\"\n"
        ))
        .expect("valid")
        .http;
        assert_eq!(http.keys.len(), 2);
        assert_eq!(http.keys[0].name, "team-a");
        assert_eq!(http.keys[0].policy.models, ["m1"]);
        assert_eq!(http.keys[0].policy.limits.max_tokens_per_day, Some(1000));
        assert_eq!(http.keys[0].policy.limits.requests_per_minute, Some(5));
        assert_eq!(http.keys[0].policy.limits.tokens_per_minute, None);
        assert!(matches!(
            &http.keys[1].secret,
            crate::config::KeySecret::File(path) if path.ends_with("bot.key")
        ));
    }

    #[test]
    fn bad_keys_are_refused_naming_the_entry_and_field() {
        let cases = [
            ("name = \"a b\"\nkey_file = \"k\"", "`http.keys[0].name`"),
            ("name = \"a\"", "`http.keys[0] (`a`).key_sha256` is missing"),
            ("name = \"a\"\nkey_sha256 = \"abc\"", "is not 64 hex digits"),
            (
                &format!("name = \"a\"\nkey_sha256 = \"{HASH}\"\nkey_file = \"k\""),
                "together with key_file",
            ),
            (
                &format!("name = \"a\"\nkey_sha256 = \"{HASH}\"\nmax_tokens_per_day = 0"),
                "`http.keys[0] (`a`).max_tokens_per_day` is 0",
            ),
            (
                &format!("name = \"a\"\nkey_sha256 = \"{HASH}\"\nmodels = [\"\"]"),
                "models[0]",
            ),
            (
                &format!("name = \"a\"\nkey_sha256 = \"{HASH}\"\nbudget = 3"),
                "budget",
            ),
        ];
        for (entry, expected) in cases {
            let message = err(&format!("[[http.keys]]\n{entry}\n"));
            assert!(message.contains(expected), "{entry}: {message}");
        }
        let message = err(&format!(
            "[[http.keys]]\nname = \"a\"\nkey_file = \"k\"\n[[http.keys]]\nname = \"a\"\nkey_sha256 = \"{HASH}\"\n"
        ));
        assert!(
            message.contains("`http.keys[1] (`a`).name` is used"),
            "{message}"
        );
    }
}
