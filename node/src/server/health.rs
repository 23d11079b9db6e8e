//! Health: the node's capabilities and the checks that make it `degraded` or `unhealthy` (data
//! dir writable, free disk, certificate expiry, clock), run at start and then in a loop that
//! mirrors the result into `grpc.health.v1`.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use mesh_domain::HealthStatus;
use tokio_util::sync::CancellationToken;
use tonic_health::{
    pb::health_server::{Health, HealthServer},
    server::HealthReporter,
};

use super::{binding::advertised_addrs, fleet::Shared, identity::NodeIdentity, loops::Loops};
use crate::{
    capabilities::Capabilities, config::Config, memory::Memory, rpc::NodeService,
    storage::SledStore, supervise::no_error,
};

/// Step 3: the capabilities, after the start-up health checks and one GPU probe.
pub(super) async fn capabilities(
    config: &Config,
    identity: &NodeIdentity,
    addr: SocketAddr,
) -> Arc<Capabilities> {
    let caps = Arc::new(Capabilities::new(
        config,
        identity.id.clone(),
        identity.fingerprint.clone(),
        advertised_addrs(addr),
    ));
    run_health_checks(&caps, &config.data_dir, identity.not_after());
    // Before the advert is built, so its `gpu` count includes probed GPUs (bounded by a 5 s
    // timeout inside; instant on hosts without nvidia-smi).
    caps.probe_gpus().await;
    caps
}

/// Step 8: `grpc.health.v1` as the checks say, kept so by the supervised `health checks` loop.
pub(super) async fn start(
    config: &Config,
    identity: &NodeIdentity,
    caps: &Arc<Capabilities>,
    shared: &Shared,
    loops: &mut Loops,
) -> (HealthReporter, HealthServer<impl Health>) {
    let (health, health_service) = tonic_health::server::health_reporter();
    report_health(&health, caps).await;
    let (caps, reporter, store, memory, data_dir, not_after) = (
        caps.clone(),
        health.clone(),
        shared.store.clone(),
        shared.memory.clone(),
        config.data_dir.clone(),
        identity.not_after(),
    );
    loops
        .supervisor
        .spawn("health checks", loops.leaving.clone(), move |stop| {
            no_error(health_loop(
                caps.clone(),
                reporter.clone(),
                store.clone(),
                memory.clone(),
                data_dir.clone(),
                not_after,
                stop,
            ))
        });
    (health, health_service)
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
    health: HealthReporter,
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

pub(super) async fn report_health(health: &HealthReporter, caps: &Capabilities) {
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
    let now = i64::try_from(mesh_domain::time::now_s()).unwrap_or(i64::MAX);
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
