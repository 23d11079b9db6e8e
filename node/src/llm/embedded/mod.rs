//! The `embedded` model backend: a small GGUF model run in-process by llama.cpp (through the
//! `llama-cpp-2` bindings), behind the same [`ChatModel`] interface as
//! the `openai` backend, so the agent loop cannot tell them apart.
//!
//! Each embedded model owns one engine thread. `EmbeddedModel::start` spawns it and returns at
//! once; the thread loads the GGUF file (once per node, at registry build, in the background),
//! creates one llama.cpp context of `context_window` tokens, measures the decode speed with a
//! short generation, and then serves chat requests one at a time from a queue, streaming text to
//! the request's `deltas` channel as it is decoded. A file that is missing or cannot be loaded
//! leaves the model in a failed state whose message names the path and how to fetch the file:
//! `probe` reports it (the node starts `degraded`) and `chat` answers it as `Unreachable`, so a
//! role's chain falls through to its next model. Inference never runs on the async runtime.
//!
//! Prompts are rendered here as ChatML (the template SmolLM2, Qwen and many small models use),
//! without the default system turn that SmolLM2's own template inserts when there is no system
//! message. Generation stops at an end-of-generation token (`<|im_end|>`, EOS), at a stop string
//! in the text, at the context window, or at the deadline. A `response_format` of `json_object`
//! or `json_schema` is enforced while decoding: the schema is compiled by llguidance into a
//! grammar whose sampler masks every token that would leave it.
//!
//! The tiny models this backend is for do not decide to call tools by themselves: with
//! `tool_choice` `auto` or `none` offered tools are left out of the prompt and the answer is
//! text. A `tool_choice` that demands a call (`required`, or a named function) is honoured with
//! the same grammar machinery: the tools are described in the prompt, and the answer must be
//! `{"name": <an offered tool>, "arguments": <its parameters schema>}`, which becomes the
//! answer's tool call (not streamed as text). The model picks the arguments; the grammar only
//! guarantees they match the schema.
//!
//! A model configured with `embeddings = true` also makes embeddings, on the same engine thread
//! (so chats and embeddings take turns on one set of threads) but in a second llama.cpp context
//! created with embeddings on and mean pooling (the average of the last hidden state over the
//! text's tokens: decoder models have no CLS token, and the last token alone says more about
//! what comes next than about the text). Each text is embedded on its own, must fit the context
//! window, and its vector is scaled to unit length, as OpenAI's are.
//!
//! This module decides nothing about tools, budgets or routing. The parts that need no model
//! are plain functions tested without a model file: `options` (what a model is started with,
//! its decode speed), `prompt` (ChatML rendering, the schemas of
//! `response_format` and of a demanded tool call, reading the call back) and `stream` (stop
//! strings, UTF-8 streaming). The engine is behind the `embedded` cargo feature (on by
//! default): `engine` (the `EmbeddedModel` handle and its thread), `generate` (a chat's
//! prefill, sampling and decoding), `embeddings` (the second context) and `llama` (llama.cpp's
//! process-wide backend, its log, its errors).

#[cfg(doc)]
use crate::llm::model::ChatModel;

#[cfg(feature = "embedded")]
mod embeddings;
#[cfg(feature = "embedded")]
mod engine;
#[cfg(feature = "embedded")]
mod generate;
#[cfg(feature = "embedded")]
mod llama;
// The pure parts (options, the chat template and tool-call grammar, the text stream) build and
// are unit-tested without the engine too; only the engine uses them.
#[cfg_attr(not(feature = "embedded"), allow(dead_code, unreachable_pub))]
mod options;
#[cfg_attr(not(feature = "embedded"), allow(dead_code))]
mod prompt;
#[cfg_attr(not(feature = "embedded"), allow(dead_code))]
mod stream;

#[cfg(feature = "embedded")]
pub use engine::EmbeddedModel;
pub use options::{EmbeddedOptions, MEASURE_TOKENS};
