//! Who a member is in foca (node id, address, run) and foca's settings for the mesh:
//! memberlist's LAN values, probing faster and suspecting shorter.

use std::{
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    time::Duration,
};

use foca::Config;
use mesh_domain::NodeId;

/// The fleet size foca's settings are derived from (how often an update is retransmitted,
/// how long a suspect has to refute): memberlist's LAN defaults for up to ~50 nodes.
pub(super) const CLUSTER_SIZE: u32 = 50;

/// How long a suspect has to refute before it is declared down. memberlist's LAN rule would
/// give ~7 s at 50 nodes; the mesh wants a dead node down everywhere within ~3 s, and a live
/// node refutes within one round trip of hearing the suspicion.
pub(super) const SUSPECT_TO_DOWN: Duration = Duration::from_secs(2);

/// How often a node probes one member, and how long it waits for the direct answer before
/// asking others to probe too (the rest of the period). memberlist's LAN values are 1 s and
/// 500 ms; halved, a dead node is suspected about a second sooner, for one more probe a second
/// per node (a few hundred µs of CPU).
pub(super) const PROBE_PERIOD: Duration = Duration::from_millis(500);
/// See [`PROBE_PERIOD`].
pub(super) const PROBE_RTT: Duration = Duration::from_millis(250);
/// How many times each membership update is sent (see [`lan_config`]).
pub(super) const MAX_TRANSMISSIONS: u8 = 12;

/// memberlist's LAN settings for [`CLUSTER_SIZE`] nodes, probing twice as often
/// ([`PROBE_PERIOD`]) with a shorter suspicion ([`SUSPECT_TO_DOWN`]).
pub fn lan_config() -> Config {
    let mut config = Config::new_lan(NonZeroU32::new(CLUSTER_SIZE).expect("non-zero"));
    config.probe_period = PROBE_PERIOD;
    config.probe_rtt = PROBE_RTT;
    // Each update (a join, a goodbye, a verdict, a version) is sent 12 times, not memberlist's
    // ~7 at 50 members: a member that misses every copy learns a goodbye only by its own probe
    // (seen once: 12.6 s instead of 0.3 s). Costs datagrams only while something changes.
    config.max_transmissions = std::num::NonZeroU8::new(MAX_TRANSMISSIONS).expect("non-zero");
    config.suspect_to_down_after = SUSPECT_TO_DOWN;
    // Members on the two sides of a healed partition find each other by announcing to the
    // members they hold down: every 5 s, not memberlist's 65 s, so a heal shows within seconds.
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(5),
        num_members: NonZeroUsize::new(2).expect("non-zero"),
    });
    // A sealed datagram adds a certificate and a signature (~600 bytes) to foca's packet.
    config.max_packet_size = NonZeroUsize::new(1200).expect("non-zero");
    config
}

/// A member's identity in foca: who, where, and which run of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// The node id (its certificate's key).
    pub id: NodeId,
    /// Where its SWIM socket (and gRPC listener) is.
    pub addr: SocketAddr,
    /// Raised at every start (Unix ms) and every rejoin, so the newest run of a node wins.
    pub bump: u64,
}

impl Member {
    /// Someone unknown at `addr`: what the node announces to (foca accepts an announce by
    /// address alone).
    pub(super) fn at(addr: SocketAddr) -> Self {
        Self {
            id: NodeId::parse(&"0".repeat(64)).expect("64 zeros are a node id"),
            addr,
            bump: 0,
        }
    }
}

impl foca::Identity for Member {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump + 1,
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}
