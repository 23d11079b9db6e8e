//! A streamed message: the gateway's events as Anthropic's server-sent events.

use mesh_domain::ChatResponse;
use serde_json::{Value, json};

use super::translate::{stop_reason, tool_input, tool_use_id, usage_json};
use crate::{
    gateway::{Event, GatewayError},
    http::{
        encode::Encoder,
        error::{ApiError, Dialect},
    },
};

/// One server-sent event in Anthropic's framing.
pub(super) fn frame(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

pub(super) fn error_frame(error: &ApiError) -> String {
    frame("error", &error.body(Dialect::Anthropic))
}

/// A streamed message: `message_start`, `ping`, the text block's start and deltas, its stop,
/// a `tool_use` block per call (its input in one `input_json_delta`), `message_delta` with
/// the stop reason and usage, `message_stop`; or `error` once a failure comes.
pub(super) struct Events {
    pub(super) id: String,
    /// The model asked for (the serving one is known only at the end, after `message_start`).
    pub(super) model: String,
    /// Blocks started so far (the index of the next).
    pub(super) blocks: u32,
    /// Whether the text block is open (the last started block).
    pub(super) text_open: bool,
    /// Whether the message is over (stopped, or failed).
    pub(super) over: bool,
}

impl Events {
    pub(super) fn new(id: String, model: String) -> Self {
        Self {
            id,
            model,
            blocks: 0,
            text_open: false,
            over: false,
        }
    }

    /// Stops the text block, if one is open.
    pub(super) fn close_text(&mut self) -> Vec<String> {
        if !self.text_open {
            return Vec::new();
        }
        self.text_open = false;
        self.blocks += 1;
        vec![frame(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.blocks - 1}),
        )]
    }

    pub(super) fn done(&mut self, response: &ChatResponse) -> Vec<String> {
        // Every input is checked before any block is sent: a bad one is an error, not a
        // broken block.
        let inputs = match response
            .tool_calls
            .iter()
            .map(|call| tool_input(&response.model, call))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(inputs) => inputs,
            Err(error) => {
                self.over = true;
                return vec![error_frame(&error)];
            }
        };
        let mut frames = self.close_text();
        for (call, input) in response.tool_calls.iter().zip(inputs) {
            let index = self.blocks;
            frames.push(frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block":
                        {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}}}),
            ));
            frames.push(frame(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta":
                        {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ));
            frames.push(frame(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
            self.blocks += 1;
        }
        frames.push(frame(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(response), "stop_sequence": null},
                    "usage": usage_json(response.usage.unwrap_or_default())}),
        ));
        frames.push(frame("message_stop", &json!({"type": "message_stop"})));
        self.over = true;
        frames
    }
}

impl Encoder for Events {
    fn start(&mut self) -> Vec<String> {
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "content": [], "model": self.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}});
        vec![
            frame(
                "message_start",
                &json!({"type": "message_start", "message": message}),
            ),
            frame("ping", &json!({"type": "ping"})),
        ]
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        if self.over {
            return Vec::new();
        }
        match event {
            Event::Delta { text, .. } => {
                let mut frames = Vec::new();
                if !self.text_open {
                    self.text_open = true;
                    frames.push(frame(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": self.blocks,
                                "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                frames.push(frame(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": self.blocks,
                            "delta": {"type": "text_delta", "text": text}}),
                ));
                frames
            }
            Event::Done { response, .. } => self.done(&response),
            Event::Failed(error) => {
                self.over = true;
                vec![error_frame(&error.into())]
            }
        }
    }

    fn end(&mut self) -> Vec<String> {
        if self.over {
            return Vec::new();
        }
        vec![error_frame(&GatewayError::NoAnswer.into())]
    }
}
