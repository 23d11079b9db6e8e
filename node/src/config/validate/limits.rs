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
    raw::{RawConnections, RawMemory, RawSecurity, RawTasks, RawTools},
    types::{ConnectionLimits, Security, TaskLimits},
};

/// `security.remote_max_tier` (default `read`), `security.client_max_tier` (default `write`)
/// and `security.mcp_max_tier` (default `read`).
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
        mcp_max_tier: tier("security.mcp_max_tier", raw.mcp_max_tier, Tier::Read)?,
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
    /// `memory.fanout`.
    pub(super) fanout: usize,
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
    let fanout = raw.fanout.unwrap_or(3);
    if !(1..=64).contains(&fanout) {
        return Err(origin.invalid(
            "memory.fanout",
            format!("is {fanout}"),
            "use 1-64 peers (default 3): a write is pushed to that many, the rest pull it",
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
        fanout,
    })
}

/// Longest handshake or header timeout, seconds: beyond it a timeout no longer protects much.
const MAX_CONNECT_TIMEOUT_S: u64 = 300;
/// Largest connection cap: more sockets than a typical hard limit on open files.
const MAX_CONNECTIONS: usize = 1_000_000;

/// `[connections]`: timeouts from 1 to [`MAX_CONNECT_TIMEOUT_S`] seconds, caps from 1 to
/// [`MAX_CONNECTIONS`], and no more handshakes than connections.
pub(super) fn connections(
    raw: RawConnections,
    origin: &Origin,
) -> Result<ConnectionLimits, ConfigError> {
    let defaults = ConnectionLimits::default();
    let timeout = |key: &str, value: Option<u64>, default: Duration| {
        match value {
        None => Ok(default),
        Some(s) if (1..=MAX_CONNECT_TIMEOUT_S).contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(origin.invalid(
            key,
            format!("is {s}"),
            &format!(
                "use 1-{MAX_CONNECT_TIMEOUT_S} seconds (default {}); 0 would close every connection, a long one lets idle sockets pile up",
                default.as_secs()
            ),
        )),
    }
    };
    let cap = |key: &str, value: Option<usize>, default: usize| match value {
        None => Ok(default),
        Some(n) if (1..=MAX_CONNECTIONS).contains(&n) => Ok(n),
        Some(n) => Err(origin.invalid(
            key,
            format!("is {n}"),
            &format!("use 1-{MAX_CONNECTIONS} (default {default})"),
        )),
    };
    let limits = ConnectionLimits {
        handshake_timeout: timeout(
            "connections.handshake_timeout_s",
            raw.handshake_timeout_s,
            defaults.handshake_timeout,
        )?,
        grpc_max_connections: cap(
            "connections.grpc_max_connections",
            raw.grpc_max_connections,
            defaults.grpc_max_connections,
        )?,
        grpc_max_handshakes: cap(
            "connections.grpc_max_handshakes",
            raw.grpc_max_handshakes,
            defaults.grpc_max_handshakes,
        )?,
        header_timeout: timeout(
            "connections.header_timeout_s",
            raw.header_timeout_s,
            defaults.header_timeout,
        )?,
        http_max_connections: cap(
            "connections.http_max_connections",
            raw.http_max_connections,
            defaults.http_max_connections,
        )?,
    };
    if limits.grpc_max_handshakes > limits.grpc_max_connections {
        return Err(origin.invalid(
            "connections.grpc_max_handshakes",
            format!(
                "is {}, more than connections.grpc_max_connections ({})",
                limits.grpc_max_handshakes, limits.grpc_max_connections
            ),
            "a handshake is an open connection too: lower grpc_max_handshakes or raise grpc_max_connections",
        ));
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{
        ConnectionLimits,
        validate::tests::{err, parse},
    };

    #[test]
    fn connection_limits_default_and_zero_or_absurd_values_name_the_key() {
        assert_eq!(
            parse("").expect("valid").connections,
            ConnectionLimits::default()
        );
        let set = parse(
            "[connections]\nhandshake_timeout_s = 2\nheader_timeout_s = 3\ngrpc_max_connections = 100\ngrpc_max_handshakes = 100\nhttp_max_connections = 50\n",
        )
        .expect("valid")
        .connections;
        assert_eq!(set.handshake_timeout, Duration::from_secs(2));
        assert_eq!(set.header_timeout, Duration::from_secs(3));
        assert_eq!(
            (
                set.grpc_max_connections,
                set.grpc_max_handshakes,
                set.http_max_connections
            ),
            (100, 100, 50)
        );
        for (bad, key, fix) in [
            (
                "handshake_timeout_s = 0",
                "connections.handshake_timeout_s",
                "1-300 seconds",
            ),
            (
                "header_timeout_s = 86400",
                "connections.header_timeout_s",
                "1-300 seconds",
            ),
            (
                "grpc_max_connections = 0",
                "connections.grpc_max_connections",
                "1-1000000",
            ),
            (
                "http_max_connections = 99999999",
                "connections.http_max_connections",
                "1-1000000",
            ),
            (
                "grpc_max_handshakes = 5000",
                "connections.grpc_max_handshakes",
                "raise grpc_max_connections",
            ),
        ] {
            let e = err(&format!("[connections]\n{bad}\n"));
            assert!(e.contains(key) && e.contains(fix), "{bad}: {e}");
        }
        assert!(err("[connections]\nmax = 3\n").contains("max"));
    }

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
