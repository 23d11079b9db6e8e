//! Edges: the front door (its keys, its gateway, its listener) and the gRPC services on the
//! node's listener, behind the certificate gate and, with TLS, the node's own accept loop.

use std::{sync::Arc, time::Duration};

use mesh_cert::TlsError;
use mesh_domain::HealthStatus;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::pb::health_server::{Health, HealthServer};

use super::{
    binding::bind_up_to,
    error::StartError,
    fleet::{Fleet, Shared},
    identity::NodeIdentity,
    loops::Loops,
    work::Work,
};
use crate::{
    agent::tools::DataTools,
    api_keys,
    capabilities::Capabilities,
    config::{Config, DEFAULT_HTTP_PORT},
    cron::Scheduler,
    gateway::{self, Gateway, GatewayParts},
    http::{self, FrontDoor},
    issuer::Issuer,
    memory::LagGauges,
    rpc::{
        NodeService, accept::TlsIncoming, approvals::ApprovalsService, cron::CronService,
        gate::CertificateGateLayer, join::JoinService, keys::KeysService, memory::MemoryService,
        models::ModelsService, settings::SettingsService, tasks::TasksService, tools::ToolsService,
    },
    settings::{Settings, Targets},
    supervise::no_error,
};

/// The file in the data directory holding the front door's bound address.
pub const HTTP_ADDR_FILE: &str = "http.addr";

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

/// Step 9: the front-door keys (their old usage collected by `usage collection`), the
/// stored-answer sweep, the gateway, and the front door served on `http.listen` until the node
/// starts leaving. A node that cannot bind it runs without one, `degraded`.
pub(super) async fn front_door(
    config: &Config,
    caps: &Arc<Capabilities>,
    fleet: &Fleet,
    shared: &Shared,
    work: &Work,
    scheduler: &Arc<Scheduler>,
    loops: &mut Loops,
) -> Result<Arc<api_keys::Keys>, StartError> {
    let (peers, memory) = (&fleet.peers, &shared.memory);
    let keys = Arc::new(api_keys::Keys::new(memory.clone(), &config.http)?);
    let collected = keys.clone();
    loops.supervisor.spawn(
        "usage collection",
        loops.background.clone(),
        move |cancel| no_error(collect_usage(collected.clone(), cancel)),
    );
    // Stored Responses-API answers expire; every node deletes what it finds expired.
    let swept = memory.clone();
    loops
        .supervisor
        .spawn("responses sweep", loops.leaving.clone(), move |stop| {
            no_error(gateway::sweep_loop(swept.clone(), stop))
        });
    // The gateway reaches the fleet's node list and memory through the agents' data tools
    // (its `MeshData` port), and `/metrics` the replication lag and the models' decode speeds
    // through their gauges.
    let gateway = Arc::new(Gateway::new(GatewayParts {
        chat: work.chat.clone(),
        keys: keys.clone(),
        memory: memory.clone(),
        admission: work.admission.clone(),
        data: Arc::new(DataTools::new(memory.clone(), caps.clone(), peers.clone())),
        task_token_budget: config.tasks.token_budget,
    }));
    let door = Arc::new(FrontDoor {
        gateway,
        caps: caps.clone(),
        peers: peers.clone(),
        keys: keys.clone(),
        gauges: vec![
            Arc::new(LagGauges {
                memory: memory.clone(),
                peers: peers.clone(),
            }),
            work.models.clone(),
        ],
        tasks: work.tasks.clone(),
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
            loops.background_tasks.spawn(http::serve(
                listener,
                http::router(door),
                config.connections,
                loops.leaving.clone(),
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
    Ok(keys)
}

/// How often the gRPC server pings a connection it heard nothing on, and how long it waits
/// for the answer before closing it.
const SERVER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const SERVER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the gRPC services of step 10 are built on.
pub(super) struct Services<'a, H> {
    pub(super) config: &'a Config,
    pub(super) identity: &'a NodeIdentity,
    pub(super) caps: &'a Arc<Capabilities>,
    pub(super) fleet: &'a Fleet,
    pub(super) shared: &'a Shared,
    pub(super) work: &'a Work,
    pub(super) scheduler: Arc<Scheduler>,
    pub(super) keys: Arc<api_keys::Keys>,
    pub(super) issuer: Option<Arc<Issuer>>,
    /// `grpc.health.v1`, as step 8 keeps it.
    pub(super) health: HealthServer<H>,
}

/// Step 10: every gRPC service on the node's `listener`, until [`Loops::serve`] is cancelled.
pub(super) fn serve_grpc<H: Health>(
    listener: TcpListener,
    services: Services<'_, H>,
    loops: &Loops,
) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, StartError> {
    let Services {
        config,
        identity,
        caps,
        fleet,
        shared,
        work,
        scheduler,
        keys,
        issuer,
        health,
    } = services;
    let secure = identity.secure();
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
        fleet.peers.clone(),
        fleet.events.clone(),
        loops.leaving.clone(),
        secure,
    )
    .with_memory(shared.memory.clone())
    .with_drain(work.drain.clone(), work.admission.clone());
    let tasks_service = TasksService::new(work.tasks.clone(), work.admission.clone(), secure);
    let revoked = shared.memory.revoked().clone();
    // In front of every service: a caller without a certificate reaches `Join` only, and a
    // revoked one nothing (its connections are closed too, but a call may be under way).
    let mut builder = Server::builder()
        // The server pings idle connections too (hyper always does): rarely, to close
        // those of callers that vanished; callers ping while their calls run.
        .http2_keepalive_interval(Some(SERVER_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(SERVER_KEEPALIVE_TIMEOUT))
        .layer(CertificateGateLayer::new(secure, revoked.clone()));
    // `mesh-cli config set`: checked, kept in the data dir, applied to these at once.
    let settings = Arc::new(Settings::new(
        config.clone(),
        Targets {
            admission: work.admission.clone(),
            caps: caps.clone(),
            scheduler: scheduler.clone(),
            approvals: work.approvals.clone(),
            keys: keys.clone(),
        },
    ));
    let admission = &work.admission;
    let router = builder
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(service.into_server())
        .add_service(tasks_service.into_server())
        .add_service(ModelsService::new(work.chat.clone()).into_server())
        .add_service(CronService::new(scheduler, admission.clone(), secure).into_server())
        .add_service(KeysService::new(keys, admission.clone(), secure).into_server())
        .add_service(ApprovalsService::new(work.approvals.clone(), secure).into_server())
        .add_service(SettingsService::new(settings, admission.clone(), secure).into_server())
        .add_service(MemoryService::new(shared.memory.clone(), secure).into_server())
        .add_service(
            ToolsService::new(
                work.mcp_hub.clone(),
                admission.clone(),
                work.approvals.clone(),
                secure,
            )
            .into_server(),
        )
        .add_optional_service(issuer.map(|issuer| JoinService::new(issuer).into_server()));
    let stop = loops.serve.clone();
    let stopped = async move { stop.cancelled().await };
    // `serve_with_incoming` ignores the builder's TCP options, so set them on the incoming
    // side; without TCP_NODELAY a streamed event can wait out a delayed ACK (~40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(10)));
    // With TLS the node runs the handshakes itself (`rpc::accept`), so it can refuse a
    // revoked certificate there and close the connections of one revoked later.
    Ok(match identity.server_tls.clone() {
        Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
            TlsIncoming::new(incoming, tls, revoked, &config.connections),
            stopped,
        )),
        None => tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped)),
    })
}
