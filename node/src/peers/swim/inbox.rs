//! What a received datagram waits in before foca sees it: the two bounded queues for the
//! signature check (live members' first, strangers' rate-limited), the checker task, the drop
//! counters, and the nodes of other meshes already named in the log.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use mesh_domain::NodeId;
use prometheus_client::metrics::counter::Counter;
use tokio::{net::UdpSocket, sync::mpsc};

use crate::{
    metrics::{labels, metrics},
    peers::envelope::{Opener, Refusal},
};

/// Datagrams from live members waiting for their signature check; past it they are dropped.
/// Members send a few a second each, so this fills only if a member's address is spoofed.
pub(super) const MEMBER_QUEUE: usize = 256;
/// Datagrams from anyone else (an announce, a node not yet a member, a flood) waiting for their
/// signature check; past it they are dropped. Checked only when no member's datagram waits.
pub(super) const STRANGER_QUEUE: usize = 64;
/// Signature checks per second for datagrams from anyone but a live member (announces of
/// nodes joining, a flood from many ports), all together, and how many at once: a join needs a
/// few, and at ~60 µs a check this is a few per cent of a core at most.
pub const STRANGER_CHECKS_PER_SECOND: f64 = 1000.0;
/// See [`STRANGER_CHECKS_PER_SECOND`].
pub(super) const STRANGER_CHECKS_BURST: f64 = 256.0;
/// Checked datagrams waiting for the loop (the checker waits when it is full).
pub(super) const CHECKED_QUEUE: usize = 64;
/// The membership socket's receive buffer: a flood the loop reads a little slower than it
/// comes (a busy machine) fills the kernel's buffer, which then drops what comes next, members'
/// probes as much as the flood; 4 MiB holds about 2,000 datagrams, a few milliseconds of a
/// flood. The kernel caps it at `net.core.rmem_max` (often 208 KiB; raise it for more).
pub(super) const RECEIVE_BUFFER: usize = 4 << 20;
/// At most one log line per this long about dropped datagrams (with the count since the last):
/// a flood must not flood the log.
pub(super) const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// The `agentmesh_swim_dropped_total` counter of each reason, each looked up once: a flood is
/// counted tens of thousands of times a second.
#[derive(Debug, Default)]
pub(super) struct DropCounters(Vec<(&'static str, Counter)>);

impl DropCounters {
    /// Counts a datagram dropped for `reason`.
    pub(super) fn inc(&mut self, reason: &'static str) {
        if let Some((_, counter)) = self.0.iter().find(|(r, _)| *r == reason) {
            counter.inc();
            return;
        }
        let counter = metrics()
            .swim_dropped
            .get_or_create(&labels(&[("reason", reason)]))
            .clone();
        counter.inc();
        self.0.push((reason, counter));
    }
}

/// Asks for a receive buffer of [`RECEIVE_BUFFER`] on the membership socket (the kernel caps
/// it at `net.core.rmem_max`).
pub(crate) fn enlarge_receive_buffer(socket: &UdpSocket) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
        .map_err(std::io::Error::from)
}

/// A screened datagram waiting for its signature check.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) datagram: Box<[u8]>,
    pub(super) from: SocketAddr,
}

/// The two queues of [`Job`]s; see the module doc.
#[derive(Debug)]
pub(super) struct Queues {
    pub(super) members: mpsc::Sender<Job>,
    pub(super) strangers: mpsc::Sender<Job>,
}

/// A checked datagram: its sender and the foca message inside, or why it is refused.
#[derive(Debug)]
pub(super) struct Checked {
    pub(super) from: SocketAddr,
    pub(super) result: Result<(NodeId, Vec<u8>), Refusal>,
}

/// Checks the certificate and signature of each queued datagram, members' first, and hands the
/// result to the loop; ends when the loop's side of any queue is gone.
pub(super) async fn check_signatures(
    opener: Arc<Opener>,
    mut members: mpsc::Receiver<Job>,
    mut strangers: mpsc::Receiver<Job>,
    checked: mpsc::Sender<Checked>,
) {
    loop {
        let job = tokio::select! {
            biased;
            Some(job) = members.recv() => job,
            Some(job) = strangers.recv() => job,
            else => return,
        };
        metrics().swim_signature_checks.inc();
        let result = opener
            .verify(&job.datagram)
            .map(|opened| (opened.sender, opened.payload.to_vec()));
        let from = job.from;
        if checked.send(Checked { from, result }).await.is_err() {
            return;
        }
    }
}

/// How many nodes of other meshes are remembered (and so named once each); past that, more are
/// met silently, so a LAN full of strangers cannot grow the set without bound.
pub(super) const MAX_FOREIGN_NODES: usize = 256;

/// The nodes of other meshes this node has met, by (name, certificate fingerprint), so that
/// the hint about each is logged once, not at every datagram. Bounded by [`MAX_FOREIGN_NODES`].
#[derive(Debug, Default)]
pub(super) struct ForeignNodes {
    pub(super) seen: std::collections::HashSet<(String, String)>,
}

impl ForeignNodes {
    /// Whether this is the first meeting with the node `name` presenting the certificate
    /// `fingerprint`; false for one met before, and for every node once the set is full.
    pub(super) fn first_meeting(&mut self, name: &str, fingerprint: &str) -> bool {
        let key = (name.to_owned(), fingerprint.to_owned());
        if self.seen.len() >= MAX_FOREIGN_NODES || self.seen.contains(&key) {
            return false;
        }
        self.seen.insert(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_of_another_mesh_is_met_once_and_the_set_stays_bounded() {
        let mut foreign = ForeignNodes::default();
        assert!(foreign.first_meeting("mallory", "fp1"));
        assert!(
            !foreign.first_meeting("mallory", "fp1"),
            "a retry is no new meeting"
        );
        // A new certificate (re-issued elsewhere) or another name is a new node to name.
        assert!(foreign.first_meeting("mallory", "fp2"));
        assert!(foreign.first_meeting("eve", "fp1"));
        for i in foreign.seen.len()..MAX_FOREIGN_NODES {
            assert!(foreign.first_meeting(&format!("n{i}"), "fp"));
        }
        assert!(
            !foreign.first_meeting("one-too-many", "fp"),
            "the set is full"
        );
        assert_eq!(foreign.seen.len(), MAX_FOREIGN_NODES);
    }
}
