//! What every model backend is to the rest of the node: the [`ChatModel`] interface (chats,
//! and embeddings for the models that make them), the bounded stream a chat's text travels
//! on ([`Deltas`]), the failures a call can end in ([`ModelError`], and which of them fall
//! through to the next model of a chain), and the measured decode speed ([`SpeedGauge`]).

use std::{fmt, time::Duration};

use mesh_domain::{BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse};
use tokio::sync::{mpsc, watch};

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Could not connect, or the connection broke.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The server answered 5xx (or 429).
    #[error("server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        message: String,
    },
    /// The server refused the request (4xx other than 429).
    #[error("request refused {status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        message: String,
    },
    /// No complete answer within the model's timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The answer could not be understood.
    #[error("bad response: {0}")]
    Protocol(String),
}

impl ModelError {
    /// Whether the next model in the chain should be tried: connect errors, 5xx, timeouts and
    /// broken streams do; a refused request or garbage would fail the same way again.
    pub fn falls_through(&self) -> bool {
        matches!(
            self,
            Self::Unreachable(_) | Self::Server { .. } | Self::Timeout(_)
        )
    }
}

/// Text deltas a chat's answer travels on as it is generated, from the model to whoever reads
/// it (the front door's client, a peer's `Models.Chat` stream, a task's events). The channel is
/// bounded ([`DELTA_BUFFER`]): a producer waits for room, so a reader that stops reading holds
/// the generation back instead of letting the text pile up in memory. A closed channel means
/// nobody reads the text (the evaluator wants only the answer): the producer carries on, and
/// the answer still comes back whole from [`ChatModel::chat`].
pub(crate) type Deltas = mpsc::Sender<String>;

/// Deltas held between a model and a reader that stopped reading. Small, since what holds a
/// slow reader's text is meant to be the model not generating it; large enough that a reader
/// that is busy for a moment (writing the previous chunk to its socket) does not stall a model
/// decoding a token every few milliseconds.
pub(crate) const DELTA_BUFFER: usize = 16;

/// A new [`Deltas`] channel of [`DELTA_BUFFER`] deltas, and its reading end.
pub fn delta_channel() -> (Deltas, mpsc::Receiver<String>) {
    mpsc::channel(DELTA_BUFFER)
}

/// A model the agent loop can call.
pub trait ChatModel: Send + Sync + fmt::Debug {
    /// The configured name (`[[models]].name`).
    fn name(&self) -> &str;
    /// Context window in tokens.
    fn context_window(&self) -> usize;
    /// Runs one chat completion, sending text deltas to `deltas` as they are generated (and
    /// waiting for room there: see [`Deltas`]); the complete answer at the end.
    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: &'a Deltas,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>>;
    /// Checks the backend is reachable (for `openai`: `GET /models`; for `embedded`: the
    /// model is loaded).
    fn probe(&self) -> BoxFuture<'_, Result<(), ModelError>>;
    /// Its measured decode speed, for models that measure one.
    fn speed(&self) -> Option<&SpeedGauge> {
        None
    }
    /// Measured decode speed in tokens per second; `None` until measured.
    fn tokens_per_s(&self) -> Option<f64> {
        self.speed().and_then(SpeedGauge::get)
    }
    /// Whether [`ChatModel::embed`] can answer (`embeddings = true` in the model's entry); what
    /// the node advertises, so the mesh sends embeddings only to models that make them.
    fn embeds(&self) -> bool {
        false
    }
    /// Embeds each text of `request` (a unit-length vector per input, in order). A model that
    /// does not make embeddings refuses, naming itself.
    fn embed<'a>(
        &'a self,
        request: &'a EmbedRequest,
    ) -> BoxFuture<'a, Result<EmbedResponse, ModelError>> {
        let _ = request;
        Box::pin(async move { Err(cannot_embed(self.name())) })
    }
}

/// The refusal of a model that does not make embeddings (the same words on every node and in
/// every API).
pub(crate) fn cannot_embed(model: &str) -> ModelError {
    ModelError::Refused {
        status: 400,
        message: format!(
            "model `{model}` does not support embeddings (set `embeddings = true` in its [[models]] entry if it makes them)"
        ),
    }
}

/// Samples with fewer decoded tokens than this are not recorded: mostly noise.
pub(crate) const MIN_SPEED_SAMPLE_TOKENS: u64 = 8;

/// `tokens / elapsed`; `None` for no tokens or no time.
pub(crate) fn tokens_per_second(tokens: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    (tokens > 0 && seconds > 0.0).then(|| tokens as f64 / seconds)
}

/// A model's decode speed, tokens/s: an exponential moving average over samples, so it follows a
/// machine that gets busier or idler without jumping on one odd call. Whoever reports it (the
/// node's capabilities) follows it with [`SpeedGauge::subscribe`].
#[derive(Debug)]
pub struct SpeedGauge {
    value: watch::Sender<Option<f64>>,
}

impl Default for SpeedGauge {
    fn default() -> Self {
        Self {
            value: watch::Sender::new(None),
        }
    }
}

impl SpeedGauge {
    /// Weight of the newest sample.
    const WEIGHT: f64 = 0.3;

    /// Records `tokens` decoded in `elapsed`; samples below [`MIN_SPEED_SAMPLE_TOKENS`] are
    /// ignored.
    pub fn record(&self, tokens: u64, elapsed: Duration) {
        if tokens < MIN_SPEED_SAMPLE_TOKENS {
            return;
        }
        let Some(rate) = tokens_per_second(tokens, elapsed) else {
            return;
        };
        self.value.send_modify(|value| {
            *value = Some(match *value {
                None => rate,
                Some(old) => old + Self::WEIGHT * (rate - old),
            });
        });
    }

    /// The current estimate.
    pub fn get(&self) -> Option<f64> {
        *self.value.borrow()
    }

    /// Follows the estimate as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<f64>> {
        self.value.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_is_a_moving_average_of_large_enough_samples() {
        assert_eq!(tokens_per_second(0, Duration::from_secs(1)), None);
        assert_eq!(tokens_per_second(5, Duration::ZERO), None);
        assert_eq!(
            tokens_per_second(100, Duration::from_millis(500)),
            Some(200.0)
        );
        let gauge = SpeedGauge::default();
        assert_eq!(gauge.get(), None);
        gauge.record(MIN_SPEED_SAMPLE_TOKENS - 1, Duration::from_millis(1));
        assert_eq!(gauge.get(), None, "too small a sample");
        gauge.record(100, Duration::from_secs(1));
        assert_eq!(gauge.get(), Some(100.0));
        gauge.record(200, Duration::from_secs(1));
        let value = gauge.get().expect("measured");
        assert!((value - 130.0).abs() < 1e-9, "{value}");
    }

    #[test]
    fn failures_that_fall_through_are_the_transient_ones() {
        assert!(ModelError::Unreachable("x".into()).falls_through());
        assert!(
            ModelError::Server {
                status: 503,
                message: String::new()
            }
            .falls_through()
        );
        assert!(ModelError::Timeout(Duration::from_secs(1)).falls_through());
        assert!(
            !ModelError::Refused {
                status: 400,
                message: String::new()
            }
            .falls_through()
        );
        assert!(!ModelError::Protocol("x".into()).falls_through());
    }
}
