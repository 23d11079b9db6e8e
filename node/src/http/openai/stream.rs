//! A streamed chat completion: the gateway's events as `chat.completion.chunk` server-sent
//! events, then `[DONE]`.

use mesh_domain::Usage;
use serde_json::{Value, json};

use super::translate::{finish_reason, tool_calls_json, usage_json};
use crate::{
    gateway::Event,
    http::{
        encode::Encoder,
        error::{ApiError, Dialect},
    },
};

/// A streamed chat completion: `chat.completion.chunk` events, then `[DONE]`.
pub(super) struct Chunks {
    pub(super) id: String,
    pub(super) created: u64,
    /// The model asked for until one answered, then the one that served.
    pub(super) model: String,
    pub(super) include_usage: bool,
    pub(super) usage: Usage,
    /// Choices started (each gets its role chunk first).
    pub(super) n: u32,
}

impl Chunks {
    pub(super) fn chunk(&self, choice: u32, delta: Value, finish: Option<&str>) -> String {
        let value = json!({"id": self.id, "object": "chat.completion.chunk",
            "created": self.created, "model": self.model,
            "choices": [{"index": choice, "delta": delta, "finish_reason": finish}]});
        format!("data: {value}\n\n")
    }

    /// The role chunk of every choice up to `choice` not yet started.
    pub(super) fn open(&mut self, choice: u32) -> Vec<String> {
        let mut frames = Vec::new();
        while self.n <= choice {
            frames.push(self.chunk(self.n, json!({"role": "assistant", "content": ""}), None));
            self.n += 1;
        }
        frames
    }
}

impl Encoder for Chunks {
    fn start(&mut self) -> Vec<String> {
        self.open(0)
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        match event {
            Event::Delta { choice, text } => {
                let mut frames = self.open(choice);
                frames.push(self.chunk(choice, json!({"content": text}), None));
                frames
            }
            Event::Done { choice, response } => {
                let mut frames = self.open(choice);
                self.model = response.model.clone();
                self.usage.add(response.usage.unwrap_or_default());
                if !response.tool_calls.is_empty() {
                    frames.push(self.chunk(
                        choice,
                        json!({"tool_calls": tool_calls_json(&response.tool_calls)}),
                        None,
                    ));
                }
                frames.push(self.chunk(choice, json!({}), Some(finish_reason(&response))));
                frames
            }
            Event::Failed(error) => {
                vec![format!(
                    "data: {}\n\n",
                    ApiError::from(error).body(Dialect::OpenAi)
                )]
            }
        }
    }

    fn end(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        if self.include_usage {
            let value = json!({"id": self.id, "object": "chat.completion.chunk",
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_json(self.usage)});
            frames.push(format!("data: {value}\n\n"));
        }
        frames.push("data: [DONE]\n\n".to_owned());
        frames
    }
}
