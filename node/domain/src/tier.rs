//! Permission tiers: what a task may do, what a tool does, and what a node lets others ask of it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Permission tiers of tools, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Reads only.
    Read,
    /// Writes memory or files.
    Write,
    /// Runs commands.
    Shell,
}

impl Tier {
    /// Parses `read`, `write` or `shell`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "shell" => Some(Self::Shell),
            _ => None,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Shell => "shell",
        })
    }
}
