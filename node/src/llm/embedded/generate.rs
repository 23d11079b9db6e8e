//! One chat on the engine thread: the prompt evaluated in batches, then one token at a time
//! sampled (greedy with a repetition penalty, or the caller's temperature, top-p and seed),
//! held to a JSON schema by an llguidance grammar when one is asked for, streamed as text and
//! stopped at an end-of-generation token, a stop string, the budget, the deadline or when the
//! caller left; and the decode-speed measurement.

use std::time::{Duration, Instant};

use llama_cpp_2::{
    context::LlamaContext, llama_batch::LlamaBatch, model::LlamaModel, sampling::LlamaSampler,
    token::LlamaToken,
};
use llguidance::{Matcher, ParserFactory, api::TopLevelGrammar};
use mesh_domain::{ChatResponse, Sampling, Usage};
use serde_json::{Value, json};
use tokio::sync::{mpsc::error::TrySendError, oneshot};

use super::{
    llama::{MAX_PROMPT_BYTES_PER_TOKEN, engine_error},
    options::DecodeSpeed,
    stream::TextStream,
};
use crate::{
    llm::model::{Deltas, ModelError, SpeedGauge},
    metrics::{labels, metrics},
};

/// Tokens per prompt-processing batch.
pub(super) const BATCH: usize = 512;
/// How many recent tokens the repetition penalty looks at, and how hard it pushes: small
/// models fall into loops under plain greedy decoding.
const PENALTY_LAST_N: i32 = 64;
const PENALTY_REPEAT: f32 = 1.1;
/// How often the engine thread, waiting for room in the deltas of a reader that fell behind,
/// looks whether the caller left or the deadline passed: the thread has no async runtime to
/// wait on all three at once, and a few milliseconds is well under one token's decode.
const WAIT_FOR_ROOM: Duration = Duration::from_millis(5);
/// The prompt of the decode-speed measurement.
const MEASURE_PROMPT: &str =
    "<|im_start|>user\nCount from one to one hundred in words.<|im_end|>\n<|im_start|>assistant\n";

/// A seed for a draw the caller did not seed.
fn rand_seed() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// One chat request, as the engine thread gets it.
pub(super) struct ChatJob {
    /// The rendered ChatML prompt.
    pub(super) prompt: String,
    /// What the caller asked for: most tokens (`None`: until the context window is full),
    /// stop strings, temperature, top-p and seed.
    pub(super) sampling: Sampling,
    /// The JSON schema the answer must match (`response_format`, or the call `tool_choice`
    /// demands); `None`: free text.
    pub(super) schema: Option<Value>,
    /// Whether `schema` is a demanded call's (its refusal then names `tool_choice`).
    pub(super) for_call: bool,
    /// When the caller gives up; the engine stops generating then.
    pub(super) deadline: Instant,
    /// The model's timeout, for the error at the deadline.
    pub(super) timeout: Duration,
    /// Where decoded text goes as it is generated; `None`: nowhere (a tool call).
    pub(super) deltas: Option<Deltas>,
    /// The answer; closed when the caller went away (timeout, cancelled task), which stops
    /// the generation between two tokens.
    pub(super) reply: oneshot::Sender<Result<ChatResponse, ModelError>>,
}

/// Everything one request needs, borrowed from the engine thread's stack.
pub(super) struct Engine<'m> {
    /// The model's configured name, for messages.
    name: &'m str,
    /// The loaded model (weights, vocabulary).
    model: &'m LlamaModel,
    /// The one context (KV cache of `n_ctx` tokens), cleared for every request.
    ctx: LlamaContext<'m>,
    /// Reused for prompt chunks and single generated tokens.
    batch: LlamaBatch<'static>,
    /// Context window in tokens.
    n_ctx: usize,
    /// Compiles `response_format` schemas against this model's vocabulary; built on the
    /// first structured request (walking the vocabulary takes a moment), then kept.
    grammars: Option<ParserFactory>,
}

/// Why a generation stopped early.
enum Interrupted {
    /// The caller went away (timeout or cancelled task): nobody wants the answer.
    Abandoned,
    /// A model error to report.
    Failed(ModelError),
}

impl From<ModelError> for Interrupted {
    fn from(e: ModelError) -> Self {
        Self::Failed(e)
    }
}

