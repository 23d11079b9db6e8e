//! `http.unknown_fields` and `http.model_aliases`: how the front door meets clients that send
//! fields the mesh does not know, or model names the fleet does not have. Applying them is the
//! front door's (`http::clients`); this only checks what the file says.

use std::collections::BTreeMap;

use mesh_domain::Target;

use crate::config::{
    error::{ConfigError, Origin},
    types::{ModelAlias, UnknownFields},
};

/// Most `http.model_aliases` entries: a list an operator writes by hand, and one that every
/// request's model name is matched against.
const MAX_ALIASES: usize = 256;
/// Longest pattern or target of an alias, in bytes (model names are far shorter).
const MAX_ALIAS_LEN: usize = 200;

/// `http.unknown_fields`: `ignore` (the default) or `refuse`.
pub(super) fn unknown_fields(
    raw: Option<&str>,
    origin: &Origin,
) -> Result<UnknownFields, ConfigError> {
    match raw {
        None | Some("ignore") => Ok(UnknownFields::Ignore),
        Some("refuse") => Ok(UnknownFields::Refuse),
        Some(other) => Err(origin.invalid(
            "http.unknown_fields",
            format!("is `{other}`, not `ignore` or `refuse`"),
            "leave it out (or write \"ignore\") to accept request fields the mesh does not use, as the APIs' newest clients need; write \"refuse\" to answer them with a 400 naming the field",
        )),
    }
}

/// `http.model_aliases`: each pattern a model name, or the start of names with a trailing `*`;
/// each target a model name or `role:NAME`. Sorted longest pattern first, so the first match
/// is the most specific.
pub(super) fn model_aliases(
    raw: BTreeMap<String, String>,
    origin: &Origin,
) -> Result<Vec<ModelAlias>, ConfigError> {
    if raw.len() > MAX_ALIASES {
        return Err(origin.invalid(
            "http.model_aliases",
            format!("has {} entries, more than {MAX_ALIASES}", raw.len()),
            "cover families of names with one pattern each, e.g. \"claude-*\" = \"role:coder\"",
        ));
    }
    let mut aliases = Vec::with_capacity(raw.len());
    for (pattern, target) in raw {
        let key = format!("http.model_aliases.{pattern:?}");
        let invalid = |problem: String, fix: &str| origin.invalid(&key, problem, fix);
        let (name, prefix) = match pattern.strip_suffix('*') {
            Some(start) => (start.to_owned(), true),
            None => (pattern.clone(), false),
        };
        if pattern.len() > MAX_ALIAS_LEN || target.len() > MAX_ALIAS_LEN {
            return Err(invalid(
                format!("is longer than {MAX_ALIAS_LEN} bytes (pattern or target)"),
                "model names are short; cover a family of names with a trailing `*`",
            ));
        }
        if name.is_empty() || name.contains('*') || name.chars().any(char::is_whitespace) {
            return Err(invalid(
                "is not a model name, or the start of names followed by one `*` at the end".into(),
                "write the name a client sends (\"gpt-4o\"), or the start of a family of names (\"claude-*\")",
            ));
        }
        if name.starts_with("role:") || name.starts_with("persona:") {
            return Err(invalid(
                "names a role or persona, which the fleet already answers to".into(),
                "alias the model names clients send, e.g. \"claude-*\"",
            ));
        }
        match target.parse::<Target>() {
            Ok(Target::Role(_) | Target::Model(_)) if !target.chars().any(char::is_whitespace) => {}
            _ => {
                return Err(invalid(
                    format!("maps to `{target}`, which is not a model name or `role:NAME`"),
                    "map it to a model of the fleet (\"qwen2.5-coder\") or a role's chain (\"role:coder\")",
                ));
            }
        }
        aliases.push(ModelAlias {
            pattern: name,
            prefix,
            target,
        });
    }
    // Longest first; an exact name before a prefix of the same length.
    aliases.sort_by(|a, b| {
        b.pattern
            .len()
            .cmp(&a.pattern.len())
            .then(a.prefix.cmp(&b.prefix))
    });
    Ok(aliases)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::tests::{err, parse};

    #[test]
    fn unknown_fields_defaults_to_ignore_and_takes_refuse() {
        assert_eq!(
            parse("").expect("valid").http.unknown_fields,
            UnknownFields::Ignore
        );
        assert_eq!(
            parse("[http]\nunknown_fields = \"refuse\"\n")
                .expect("valid")
                .http
                .unknown_fields,
            UnknownFields::Refuse
        );
        let message = err("[http]\nunknown_fields = \"drop\"\n");
        assert!(message.contains("http.unknown_fields"), "{message}");
        assert!(message.contains("`drop`"), "{message}");
        assert!(message.contains("\"refuse\""), "{message}");
    }

    #[test]
    fn aliases_are_sorted_most_specific_first_and_bad_ones_are_named() {
        let config = parse(
            "[http.model_aliases]\n\"claude-*\" = \"role:coder\"\n\"claude-haiku-*\" = \"role:chat\"\n\"gpt-4o\" = \"qwen\"\n",
        )
        .expect("valid");
        let patterns: Vec<(&str, bool, &str)> = config
            .http
            .model_aliases
            .iter()
            .map(|a| (a.pattern.as_str(), a.prefix, a.target.as_str()))
            .collect();
        assert_eq!(
            patterns,
            [
                ("claude-haiku-", true, "role:chat"),
                ("claude-", true, "role:coder"),
                ("gpt-4o", false, "qwen"),
            ]
        );
        for (bad, wanted) in [
            ("\"*\" = \"role:chat\"", "not a model name"),
            ("\"cl*ude\" = \"role:chat\"", "not a model name"),
            ("\"a b\" = \"role:chat\"", "not a model name"),
            ("\"role:x\" = \"role:chat\"", "names a role"),
            (
                "\"gpt\" = \"persona:reviewer\"",
                "not a model name or `role:NAME`",
            ),
            ("\"gpt\" = \"role:\"", "not a model name or `role:NAME`"),
            ("\"gpt\" = \"\"", "not a model name or `role:NAME`"),
        ] {
            let message = err(&format!("[http.model_aliases]\n{bad}\n"));
            assert!(message.contains("http.model_aliases."), "{bad}: {message}");
            assert!(message.contains(wanted), "{bad}: {message}");
        }
        let many: String = (0..=MAX_ALIASES)
            .map(|i| format!("\"m{i}\" = \"role:chat\"\n"))
            .collect();
        let message = err(&format!("[http.model_aliases]\n{many}"));
        assert!(message.contains("more than 256"), "{message}");
    }
}
