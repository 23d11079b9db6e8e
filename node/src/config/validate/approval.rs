//! Checks `[approval]`: the tiers, tool names and MCP server names whose calls wait for a
//! person, how long they wait and how many may wait at once. It must not decide whether a call
//! needs approval (that is `approvals::ApprovalPolicy`) or check that a listed tool exists: MCP
//! tools appear only once their servers run.

use std::{collections::BTreeSet, time::Duration};

use mesh_domain::Tier;

use super::syntax::{is_tool_name, is_valid_name};
use crate::config::{
    error::{ConfigError, Origin},
    raw::RawApproval,
    types::ApprovalConfig,
};

/// Most names in each of `approval.tiers`, `approval.tools` and `approval.servers`.
const MAX_LISTED: usize = 256;
/// Longest wait for a decision, in seconds: 9 minutes, within the 10 minutes a forwarding
/// node waits for the next event of a task before it takes the executing node for lost
/// (`mesh_tls::deadline`'s `task_idle`); a waiting call sends none.
const MAX_TIMEOUT_S: u64 = 540;
/// Most calls that may wait at once.
const MAX_PENDING: usize = 1024;

/// `[approval]`: every name well-formed and listed once at most, `timeout_s` from 1 to 540
/// (default 300), `max_pending` from 1 to 1024 (default 16).
pub(super) fn approval(raw: RawApproval, origin: &Origin) -> Result<ApprovalConfig, ConfigError> {
    let defaults = ApprovalConfig::default();
    let listed = |key: &str, names: Vec<String>, valid: &dyn Fn(&str) -> bool, fix: &str| {
        if names.len() > MAX_LISTED {
            return Err(origin.invalid(
                key,
                format!("lists {} names", names.len()),
                &format!("list at most {MAX_LISTED}"),
            ));
        }
        let mut set = BTreeSet::new();
        for (i, name) in names.into_iter().enumerate() {
            if !valid(&name) {
                return Err(origin.invalid(
                    &format!("{key}[{i}]"),
                    format!("is `{}`", name.escape_debug()),
                    fix,
                ));
            }
            if !set.insert(name.clone()) {
                return Err(origin.invalid(
                    &format!("{key}[{i}]"),
                    format!("lists `{name}` twice"),
                    "list each name once",
                ));
            }
        }
        Ok(set)
    };
    let tiers = listed(
        "approval.tiers",
        raw.tiers,
        &|t| Tier::parse(t).is_some(),
        "use `read`, `write` or `shell`",
    )?
    .iter()
    .filter_map(|t| Tier::parse(t))
    .collect();
    let tools = listed(
        "approval.tools",
        raw.tools,
        &is_tool_name,
        "use a tool's name: 1-64 letters, digits, `-` or `_` (e.g. `shell_exec`, or an MCP tool's `<server>__<tool>`)",
    )?;
    let servers = listed(
        "approval.servers",
        raw.servers,
        &is_valid_name,
        "use an `[[mcp]] name`: 1-63 letters, digits, `-` or `_`",
    )?;
    let timeout_s = raw.timeout_s.unwrap_or(defaults.timeout.as_secs());
    if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
        return Err(origin.invalid(
            "approval.timeout_s",
            format!("is {timeout_s}"),
            &format!("use 1-{MAX_TIMEOUT_S} seconds (default 300)"),
        ));
    }
    let max_pending = raw.max_pending.unwrap_or(defaults.max_pending);
    if !(1..=MAX_PENDING).contains(&max_pending) {
        return Err(origin.invalid(
            "approval.max_pending",
            format!("is {max_pending}"),
            &format!("use 1-{MAX_PENDING} (default 16)"),
        ));
    }
    Ok(ApprovalConfig {
        tiers,
        tools,
        servers,
        timeout: Duration::from_secs(timeout_s),
        max_pending,
    })
}

#[cfg(test)]
mod tests {
    use mesh_domain::Tier;

    use crate::config::validate::tests::{err, parse};

    #[test]
    fn no_section_means_no_approvals() {
        let approval = parse("").expect("valid").approval;
        assert!(approval.tiers.is_empty() && approval.tools.is_empty());
        assert!(approval.servers.is_empty());
        assert_eq!(approval.timeout.as_secs(), 300);
        assert_eq!(approval.max_pending, 16);
    }

    #[test]
    fn a_full_section_parses() {
        let approval = parse(
            r#"
            [approval]
            tiers = ["shell"]
            tools = ["file_write", "time__get_current_time"]
            servers = ["git"]
            timeout_s = 60
            max_pending = 4
            "#,
        )
        .expect("valid")
        .approval;
        assert_eq!(
            approval.tiers.into_iter().collect::<Vec<_>>(),
            [Tier::Shell]
        );
        assert!(approval.tools.contains("time__get_current_time"));
        assert!(approval.servers.contains("git"));
        assert_eq!(approval.timeout.as_secs(), 60);
        assert_eq!(approval.max_pending, 4);
    }

    #[test]
    fn every_bad_value_names_its_key_and_the_fix() {
        let cases = [
            ("tiers = [\"root\"]", "approval.tiers[0]", "`shell`"),
            (
                "tiers = [\"shell\", \"shell\"]",
                "approval.tiers[1]",
                "once",
            ),
            ("tools = [\"shell exec\"]", "approval.tools[0]", "1-64"),
            ("tools = [\"\"]", "approval.tools[0]", "1-64"),
            (
                &format!("tools = [\"{}\"]", "x".repeat(65)),
                "approval.tools[0]",
                "1-64",
            ),
            ("servers = [\"a.b\"]", "approval.servers[0]", "[[mcp]] name"),
            ("timeout_s = 0", "approval.timeout_s", "1-540"),
            ("timeout_s = 541", "approval.timeout_s", "1-540"),
            ("max_pending = 0", "approval.max_pending", "1-1024"),
            ("max_pending = 5000", "approval.max_pending", "1-1024"),
            ("timeout = 5", "unknown field `timeout`", "`timeout_s`"),
        ];
        for (line, key, fix) in cases {
            let message = err(&format!("[approval]\n{line}"));
            assert!(message.contains(key), "{line}: {message}");
            assert!(message.contains(fix), "{line}: {message}");
            assert!(message.contains("node.toml"), "{line}: {message}");
        }
        let many: Vec<String> = (0..257).map(|i| format!("\"t{i}\"")).collect();
        let message = err(&format!("[approval]\ntools = [{}]", many.join(",")));
        assert!(message.contains("at most 256"), "{message}");
    }
}
