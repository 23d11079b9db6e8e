//! The fleet: the peer table, SWIM membership, the discovery sources (static peers, the issuer a
//! joined node remembers, mDNS), the database and the shared memory with its replication.

use std::{net::SocketAddr, path::Path, sync::Arc};

use mesh_domain::HealthStatus;
use mesh_join::bootstrap;
use tokio::{
    net::UdpSocket,
    sync::{Notify, mpsc},
};

use super::{binding::advertised_addrs, error::StartError, identity::NodeIdentity, loops::Loops};
use crate::{
    capabilities::Capabilities,
    config::{Config, TlsMode},
    discovery::{Advert, Discovery, DiscoveryEvent, Mdns, StaticPeers},
    memory::{self, Memory, MemoryOptions},
    peers::{
        PeerTable,
        adverts::AdvertGuard,
        envelope::{Opener, Sealer},
        swim::{self, Member, Membership, MembershipParts},
    },
    rpc::{NodeLink, PeerChannels, memory::RemoteMemory},
    storage::SledStore,
    supervise::no_error,
};

/// What step 4 of start-up builds: the fleet as this node will know it.
pub(super) struct Fleet {
    pub(super) peers: Arc<PeerTable>,
    /// Where the discovery sources report, and `NodeService` a peer's hello.
    pub(super) events: mpsc::Sender<DiscoveryEvent>,
    /// Built in step 4, started by [`Fleet::start_discovery`] once the revocations are loaded.
    sources: Vec<Arc<dyn Discovery>>,
    /// The static peers and the issuer a joined node remembers: the nodes dialed at start.
    pub(super) static_peers: Vec<String>,
    /// One kept channel per peer address, for every call to a peer.
    pub(super) channels: PeerChannels,
}

/// What step 5 opens: the database and the shared memory on it.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) store: Arc<SledStore>,
    pub(super) memory: Arc<Memory>,
}

/// Step 4: the peer table, membership (supervised as `membership`, stopped as the node starts
/// leaving so its goodbye goes out first) and the discovery sources, not yet started.
pub(super) async fn join(
    config: &Config,
    identity: &NodeIdentity,
    caps: &Arc<Capabilities>,
    addr: SocketAddr,
    loops: &mut Loops,
) -> Result<Fleet, StartError> {
    let peers = Arc::new(PeerTable::for_node(
        identity.id.clone(),
        config.name.clone(),
    ));
    let (events, events_rx) = mpsc::channel(1024);
    // Membership asks the mDNS source through this to offer adverts it dropped again.
    let reoffer = Arc::new(Notify::new());
    // SWIM listens on UDP at the gRPC port's number and address (one port to open and
    // forward); bound here, once, so a restarted loop keeps it.
    let socket = Arc::new(
        UdpSocket::bind(addr)
            .await
            .map_err(|error| StartError::Bind {
                addr,
                error,
                hint: " (membership's UDP socket, on the same port as gRPC: free that UDP port)",
            })?,
    );
    if let Err(e) = swim::enlarge_receive_buffer(&socket) {
        tracing::warn!(error = %e, "cannot enlarge the membership socket's receive buffer; a datagram flood may crowd out members' probes sooner");
    }
    if let Err(e) = crate::peers::icmp::enable(&socket) {
        tracing::warn!(error = %e, "cannot receive ICMP errors on the membership socket; a crashed peer is found by the probes alone (~1 s later)");
    }
    let membership = Arc::new(Membership::new(MembershipParts {
        own: Member {
            id: identity.id.clone(),
            addr: member_addr(addr),
            bump: next_run(&config.data_dir),
        },
        socket,
        sealer: Arc::new(Sealer::new(identity.signer.clone())),
        opener: Arc::new(Opener::new(identity.verifier.clone())),
        link: Arc::new(NodeLink::new(identity.dialer.clone())),
        table: peers.clone(),
        changes: caps.subscribe(),
        config: swim::lan_config(),
        adverts: AdvertGuard::new(
            config.discovery.max_advert_dials,
            config.discovery.max_failing_addrs,
            reoffer.clone(),
        ),
    }));
    // Shared between runs: a restarted membership reads on where the last one stopped.
    let events_rx = Arc::new(tokio::sync::Mutex::new(events_rx));
    loops
        .supervisor
        .spawn("membership", loops.leaving.clone(), move |cancel| {
            let (membership, events_rx) = (membership.clone(), events_rx.clone());
            no_error(async move {
                let mut events_rx = events_rx.lock_owned().await;
                membership.run(&mut events_rx, cancel).await;
            })
        });

    let mut static_peers = config.discovery.static_peers.clone();
    // A node that joined with a token dials its issuer at every start, so it finds its
    // mesh again where mDNS does not reach.
    if config.tls == TlsMode::Bootstrap
        && let Some(issuer) = bootstrap::remembered_issuer(&config.data_dir)
        && !static_peers.contains(&issuer)
    {
        static_peers.push(issuer);
    }
    let mut sources: Vec<Arc<dyn Discovery>> = Vec::new();
    if !static_peers.is_empty() {
        sources.push(Arc::new(StaticPeers::new(static_peers.clone())));
    }
    if config.discovery.mdns {
        let advert = Advert {
            name: config.name.clone(),
            id: identity.id.clone(),
            port: addr.port(),
            roles: config.roles.clone(),
            gpus: caps.snapshot().resources.gpus.len(),
            fingerprint: identity.fingerprint.clone(),
        };
        match Mdns::new(advert, &config.discovery.interfaces, reoffer) {
            Ok(mdns) => sources.push(Arc::new(mdns)),
            Err(e) => caps.set_check(
                "mdns",
                Some((
                    HealthStatus::Degraded,
                    format!("cannot start ({e}); only static peers are used"),
                )),
            ),
        }
    } else {
        caps.set_check(
            "mdns",
            Some((
                HealthStatus::Degraded,
                "disabled; peers come from static_peers and membership".into(),
            )),
        );
    }
    let channels = PeerChannels::new(identity.dialer.clone()).reporting_to(peers.clone());
    Ok(Fleet {
        peers,
        events,
        sources,
        static_peers,
        channels,
    })
}

