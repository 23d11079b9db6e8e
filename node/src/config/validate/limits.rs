//! Checks `[security]`, `[tasks]`, `[tools]` and `[memory]`: the bounds work runs within on this
//! node (the highest tier a remote caller may ask for, how many tasks run and wait and their
//! default budgets, the directories the file and shell tools may use) and the bounds of memory
//! replication (local namespaces, clock skew, tombstone window, sync interval). It must not
//! create the tool roots or touch the store; it only checks the numbers and names.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use mesh_domain::{Tier, keys};

use crate::config::{
    error::{ConfigError, Origin},
    raw::{RawMemory, RawSecurity, RawTasks, RawTools},
    types::{Security, TaskLimits},
};

/// `security.remote_max_tier` (default `read`) and `security.client_max_tier` (default
/// `write`).
pub(super) fn security(raw: RawSecurity, origin: &Origin) -> Result<Security, ConfigError> {
    let tier = |key: &str, value: Option<String>, default: Tier| match value.as_deref() {
        None => Ok(default),
        Some(text) => Tier::parse(text).ok_or_else(|| {
            origin.invalid(
                key,
                format!("is `{text}`"),
                "use `read`, `write` or `shell`",
            )
        }),
    };
    Ok(Security {
        remote_max_tier: tier("security.remote_max_tier", raw.remote_max_tier, Tier::Read)?,
        client_max_tier: tier("security.client_max_tier", raw.client_max_tier, Tier::Write)?,
    })
}

/// `[tasks]`: each value from 1 to its own maximum, the defaults of [`TaskLimits`] where unset.
pub(super) fn tasks(raw: RawTasks, origin: &Origin) -> Result<TaskLimits, ConfigError> {
    let defaults = TaskLimits::default();
    let positive = |key: &str, value: Option<u64>, default: u64, max: u64| match value {
        None => Ok(default),
        Some(v) if v >= 1 && v <= max => Ok(v),
        Some(v) => Err(origin.invalid(
            key,
            format!("is {v}"),
            &format!("use a value from 1 to {max}"),
        )),
    };
    Ok(TaskLimits {
        workers: positive(
            "tasks.workers",
            raw.workers.map(|v| v as u64),
            defaults.workers as u64,
            256,
        )? as usize,
        queue: positive(
            "tasks.queue",
            raw.queue.map(|v| v as u64),
            defaults.queue as u64,
            100_000,
        )? as usize,
        max_rounds: positive(
            "tasks.max_rounds",
            raw.max_rounds.map(u64::from),
            u64::from(defaults.max_rounds),
            1000,
        )? as u32,
        token_budget: positive(
            "tasks.token_budget",
            raw.token_budget,
            defaults.token_budget,
            100_000_000,
        )?,
        timeout: Duration::from_secs(positive(
            "tasks.timeout_s",
            raw.timeout_s,
            defaults.timeout.as_secs(),
            86_400,
        )?),
    })
}

/// `tools.roots`, or `<data_dir>/workspace` when there are none.
pub(super) fn tools(
    raw: RawTools,
    data_dir: &Path,
    origin: &Origin,
) -> Result<Vec<PathBuf>, ConfigError> {
    if raw.roots.is_empty() {
        return Ok(vec![data_dir.join("workspace")]);
    }
    for (i, root) in raw.roots.iter().enumerate() {
        if root.as_os_str().is_empty() {
            return Err(origin.invalid(
                &format!("tools.roots[{i}]"),
                "is empty".into(),
                "list directories the file tools may use",
            ));
        }
    }
    Ok(raw.roots)
}

/// Validated `[memory]`.
#[derive(Debug)]
pub(super) struct MemorySection {
    /// `memory.local_namespaces`.
    pub(super) local_namespaces: Vec<String>,
    /// `memory.max_clock_skew_ms`.
    pub(super) max_clock_skew: Duration,
    /// `memory.tombstone_window_s`.
    pub(super) tombstone_window: Duration,
    /// `memory.sync_interval_s`.
    pub(super) sync_interval: Duration,
    /// `memory.max_namespaces`.
    pub(super) max_namespaces: usize,
}

