//! A streamed Ollama answer: the gateway's events as NDJSON, one object per line.

use std::time::Instant;

use serde_json::{Value, json};

use super::translate::{Clock, Kind, done_fields, object, tool_calls_json};
use crate::{
    gateway::Event,
    http::encode::Encoder,
    http::error::{ApiError, Dialect},
};

/// A streamed answer: one JSON object per line.
pub(super) struct Lines {
    pub(super) kind: Kind,
    /// The model asked for until one answered, then the one that served.
    pub(super) model: String,
    pub(super) max_tokens: Option<u32>,
    pub(super) clock: Clock,
}

pub(super) fn line(value: &Value) -> String {
    format!("{value}\n")
}

impl Encoder for Lines {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        match event {
            Event::Delta { text, .. } => {
                self.clock.first.get_or_insert_with(Instant::now);
                vec![line(&object(
                    self.kind,
                    &self.model,
                    &text,
                    json!({"done": false}),
                ))]
            }
            Event::Done { response, .. } => {
                self.model = response.model.clone();
                let mut lines = Vec::new();
                if !response.tool_calls.is_empty() {
                    // As Ollama streams them: in an object of their own before the last.
                    match tool_calls_json(&response) {
                        Ok(calls) => {
                            let mut value =
                                object(self.kind, &self.model, "", json!({"done": false}));
                            value["message"]["tool_calls"] = Value::Array(calls);
                            lines.push(line(&value));
                        }
                        Err(error) => return vec![line(&error.body(Dialect::Ollama))],
                    }
                }
                let done = done_fields(&response, self.max_tokens, self.clock);
                lines.push(line(&object(self.kind, &self.model, "", done)));
                lines
            }
            Event::Failed(error) => vec![line(&ApiError::from(error).body(Dialect::Ollama))],
        }
    }

    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }
}
