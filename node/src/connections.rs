//! Bounds on connections that have not proved anything yet: a [`ConnectionCap`] caps how many
//! connections a listener holds at once (the gRPC port and the front door each have one, and
//! the gRPC port a second, lower one for TLS handshakes in progress), and
//! [`raise_open_files_limit`] gives the process every file descriptor its hard limit allows.
//!
//! A cap refuses at once: a socket over it is closed the moment it is accepted, so a flood of
//! idle sockets costs the node one file descriptor each only for as long as it takes to close
//! them, and the node never runs out of descriptors for the callers it does serve. Each
//! refusal is counted (`agentmesh_connections_refused_total{listener, reason}`), the open
//! connections are a gauge (`agentmesh_connections{listener, state}`), and a warning is logged
//! at most once per [`WARN_EVERY`] with the count since the last one, so a flood cannot flood
//! the log too. How long an unproven connection may stay (the handshake and header timeouts)
//! is the listeners' business (`rpc::accept`, `http`): this module only counts and caps.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use mesh_domain::{sync::MutexExt, throttle::LogThrottle};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{labels, metrics};

/// At most one "cap reached" warning per listener and cap in this long.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// How long a listener waits after a failed accept (out of file descriptors, most likely)
/// before it accepts again, so a failing listener neither spins nor floods the log.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Which cap of a listener: what it counts, and the `reason` a refusal is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    /// Every open connection of the listener, handshaking or established.
    Connections,
    /// TLS handshakes in progress (the gRPC port).
    Handshakes,
}

impl Cap {
    /// The `reason` label of a refusal: the config key's last part.
    fn reason(self) -> &'static str {
        match self {
            Self::Connections => "max_connections",
            Self::Handshakes => "max_handshakes",
        }
    }

    /// The `state` label of the gauge.
    fn state(self) -> &'static str {
        match self {
            Self::Connections => "open",
            Self::Handshakes => "handshaking",
        }
    }
}

/// At most `max` connections of one listener at a time. Cloning shares the count.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionCap {
    /// The listener's name in metrics and logs: `grpc` or `http`.
    listener: &'static str,
    cap: Cap,
    max: usize,
    permits: Arc<Semaphore>,
    /// `agentmesh_connections{listener, state}`, moved by [`ConnectionSlot`].
    open: Gauge,
    /// Refusals not yet logged, and when the last warning was.
    refusals: Arc<Mutex<LogThrottle>>,
}

/// One connection's place under a [`ConnectionCap`], given back when dropped (when the
/// connection closes, or its handshake ends for the handshake cap).
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl ConnectionCap {
    /// A cap of `max` connections (at least 1) for `listener`.
    pub(crate) fn new(listener: &'static str, cap: Cap, max: usize) -> Self {
        let max = max.max(1);
        let open = metrics()
            .connections
            .get_or_create(&labels(&[("listener", listener), ("state", cap.state())]))
            .clone();
        Self {
            listener,
            cap,
            max,
            permits: Arc::new(Semaphore::new(max)),
            open,
            refusals: Arc::new(Mutex::new(LogThrottle::new(WARN_EVERY))),
        }
    }

    /// A slot for one more connection, or `None` when `max` are open: the caller closes the
    /// connection at once. A refusal is counted, and logged now and then.
    pub(crate) fn admit(&self) -> Option<ConnectionSlot> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.open.inc();
                Some(ConnectionSlot {
                    _permit: permit,
                    open: self.open.clone(),
                })
            }
            Err(_) => {
                self.refused();
                None
            }
        }
    }

    fn refused(&self) {
        metrics()
            .connections_refused
            .get_or_create(&labels(&[
                ("listener", self.listener),
                ("reason", self.cap.reason()),
            ]))
            .inc();
        let due = self.refusals.lock_unpoisoned().note(Instant::now());
        if let Some(refused) = due {
            tracing::warn!(
                listener = self.listener,
                cap = self.cap.reason(),
                max = self.max,
                refused,
                "connection cap reached: refused {refused} connection(s) since the last warning; a flood, or raise connections.{}_{} if the load is real",
                self.listener,
                self.cap.reason(),
            );
        }
    }
}

/// The open-files limit the process runs with, after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit before.
    pub was: u64,
    /// The soft limit now (`None`: unlimited).
    pub now: Option<u64>,
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does: the default
/// soft limit (often 1,024) is a leftover of `select(2)`, which nothing here uses, and it
/// would let a few hundred idle sockets starve the node of descriptors for its store, its
/// peers and its callers. The caps in `[connections]` are what bounds the sockets.
pub fn raise_open_files_limit() -> std::io::Result<OpenFilesLimit> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let was = limit.current.unwrap_or(u64::MAX);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, raised)?;
    }
    Ok(OpenFilesLimit {
        was,
        now: getrlimit(Resource::Nofile).current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(listener: &str, reason: &str) -> String {
        let text = metrics().encode();
        let prefix = format!(
            "agentmesh_connections_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or("0")
            .to_owned()
    }

    fn open(listener: &str, state: &str) -> String {
        let text = metrics().encode();
        let prefix = format!("agentmesh_connections{{listener=\"{listener}\",state=\"{state}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or("0")
            .to_owned()
    }

    /// The cap refuses the connection past `max`, counts it, and takes one again once a slot
    /// is given back; the gauge follows the open slots. (A listener name of its own, since the
    /// metrics are process-wide and other tests count too.)
    #[test]
    fn past_the_cap_a_connection_is_refused_and_counted_until_one_closes() {
        let cap = ConnectionCap::new("cap-test", Cap::Handshakes, 3);
        let slots: Vec<_> = (0..3)
            .map(|_| cap.admit().expect("under the cap"))
            .collect();
        assert_eq!(open("cap-test", "handshaking"), "3");
        assert_eq!(refused("cap-test", "max_handshakes"), "0");
        assert!(cap.admit().is_none(), "a fourth connection is refused");
        assert!(cap.clone().admit().is_none(), "a clone shares the count");
        assert_eq!(refused("cap-test", "max_handshakes"), "2");
        drop(slots);
        assert_eq!(open("cap-test", "handshaking"), "0");
        let again = cap.admit().expect("a closed connection frees its slot");
        assert_eq!(open("cap-test", "handshaking"), "1");
        drop(again);
    }
}

/// What the listeners' tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::time::Duration;

    use tokio::{io::AsyncReadExt, net::TcpStream};

    /// Whether the listener closed `tcp` (a read ends or fails) within `within`.
    pub(crate) async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, tcp.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}