impl ChatJob {
    /// Passes `text` on to the caller. While the reader is behind (its bounded channel full)
    /// the engine waits here, generating nothing, so a slow client holds the generation back
    /// instead of the text piling up; until the caller leaves or the deadline passes. A closed
    /// channel means nobody reads the text: the answer is still wanted, generation goes on.
    fn pass_on(&self, text: String) -> Result<(), Interrupted> {
        let Some(deltas) = &self.deltas else {
            return Ok(());
        };
        let mut text = text;
        loop {
            match deltas.try_send(text) {
                Ok(()) | Err(TrySendError::Closed(_)) => return Ok(()),
                Err(TrySendError::Full(back)) => text = back,
            }
            if self.reply.is_closed() {
                return Err(Interrupted::Abandoned);
            }
            if Instant::now() >= self.deadline {
                return Err(Interrupted::Failed(ModelError::Timeout(self.timeout)));
            }
            std::thread::sleep(WAIT_FOR_ROOM);
        }
    }
}

impl<'m> Engine<'m> {
    /// The engine of the model `name`, on its chat context `ctx` of `n_ctx` tokens.
    pub(super) fn new(
        name: &'m str,
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        n_ctx: usize,
    ) -> Self {
        Self {
            name,
            model,
            ctx,
            batch: LlamaBatch::new(BATCH, 1),
            n_ctx,
            grammars: None,
        }
    }

    /// Tokenizes `prompt` (its special tokens parsed), clears the context and evaluates
    /// the prompt; returns its token count.
    fn prefill(&mut self, prompt: &str) -> Result<usize, ModelError> {
        if prompt.len() > self.n_ctx * MAX_PROMPT_BYTES_PER_TOKEN {
            return Err(self.too_long(format!("{} bytes", prompt.len())));
        }
        let tokens = self.model.vocab().tokenize(prompt.as_bytes(), false, true);
        if tokens.is_empty() {
            return Err(ModelError::Refused {
                status: 400,
                message: "the prompt is empty".into(),
            });
        }
        // Room for at least one generated token.
        if tokens.len() >= self.n_ctx {
            return Err(self.too_long(format!("{} tokens", tokens.len())));
        }
        self.ctx.clear_kv_cache();
        let last = tokens.len() - 1;
        for (chunk_index, chunk) in tokens.chunks(BATCH).enumerate() {
            self.batch.clear();
            for (i, token) in chunk.iter().enumerate() {
                let pos = chunk_index * BATCH + i;
                self.batch
                    .add(*token, pos as i32, &[0], pos == last)
                    .map_err(|e| engine_error(format!("prompt batch: {e}")))?;
            }
            self.ctx
                .decode(&mut self.batch)
                .map_err(|e| engine_error(format!("prompt: {e}")))?;
        }
        Ok(tokens.len())
    }

    fn too_long(&self, size: String) -> ModelError {
        ModelError::Refused {
            status: 400,
            message: format!(
                "the prompt ({size}) does not fit the {}-token context window of embedded model `{}` (set context_window in its [[models]] entry)",
                self.n_ctx, self.name
            ),
        }
    }

    /// Evaluates one generated token at `pos`, timing the decode.
    fn step(
        &mut self,
        token: LlamaToken,
        pos: usize,
        speed: &mut DecodeSpeed,
    ) -> Result<(), ModelError> {
        self.batch.clear();
        self.batch
            .add(token, pos as i32, &[0], true)
            .map_err(|e| engine_error(format!("batch: {e}")))?;
        let started = Instant::now();
        self.ctx
            .decode(&mut self.batch)
            .map_err(|e| engine_error(format!("decode: {e}")))?;
        speed.elapsed += started.elapsed();
        speed.tokens += 1;
        Ok(())
    }

    /// A sampler that keeps the answer inside `schema`: every token that would leave it
    /// is masked before the others sample. A schema llguidance cannot compile is refused.
    fn grammar(&mut self, schema: Value, for_call: bool) -> Result<LlamaSampler, ModelError> {
        let factory = match &mut self.grammars {
            Some(factory) => factory,
            None => {
                let vocabulary = LlamaSampler::llguidance_tok_env(self.model);
                let mut factory = ParserFactory::new_simple(&vocabulary).map_err(|e| {
                    engine_error(format!("cannot prepare grammars for the vocabulary: {e}"))
                })?;
                // Its errors come back to us; nothing for stderr.
                factory.quiet();
                self.grammars.insert(factory)
            }
        };
        let mut schema = schema;
        if let Some(object) = schema.as_object_mut() {
            // Compact JSON: with whitespace allowed between tokens, a small model can
            // write newlines until the context is full.
            object.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
        }
        let parser = factory
            .create_parser(TopLevelGrammar::from_json_schema(schema))
            .map_err(|e| ModelError::Refused {
                status: 400,
                message: if for_call {
                    format!(
                        "tool_choice: embedded model `{}` cannot hold a call to the parameters schema of the tools offered ({e}); simplify the tool's parameters or ask a model served by an `openai` backend",
                        self.name
                    )
                } else {
                    format!(
                        "response_format: embedded model `{}` cannot enforce this JSON schema ({e}); simplify the schema or send `json_object`",
                        self.name
                    )
                },
            })?;
        Ok(Matcher::new(Ok(parser)).into())
    }

