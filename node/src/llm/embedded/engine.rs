//! The llama.cpp side: one thread per model owns the model, its contexts and its queue.
//! [`EmbeddedModel`] is the handle the node holds: it queues jobs to the thread and waits for
//! their answers at most the model's timeout; the thread loads the file, measures the decode
//! speed and serves the jobs one at a time.

use std::{
    fmt,
    num::NonZeroU32,
    panic::AssertUnwindSafe,
    path::Path,
    sync::{Arc, mpsc as std_mpsc},
    time::Instant,
};

use llama_cpp_2::{
    context::params::LlamaContextParams,
    model::{LlamaModel, params::LlamaModelParams},
};
use mesh_domain::{BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse};
use tokio::sync::{oneshot, watch};

use super::{
    embeddings::{EmbedJob, Embedder},
    generate::{BATCH, ChatJob, Engine},
    llama::{backend, quietly, with_log},
    options::{DecodeSpeed, EmbeddedOptions, MEASURE_TOKENS},
    prompt::{answer_schema, demanded_call, read_call, render_chatml},
};
use crate::{
    config::FETCH_HINT,
    llm::model::{ChatModel, Deltas, ModelError, SpeedGauge},
};

/// Where the engine is.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Loading the file.
    Loading,
    /// Serving requests.
    Ready,
    /// Could not load, or the engine stopped: the message says why and what to do.
    Failed(String),
}

/// Work for the engine thread.
enum Job {
    /// Answer a conversation.
    Chat(ChatJob),
    /// Measure the decode speed over `tokens` tokens (at load and for `embedded-bench`).
    Measure {
        tokens: usize,
        reply: oneshot::Sender<Result<DecodeSpeed, ModelError>>,
    },
    /// Embed texts (models with `embeddings = true`).
    Embed(EmbedJob),
}

/// A GGUF model run in-process; see the module docs.
pub struct EmbeddedModel {
    /// The configured name (`[[models]].name`).
    name: String,
    /// File, threads, context window and timeout.
    options: EmbeddedOptions,
    /// The engine thread's queue; `None` when the model failed before a thread was started.
    jobs: Option<std_mpsc::Sender<Job>>,
    /// Loading, ready or failed (with why), as the engine thread reports it.
    state: watch::Receiver<State>,
    /// Decode speed: measured at load, then from every answer.
    speed: Arc<SpeedGauge>,
}

impl fmt::Debug for EmbeddedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedModel")
            .field("name", &self.name)
            .field("path", &self.options.path)
            .field("threads", &self.options.threads)
            .finish_non_exhaustive()
    }
}