/// `[memory]`: namespace names, the clock skew, and a tombstone window that outlives several
/// sync rounds (at least four sync intervals).
pub(super) fn memory(raw: RawMemory, origin: &Origin) -> Result<MemorySection, ConfigError> {
    for (i, ns) in raw.local_namespaces.iter().enumerate() {
        if keys::check_namespace(ns).is_err() {
            return Err(origin.invalid(
                &format!("memory.local_namespaces[{i}]"),
                format!("is `{ns}`"),
                "use 1-64 letters, digits, `-`, `_`, `.`",
            ));
        }
    }
    let skew = raw.max_clock_skew_ms.unwrap_or(500);
    if !(10..=3_600_000).contains(&skew) {
        return Err(origin.invalid(
            "memory.max_clock_skew_ms",
            format!("is {skew}"),
            "use 10-3600000 milliseconds (default 500)",
        ));
    }
    let window = raw.tombstone_window_s.unwrap_or(7 * 24 * 3600);
    if !(1..=365 * 24 * 3600).contains(&window) {
        return Err(origin.invalid(
            "memory.tombstone_window_s",
            format!("is {window}"),
            "use 1-31536000 seconds (default 604800, 7 days); a node away longer resyncs",
        ));
    }
    let sync_interval = raw.sync_interval_s.unwrap_or(30);
    if !(1..=3600).contains(&sync_interval) {
        return Err(origin.invalid(
            "memory.sync_interval_s",
            format!("is {sync_interval}"),
            "use 1-3600 seconds (default 30)",
        ));
    }
    let max_namespaces = raw.max_namespaces.unwrap_or(1000);
    if !(1..=1_000_000).contains(&max_namespaces) {
        return Err(origin.invalid(
            "memory.max_namespaces",
            format!("is {max_namespaces}"),
            "use 1-1000000 (default 1000)",
        ));
    }
    if window < 4 * sync_interval {
        return Err(origin.invalid(
            "memory.tombstone_window_s",
            format!("is {window}, less than 4 x memory.sync_interval_s ({sync_interval})"),
            "make the window at least four sync intervals, or sync more often",
        ));
    }
    Ok(MemorySection {
        local_namespaces: raw.local_namespaces,
        max_clock_skew: Duration::from_millis(skew),
        tombstone_window: Duration::from_secs(window),
        sync_interval: Duration::from_secs(sync_interval),
        max_namespaces,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::validate::tests::{err, parse};

    #[test]
    fn the_tombstone_window_must_cover_several_sync_rounds() {
        let config = parse("").expect("valid");
        assert_eq!(config.tombstone_window.as_secs(), 7 * 24 * 3600);
        assert_eq!(config.sync_interval.as_secs(), 30);
        let e = err("[memory]\ntombstone_window_s = 60\nsync_interval_s = 30\n");
        assert!(e.contains("memory.tombstone_window_s"), "{e}");
        assert!(e.contains("memory.sync_interval_s"), "{e}");
        assert!(err("[memory]\nsync_interval_s = 0\n").contains("1-3600"));
        assert!(err("[memory]\ntombstone_window_s = 0\n").contains("default 604800"));
    }

    #[test]
    fn the_namespace_bound_defaults_to_1000_and_must_be_positive() {
        assert_eq!(parse("").expect("valid").max_namespaces, 1000);
        let config = parse("[memory]\nmax_namespaces = 5\n").expect("valid");
        assert_eq!(config.max_namespaces, 5);
        let e = err("[memory]\nmax_namespaces = 0\n");
        assert!(
            e.contains("memory.max_namespaces") && e.contains("1-1000000"),
            "{e}"
        );
    }
}
