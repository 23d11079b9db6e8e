//! Starting and stopping a node: wires config, identity, capabilities, discovery, membership
//! and the gRPC server together, and owns the shutdown order.
//!
//! [`bind`] picks the listening socket (7700, else the next free port up to 7710 when the port
//! was not chosen explicitly); [`Node::start`] takes that bound listener, so tests bind
//! `127.0.0.1:0` and read the port back. Shutdown runs in a fixed order, documented on
//! [`Node::shutdown`]. This module holds no behaviour of its own beyond that wiring.

use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_cert::{
    CertIdentity, CertRole, OriginSigner, OriginVerifier, RevokedSet, TlsError,
    ca::{self, CaSigner},
    origin,
};
use mesh_domain::{HealthStatus, NodeId, PeerState};
use mesh_join::bootstrap;
use mesh_tls::{Dialer, MeshTls, TlsFiles};
use tokio::{
    net::{TcpListener, UdpSocket},
    sync::mpsc,
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::{
    admission::Admission,
    agent::{
        AgentRuntime,
        hooks::Hooks,
        tools::{DataTools, ToolRegistry},
    },
    api_keys,
    approvals::Approvals,
    capabilities::Capabilities,
    chat::ChatService,
    config::{Config, ConfigError, DEFAULT_HTTP_PORT, LAST_FALLBACK_PORT, Listen, TlsMode},
    cron::{ScheduleLimits, Scheduler},
    discovery::{Advert, Discovery, Mdns, StaticPeers},
    gateway::{self, Gateway, GatewayParts},
    http::{self, FrontDoor},
    issuer::Issuer,
    llm::ModelRegistry,
    mcp::{self, McpHub},
    memory::{self, LagGauges, Memory, MemoryOptions},
    peers::{
        PeerTable,
        adverts::AdvertGuard,
        envelope::{Opener, Sealer},
        swim::{self, Member, Membership},
    },
    rpc::{
        NodeLink, NodeService, PeerChannels,
        accept::TlsIncoming,
        approvals::ApprovalsService,
        cron::CronService,
        gate::CertificateGateLayer,
        join::JoinService,
        keys::KeysService,
        memory::{MemoryService, RemoteMemory},
        models::{ModelsService, RemoteModels},
        settings::SettingsService,
        tasks::{RemoteTasks, TasksService},
        tools::{RemoteToolsClient, ToolsService},
    },
    settings::{Settings, Targets},
    storage::{self, SledStore, Store},
    supervise::{Backoff, Supervisor, no_error},
    tasks::{TaskManager, TaskParts},
};

/// How long in-flight RPCs get to finish once the node stops accepting.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long running tasks get to finish at shutdown before they are cancelled.
pub const TASK_GRACE: Duration = Duration::from_secs(10);
/// File in the data dir holding the address the node actually listens on.
pub const ADDR_FILE: &str = "node.addr";
/// The file in the data directory holding the front door's bound address.
pub const HTTP_ADDR_FILE: &str = "http.addr";

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No port could be bound. (The OS error is in the message, not a `source`: printed with
    /// its causes, the error would say it twice.)
    #[error("cannot listen on {addr}: {}{hint}", io_words(error))]
    Bind {
        /// What was tried.
        addr: SocketAddr,
        /// The OS error.
        error: io::Error,
        /// A hint on how to fix it.
        hint: &'static str,
    },
    /// Certificates could not be loaded or created.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The data dir cannot be created.
    #[error("cannot create data dir {}: {}; set node.data_dir or --data-dir to a writable directory", path.display(), io_words(error))]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// Two hooks claim the same stage and order.
    #[error("hooks: {0}")]
    Hooks(String),
    /// The node was given a client certificate, which may never serve as a node.
    #[error(
        "{} is a client certificate (role `client`): a node needs one issued with `mesh-cli ca issue --role node`", .0.display()
    )]
    ClientCertificate(PathBuf),
    /// The configuration asks for something this node does not have (found once the parts it
    /// names exist, such as the tool table).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another process holds the data dir's database (sled locks it while open).
    #[error("the data dir {} is in use: another mesh-node runs on it (its database, {}, is locked); stop that node, or start this one with another --data-dir", data_dir.display(), db.display())]
    DataDirInUse {
        /// The data dir.
        data_dir: PathBuf,
        /// The locked database.
        db: PathBuf,
    },
    /// The sled database could not be opened.
    #[error("cannot open the database in {}: {error}", path.display())]
    Storage {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        error: sled::Error,
    },
    /// A configured front-door key cannot be used (its key file).
    #[error(transparent)]
    Keys(#[from] api_keys::KeysError),
    /// The node was given a name that is not its certificate's: its peers would refuse its
    /// `NodeInfo`, so it does not start as someone it cannot prove to be.
    #[error(
        "this node is named `{name}` (node.name in {file}, or --name), but its certificate was issued to `{issued}`; peers refuse a node whose name is not its certificate's. Set `name = \"{issued}\"` under [node] (or drop node.name and --name), or give this node a certificate issued for `{name}`: `mesh-cli ca issue --role node --name {name}` where the CA key is, or `mesh-node --join TOKEN` into a fresh data dir"
    )]
    NameNotCertificates {
        /// The name given.
        name: String,
        /// The name the certificate was issued for.
        issued: String,
        /// The config file (the name was given there or with `--name`).
        file: String,
    },
    /// The certificate carries no usable node name.
    #[error(
        "this node's certificate {problem}; issue one with `mesh-cli ca issue --role node --name NAME`"
    )]
    CertificateName {
        /// What is wrong with it.
        problem: String,
    },
}