impl EmbeddedModel {
    /// Starts loading `options.path` on a thread of its own and returns at once. A missing
    /// file gives a model in the failed state (no thread), so the node can start degraded.
    pub fn start(name: &str, options: EmbeddedOptions) -> Self {
        let speed = Arc::new(SpeedGauge::default());
        if let Err(message) = check_file(&options.path) {
            let (_, state) = watch::channel(State::Failed(message));
            return Self {
                name: name.to_owned(),
                options,
                jobs: None,
                state,
                speed,
            };
        }
        let (state_tx, state) = watch::channel(State::Loading);
        let (jobs_tx, jobs_rx) = std_mpsc::channel();
        let thread = {
            let (name, options, speed) = (name.to_owned(), options.clone(), speed.clone());
            let state_tx = state_tx.clone();
            std::thread::Builder::new()
                .name(format!("embedded-{name}"))
                .spawn(move || {
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        run_engine(&name, &options, &state_tx, &speed, &jobs_rx)
                    }));
                    let message = match outcome {
                        Ok(Ok(())) => "the engine thread stopped".to_owned(),
                        Ok(Err(message)) => message,
                        Err(panic) => format!(
                            "the engine thread panicked ({}); restart the node",
                            panic_text(&panic)
                        ),
                    };
                    state_tx.send_replace(State::Failed(message));
                })
        };
        if let Err(e) = thread {
            state_tx.send_replace(State::Failed(format!(
                "cannot start the engine thread: {e}"
            )));
        }
        Self {
            name: name.to_owned(),
            options,
            jobs: Some(jobs_tx),
            state,
            speed,
        }
    }

    /// The GGUF file.
    pub fn path(&self) -> &Path {
        &self.options.path
    }

    /// Waits until the model is loaded (or failed to load).
    pub async fn ready(&self) -> Result<(), ModelError> {
        let mut state = self.state.clone();
        let outcome = state
            .wait_for(|s| !matches!(s, State::Loading))
            .await
            .map(|s| s.clone());
        match outcome {
            Ok(State::Ready) => Ok(()),
            Ok(State::Failed(message)) => Err(ModelError::Unreachable(message)),
            Ok(State::Loading) | Err(_) => Err(self.stopped()),
        }
    }

    /// Decodes `tokens` tokens from a fixed prompt (end-of-generation ignored) and reports
    /// the decode speed: what the node measures at load, and what `embedded-bench` runs.
    pub async fn measure_decode(&self, tokens: usize) -> Result<DecodeSpeed, ModelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Measure { tokens, reply })?;
        answer.await.map_err(|_| self.stopped())?
    }

    fn send(&self, job: Job) -> Result<(), ModelError> {
        let jobs = self.jobs.as_ref().ok_or_else(|| self.stopped())?;
        jobs.send(job).map_err(|_| self.stopped())
    }

    /// Queues an embeddings job and waits for it, at most the model's timeout.
    async fn embed_texts(&self, request: &EmbedRequest) -> Result<EmbedResponse, ModelError> {
        if !self.options.embeddings {
            return Err(crate::llm::model::cannot_embed(&self.name));
        }
        let (reply, answer) = oneshot::channel();
        self.send(Job::Embed(EmbedJob {
            inputs: request.inputs.clone(),
            deadline: Instant::now() + self.options.timeout,
            timeout: self.options.timeout,
            reply,
        }))?;
        match tokio::time::timeout(self.options.timeout, answer).await {
            Err(_) => Err(ModelError::Timeout(self.options.timeout)),
            Ok(Err(_)) => Err(self.stopped()),
            Ok(Ok(result)) => result,
        }
    }

    /// The error for a model whose engine is not running.
    fn stopped(&self) -> ModelError {
        match &*self.state.borrow() {
            State::Failed(message) => ModelError::Unreachable(message.clone()),
            State::Loading | State::Ready => ModelError::Unreachable(format!(
                "the engine of embedded model `{}` stopped",
                self.name
            )),
        }
    }

    async fn generate(
        &self,
        request: &ChatRequest,
        deltas: &Deltas,
    ) -> Result<ChatResponse, ModelError> {
        let call = demanded_call(&self.name, request)?;
        let (reply, answer) = oneshot::channel();
        self.send(Job::Chat(ChatJob {
            prompt: render_chatml(call.as_ref().map_or(&request.messages, |c| &c.messages)),
            sampling: request.sampling.clone(),
            schema: match &call {
                Some(call) => Some(call.schema.clone()),
                None => answer_schema(request.response_format.as_ref()),
            },
            for_call: call.is_some(),
            deadline: Instant::now() + self.options.timeout,
            timeout: self.options.timeout,
            // A demanded call is the answer's tool call, not text for the caller.
            deltas: call.is_none().then(|| deltas.clone()),
            reply,
        }))?;
        // Dropping `answer` (timeout, cancelled task) closes the channel, which the engine
        // notices between tokens and stops.
        let mut response = match tokio::time::timeout(self.options.timeout, answer).await {
            Err(_) => return Err(ModelError::Timeout(self.options.timeout)),
            Ok(Err(_)) => return Err(self.stopped()),
            Ok(Ok(result)) => result?,
        };
        if call.is_some() {
            let tokens = response.usage.map_or(0, |u| u.completion_tokens);
            let text = std::mem::take(&mut response.content);
            response.tool_calls = vec![read_call(&self.name, &text, tokens)?];
        }
        Ok(response)
    }
}

impl ChatModel for EmbeddedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> usize {
        self.options.context_window
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: &'a Deltas,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
        Box::pin(self.generate(request, deltas))
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), ModelError>> {
        Box::pin(self.ready())
    }

    fn speed(&self) -> Option<&SpeedGauge> {
        Some(&self.speed)
    }

    fn embeds(&self) -> bool {
        self.options.embeddings
    }

    fn embed<'a>(
        &'a self,
        request: &'a EmbedRequest,
    ) -> BoxFuture<'a, Result<EmbedResponse, ModelError>> {
        Box::pin(self.embed_texts(request))
    }
}

