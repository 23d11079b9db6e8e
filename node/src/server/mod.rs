//! Starting and stopping a node: wires config, identity, capabilities, discovery, membership
//! and the gRPC server together, and owns the shutdown order.
//!
//! [`bind`] picks the listening socket (7700, else the next free port up to 7710 when the port
//! was not chosen explicitly); [`Node::start`] takes that bound listener, so tests bind
//! `127.0.0.1:0` and read the port back. Start-up runs in the order docs/src/architecture/startup.md
//! (Startup) gives, one step per line of [`Node::start`], each built in the file of its
//! concern: `binding` (listeners), `identity` (TLS, name, issuer, operators, revocations),
//! `health`, `fleet` (membership, discovery, memory, replication), `work` (models, MCP, tools,
//! approvals, agent, tasks, scheduler) and `edges` (the front door, the gRPC services).
//! Shutdown runs in a fixed order, documented on [`Node::shutdown`]. This module holds no
//! behaviour of its own beyond that wiring.

mod binding;
mod edges;
mod error;
mod fleet;
mod health;
mod identity;
mod loops;
mod work;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use mesh_domain::NodeId;
use tokio::{net::TcpListener, task::JoinSet};
use tokio_util::sync::CancellationToken;

pub use binding::bind;
pub use edges::HTTP_ADDR_FILE;
pub use error::StartError;
pub use health::HEALTH_CHECK_INTERVAL;
pub use identity::OWN_CERTIFICATE_REVOKED;
use loops::Loops;

use crate::{
    capabilities::Capabilities,
    config::Config,
    peers::PeerTable,
    rpc::NodeService,
    storage::{self, SledStore, Store},
    supervise::{Backoff, Supervisor},
    tasks::{Drain, TaskManager},
};

/// How long in-flight RPCs get to finish once the node stops accepting.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long running tasks get to finish at shutdown before they are cancelled, when the node
/// does not drain first (`node.drain_on_stop_s = 0`).
pub const TASK_GRACE: Duration = Duration::from_secs(10);
/// File in the data dir holding the address the node actually listens on.
pub const ADDR_FILE: &str = "node.addr";

