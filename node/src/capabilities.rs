//! What this node is and can do right now: identity, roles, personas, models, CPU, memory, GPUs
//! (declared in config plus what `nvidia-smi` reports), load and health.
//!
//! [`Capabilities`] owns the probes and hands out [`NodeInfo`] snapshots; it notifies watchers
//! when something they would want to see changes (health, load). It decides nothing about peers
//! and does no networking.

use std::{
    collections::BTreeMap,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, SystemTime},
};

use mesh_domain::{
    Gpu, Health, HealthStatus, Load, McpToolInfo, ModelInfo, NodeId, NodeInfo, PersonaInfo,
    Resources, Tier, sync::MutexExt, time::unix_ms,
};
use tokio::{process::Command, sync::watch};

use crate::{
    config::{Backend, Config, GpuDecl},
    supervise::LoopHealth,
};

/// Live load counters, shared with whatever runs tasks.
#[derive(Debug, Default)]
pub struct LoadGauge {
    running: AtomicU32,
    queued: AtomicU32,
    workers: AtomicU32,
    queue_capacity: AtomicU32,
}

impl LoadGauge {
    /// Current values.
    pub fn get(&self) -> Load {
        Load {
            running: self.running.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            workers: self.workers.load(Ordering::Relaxed),
            queue_capacity: self.queue_capacity.load(Ordering::Relaxed),
        }
    }

    /// Sets both counters.
    pub fn set(&self, load: Load) {
        self.running.store(load.running, Ordering::Relaxed);
        self.queued.store(load.queued, Ordering::Relaxed);
        self.workers.store(load.workers, Ordering::Relaxed);
        self.queue_capacity
            .store(load.queue_capacity, Ordering::Relaxed);
    }
}

/// How long the host's memory, CPU and load figures are reused.
const SYSTEM_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// The host's figures, as last read.
#[derive(Debug)]
struct SystemFigures {
    host: sysinfo::System,
    cpu_count: u32,
    load: f64,
    read_at: Option<std::time::Instant>,
}

impl SystemFigures {
    fn refresh(&mut self) {
        self.host.refresh_memory();
        self.cpu_count = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        self.load = sysinfo::System::load_average().one;
        self.read_at = Some(std::time::Instant::now());
    }
}

/// The node's self-description: static facts from config plus live probes.
#[derive(Debug)]
pub struct Capabilities {
    base: NodeInfo,
    /// `resources.gpus` (a runtime setting).
    declared_gpus: Mutex<Vec<Gpu>>,
    /// `security.remote_max_tier` (a runtime setting), advertised.
    remote_max_tier: Mutex<Tier>,
    load: Arc<LoadGauge>,
    /// Failing checks by component (`tls`, `mdns`, `data_dir`, …) → (status, reason).
    checks: Mutex<BTreeMap<String, (HealthStatus, String)>>,
    probed_gpus: Mutex<Vec<Gpu>>,
    /// The host's figures, read at most every [`SYSTEM_TTL`] (from /proc and cgroups: too slow
    /// for every routing decision).
    system: Mutex<SystemFigures>,
    /// Bumped whenever watchers should get a fresh `NodeInfo` before the next beat.
    changed: watch::Sender<u64>,
    /// The sequence number of this node's latest shared-memory write, as the memory publishes
    /// it (0 until the memory is opened).
    memory_seq: Mutex<Option<watch::Receiver<u64>>>,
    /// Each measuring model's decode speed, as the models publish it.
    model_speeds: Mutex<BTreeMap<String, watch::Receiver<Option<f64>>>>,
    /// The tools of this node's MCP servers that it advertises, as `mcp` publishes them.
    mcp_tools: Mutex<Option<watch::Receiver<Arc<[McpToolInfo]>>>>,
    /// Whether the node is draining (`NodeInfo.draining`), as `tasks::Drain` sets it.
    draining: AtomicBool,
}

/// A failing background loop makes the node `degraded`, named after the loop.
impl LoopHealth for Capabilities {
    fn loop_failing(&self, name: &str, reason: Option<String>) {
        self.set_check(name, reason.map(|reason| (HealthStatus::Degraded, reason)));
    }
}