    /// Greedy with a repetition penalty, unless the caller asked for a temperature above 0:
    /// then top-p (when given), the temperature, and a draw seeded by the caller's seed.
    /// A `grammar` goes first, so the others only ever see tokens it allows.
    fn sampler(&self, sampling: &Sampling, grammar: Option<LlamaSampler>) -> LlamaSampler {
        let mut chain: Vec<LlamaSampler> = grammar.into_iter().collect();
        chain.push(LlamaSampler::penalties(
            self.model.n_vocab(),
            PENALTY_LAST_N,
            PENALTY_REPEAT,
            0.0,
            0.0,
        ));
        match sampling.temperature {
            Some(t) if t > 0.0 => {
                if let Some(p) = sampling.top_p {
                    chain.push(LlamaSampler::top_p(p, 1));
                }
                chain.push(LlamaSampler::temp(t));
                let seed = sampling.seed.map_or_else(rand_seed, |s| s as u32);
                chain.push(LlamaSampler::dist(seed));
            }
            _ => chain.push(LlamaSampler::greedy()),
        }
        LlamaSampler::chain_simple(chain)
    }

    pub(super) fn chat(
        &mut self,
        job: &ChatJob,
        gauge: &SpeedGauge,
    ) -> Result<ChatResponse, ModelError> {
        let mut speed = DecodeSpeed::default();
        let outcome = self.generate(job, &mut speed);
        // Every decode step counts, even of an answer cut short.
        gauge.record(speed.tokens, speed.elapsed);
        match outcome {
            Ok(response) => Ok(response),
            Err(Interrupted::Failed(e)) => Err(e),
            // Nobody reads this; the caller already answered itself with a timeout.
            Err(Interrupted::Abandoned) => Err(ModelError::Timeout(Duration::ZERO)),
        }
    }

    fn generate(
        &mut self,
        job: &ChatJob,
        speed: &mut DecodeSpeed,
    ) -> Result<ChatResponse, Interrupted> {
        let grammar = job
            .schema
            .clone()
            .map(|s| self.grammar(s, job.for_call))
            .transpose()?;
        let prompt_tokens = self.prefill(&job.prompt)?;
        let room = self.n_ctx - prompt_tokens;
        let budget = job
            .sampling
            .max_tokens
            .map_or(room, |max| (max as usize).min(room));
        let vocab = self.model.vocab();
        let mut sampler = self.sampler(&job.sampling, grammar);
        let mut stream = TextStream::with_stops(&job.sampling.stop);
        let mut content = String::new();
        let mut completion = 0usize;
        let mut pos = prompt_tokens;
        let mut logits_at = self.batch.n_tokens() - 1;
        let generated = metrics()
            .model_tokens_generated
            .get_or_create(&labels(&[("model", self.name)]))
            .clone();
        while completion < budget {
            let token = sampler.sample(&self.ctx, logits_at);
            if vocab.is_eog(token) {
                break;
            }
            completion += 1;
            generated.inc();
            let step = stream.push(&vocab.token_to_piece(token, true, None));
            if !step.text.is_empty() {
                content.push_str(&step.text);
                job.pass_on(step.text)?;
            }
            if step.stopped || completion == budget {
                break;
            }
            if job.reply.is_closed() {
                return Err(Interrupted::Abandoned);
            }
            if Instant::now() >= job.deadline {
                return Err(Interrupted::Failed(ModelError::Timeout(job.timeout)));
            }
            self.step(token, pos, speed)?;
            pos += 1;
            logits_at = 0;
        }
        let tail = stream.finish();
        if !tail.is_empty() {
            content.push_str(&tail);
            job.pass_on(tail)?;
        }
        Ok(ChatResponse {
            model: String::new(),
            content,
            tool_calls: Vec::new(),
            usage: Some(Usage {
                prompt_tokens: prompt_tokens as u64,
                completion_tokens: completion as u64,
            }),
        })
    }

    /// Greedy-decodes `tokens` tokens from a fixed prompt, ignoring end-of-generation.
    pub(super) fn measure(&mut self, tokens: usize) -> Result<DecodeSpeed, ModelError> {
        let prompt_tokens = self.prefill(MEASURE_PROMPT)?;
        let tokens = tokens.min(self.n_ctx.saturating_sub(prompt_tokens + 1));
        let mut sampler = LlamaSampler::greedy();
        let mut speed = DecodeSpeed::default();
        let mut logits_at = self.batch.n_tokens() - 1;
        for i in 0..tokens {
            let token = sampler.sample(&self.ctx, logits_at);
            self.step(token, prompt_tokens + i, &mut speed)?;
            logits_at = 0;
        }
        Ok(speed)
    }
}