/// An OS error in words: `Address already in use`, without the `(os error 98)` that only a
/// programmer can use.
fn io_words(error: &io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
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

/// How often a node collects its own front-door usage records of past months.
const USAGE_COLLECT_INTERVAL: Duration = Duration::from_secs(3600);

/// Collects this node's old usage records every [`USAGE_COLLECT_INTERVAL`], until `cancel`.
async fn collect_usage(keys: Arc<api_keys::Keys>, cancel: CancellationToken) {
    loop {
        match keys.collect(mesh_domain::time::now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                records = n,
                "collected front-door usage records of past months"
            ),
            Err(e) => tracing::warn!(error = %e, "collect front-door usage records"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(USAGE_COLLECT_INTERVAL) => {}
        }
    }
}

/// Binds the listener `listen` asks for. When the port was not chosen explicitly and is taken,
/// tries the following ports up to 7710.
pub async fn bind(listen: Listen) -> Result<TcpListener, StartError> {
    bind_up_to(listen, LAST_FALLBACK_PORT).await
}

/// Pending connections the kernel queues for a listener before the node accepts them (capped
/// by `net.core.somaxconn`). The default of 128 overflows under a burst of connections (an
/// idle-socket flood, many clients at once) while the node is busy, and a connection dropped
/// from the queue waits a second or more for its SYN to be sent again, however idle the node
/// is a moment later.
const LISTEN_BACKLOG: u32 = 4096;
/// How often the gRPC server pings a connection it heard nothing on, and how long it waits
/// for the answer before closing it.
const SERVER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const SERVER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as `TcpListener::bind`
/// sets it, so a restarted node gets its port back at once).
fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `listen`; when its port was not chosen, the next free one up to `last_fallback`.
async fn bind_up_to(listen: Listen, last_fallback: u16) -> Result<TcpListener, StartError> {
    let last = if listen.fallback {
        last_fallback.max(listen.addr.port())
    } else {
        listen.addr.port()
    };
    let mut addr = listen.addr;
    loop {
        match listen_on(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && addr.port() < last => {
                tracing::info!(port = addr.port(), "port taken; trying the next one");
                addr.set_port(addr.port() + 1);
            }
            Err(source) => {
                let hint = if source.kind() == io::ErrorKind::AddrInUse {
                    "; another mesh-node may be running: stop it, or choose another port with --listen"
                } else {
                    ""
                };
                return Err(StartError::Bind {
                    addr,
                    error: source,
                    hint,
                });
            }
        }
    }
}

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
    /// Stops the task workers once running tasks are finished or cancelled.
    task_stop: CancellationToken,
    task_workers: JoinSet<()>,
    /// Ends served `WatchInfo` streams: peers see us leave before anything else stops.
    leaving: CancellationToken,
    /// Stops discovery (mDNS goodbye) and membership sessions.
    background: CancellationToken,
    /// Stops the gRPC server (graceful drain).
    serve: CancellationToken,
    /// Every long-running loop, restarted when it fails (so none dies silently).
    supervisor: Supervisor,
    /// The front door's server (it owns its listener, so it is not restarted).
    background_tasks: JoinSet<()>,
    server_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Node {
    /// Starts a node on an already-bound listener.
    pub async fn start(mut config: Config, listener: TcpListener) -> Result<Self, StartError> {
        let addr = listener.local_addr().map_err(|error| StartError::Bind {
            addr: config.listen.addr,
            error,
            hint: "",
        })?;
        std::fs::create_dir_all(&config.data_dir).map_err(|error| StartError::DataDir {
            path: config.data_dir.clone(),
            error,
        })?;

        let (mesh_tls, signer, verifier, fingerprint) = match &config.tls {
            TlsMode::Insecure => {
                tracing::warn!(
                    "--insecure: plain TCP, no authentication; anyone who can reach {addr} can use this node"
                );
                (
                    None,
                    origin::insecure_identity(&config.data_dir)?,
                    OriginVerifier::self_certified(),
                    String::new(),
                )
            }
            TlsMode::Mtls(files) => load_tls(files)?,
            TlsMode::Bootstrap => load_tls(&bootstrap_tls(&config.data_dir, &config.name)?)?,
        };
        if let Some(tls) = &mesh_tls {
            config.name = node_name(&config, tls.identity())?;
        }
        let id = signer.id().clone();
        let issuer_ca = issuer_ca(&config)?;

        let caps = Arc::new(Capabilities::new(
            &config,
            id.clone(),
            fingerprint.clone(),
            advertised_addrs(addr),
        ));
        let not_after = mesh_tls.as_ref().map(|tls| tls.identity().not_after);
        run_health_checks(&caps, &config.data_dir, not_after);
        // Before the advert is built, so its `gpu` count includes probed GPUs (bounded by a 5 s
        // timeout inside; instant on hosts without nvidia-smi).
        caps.probe_gpus().await;

        let peers = Arc::new(PeerTable::for_node(id.clone(), config.name.clone()));
        let (events_tx, events_rx) = mpsc::channel(1024);
        let leaving = CancellationToken::new();
        let background = CancellationToken::new();
        let serve = CancellationToken::new();
        let mut background_tasks = JoinSet::new();
        let mut supervisor = Supervisor::new(caps.clone(), Backoff::default());

        let dialer = match &mesh_tls {
            Some(tls) => tls.dialer(),
            None => Dialer::Plain,
        };
        // Membership asks the mDNS source through this to offer adverts it dropped again.
        let reoffer = Arc::new(tokio::sync::Notify::new());
        // SWIM listens on UDP at the gRPC port's number and address (one port to open and
        // forward); bound here, once, so a restarted loop keeps it.
        let socket = Arc::new(UdpSocket::bind(addr).await.map_err(|error| StartError::Bind {
            addr,
            error,
            hint: " (membership's UDP socket, on the same port as gRPC: free that UDP port)",
        })?);
        if let Err(e) = swim::enlarge_receive_buffer(&socket) {
            tracing::warn!(error = %e, "cannot enlarge the membership socket's receive buffer; a datagram flood may crowd out members' probes sooner");
        }
        if let Err(e) = crate::peers::icmp::enable(&socket) {
            tracing::warn!(error = %e, "cannot receive ICMP errors on the membership socket; a crashed peer is found by the probes alone (~1 s later)");
        }
        let signer = Arc::new(signer);
        let verifier = Arc::new(verifier);
        let own = Member {
            id: id.clone(),
            addr: member_addr(addr),
            bump: next_run(&config.data_dir),
        };
        let membership = Arc::new(Membership {
            own,
            socket,
            sealer: Arc::new(Sealer::new(signer.clone())),
            opener: Arc::new(Opener::new(verifier.clone())),
            link: Arc::new(NodeLink::new(dialer.clone())),
            table: peers.clone(),
            changes: caps.subscribe(),
            config: swim::lan_config(),
            restarts: std::sync::atomic::AtomicU64::new(0),
            adverts: std::sync::Mutex::new(AdvertGuard::new(
                config.discovery.max_advert_dials,
                config.discovery.max_failing_addrs,
                reoffer.clone(),
            )),
        });
        // Shared between runs: a restarted membership reads on where the last one stopped. It
        // stops when the node starts leaving, so its goodbye goes out first.
        let events_rx = Arc::new(tokio::sync::Mutex::new(events_rx));
        supervisor.spawn("membership", leaving.clone(), move |cancel| {
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
                id: id.clone(),
                port: addr.port(),
                roles: config.roles.clone(),
                gpus: caps.snapshot().resources.gpus.len(),
                fingerprint: fingerprint.clone(),
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

        let db = open_db(&config.data_dir)?;
        let store =
            Arc::new(SledStore::new(db).with_floor(config.data_dir.clone(), config.min_free_disk));
        let issuer = issuer_ca.map(|ca| {
            tracing::info!("this node is an issuer: add a device with `mesh-cli token create`, then `mesh-node --join TOKEN` on it");
            let store: Arc<dyn Store> = store.clone();
            Arc::new(Issuer::new(ca, store, peers.clone()))
        });
        let channels = PeerChannels::new(dialer.clone()).reporting_to(peers.clone());
        let (memory, memory_writes) = Memory::open(
            store.clone(),
            signer,
            verifier,
            MemoryOptions {
                local_namespaces: config.local_namespaces.clone(),
                max_skew: config.max_clock_skew,
                tombstone_window: config.tombstone_window,
                sync_interval: config.sync_interval,
                fanout: config.memory_fanout,
                max_namespaces: config.max_namespaces,
            },
        );
        {
            let (memory, peers) = (memory.clone(), peers.clone());
            let link: Arc<dyn memory::MemoryPeers> =
                Arc::new(RemoteMemory::new(channels.clone(), id.clone()));
            // Shared between runs: a restarted replicator pushes the writes not yet pushed.
            let writes = Arc::new(tokio::sync::Mutex::new(memory_writes));
            supervisor.spawn("replication", background.clone(), move |cancel| {
                let (memory, peers, link, writes) =
                    (memory.clone(), peers.clone(), link.clone(), writes.clone());
                no_error(async move {
                    let mut writes = writes.lock_owned().await;
                    memory::replicate(memory, peers, link, &mut writes, cancel).await;
                })
            });
        }
        caps.follow_memory_seq(memory.follow_own_seq());
        // A peer whose certificate is revoked (loaded at start, or learned from any path) leaves
        // the table's live rows at once; its session ends at its next beat.
        {
            let (revoked, peers, caps) = (memory.revoked().clone(), peers.clone(), caps.clone());
            let probe = Arc::new(RevocationProbe {
                dialer: dialer.clone(),
                addrs: static_peers.clone(),
            });
            supervisor.spawn("revocations", background.clone(), move |cancel| {
                no_error(follow_revocations(
                    revoked.clone(),
                    peers.clone(),
                    caps.clone(),
                    probe.clone(),
                    cancel,
                ))
            });
        }
        // Discovery starts only now that the memory has loaded the revocations into the
        // dialer's revoked set, so no revoked peer is dialed (and listed up) at start.
        for source in sources {
            tracing::info!(source = source.name(), "discovery started");
            let events_tx = events_tx.clone();
            supervisor.spawn(
                &format!("discovery {}", source.name()),
                background.clone(),
                move |cancel| no_error(source.clone().run(events_tx.clone(), cancel)),
            );
        }
        let (models, skipped) = ModelRegistry::from_config(&config);
        for (name, reason) in skipped {
            caps.set_check(
                &format!("model {name}"),
                Some((HealthStatus::Degraded, reason)),
            );
        }
        let models = Arc::new(models);
        caps.follow_model_speeds(models.speeds());
        {
            // Probed at start and then with the other health checks, so a model server that
            // comes up later clears the node's `degraded` reason.
            let (models, probe_caps) = (models.clone(), caps.clone());
            supervisor.spawn("model prober", leaving.clone(), move |stop| {
                no_error(probe_models(models.clone(), probe_caps.clone(), stop))
            });
        }
        // One door for every task and chat, whichever way it comes.
        // The client certificates of this node's own machine are its operators (they may
        // change its settings and the fleet's front-door keys); there are none without TLS.
        let operators = match &mesh_tls {
            Some(_) => bootstrap::operator_certificates(&config.data_dir),
            None => Vec::new(),
        };
        for operator in &operators {
            tracing::info!(
                operator = operator.common_name.as_deref().unwrap_or_default(),
                id = %operator.id.short(),
                "this machine's client certificate operates this node: it may change its settings (mesh-cli config) and the fleet's front-door keys"
            );
        }
        // Read again at each decision: `mesh-cli join` on this machine after the node started
        // makes an operator at once.
        let operators_of = mesh_tls.is_some().then(|| config.data_dir.clone());
        let admission = Arc::new(
            Admission::new(caps.clone(), peers.clone(), config.client_max_tier)
                .with_mcp_max_tier(config.mcp_max_tier)
                .with_operators(move || {
                    operators_of.as_deref().map_or_else(Vec::new, |data_dir| {
                        bootstrap::operator_certificates(data_dir)
                            .into_iter()
                            .map(|o| o.id)
                            .collect()
                    })
                }),
        );
        // This node's MCP servers, each kept connected by a supervised loop (restarted with
        // back-off, named in the health while down); their tools are advertised to the fleet.
        let mcp_hub = McpHub::new(config.mcp.clone(), caps.clone());
        caps.follow_mcp_tools(mcp_hub.advertised());
        for (index, name) in mcp_hub.servers().iter().enumerate() {
            let hub = mcp_hub.clone();
            supervisor.spawn(&mcp::loop_name(name), background.clone(), move |cancel| {
                hub.clone().run(index, cancel)
            });
        }
        let tools = Arc::new(
            ToolRegistry::new(
                caps.clone(),
                peers.clone(),
                config.tool_roots.clone(),
                memory.clone(),
            )
            // The fleet's MCP tools: this node's, and its peers' through `Tools.Call`.
            .with_mcp(
                mcp_hub.clone(),
                peers.clone(),
                Arc::new(RemoteToolsClient::new(channels.clone())),
            ),
        );
        check_persona_tools(&config, &tools)?;
        // Every tool call passes this gate; calls `[approval]` names wait for a person.
        let approvals = Approvals::new(
            memory.clone(),
            admission.clone(),
            config.name.clone(),
            config.approval.clone(),
            mesh_tls.is_some(),
        );
        let runtime = Arc::new(
            AgentRuntime::new(
                memory.clone(),
                models.clone(),
                tools.clone(),
                Hooks::supervisor().map_err(|e| StartError::Hooks(e.to_string()))?,
                config.personas.clone(),
                config.tasks,
            )
            .with_approvals(approvals.clone()),
        );
        let chat = Arc::new(ChatService::new(
            models.clone(),
            admission.clone(),
            Arc::new(RemoteModels::new(channels.clone())),
        ));
        let task_stop = CancellationToken::new();
        let mut task_workers = JoinSet::new();
        let tasks = TaskManager::start(
            TaskParts {
                store: store.clone(),
                runtime,
                chat: chat.clone(),
                limits: config.tasks,
                caps: caps.clone(),
                admission: admission.clone(),
                forwarder: Arc::new(RemoteTasks::new(channels.clone())),
            },
            &mut task_workers,
            task_stop.clone(),
        );
        // The `delegate` tool's sub-tasks go through the same door as any task.
        tools.connect_subtasks(Arc::new(tasks.clone()));

        let (health, health_service) = tonic_health::server::health_reporter();
        report_health(&health, &caps).await;
        {
            let (caps, health, store, memory, data_dir) = (
                caps.clone(),
                health.clone(),
                store.clone(),
                memory.clone(),
                config.data_dir.clone(),
            );
            supervisor.spawn("health checks", leaving.clone(), move |stop| {
                no_error(health_loop(
                    caps.clone(),
                    health.clone(),
                    store.clone(),
                    memory.clone(),
                    data_dir.clone(),
                    not_after,
                    stop,
                ))
            });
        }
        // Reflection in both versions: v1, and v1alpha for the tools that only speak that one
        // (the official grpcio-reflection client, older grpcurl, Postman). Both sit behind
        // the certificate gate like every other service.
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(mesh_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_error = |e: tonic_reflection::server::Error| {
            StartError::Tls(TlsError::Config(format!("reflection: {e}")))
        };
        let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
        let reflection = reflection().build_v1().map_err(reflection_error)?;
        let service = NodeService::new(
            caps.clone(),
            peers.clone(),
            events_tx,
            leaving.clone(),
            mesh_tls.is_some(),
        )
        .with_memory(memory.clone());

        let tasks_service = TasksService::new(tasks.clone(), admission.clone(), mesh_tls.is_some());
        // Schedules fire through the same door too; firing stops as the node starts leaving.
        let scheduler = Scheduler::new(
            memory.clone(),
            peers.clone(),
            id.clone(),
            config.name.clone(),
            config.remote_max_tier,
            ScheduleLimits {
                schedules: config.cron.max_schedules,
                schedules_per_creator: config.cron.max_schedules_per_creator,
                bytes: config.cron.max_bytes,
                bytes_per_creator: config.cron.max_bytes_per_creator,
            },
            Arc::new(tasks.clone()),
        );
        {
            let scheduler = scheduler.clone();
            supervisor.spawn("scheduler", leaving.clone(), move |stop| {
                no_error(scheduler.clone().run(stop))
            });
        }

        // The handshake refuses a revoked certificate; an issuer also lets a caller without a
        // certificate through, for `Join` (the gate below refuses it everything else).
        let server_tls = match &mesh_tls {
            Some(tls) => Some(tls.server_config(issuer.is_some())?),
            None => None,
        };
        let revoked = memory.revoked().clone();
        // In front of every service: a caller without a certificate reaches `Join` only, and a
        // revoked one nothing (its connections are closed too, but a call may be under way).
        let mut builder = Server::builder()
            // The server pings idle connections too (hyper always does): rarely, to close
            // those of callers that vanished; callers ping while their calls run.
            .http2_keepalive_interval(Some(SERVER_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(SERVER_KEEPALIVE_TIMEOUT))
            .layer(CertificateGateLayer::new(
                mesh_tls.is_some(),
                revoked.clone(),
            ));
        let keys = Arc::new(api_keys::Keys::new(memory.clone(), &config.http)?);
        {
            let keys = keys.clone();
            supervisor.spawn("usage collection", background.clone(), move |cancel| {
                no_error(collect_usage(keys.clone(), cancel))
            });
        }
        // The OpenAI-compatible front door; a node without one still serves the mesh.
        {
            // Stored Responses-API answers expire; every node deletes what it finds expired.
            let memory = memory.clone();
            supervisor.spawn("responses sweep", leaving.clone(), move |stop| {
                no_error(gateway::sweep_loop(memory.clone(), stop))
            });
        }
        // The gateway reaches the fleet's node list and memory through the agents' data tools
        // (its `MeshData` port), and `/metrics` the replication lag through the memory's gauges.
        let gateway = Arc::new(Gateway::new(GatewayParts {
            chat: chat.clone(),
            keys: keys.clone(),
            memory: memory.clone(),
            admission: admission.clone(),
            data: Arc::new(DataTools::new(memory.clone(), caps.clone(), peers.clone())),
            task_token_budget: config.tasks.token_budget,
        }));
        let door = Arc::new(FrontDoor {
            gateway,
            caps: caps.clone(),
            peers: peers.clone(),
            keys: keys.clone(),
            gauges: Arc::new(LagGauges {
                memory: memory.clone(),
                peers: peers.clone(),
            }),
            tasks: tasks.clone(),
            scheduler: scheduler.clone(),
            guard: http::guard::Guard {
                allowed_hosts: config.http.allowed_hosts.clone(),
                allowed_origins: config.http.allowed_origins.clone(),
            },
            clients: http::clients::Clients::new(&config.http),
        });
        match bind_up_to(config.http.listen, DEFAULT_HTTP_PORT + 10).await {
            Ok(listener) => {
                let http_addr = listener.local_addr().ok();
                if let Some(http_addr) = http_addr {
                    if !http_addr.ip().is_loopback()
                        && config.http.api_keys.is_empty()
                        && config.http.keys.is_empty()
                    {
                        tracing::warn!(%http_addr, "the front door listens beyond loopback without http.api_keys (http.allow_unauthenticated): anyone who can reach it can use every model of the mesh");
                    }
                    let _ = std::fs::write(
                        config.data_dir.join(HTTP_ADDR_FILE),
                        format!("{http_addr}\n"),
                    );
                    tracing::info!(%http_addr, "front door (OpenAI-compatible) listening");
                }
                // Stops taking requests as the node starts leaving.
                background_tasks.spawn(http::serve(
                    listener,
                    http::router(door),
                    config.connections,
                    leaving.clone(),
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no front door: cannot bind http.listen");
                caps.set_check(
                    "front door",
                    Some((
                        HealthStatus::Degraded,
                        format!("cannot bind http.listen: {e}"),
                    )),
                );
            }
        }

        // `mesh-cli config set`: checked, kept in the data dir, applied to these at once.
        let settings = Arc::new(Settings::new(
            config.clone(),
            Targets {
                admission: admission.clone(),
                caps: caps.clone(),
                scheduler: scheduler.clone(),
                approvals: approvals.clone(),
                keys: keys.clone(),
            },
        ));
        let router = builder
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(service.into_server())
            .add_service(tasks_service.into_server())
            .add_service(ModelsService::new(chat).into_server())
            .add_service(
                CronService::new(scheduler, admission.clone(), mesh_tls.is_some()).into_server(),
            )
            .add_service(
                KeysService::new(keys, admission.clone(), mesh_tls.is_some()).into_server(),
            )
            .add_service(ApprovalsService::new(approvals.clone(), mesh_tls.is_some()).into_server())
            .add_service(
                SettingsService::new(settings, admission.clone(), mesh_tls.is_some()).into_server(),
            )
            .add_service(MemoryService::new(memory, mesh_tls.is_some()).into_server())
            .add_service(
                ToolsService::new(mcp_hub, admission.clone(), approvals, mesh_tls.is_some())
                    .into_server(),
            )
            .add_optional_service(issuer.map(|issuer| JoinService::new(issuer).into_server()));
        let stop = serve.clone();
        let stopped = async move { stop.cancelled().await };
        // `serve_with_incoming` ignores the builder's TCP options, so set them on the incoming
        // side; without TCP_NODELAY a streamed event can wait out a delayed ACK (~40 ms).
        let incoming = tonic::transport::server::TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(10)));
        // With TLS the node runs the handshakes itself (`rpc::accept`), so it can refuse a
        // revoked certificate there and close the connections of one revoked later.
        let server_task = match server_tls {
            Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
                TlsIncoming::new(incoming, tls, revoked, &config.connections),
                stopped,
            )),
            None => tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped)),
        };

        if let Err(e) = std::fs::write(config.data_dir.join(ADDR_FILE), format!("{addr}\n")) {
            tracing::warn!(error = %e, "cannot write {ADDR_FILE}");
        }
        tracing::info!(name = %config.name, id = %id.short(), %addr, tls = mesh_tls.is_some(), "node started");

        Ok(Self {
            addr,
            id,
            data_dir: config.data_dir,
            caps,
            peers,
            health,
            store,
            tasks,
            task_stop,
            task_workers,
            leaving,
            background,
            serve,
            supervisor,
            background_tasks,
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
        self.supervisor.names()
    }

    /// The capabilities (for tests and the task runner).
    pub fn capabilities(&self) -> Arc<Capabilities> {
        self.caps.clone()
    }

    /// Stops the node, in this order:
    /// 1. end every served `WatchInfo` stream and refuse new ones, so peers mark us down at once
    ///    and route nothing new here;
    /// 2. stop admitting tasks, give running ones [`TASK_GRACE`] to finish, cancel the rest (each
    ///    ends with a `failed: cancelled` event its caller sees), stop the workers;
    /// 3. stop discovery (mDNS goodbye) and close our own watch sessions;
    /// 4. stop the gRPC server, letting in-flight calls finish for up to [`SHUTDOWN_GRACE`];
    /// 5. flush sled and remove the address file.
    pub async fn shutdown(mut self) {
        tracing::info!("shutting down");
        self.leaving.cancel();
        self.health
            .set_not_serving::<mesh_proto::v1::node_server::NodeServer<NodeService>>()
            .await;

        self.tasks.shutdown(TASK_GRACE).await;
        self.task_stop.cancel();
        while self.task_workers.join_next().await.is_some() {}

        self.background.cancel();
        self.supervisor.shutdown().await;
        while let Some(done) = self.background_tasks.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "background task failed during shutdown");
            }
        }

        self.serve.cancel();
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

/// Every tool a persona lists must be in the node's tool table.
fn check_persona_tools(config: &Config, tools: &ToolRegistry) -> Result<(), ConfigError> {
    for (i, persona) in config.personas.iter().enumerate() {
        for (t, tool) in persona.tools.iter().flatten().enumerate() {
            if !tools.may_list(tool) {
                return Err(ConfigError::Invalid {
                    origin: config.source.as_ref().map_or_else(
                        || "configuration".to_owned(),
                        |path| path.display().to_string(),
                    ),
                    key: format!("personas[{i}].tools[{t}]"),
                    problem: format!("names tool `{tool}`, which does not exist"),
                    fix: format!(
                        "use some of: {}, or an MCP tool's `<server>__<tool>`",
                        tools.names().join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The CA this node signs join-token certificates with, if it is an issuer: `tls.ca_key` with
/// the configured CA, or a zero-config node's own CA when its key is in the data dir.
fn issuer_ca(config: &Config) -> Result<Option<CaSigner>, StartError> {
    let (ca, key) = match (&config.tls, &config.ca_key) {
        (TlsMode::Mtls(files), Some(key)) => (files.ca.clone(), key.clone()),
        (TlsMode::Bootstrap, _) => (
            bootstrap::tls_dir(&config.data_dir).join(ca::CA_CERT_FILE),
            bootstrap::ca_key(&config.data_dir),
        ),
        _ => return Ok(None),
    };
    if config.tls == TlsMode::Bootstrap && !key.exists() {
        // A node that joined with a token holds no CA key.
        return Ok(None);
    }
    Ok(Some(CaSigner::load(&ca, &key)?))
}

/// The node's TLS material, the signer of its records (its certificate's key) and the verifier
/// of peers' records (the same CA), and its certificate's fingerprint.
type Identity = (Option<MeshTls>, OriginSigner, OriginVerifier, String);

fn load_tls(files: &TlsFiles) -> Result<Identity, StartError> {
    let tls = MeshTls::load(files)?;
    match tls.identity().role {
        Some(CertRole::Node) => {}
        Some(CertRole::Client) => {
            return Err(StartError::ClientCertificate(files.cert.clone()));
        }
        None => tracing::warn!(
            cert = %files.cert.display(),
            "this node's certificate carries no role (issued before roles existed): peers trust it \
             least; issue a new one with `mesh-cli ca issue --role node`"
        ),
    }
    let signer = tls.origin_signer().map_err(|e| TlsError::KeyMismatch {
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let verifier = tls.origin_verifier()?;
    let fingerprint = tls.identity().fingerprint.clone();
    Ok((Some(tls), signer, verifier, fingerprint))
}

/// The name this node runs under: the one its certificate was issued for, which is what its
/// peers check its `NodeInfo` against. A host name that differs gives way to it (logged); a
/// name the user gave (`node.name`, `--name`) that differs is an error naming both fixes.
fn node_name(config: &Config, certificate: &CertIdentity) -> Result<String, StartError> {
    let Some(issued) = certificate.common_name.as_deref() else {
        return Err(StartError::CertificateName {
            problem: "names no node (it has no common name)".into(),
        });
    };
    if !crate::config::is_valid_node_name(issued) {
        return Err(StartError::CertificateName {
            problem: format!(
                "is issued to `{issued}`, which is not a valid node name (1-63 ASCII letters, digits, `-` or `_`)"
            ),
        });
    }
    if issued == config.name {
        return Ok(config.name.clone());
    }
    if config.name_from_host {
        tracing::info!(
            host = %config.name,
            name = issued,
            "this node runs as `{issued}`, the name its certificate was issued for, not as its host name `{}`; set node.name to say so and silence this",
            config.name
        );
        return Ok(issued.to_owned());
    }
    Err(StartError::NameNotCertificates {
        name: config.name.clone(),
        issued: issued.to_owned(),
        file: config.source.as_ref().map_or_else(
            || "no config file".into(),
            |path| path.display().to_string(),
        ),
    })
}

/// Zero-config TLS: a CA of this node's own under `<data_dir>/tls`, created on first start with
/// a certificate for the node and one for the local `mesh-cli`.
fn bootstrap_tls(data_dir: &Path, name: &str) -> Result<TlsFiles, StartError> {
    let (files, created) = bootstrap::bootstrap(data_dir, name)?;
    if created {
        let dir = bootstrap::tls_dir(data_dir);
        tracing::info!(dir = %dir.display(), "created a new mesh CA for this node; to add a device, run `mesh-cli token create` here and `mesh-node --join TOKEN` there");
    }
    Ok(files)
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

/// `addr`, or one `ip:port` per interface address when listening on a wildcard.
fn advertised_addrs(addr: SocketAddr) -> Vec<String> {
    if !addr.ip().is_unspecified() {
        return vec![addr.to_string()];
    }
    let mut addrs: Vec<String> = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|iface| iface.ip())
        .filter(|ip| ip.is_ipv4() == addr.is_ipv4() || addr.is_ipv6())
        .map(|ip| SocketAddr::new(ip, addr.port()).to_string())
        .collect();
    addrs.sort();
    addrs.truncate(16);
    addrs
}

/// How often the start-up health checks run again (a disk can fill, a certificate can expire).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// How often the data dir's free space is checked (a statvfs), so `degraded` comes and goes
/// with it within seconds.
const DISK_CHECK_INTERVAL: Duration = Duration::from_secs(2);

fn run_health_checks(caps: &Capabilities, data_dir: &Path, not_after: Option<i64>) {
    check_data_dir(caps, data_dir);
    if let Some(not_after) = not_after {
        check_cert_expiry(caps, not_after);
    }
}

/// Re-runs the health checks until the node starts leaving, mirroring the result into
/// `grpc.health.v1` so `grpc_health_probe` sees an unhealthy node as `NOT_SERVING`.
async fn health_loop(
    caps: Arc<Capabilities>,
    health: tonic_health::server::HealthReporter,
    store: Arc<SledStore>,
    memory: Arc<Memory>,
    data_dir: PathBuf,
    not_after: Option<i64>,
    leaving: CancellationToken,
) {
    let mut tick = tokio::time::interval(DISK_CHECK_INTERVAL);
    let every = (HEALTH_CHECK_INTERVAL.as_millis() / DISK_CHECK_INTERVAL.as_millis()).max(1);
    for round in 0u128.. {
        tokio::select! {
            () = leaving.cancelled() => return,
            _ = tick.tick() => {}
        }
        check_disk(&caps, &store);
        caps.set_check(
            "clock",
            memory
                .clock_problem()
                .map(|problem| (HealthStatus::Degraded, problem)),
        );
        if round > 0 && round % every == 0 {
            run_health_checks(&caps, &data_dir, not_after);
        }
        report_health(&health, &caps).await;
    }
}

fn check_disk(caps: &Capabilities, store: &SledStore) {
    caps.set_check(
        "disk",
        match store.disk_problem() {
            Err(failed) => Some((HealthStatus::Unhealthy, failed)),
            Ok(low) => low.map(|low| (HealthStatus::Degraded, low)),
        },
    );
}

async fn report_health(health: &tonic_health::server::HealthReporter, caps: &Capabilities) {
    type Service = mesh_proto::v1::node_server::NodeServer<NodeService>;
    if caps.health().status == HealthStatus::Unhealthy {
        health.set_not_serving::<Service>().await;
    } else {
        health.set_serving::<Service>().await;
    }
}

fn check_data_dir(caps: &Capabilities, dir: &Path) {
    let probe = dir.join(".write-test");
    let result = std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe));
    caps.set_check(
        "data_dir",
        result.err().map(|e| {
            (
                HealthStatus::Degraded,
                format!("{} is not writable ({e})", dir.display()),
            )
        }),
    );
}

fn check_cert_expiry(caps: &Capabilities, not_after: i64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let left = not_after - now;
    let failure = if left <= 0 {
        Some((
            HealthStatus::Unhealthy,
            "certificate has expired; issue a new one with `mesh-cli ca issue --role node`"
                .to_owned(),
        ))
    } else if left < 14 * 24 * 3600 {
        Some((
            HealthStatus::Degraded,
            format!("certificate expires in {} days", left / 86400),
        ))
    } else {
        None
    };
    caps.set_check("tls", failure);
}

/// Probes every model at start and then every [`HEALTH_CHECK_INTERVAL`], so a model server that
/// comes up later clears the node's `degraded` reason.
async fn probe_models(
    models: Arc<ModelRegistry>,
    caps: Arc<Capabilities>,
    stop: CancellationToken,
) {
    loop {
        for (name, result) in models.probe_all().await {
            caps.set_check(
                &format!("model {name}"),
                result
                    .err()
                    .map(|e| (HealthStatus::Degraded, format!("unreachable ({e})"))),
            );
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(HEALTH_CHECK_INTERVAL) => {}
        }
    }
}

/// What a node whose own certificate was revoked says, in its health (`certificate: …`) and
/// its log.
pub const OWN_CERTIFICATE_REVOKED: &str = "this node's certificate was revoked by the mesh CA, so the fleet refuses it; to rejoin, run `mesh-cli token create` where the CA key is and restart this node with `mesh-node --join TOKEN`";

/// How often a node with no peer up asks the nodes it dials at start whether they refuse its
/// certificate as revoked.
const REVOCATION_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Most of those nodes asked in one round.
const REVOCATION_PROBES: usize = 4;

/// Where a node that hears from nobody asks whether its certificate was revoked: the static
/// peers and the issuer it joined with (a revoked node's datagrams are dropped in silence,
/// but a TLS handshake is refused with `certificate_revoked`).
struct RevocationProbe {
    dialer: Dialer,
    addrs: Vec<String>,
}

impl RevocationProbe {
    /// The first address whose node refuses this node's certificate as revoked.
    async fn refused_at(&self) -> Option<&str> {
        for addr in self.addrs.iter().take(REVOCATION_PROBES) {
            if self.dialer.certificate_refusal(addr).await
                == Some(mesh_tls::CertificateRefusal::Revoked)
            {
                return Some(addr);
            }
        }
        None
    }
}

/// Marks every revoked certificate's peer row `revoked`, now and after every new revocation;
/// and finds out whether this node's own certificate was revoked, from a revocation it holds
/// or, while no peer is up, from `probe`. A revoked node is `unhealthy` and says so once.
async fn follow_revocations(
    revoked: RevokedSet,
    peers: Arc<PeerTable>,
    caps: Arc<Capabilities>,
    probe: Arc<RevocationProbe>,
    stop: CancellationToken,
) {
    let mut changed = revoked.subscribe();
    let mut tick = tokio::time::interval(REVOCATION_PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut own_revoked = false;
    let learn = |how: &str| {
        tracing::warn!(how, "{OWN_CERTIFICATE_REVOKED}");
        caps.set_check(
            "certificate",
            Some((HealthStatus::Unhealthy, OWN_CERTIFICATE_REVOKED.to_owned())),
        );
        true
    };
    loop {
        for revocation in revoked.list() {
            peers.revoke(&revocation.id);
        }
        if !own_revoked && revoked.contains(caps.id()) {
            own_revoked = learn("a revocation signed by the mesh CA reached this node");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            result = changed.changed() => if result.is_err() { return },
            _ = tick.tick() => {
                let alone = !peers.snapshot().iter().any(|p| p.state == PeerState::Up);
                if !own_revoked && alone && let Some(addr) = probe.refused_at().await {
                    own_revoked = learn(&format!("{addr} refuses this node's certificate as revoked"));
                }
            }
        }
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

    /// A config naming the node `name` (`None`: no name given, the host's), and a certificate
    /// issued to `issued`.
    fn named(name: Option<&str>, issued: Option<&str>) -> (Config, CertIdentity) {
        let file = std::path::Path::new("node.toml");
        let text = name.map_or_else(String::new, |n| format!("[node]\nname = \"{n}\"\n"));
        let config = crate::config::RawConfig::parse(&text, file)
            .expect("parse")
            .validate(Some(file), &Overrides::default())
            .expect("valid");
        let certificate = CertIdentity {
            id: NodeId::from_spki_der(b"key"),
            fingerprint: String::new(),
            common_name: issued.map(str::to_owned),
            role: Some(CertRole::Node),
            not_before: 0,
            not_after: 0,
        };
        (config, certificate)
    }

    /// Issue 26: a node runs under its certificate's name. A host name gives way to it; a name
    /// the user gave that differs stops the start, naming both and the fixes.
    #[test]
    fn a_node_runs_under_its_certificates_name() {
        let (config, cert) = named(Some("alpha"), Some("alpha"));
        assert_eq!(node_name(&config, &cert).expect("the same"), "alpha");

        let (config, cert) = named(None, Some("alpha"));
        assert!(config.name_from_host);
        assert_eq!(
            node_name(&config, &cert).expect("the host's gives way"),
            "alpha"
        );

        let (config, cert) = named(Some("a"), Some("evil"));
        let refused = node_name(&config, &cert).expect_err("given, and not the certificate's");
        let message = refused.to_string();
        for part in [
            "named `a`",
            "node.toml",
            "issued to `evil`",
            "name = \"evil\"",
            "mesh-cli ca issue --role node --name a",
            "mesh-node --join TOKEN",
        ] {
            assert!(message.contains(part), "`{part}` missing: {message}");
        }

        let (config, cert) = named(None, None);
        let message = node_name(&config, &cert).expect_err("no name").to_string();
        assert!(message.contains("names no node"), "{message}");
        let (config, cert) = named(None, Some("gpu.lan"));
        let message = node_name(&config, &cert)
            .expect_err("not a node name")
            .to_string();
        assert!(
            message.contains("`gpu.lan`, which is not a valid node name"),
            "{message}"
        );
    }
}