impl Capabilities {
    /// Builds the static part from config.
    pub fn new(config: &Config, id: NodeId, cert_fingerprint: String, addrs: Vec<String>) -> Self {
        let declared_gpus = declared(&config.gpus);
        let models = config
            .models
            .iter()
            .map(|m| match &m.backend {
                Backend::OpenAi {
                    base_url, model, ..
                } => ModelInfo {
                    name: m.name.clone(),
                    backend: "openai".into(),
                    model: model.clone(),
                    base_url: base_url.clone(),
                    tokens_per_s: 0.0,
                    embeds: m.embeddings,
                },
                Backend::Embedded { path, .. } => ModelInfo {
                    name: m.name.clone(),
                    backend: "embedded".into(),
                    model: path.display().to_string(),
                    base_url: String::new(),
                    tokens_per_s: 0.0,
                    embeds: m.embeddings,
                },
            })
            .collect();
        let base = NodeInfo {
            name: config.name.clone(),
            id,
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: mesh_proto::PROTOCOL_MAJOR,
            addrs,
            roles: config.roles.clone(),
            labels: config.labels.clone(),
            personas: config
                .personas
                .iter()
                .map(|p| PersonaInfo {
                    name: p.name.clone(),
                    role: p.role.clone(),
                })
                .collect(),
            models,
            role_chains: config.role_chains.clone(),
            resources: Resources::default(),
            load: Load::default(),
            health: Health::default(),
            cert_fingerprint,
            started_at_ms: unix_ms(SystemTime::now()),
            remote_max_tier: config.remote_max_tier,
            memory_seq: 0,
            mcp_tools: Arc::default(),
            draining: false,
        };
        Self {
            base,
            declared_gpus: Mutex::new(declared_gpus),
            remote_max_tier: Mutex::new(config.remote_max_tier),
            load: Arc::default(),
            checks: Mutex::default(),
            probed_gpus: Mutex::default(),
            system: Mutex::new(SystemFigures {
                host: sysinfo::System::new(),
                cpu_count: 1,
                load: 0.0,
                read_at: None,
            }),
            changed: watch::Sender::new(0),
            memory_seq: Mutex::default(),
            model_speeds: Mutex::default(),
            mcp_tools: Mutex::default(),
            draining: AtomicBool::new(false),
        }
    }

    /// Advertises the MCP tools `mcp` publishes (`NodeInfo.mcp_tools`), and tells watchers
    /// when they change (a server came up, went down or changed its tools), so peers learn
    /// them. Needs a Tokio runtime.
    pub fn follow_mcp_tools(self: &Arc<Self>, tools: watch::Receiver<Arc<[McpToolInfo]>>) {
        *self.mcp_tools.lock_unpoisoned() = Some(tools.clone());
        let caps = Arc::downgrade(self);
        let mut tools = tools;
        tokio::spawn(async move {
            while tools.changed().await.is_ok() {
                let Some(caps) = caps.upgrade() else { return };
                caps.notify();
            }
        });
    }

    /// Reports the shared memory's write sequence (`NodeInfo.memory_seq`) as it publishes it,
    /// and tells watchers when it rises (membership gossips a new `NodeInfo` version, so peers
    /// learn they lack writes the few pushed peers got). Needs a Tokio runtime.
    pub fn follow_memory_seq(self: &Arc<Self>, seq: watch::Receiver<u64>) {
        *self.memory_seq.lock_unpoisoned() = Some(seq.clone());
        let caps = Arc::downgrade(self);
        let mut seq = seq;
        tokio::spawn(async move {
            while seq.changed().await.is_ok() {
                let Some(caps) = caps.upgrade() else { return };
                caps.notify();
            }
        });
    }

    /// Reports the models' measured speeds (`NodeInfo.models[].tokens_per_s`) as they publish
    /// them.
    pub fn follow_model_speeds(&self, speeds: BTreeMap<String, watch::Receiver<Option<f64>>>) {
        *self.model_speeds.lock_unpoisoned() = speeds;
    }

    /// The node id.
    pub fn id(&self) -> &NodeId {
        &self.base.id
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.base.name
    }

    /// The load gauge, for the task runner to update.
    pub fn load_gauge(&self) -> Arc<LoadGauge> {
        self.load.clone()
    }

    /// `security.remote_max_tier`, as this node advertises it.
    pub fn remote_max_tier(&self) -> Tier {
        *self.remote_max_tier.lock_unpoisoned()
    }

    /// Changes what the runtime settings change here, `security.remote_max_tier` and
    /// `resources.gpus`, and tells watchers (so the fleet learns them at once).
    pub fn set_runtime(&self, remote_max_tier: Tier, gpus: &[GpuDecl]) {
        *self.remote_max_tier.lock_unpoisoned() = remote_max_tier;
        *self.declared_gpus.lock_unpoisoned() = declared(gpus);
        self.notify();
    }

    /// Whether the node is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Starts or ends draining, and tells watchers when that changes it (so the fleet's
    /// routers learn it at once). Returns whether it was draining before.
    pub fn set_draining(&self, draining: bool) -> bool {
        let before = self.draining.swap(draining, Ordering::SeqCst);
        if before != draining {
            self.notify();
        }
        before
    }

