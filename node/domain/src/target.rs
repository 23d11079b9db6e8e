//! What runs a task or a chat: a role's model chain, one model, or a persona.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// What runs a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A role's model chain.
    Role(String),
    /// One model.
    Model(String),
    /// A persona (its role's chain, prompt, tools and tier).
    Persona(String),
}

/// A target text with an empty name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` names no role, model or persona: use `role:NAME`, `persona:NAME` or a model name")]
pub struct InvalidTarget(pub String);

impl Target {
    /// The name of the role, model or persona.
    pub fn name(&self) -> &str {
        match self {
            Self::Role(name) | Self::Model(name) | Self::Persona(name) => name,
        }
    }

    /// The id OpenAI clients use for it: `role:NAME` for a role, the bare name for a model (as
    /// `/v1/models` lists them), `persona:NAME` for a persona.
    pub fn model_id(&self) -> String {
        match self {
            Self::Model(name) => name.clone(),
            other => other.to_string(),
        }
    }
}

/// `role:NAME`, `model:NAME` or `persona:NAME`.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Role(r) => write!(f, "role:{r}"),
            Self::Model(m) => write!(f, "model:{m}"),
            Self::Persona(p) => write!(f, "persona:{p}"),
        }
    }
}

/// Reads what [`Display`](fmt::Display) writes, and a bare name as a model (the form OpenAI
/// clients send). Names of roles, models and personas contain no `:`, so the prefixes are
/// unambiguous.
impl FromStr for Target {
    type Err = InvalidTarget;

    fn from_str(text: &str) -> Result<Self, InvalidTarget> {
        let target = if let Some(role) = text.strip_prefix("role:") {
            Self::Role(role.to_owned())
        } else if let Some(persona) = text.strip_prefix("persona:") {
            Self::Persona(persona.to_owned())
        } else {
            Self::Model(text.strip_prefix("model:").unwrap_or(text).to_owned())
        };
        if target.name().is_empty() {
            return Err(InvalidTarget(text.to_owned()));
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_read_back_what_they_write_and_bare_names_are_models() {
        for target in [
            Target::Role("chat".into()),
            Target::Model("qwen".into()),
            Target::Persona("reviewer".into()),
        ] {
            assert_eq!(target.to_string().parse::<Target>(), Ok(target.clone()));
        }
        assert_eq!("qwen".parse(), Ok(Target::Model("qwen".into())));
        assert_eq!(Target::Model("qwen".into()).model_id(), "qwen");
        assert_eq!(Target::Role("chat".into()).model_id(), "role:chat");
        for bad in ["", "role:", "model:", "persona:"] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?}");
        }
    }
}
