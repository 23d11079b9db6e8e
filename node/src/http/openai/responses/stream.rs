//! A streamed response: the gateway's events as the Responses API's server-sent events, each
//! numbered; the answer is stored before `response.completed` is sent.

use axum::http::StatusCode;
use mesh_domain::{BoxFuture, ChatResponse};
use serde_json::{Value, json};

use super::translate::{Head, has_message, keep, output_text, with_call_ids};
use crate::{
    gateway::{Event, GatewayError, Keeper},
    http::{
        encode::Encoder,
        error::{ApiError, Dialect},
    },
};

/// A streamed response: the Responses API's server-sent events, each numbered.
pub(super) struct Events {
    pub(super) head: Head,
    /// Where the answer is kept before `response.completed` (none: `store: false`).
    pub(super) keeper: Option<Keeper>,
    /// The next event's `sequence_number`.
    pub(super) seq: u64,
    /// Whether the message item (output 0) and its text part were announced.
    pub(super) message_open: bool,
    /// The complete answer, once it came.
    pub(super) answer: Option<ChatResponse>,
    /// Whether `response.failed` was sent.
    pub(super) failed: bool,
}

impl Events {
    /// One event: `value` (which has its `type`) with the next sequence number.
    pub(super) fn frame(&mut self, mut value: Value) -> String {
        value["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = value["type"].as_str().unwrap_or_default().to_owned();
        format!("event: {kind}\ndata: {value}\n\n")
    }

    /// Announces the message item and its `output_text` part, once.
    pub(super) fn open_message(&mut self, frames: &mut Vec<String>) {
        if self.message_open {
            return;
        }
        self.message_open = true;
        let item = self.head.message_item("in_progress", None);
        let item_id = self.head.message_id();
        frames.push(self.frame(json!({"type": "response.output_item.added",
            "output_index": 0, "item": item})));
        frames.push(self.frame(json!({"type": "response.content_part.added",
            "item_id": item_id, "output_index": 0, "content_index": 0, "part": output_text("")})));
    }

    pub(super) fn delta(&mut self, text: &str) -> String {
        let item_id = self.head.message_id();
        self.frame(
            json!({"type": "response.output_text.delta", "item_id": item_id,
            "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}),
        )
    }

    /// The events that close the message and announce each tool call whole.
    pub(super) fn done(&mut self, answer: ChatResponse) -> Vec<String> {
        let answer = with_call_ids(answer, self.head.suffix());
        self.head.model = answer.model.clone();
        let mut frames = Vec::new();
        if has_message(&answer) && !self.message_open {
            // A backend that streamed no deltas: the text comes as one.
            self.open_message(&mut frames);
            if !answer.content.is_empty() {
                frames.push(self.delta(&answer.content));
            }
        }
        let mut index = 0;
        if self.message_open {
            let item_id = self.head.message_id();
            let part = output_text(&answer.content);
            let item = self.head.message_item("completed", Some(&answer.content));
            frames.push(self.frame(json!({"type": "response.output_text.done",
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "text": answer.content, "logprobs": []})));
            frames.push(self.frame(json!({"type": "response.content_part.done",
                "item_id": item_id, "output_index": 0, "content_index": 0, "part": part})));
            frames.push(self.frame(json!({"type": "response.output_item.done",
                "output_index": 0, "item": item})));
            index = 1;
        }
        for (i, call) in answer.tool_calls.iter().enumerate() {
            let output_index = index + i;
            let item_id = self.head.call_item_id(i);
            let added = self.head.call_item(i, call, "in_progress", "");
            let item = self.head.call_item(i, call, "completed", &call.arguments);
            frames.push(self.frame(json!({"type": "response.output_item.added",
                "output_index": output_index, "item": added})));
            frames.push(
                self.frame(json!({"type": "response.function_call_arguments.delta",
                "item_id": item_id, "output_index": output_index, "delta": call.arguments})),
            );
            let name = self.head.called(call).1.to_owned();
            frames.push(
                self.frame(json!({"type": "response.function_call_arguments.done",
                "item_id": item_id, "output_index": output_index, "name": name,
                "arguments": call.arguments})),
            );
            frames.push(self.frame(json!({"type": "response.output_item.done",
                "output_index": output_index, "item": item})));
        }
        self.answer = Some(answer);
        frames
    }

    /// `error`, then `response.failed` carrying it.
    pub(super) fn failed(&mut self, error: &ApiError) -> Vec<String> {
        self.failed = true;
        let body = error.body(Dialect::OpenAi);
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or(match error.status {
                StatusCode::GATEWAY_TIMEOUT => "timeout",
                _ => "server_error",
            })
            .to_owned();
        let mut response = self.head.object("failed", Vec::new(), None);
        response["error"] = json!({"code": code, "message": error.message});
        vec![
            self.frame(
                json!({"type": "error", "code": code, "message": error.message,
                "param": error.param}),
            ),
            self.frame(json!({"type": "response.failed", "response": response})),
        ]
    }
}

impl Encoder for Events {
    fn start(&mut self) -> Vec<String> {
        let response = self.head.object("in_progress", Vec::new(), None);
        vec![
            self.frame(json!({"type": "response.created", "response": response})),
            self.frame(json!({"type": "response.in_progress", "response": response})),
        ]
    }

    fn event(&mut self, event: Event) -> Vec<String> {
        if self.failed || self.answer.is_some() {
            return Vec::new();
        }
        match event {
            Event::Delta { text, .. } => {
                let mut frames = Vec::new();
                self.open_message(&mut frames);
                frames.push(self.delta(&text));
                frames
            }
            Event::Done { response, .. } => self.done(response),
            Event::Failed(error) => self.failed(&error.into()),
        }
    }

    fn end(&mut self) -> Vec<String> {
        if self.failed || self.answer.is_some() {
            return Vec::new();
        }
        self.failed(&GatewayError::NoAnswer.into())
    }

    fn close(&mut self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            let Some(answer) = self.answer.take() else {
                return self.end();
            };
            // The message item is in the output when its events were sent.
            let output = self.head.output(&answer, self.message_open);
            let mut response = self.head.object("completed", output, answer.usage);
            if let Some(keeper) = self.keeper.take() {
                keep(keeper, &self.head.id, &answer, &mut response).await;
            }
            vec![self.frame(json!({"type": "response.completed", "response": response}))]
        })
    }
}
