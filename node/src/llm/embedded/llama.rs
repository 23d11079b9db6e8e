//! llama.cpp itself, as the engine's files share it: its process-wide backend, its log
//! (captured while loading, so a failure's message can quote it), and its errors.

use std::{
    fmt,
    sync::{Arc, Mutex, OnceLock},
};

use llama_cpp_2::llama_backend::LlamaBackend;
use mesh_domain::sync::MutexExt;
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _};

use crate::llm::model::ModelError;

/// A prompt longer than this many bytes per context token cannot fit; refused before
/// tokenizing, which bounds the work an oversized request causes.
pub(super) const MAX_PROMPT_BYTES_PER_TOKEN: usize = 32;

/// llama.cpp's process-wide backend: initialised once, its log routed into `tracing`.
pub(super) fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| format!("cannot initialise llama.cpp: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `f` with llama.cpp's log (which it sends to `tracing`) captured on this thread:
/// warnings and errors are returned, for the message when `f` fails; the chatter of a
/// normal load (dozens of info lines) is dropped.
pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let capture =
        LogCapture(lines.clone()).with_filter(tracing_subscriber::filter::LevelFilter::WARN);
    let value = tracing::subscriber::with_default(tracing_subscriber::registry().with(capture), f);
    let lines = std::mem::take(&mut *lines.lock_unpoisoned());
    (value, lines)
}

/// A `tracing` layer that keeps the text of each event.
struct LogCapture(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.0.push_str(value.trim());
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                if field.name() == "message" {
                    self.0.push_str(format!("{value:?}").trim());
                }
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        if !text.0.is_empty() {
            self.0.lock_unpoisoned().push(text.0);
        }
    }
}

pub(super) fn with_log(message: String, log: &[String]) -> String {
    match log.last() {
        Some(last) => format!("{message} (llama.cpp: {last})"),
        None => message,
    }
}

pub(super) fn engine_error(message: String) -> ModelError {
    ModelError::Server {
        status: 500,
        message: format!("llama.cpp {message}"),
    }
}