    /// Records the outcome of a health check; `None` clears it.
    pub fn set_check(&self, component: &str, failure: Option<(HealthStatus, String)>) {
        let mut checks = self.checks.lock_unpoisoned();
        let before = checks.get(component).cloned();
        match failure {
            Some(failure) => checks.insert(component.to_owned(), failure),
            None => checks.remove(component),
        };
        if checks.get(component) != before.as_ref() {
            drop(checks);
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// A receiver that ticks when watchers should get a fresh snapshot.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Tells watchers to send a fresh snapshot now.
    pub fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// The current health.
    pub fn health(&self) -> Health {
        let checks = self.checks.lock_unpoisoned();
        Health {
            status: checks
                .values()
                .map(|(status, _)| *status)
                .max()
                .unwrap_or_default(),
            reasons: checks
                .iter()
                .map(|(component, (_, reason))| format!("{component}: {reason}"))
                .collect(),
        }
    }

    /// A snapshot of everything, with memory and load figures at most [`SYSTEM_TTL`] old.
    pub fn snapshot(&self) -> NodeInfo {
        let mut info = self.base.clone();
        {
            let mut system = self.system.lock_unpoisoned();
            if system.read_at.is_none_or(|at| at.elapsed() >= SYSTEM_TTL) {
                system.refresh();
            }
            info.resources.cpu_count = system.cpu_count;
            info.resources.memory_total_bytes = system.host.total_memory();
            info.resources.memory_available_bytes = system.host.available_memory();
            info.resources.cpu_load = system.load;
        }
        let mut gpus = self.probed_gpus.lock_unpoisoned().clone();
        gpus.extend(self.declared_gpus.lock_unpoisoned().iter().cloned());
        info.resources.gpus = gpus;
        info.remote_max_tier = self.remote_max_tier();
        info.draining = self.draining();
        info.load = self.load.get();
        info.health = self.health();
        info.memory_seq = self
            .memory_seq
            .lock_unpoisoned()
            .as_ref()
            .map_or(0, |seq| *seq.borrow());
        if let Some(tools) = self.mcp_tools.lock_unpoisoned().as_ref() {
            info.mcp_tools = tools.borrow().clone();
        }
        let speeds = self.model_speeds.lock_unpoisoned();
        for model in &mut info.models {
            model.tokens_per_s = speeds
                .get(&model.name)
                .and_then(|speed| *speed.borrow())
                .unwrap_or(0.0);
        }
        info
    }

    /// Asks nvidia-smi for GPUs once; a host without it simply has none probed.
    pub async fn probe_gpus(&self) {
        let gpus = nvidia_smi().await.unwrap_or_default();
        let mut probed = self.probed_gpus.lock_unpoisoned();
        if *probed != gpus {
            *probed = gpus;
            drop(probed);
            self.notify();
        }
    }
}

/// GPUs declared in the config, as advertised.
fn declared(gpus: &[GpuDecl]) -> Vec<Gpu> {
    gpus.iter()
        .map(|gpu| Gpu {
            name: gpu.name.clone(),
            vram_mb: gpu.vram_mb,
            vram_free_mb: None,
            source: "declared".into(),
        })
        .collect()
}

/// Runs `nvidia-smi` with a timeout; `None` when it is absent or fails.
async fn nvidia_smi() -> Option<Vec<Gpu>> {
    let output = tokio::time::timeout(
        Duration::from_secs(5),
        Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,memory.total,memory.free",
                "--format=csv,noheader,nounits",
            ])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(parse_nvidia_smi(&String::from_utf8_lossy(&output.stdout)))
}

/// Parses `name, total, free` CSV lines; malformed lines are skipped.
pub(crate) fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(',').map(str::trim);
            let name = fields.next().filter(|n| !n.is_empty())?;
            let total = fields.next()?.parse().ok()?;
            let free = fields.next().and_then(|f| f.parse().ok());
            Some(Gpu {
                name: name.into(),
                vram_mb: total,
                vram_free_mb: free,
                source: "nvidia-smi".into(),
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::{path::Path, sync::Arc};

    use mesh_domain::NodeId;

    use super::Capabilities;
    use crate::config::RawConfig;

    /// The capabilities of a node configured with nothing (name `me`).
    pub(crate) fn test_capabilities() -> Arc<Capabilities> {
        let config = RawConfig::parse("[node]\nname = \"me\"\n", Path::new("test.toml"))
            .and_then(|raw| raw.validate(None, &Default::default()))
            .expect("an empty config is valid");
        Arc::new(Capabilities::new(
            &config,
            NodeId::from_spki_der(b"me"),
            String::new(),
            Vec::new(),
        ))
    }
}