/// A running node.
#[derive(Debug)]
pub struct Node {
    addr: SocketAddr,
    id: NodeId,
    data_dir: PathBuf,
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
    health: tonic_health::server::HealthReporter,
    store: Arc<SledStore>,
    tasks: TaskManager,
    /// Drains the tasks before the node leaves, for `drain_on_stop`.
    drain: Arc<Drain>,
    /// `node.drain_on_stop_s`.
    drain_on_stop: Duration,
    /// Stops the task workers once running tasks are finished or cancelled.
    task_stop: CancellationToken,
    task_workers: JoinSet<()>,
    loops: Loops,
    server_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Node {
    /// Starts a node on an already-bound listener, in the steps of docs/src/architecture/startup.md
    /// (Startup), numbered alike here.
    pub async fn start(mut config: Config, listener: TcpListener) -> Result<Self, StartError> {
        let addr = binding::bound_addr(&listener, &config)?;
        // 1. The data dir.
        std::fs::create_dir_all(&config.data_dir).map_err(|error| StartError::DataDir {
            path: config.data_dir.clone(),
            error,
        })?;
        // 2. Who this node is: TLS, its name and id, the signer and verifier of records, and
        //    the CA of an issuer.
        let mut identity = identity::load(&mut config, addr)?;
        // 3. What it has, after the start-up health checks and one GPU probe.
        let caps = health::capabilities(&config, &identity, addr).await;
        let mut loops = Loops {
            leaving: CancellationToken::new(),
            background: CancellationToken::new(),
            serve: CancellationToken::new(),
            supervisor: Supervisor::new(caps.clone(), Backoff::default()),
            background_tasks: JoinSet::new(),
        };
        // 4. Membership, and the discovery sources (not started yet).
        let mut fleet = fleet::join(&config, &identity, &caps, addr, &mut loops).await?;
        // 5. The database, the memory and its replication, the issuer; revocations are
        //    loaded before discovery starts, so no revoked peer is dialed at start.
        let shared = fleet::open_memory(&config, &identity, &caps, &fleet, &mut loops)?;
        let issuer = identity::issuer(&mut identity, &shared.store, &fleet.peers);
        identity::watch_revocations(
            &identity,
            &caps,
            &fleet.peers,
            &fleet.static_peers,
            &shared.memory,
            &mut loops,
        );
        fleet.start_discovery(&mut loops);
        // 6. The models, probed in the background.
        let models = work::models(&config, &caps, &mut loops);
        // 7. The admission, MCP servers, tools, approvals, agent runtime, chats and tasks.
        let work = work::start(
            &config, &identity, &caps, &fleet, &shared, models, &mut loops,
        )?;
        // 8. The health loop, then the scheduler.
        let (health, health_service) =
            health::start(&config, &identity, &caps, &shared, &mut loops).await;
        let scheduler = work::scheduler(&config, &identity, &fleet, &shared, &work, &mut loops);
        // 9. The front door.
        let keys = edges::front_door(
            &config, &caps, &fleet, &shared, &work, &scheduler, &mut loops,
        )
        .await?;
        // 10. The gRPC services on the node's listener.
        let services = edges::Services {
            config: &config,
            identity: &identity,
            caps: &caps,
            fleet: &fleet,
            shared: &shared,
            work: &work,
            scheduler,
            keys,
            issuer,
            health: health_service,
        };
        let server_task = edges::serve_grpc(listener, services, &loops)?;
        // 11. The address file.
        if let Err(e) = std::fs::write(config.data_dir.join(ADDR_FILE), format!("{addr}\n")) {
            tracing::warn!(error = %e, "cannot write {ADDR_FILE}");
        }
        tracing::info!(name = %config.name, id = %identity.id.short(), %addr, tls = identity.secure(), "node started");

        let work::Work {
            tasks,
            drain,
            task_stop,
            task_workers,
            ..
        } = work;
        Ok(Self {
            addr,
            id: identity.id,
            data_dir: config.data_dir,
            caps,
            peers: fleet.peers,
            health,
            store: shared.store,
            tasks,
            drain,
            drain_on_stop: config.drain_on_stop,
            task_stop,
            task_workers,
            loops,
            server_task,
        })
    }

    /// The address the gRPC server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// The peer table.
    pub fn peers(&self) -> Arc<PeerTable> {
        self.peers.clone()
    }

    /// The task manager.
    pub fn tasks(&self) -> TaskManager {
        self.tasks.clone()
    }

    /// The names of the background loops running under the supervisor.
    pub fn supervised(&self) -> &[String] {
        self.loops.supervisor.names()
    }

    /// The capabilities (for tests and the task runner).
    pub fn capabilities(&self) -> Arc<Capabilities> {
        self.caps.clone()
    }

    /// Stops the node, in this order:
    /// 0. with `node.drain_on_stop_s`, drain for at most that long, still a member of the fleet
    ///    (advertised as draining, so peers route nothing new here): queued tasks to other
    ///    nodes or back to their callers, running ones given the time to finish, then those
    ///    other nodes sent handed back to them;
    /// 1. end every served `WatchInfo` stream and refuse new ones, so peers mark us down at once
    ///    and route nothing new here;
    /// 2. stop admitting tasks, give running ones [`TASK_GRACE`] to finish (none after a
    ///    drain, which was their time), cancel the rest (each ends with a `failed: cancelled`
    ///    event its caller sees), stop the workers;
    /// 3. stop discovery (mDNS goodbye) and close our own watch sessions;
    /// 4. stop the gRPC server, letting in-flight calls finish for up to [`SHUTDOWN_GRACE`];
    /// 5. flush sled and remove the address file.
    pub async fn shutdown(mut self) {
        tracing::info!("shutting down");
        let grace = if self.drain_on_stop.is_zero() {
            TASK_GRACE
        } else {
            self.drain.before_stop(self.drain_on_stop).await;
            Duration::ZERO
        };
        self.loops.leaving.cancel();
        self.health
            .set_not_serving::<mesh_proto::v1::node_server::NodeServer<NodeService>>()
            .await;

        self.tasks.shutdown(grace).await;
        self.task_stop.cancel();
        while self.task_workers.join_next().await.is_some() {}

        self.loops.background.cancel();
        self.loops.supervisor.shutdown().await;
        while let Some(done) = self.loops.background_tasks.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "background task failed during shutdown");
            }
        }

        self.loops.serve.cancel();
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.server_task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "gRPC server stopped with an error"),
            Ok(Err(e)) => tracing::error!(error = %e, "gRPC server task failed"),
            Err(_) => {
                tracing::warn!(
                    "in-flight calls did not finish within the grace period; closing them"
                );
                self.server_task.abort();
            }
        }
        let store: Arc<dyn Store> = self.store.clone();
        if let Err(e) = storage::flush(&store).await {
            tracing::error!(error = %e, "flush the database");
        }
        let _ = std::fs::remove_file(self.data_dir.join(ADDR_FILE));
        let _ = std::fs::remove_file(self.data_dir.join(HTTP_ADDR_FILE));
        tracing::info!("stopped");
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    /// Point 5 of issue 16: no background loop may run outside the supervisor, where its death
    /// would go unnoticed while the node looks healthy.
    #[tokio::test]
    async fn every_background_loop_runs_under_the_supervisor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "[http]\nlisten = \"127.0.0.1:0\"\n").expect("write config");
        let overrides = Overrides {
            name: Some("supervised".into()),
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().join("data")),
            // Port 9 (discard) on loopback: a static source runs, its dials fail quietly.
            static_peers: vec!["127.0.0.1:9".into()],
            no_mdns: true,
            insecure: true,
            ..Overrides::default()
        };
        let config = Config::load(Some(&file), &overrides).expect("config");
        let listener = bind(config.listen).await.expect("bind");
        let node = Node::start(config, listener).await.expect("start");
        let names = node.supervised().to_vec();
        for expected in [
            "membership",
            "replication",
            "revocations",
            "discovery static",
            "model prober",
            "health checks",
            "scheduler",
            "responses sweep",
        ] {
            assert!(
                names.iter().any(|name| name == expected),
                "`{expected}` is not supervised: {names:?}"
            );
        }
        node.shutdown().await;
    }
}
