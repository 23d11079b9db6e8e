//! How a dialect writes a running call to its client: an [`Encoder`] turns the gateway's
//! [`Event`]s into the dialect's frames (server-sent events or NDJSON lines), and [`stream`]
//! sends them as they come, cancelling the call when the client goes away. What the frames
//! say is each dialect's; this module only moves them.

use std::convert::Infallible;

use axum::{
    body::{Body, Bytes},
    http::header,
    response::{IntoResponse, Response},
};
use mesh_domain::BoxFuture;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::gateway::{Event, Run};

/// Frames buffered between a running call and a slow client.
const FRAME_BUFFER: usize = 64;

/// How a dialect writes a streamed answer: frames (server-sent events or NDJSON lines, each
/// complete with its line ends) before, per event, and after.
pub(crate) trait Encoder: Send + 'static {
    /// Frames before the first event (OpenAI's role chunk, Anthropic's `message_start`).
    fn start(&mut self) -> Vec<String>;
    /// Frames for one event.
    fn event(&mut self, event: Event) -> Vec<String>;
    /// Frames after the last event (OpenAI's `[DONE]`).
    fn end(&mut self) -> Vec<String>;
    /// The closing frames, once work that must come before them is done: the Responses API
    /// stores the answer before it says it is complete, so a continuation sent as soon as the
    /// client reads the end finds it. By default [`Encoder::end`], at once.
    fn close(&mut self) -> BoxFuture<'_, Vec<String>> {
        let frames = self.end();
        Box::pin(async move { frames })
    }
}

/// Streams `run` to the client through `encoder`, as `content_type`. When the client goes
/// away the run is dropped, which cancels the chat.
pub(crate) fn stream(
    mut run: Run,
    content_type: &'static str,
    mut encoder: impl Encoder,
) -> Response {
    let (frames_tx, frames) = mpsc::channel::<Result<Bytes, Infallible>>(FRAME_BUFFER);
    tokio::spawn(async move {
        let send = |frames: Vec<String>| {
            let frames_tx = frames_tx.clone();
            async move {
                for frame in frames {
                    if frames_tx.send(Ok(Bytes::from(frame))).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        if !send(encoder.start()).await {
            return;
        }
        loop {
            tokio::select! {
                event = run.next() => match event {
                    Some(event) => if !send(encoder.event(event)).await { return },
                    None => break,
                },
                // The client went away: dropping `run` cancels the chat.
                () = frames_tx.closed() => return,
            }
        }
        let frames = encoder.close().await;
        send(frames).await;
    });
    let body = Body::from_stream(ReceiverStream::new(frames));
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
