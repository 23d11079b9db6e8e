//! Embeddings on the engine thread: a second llama.cpp context beside the chat one, with
//! embeddings on and mean pooling; each text is embedded on its own, must fit the context
//! window, and its vector is scaled to unit length.

use std::{
    num::NonZeroU32,
    time::{Duration, Instant},
};

use llama_cpp_2::{
    context::{
        LlamaContext,
        params::{LlamaContextParams, LlamaPoolingType},
    },
    llama_backend::LlamaBackend,
    llama_batch::LlamaBatch,
    model::LlamaModel,
};
use mesh_domain::{EmbedResponse, embed::normalize};
use tokio::sync::oneshot;

use super::llama::{MAX_PROMPT_BYTES_PER_TOKEN, engine_error, quietly, with_log};
use crate::llm::model::ModelError;

/// One embeddings request, as the engine thread gets it.
pub(super) struct EmbedJob {
    /// The texts, each embedded on its own.
    pub(super) inputs: Vec<String>,
    /// When the caller gives up; the engine stops between two texts then.
    pub(super) deadline: Instant,
    /// The model's timeout, for the error at the deadline.
    pub(super) timeout: Duration,
    /// The answer; closed when the caller went away.
    pub(super) reply: oneshot::Sender<Result<EmbedResponse, ModelError>>,
}

/// The embedding side of an engine: its own context (embeddings on, mean pooling) and batch.
pub(super) struct Embedder<'m> {
    /// The model's configured name, for messages.
    name: &'m str,
    /// The loaded model, shared with the chat context.
    model: &'m LlamaModel,
    /// A context of `n_ctx` tokens that outputs pooled embeddings instead of logits.
    ctx: LlamaContext<'m>,
    /// One whole text: pooling needs every token of a sequence in one batch.
    batch: LlamaBatch<'static>,
    /// Most tokens of one text.
    n_ctx: usize,
}

impl<'m> Embedder<'m> {
    /// An embedding context beside the chat one: the whole window is one batch (and one
    /// micro-batch), since a pooled sequence may not be split.
    pub(super) fn new(
        name: &'m str,
        model: &'m LlamaModel,
        backend: &LlamaBackend,
        n_ctx: usize,
        threads: i32,
    ) -> Result<Self, String> {
        let size = u32::try_from(n_ctx).unwrap_or(u32::MAX);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(size))
            .with_n_batch(size)
            .with_n_ubatch(size)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_embeddings(true)
            .with_pooling_type(LlamaPoolingType::Mean);
        let (ctx, log) = quietly(|| model.new_context(backend, params));
        let ctx = ctx.map_err(|e| with_log(e.to_string(), &log))?;
        Ok(Self {
            name,
            model,
            ctx,
            batch: LlamaBatch::new(n_ctx, 1),
            n_ctx,
        })
    }

    /// Embeds every text of `job` in turn; stops at the deadline or when the caller left.
    pub(super) fn embed(&mut self, job: &EmbedJob) -> Result<EmbedResponse, ModelError> {
        let mut vectors = Vec::with_capacity(job.inputs.len());
        let mut prompt_tokens = 0;
        for (i, text) in job.inputs.iter().enumerate() {
            if job.reply.is_closed() || Instant::now() >= job.deadline {
                return Err(ModelError::Timeout(job.timeout));
            }
            let (vector, tokens) = self.embed_one(i, text)?;
            vectors.push(vector);
            prompt_tokens += tokens as u64;
        }
        Ok(EmbedResponse {
            model: self.name.to_owned(),
            vectors,
            prompt_tokens,
        })
    }

    /// The unit-length, mean-pooled embedding of `text` (input `i`), and its token count.
    fn embed_one(&mut self, i: usize, text: &str) -> Result<(Vec<f32>, usize), ModelError> {
        let refuse = |message: String| ModelError::Refused {
            status: 400,
            message,
        };
        if text.len() > self.n_ctx * MAX_PROMPT_BYTES_PER_TOKEN {
            return Err(refuse(format!(
                "input[{i}]: {} bytes cannot fit the {}-token context window of embedded model `{}`",
                text.len(),
                self.n_ctx,
                self.name
            )));
        }
        // Special tokens (BOS/EOS as the model wants them) added, none parsed from the
        // text: a text cannot pass itself off as markup.
        let tokens = self.model.vocab().tokenize(text.as_bytes(), true, false);
        if tokens.is_empty() {
            return Err(refuse(format!("input[{i}]: the text has no tokens")));
        }
        if tokens.len() > self.n_ctx {
            return Err(refuse(format!(
                "input[{i}]: {} tokens, more than the {}-token context window of embedded model `{}` (split the text, or raise context_window in its [[models]] entry)",
                tokens.len(),
                self.n_ctx,
                self.name
            )));
        }
        self.ctx.clear_kv_cache();
        self.batch.clear();
        for (pos, token) in tokens.iter().enumerate() {
            self.batch
                .add(*token, pos as i32, &[0], true)
                .map_err(|e| engine_error(format!("embedding batch: {e}")))?;
        }
        self.ctx
            .decode(&mut self.batch)
            .map_err(|e| engine_error(format!("embedding: {e}")))?;
        let mut vector = self
            .ctx
            .embeddings_seq_ith(0)
            .map_err(|e| engine_error(format!("embedding output: {e}")))?
            .to_vec();
        normalize(&mut vector);
        Ok((vector, tokens.len()))
    }
}