impl Fleet {
    /// Starts the discovery sources (each supervised as `discovery NAME`). Only once the memory
    /// has loaded the revocations into the dialer's revoked set, so no revoked peer is dialed
    /// (and listed up) at start.
    pub(super) fn start_discovery(&mut self, loops: &mut Loops) {
        for source in std::mem::take(&mut self.sources) {
            tracing::info!(source = source.name(), "discovery started");
            let events = self.events.clone();
            loops.supervisor.spawn(
                &format!("discovery {}", source.name()),
                loops.background.clone(),
                move |cancel| no_error(source.clone().run(events.clone(), cancel)),
            );
        }
    }
}

/// Step 5: the database in the data dir, the memory on it, and its replication (supervised as
/// `replication`); the capabilities follow the memory's write sequence.
pub(super) fn open_memory(
    config: &Config,
    identity: &NodeIdentity,
    caps: &Arc<Capabilities>,
    fleet: &Fleet,
    loops: &mut Loops,
) -> Result<Shared, StartError> {
    let db = open_db(&config.data_dir)?;
    let store =
        Arc::new(SledStore::new(db).with_floor(config.data_dir.clone(), config.min_free_disk));
    let (memory, memory_writes) = Memory::open(
        store.clone(),
        identity.signer.clone(),
        identity.verifier.clone(),
        MemoryOptions {
            local_namespaces: config.local_namespaces.clone(),
            max_skew: config.max_clock_skew,
            tombstone_window: config.tombstone_window,
            sync_interval: config.sync_interval,
            fanout: config.memory_fanout,
            max_namespaces: config.max_namespaces,
        },
    );
    let (replicated, peers) = (memory.clone(), fleet.peers.clone());
    let link: Arc<dyn memory::MemoryPeers> = Arc::new(RemoteMemory::new(
        fleet.channels.clone(),
        identity.id.clone(),
    ));
    // Shared between runs: a restarted replicator pushes the writes not yet pushed.
    let writes = Arc::new(tokio::sync::Mutex::new(memory_writes));
    loops
        .supervisor
        .spawn("replication", loops.background.clone(), move |cancel| {
            let (memory, peers, link, writes) = (
                replicated.clone(),
                peers.clone(),
                link.clone(),
                writes.clone(),
            );
            no_error(async move {
                let mut writes = writes.lock_owned().await;
                memory::replicate(memory, peers, link, &mut writes, cancel).await;
            })
        });
    caps.follow_memory_seq(memory.follow_own_seq());
    Ok(Shared { store, memory })
}

/// Opens the node's database in `data_dir`; a database another process holds open (sled's
/// lock, whose error reads `could not acquire lock on "…": Os { … }`) is said in words.
fn open_db(data_dir: &Path) -> Result<sled::Db, StartError> {
    let path = data_dir.join("db");
    sled::open(&path).map_err(|error| match &error {
        sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock") => {
            StartError::DataDirInUse {
                data_dir: data_dir.to_owned(),
                db: path.clone(),
            }
        }
        _ => StartError::Storage { path, error },
    })
}

/// The file in the data directory holding the bump of this node's last SWIM run.
const SWIM_RUN_FILE: &str = "swim.run";

/// This run's bump: above the last run's (kept in the data dir) even when the clock is now
/// behind it, so peers take this run for the newer one at the same address.
fn next_run(data_dir: &Path) -> u64 {
    let path = data_dir.join(SWIM_RUN_FILE);
    let last = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let run = mesh_domain::time::unix_ms(std::time::SystemTime::now()).max(last + 1);
    if let Err(e) = std::fs::write(&path, run.to_string()) {
        tracing::warn!(path = %path.display(), error = %e, "cannot keep the SWIM run number; a restart with the clock behind may not be taken for the newer run");
    }
    run
}

/// The address this node is a SWIM member at: the listener's, or on a wildcard the first
/// address it advertises (members gossip it, so it must be one peers can reach).
fn member_addr(addr: SocketAddr) -> SocketAddr {
    if !addr.ip().is_unspecified() {
        return addr;
    }
    advertised_addrs(addr)
        .iter()
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .find(|a| !a.ip().is_loopback())
        .unwrap_or(addr)
}