/// Checks the file is there and looks like GGUF, so the common mistakes get a precise
/// message instead of llama.cpp's null pointer.
fn check_file(path: &Path) -> Result<(), String> {
    use std::io::Read as _;
    let shown = path.display();
    let mut file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("GGUF file {shown} not found; {FETCH_HINT}, or fix `path`")
        }
        _ => format!("cannot open GGUF file {shown}: {e}"),
    })?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .map_err(|e| format!("cannot read GGUF file {shown}: {e}; {FETCH_HINT}"))?;
    if &magic != b"GGUF" {
        return Err(format!(
            "{shown} is not a GGUF file (it does not start with `GGUF`); {FETCH_HINT}"
        ));
    }
    Ok(())
}

/// The engine thread: load, measure, then serve until every sender is gone.
fn run_engine(
    name: &str,
    options: &EmbeddedOptions,
    state: &watch::Sender<State>,
    speed: &SpeedGauge,
    jobs: &std_mpsc::Receiver<Job>,
) -> Result<(), String> {
    let started = Instant::now();
    let backend = backend()?;
    let shown = options.path.display();
    let (model, log) = quietly(|| {
        LlamaModel::load_from_file(backend, &options.path, &LlamaModelParams::default())
    });
    let model = model.map_err(|e| {
        with_log(
            format!(
                "llama.cpp cannot load {shown} ({e}): the file is truncated, corrupt or a model this build does not support; {FETCH_HINT}"
            ),
            &log,
        )
    })?;
    let train = usize::try_from(model.n_ctx_train()).unwrap_or(usize::MAX);
    let n_ctx = options.context_window.min(train);
    if n_ctx < options.context_window {
        tracing::warn!(
            model = name,
            context_window = options.context_window,
            trained = train,
            "context_window is larger than the model was trained for; using the trained size"
        );
    }
    let threads = i32::try_from(options.threads).unwrap_or(i32::MAX);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(u32::try_from(n_ctx).unwrap_or(u32::MAX)))
        .with_n_batch(BATCH as u32)
        .with_n_ubatch(BATCH as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let (ctx, log) = quietly(|| model.new_context(backend, params));
    let ctx = ctx.map_err(|e| {
        with_log(
            format!("llama.cpp cannot create a {n_ctx}-token context for {shown}: {e}"),
            &log,
        )
    })?;
    let mut embedder = if options.embeddings {
        Some(
            Embedder::new(name, &model, backend, n_ctx, threads).map_err(|e| {
                format!("llama.cpp cannot create an embedding context for {shown}: {e}")
            })?,
        )
    } else {
        None
    };
    let mut engine = Engine::new(name, &model, ctx, n_ctx);
    let loaded = started.elapsed();
    state.send_replace(State::Ready);
    let measured = engine.measure(MEASURE_TOKENS);
    match &measured {
        Ok(m) => speed.record(m.tokens, m.elapsed),
        Err(e) => tracing::warn!(model = name, error = %e, "cannot measure the decode speed"),
    }
    tracing::info!(
        model = name,
        path = %shown,
        threads = options.threads,
        context_window = n_ctx,
        load_ms = loaded.as_millis() as u64,
        tokens_per_s = measured.ok().and_then(|m| m.tokens_per_s()).map(|t| (t * 10.0).round() / 10.0),
        "embedded model loaded"
    );
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Chat(job) => {
                if job.reply.is_closed() {
                    continue;
                }
                let result = engine.chat(&job, speed);
                let _ = job.reply.send(result);
            }
            Job::Measure { tokens, reply } => {
                let _ = reply.send(engine.measure(tokens));
            }
            Job::Embed(job) => {
                if job.reply.is_closed() {
                    continue;
                }
                let result = match embedder.as_mut() {
                    Some(embedder) => embedder.embed(&job),
                    None => Err(crate::llm::model::cannot_embed(name)),
                };
                let _ = job.reply.send(result);
            }
        }
    }
    Ok(())
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}
