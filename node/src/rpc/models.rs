//! The `agentmesh.v1.Models` service: another node's front door runs a chat, or embeddings, on
//! this node's models; and the client side of it.

use std::{pin::Pin, sync::Arc};

use mesh_domain::{BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Target};
use mesh_proto::{convert::check_len, v1 as pb};
use mesh_tls::deadline;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::{
    chat::{ChatService, RemoteChat, RemoteChatError},
    llm::{Deltas, ModelError, delta_channel},
};

/// Most texts one `Models.Embed` call carries, and most bytes of text: the answer (`repeated
/// float`, 4 bytes each) of 96 vectors of up to 8,192 dimensions (3 MiB) stays under the
/// service's 4 MiB message limit, so a larger request goes to a peer in several calls.
const EMBED_BATCH_INPUTS: usize = 96;
/// See [`EMBED_BATCH_INPUTS`].
const EMBED_BATCH_BYTES: usize = super::MAX_MESSAGE_BYTES;

/// The Models service: runs a chat that another node's front door placed here.
#[derive(Debug, Clone)]
pub(crate) struct ModelsService {
    chat: Arc<ChatService>,
}

impl ModelsService {
    /// Serves chats on this node's models.
    pub(crate) fn new(chat: Arc<ChatService>) -> Self {
        Self { chat }
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::models_server::ModelsServer<Self> {
        pb::models_server::ModelsServer::new(self)
            .max_decoding_message_size(4 * super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES)
    }
}

fn target(text: &str) -> Result<Target, Status> {
    if text.is_empty() {
        return Err(Status::invalid_argument(
            "target: name a model or `role:<name>`",
        ));
    }
    check_len("target", text, 256)?;
    text.parse()
        .map_err(|e| Status::invalid_argument(format!("target: {e}")))
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::ChatChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::models_server::Models for ModelsService {
    type ChatStream = ChunkStream;

    async fn chat(&self, request: Request<pb::ChatCall>) -> Result<Response<ChunkStream>, Status> {
        let call = request.into_inner();
        let target = target(&call.target)?;
        let chat = ChatRequest::try_from(call.request.unwrap_or_default())?;
        if chat.messages.is_empty() {
            return Err(Status::invalid_argument(
                "request.messages: must not be empty",
            ));
        }
        chat.sampling
            .check()
            .map_err(|e| Status::invalid_argument(format!("request.sampling.{e}")))?;
        self.chat.takes_new_work()?;
        if !self.chat.serves(&target) {
            return Err(Status::not_found(format!(
                "this node does not serve `{}`",
                call.target
            )));
        }
        let service = self.chat.clone();
        Ok(Response::new(Box::pin(super::stream_from(
            move |tx| async move {
                // Bounded both ways: the model waits while the caller's stream is full (the
                // caller reads as fast as its own client does), so a slow client far away
                // still holds the generation here back.
                let (deltas, mut rx) = delta_channel();
                let run = service.serve_here(&target, &chat, &deltas);
                tokio::pin!(run);
                let result = loop {
                    tokio::select! {
                        result = &mut run => break result,
                        // The caller went away (its stream was reset or timed out): dropping
                        // `run` stops the generation, also while the model sends nothing.
                        () = tx.closed() => return,
                        Some(text) = rx.recv() => {
                            if tx.send(Ok(pb::ChatChunk { kind: Some(pb::chat_chunk::Kind::Delta(text)) })).await.is_err() {
                                return;
                            }
                        }
                    }
                };
                while let Ok(text) = rx.try_recv() {
                    let _ = tx
                        .send(Ok(pb::ChatChunk {
                            kind: Some(pb::chat_chunk::Kind::Delta(text)),
                        }))
                        .await;
                }
                let last = match result {
                    Some(Ok(response)) => Ok(pb::ChatChunk {
                        kind: Some(pb::chat_chunk::Kind::Answer((&response).into())),
                    }),
                    Some(Err(error)) => Err(model_status(&error)),
                    None => Err(Status::not_found("the model went away")),
                };
                let _ = tx.send(last).await;
            },
        ))))
    }

    async fn embed(
        &self,
        request: Request<pb::EmbedCall>,
    ) -> Result<Response<pb::EmbedAnswer>, Status> {
        let call = request.into_inner();
        if call.model.is_empty() {
            return Err(Status::invalid_argument("model: name a model"));
        }
        check_len("model", &call.model, 256)?;
        let embed = EmbedRequest {
            inputs: call.inputs,
        };
        embed
            .check()
            .map_err(|e| Status::invalid_argument(format!("request.{e}")))?;
        self.chat.takes_new_work()?;
        match self.chat.embed_here(&call.model, &embed).await {
            None => Err(Status::not_found(format!(
                "this node does not serve `{}`",
                call.model
            ))),
            Some(Err(error)) => Err(model_status(&error)),
            Some(Ok(response)) => Ok(Response::new((&response).into())),
        }
    }
}

/// A model's failure (a chat's or embeddings'), for the calling node: a refusal is the
/// request's fault (`INVALID_ARGUMENT`: the caller does not try another node and answers its
/// client a 400), anything else is this node's (`UNAVAILABLE`).
fn model_status(error: &ModelError) -> Status {
    match error {
        ModelError::Refused { message, .. } => Status::invalid_argument(message.clone()),
        ModelError::Unreachable(_)
        | ModelError::Server { .. }
        | ModelError::Timeout(_)
        | ModelError::Protocol(_) => Status::unavailable(format!("model: {error}")),
    }
}

fn remote_chat_error(status: &Status, streamed: String) -> RemoteChatError {
    RemoteChatError {
        message: format!("{}: {}", status.code(), status.message()),
        streamed,
        invalid_request: status.code() == tonic::Code::InvalidArgument,
    }
}

fn failure(message: impl Into<String>, streamed: String) -> RemoteChatError {
    RemoteChatError {
        message: message.into(),
        streamed,
        invalid_request: false,
    }
}

/// Chats on peers' models through their `Models.Chat`, over the node's kept peer channels; a
/// chat on a peer ends by the deadlines of the channels' table (`open`, `chat_idle`, `chat`)
/// whatever the peer does, and dropping the call resets the stream, so the peer stops
/// generating too.
#[derive(Debug, Clone)]
pub(crate) struct RemoteModels {
    channels: super::PeerChannels,
}

impl RemoteModels {
    /// Reaches peers through `channels`.
    pub(crate) fn new(channels: super::PeerChannels) -> Self {
        Self { channels }
    }
}

impl RemoteChat for RemoteModels {
    fn chat<'a>(
        &'a self,
        addr: &'a str,
        target: &'a Target,
        request: &'a ChatRequest,
        deltas: &'a Deltas,
    ) -> BoxFuture<'a, Result<ChatResponse, RemoteChatError>> {
        Box::pin(chat_remote(&self.channels, addr, target, request, deltas))
    }

    fn embed<'a>(
        &'a self,
        addr: &'a str,
        model: &'a str,
        request: &'a EmbedRequest,
    ) -> BoxFuture<'a, Result<EmbedResponse, RemoteChatError>> {
        Box::pin(embed_remote(&self.channels, addr, model, request))
    }
}

/// The inputs cut into consecutive batches of at most [`EMBED_BATCH_INPUTS`] texts and
/// [`EMBED_BATCH_BYTES`] bytes (a text alone over the bytes is a batch of its own; the domain's
/// bounds keep it under the message limit).
fn embed_batches(inputs: &[String]) -> Vec<&[String]> {
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, text) in inputs.iter().enumerate() {
        if i > start && (i - start == EMBED_BATCH_INPUTS || bytes + text.len() > EMBED_BATCH_BYTES)
        {
            batches.push(&inputs[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += text.len();
    }
    if start < inputs.len() {
        batches.push(&inputs[start..]);
    }
    batches
}

/// Embeds `request` with `model` on the peer at `addr`, in batches that fit the service's
/// message limit, each within `chat_idle` (longer than one model call's timeout).
async fn embed_remote(
    channels: &super::PeerChannels,
    addr: &str,
    model: &str,
    request: &EmbedRequest,
) -> Result<EmbedResponse, RemoteChatError> {
    let fail = |message: String| failure(message, String::new());
    let channel = channels.get(addr).await.map_err(|e| fail(e.to_string()))?;
    let mut client = pb::models_client::ModelsClient::new(channel)
        .max_decoding_message_size(4 * super::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES);
    let mut answer = EmbedResponse::default();
    for batch in embed_batches(&request.inputs) {
        let call = pb::EmbedCall {
            model: model.to_owned(),
            inputs: batch.to_vec(),
        };
        let limit = channels.deadlines().chat_idle;
        let part = match deadline::within(limit, "Models.Embed", client.embed(call)).await {
            Ok(response) => EmbedResponse::from(response.into_inner()),
            Err(status) => {
                // As for chats: a broken or silent channel is dialled afresh next time.
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) {
                    channels.forget(addr);
                }
                return Err(RemoteChatError {
                    // A refusal is passed on in the model's own words.
                    message: if status.code() == tonic::Code::InvalidArgument {
                        status.message().to_owned()
                    } else {
                        format!("{}: {}", status.code(), status.message())
                    },
                    ..remote_chat_error(&status, String::new())
                });
            }
        };
        if part.vectors.len() != batch.len() {
            return Err(fail(format!(
                "bad answer: {} vectors for {} texts",
                part.vectors.len(),
                batch.len()
            )));
        }
        answer.model = part.model;
        answer.vectors.extend(part.vectors);
        answer.prompt_tokens += part.prompt_tokens;
    }
    Ok(answer)
}

/// Runs a chat on the peer at `addr`, forwarding its deltas; the complete answer at the end.
async fn chat_remote(
    channels: &super::PeerChannels,
    addr: &str,
    target: &Target,
    request: &ChatRequest,
    deltas: &Deltas,
) -> Result<ChatResponse, RemoteChatError> {
    let fail = |message: String| failure(message, String::new());
    let channel = channels.get(addr).await.map_err(|e| fail(e.to_string()))?;
    let mut client = pb::models_client::ModelsClient::new(channel)
        .max_decoding_message_size(4 * super::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES);
    let call = pb::ChatCall {
        target: target.model_id(),
        request: Some(request.into()),
    };
    let deadlines = channels.deadlines();
    // The whole chat has a deadline, its opening a shorter one, and the
    // stream may not go silent between chunks for longer than `chat_idle`.
    let whole = tokio::time::Instant::now() + deadlines.chat;
    let open = client.chat(call);
    let mut stream = match deadline::within(deadlines.open, "Models.Chat", open).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            if matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ) {
                channels.forget(addr);
            }
            return Err(remote_chat_error(&status, String::new()));
        }
    };
    // What went out, for the next node to continue from should this one fail.
    let mut streamed = String::new();
    loop {
        let idle = deadlines
            .chat_idle
            .min(whole.saturating_duration_since(tokio::time::Instant::now()));
        match deadline::within(idle, "Models.Chat stream", stream.message()).await {
            Ok(Some(pb::ChatChunk {
                kind: Some(pb::chat_chunk::Kind::Delta(text)),
            })) => {
                streamed.push_str(&text);
                // Not reading the stream while the reader is behind: HTTP/2 flow control
                // then holds the peer's model back.
                let _ = deltas.send(text).await;
            }
            Ok(Some(pb::ChatChunk {
                kind: Some(pb::chat_chunk::Kind::Answer(answer)),
            })) => {
                // Read on to the end of the stream (the server ends it right after the answer):
                // a stream dropped before its end is reset, and after 1,024 resets h2 refuses
                // the connection ("locally-reset streams reached limit"), which the front-door
                // bench hit as a failed request.
                while let Ok(Some(_)) =
                    deadline::within(idle, "Models.Chat", stream.message()).await
                {}
                return Ok(answer.into());
            }
            Ok(Some(pb::ChatChunk { kind: None })) => {}
            Ok(None) => {
                return Err(failure("the stream ended without an answer", streamed));
            }
            Err(status) => return Err(remote_chat_error(&status, streamed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mesh_domain::{Message, Role, Sampling};
    use mesh_proto::v1::models_server::Models as _;

    use super::*;
    use crate::{
        admission::Admission, capabilities::test_support::test_capabilities, llm::ModelRegistry,
    };

    #[test]
    fn embeddings_go_to_a_peer_in_batches_that_fit_the_message_limit() {
        let texts = |n: usize, len: usize| vec!["x".repeat(len); n];
        let sizes = |inputs: &[String]| -> Vec<usize> {
            embed_batches(inputs).iter().map(|b| b.len()).collect()
        };
        const N: usize = EMBED_BATCH_INPUTS;
        assert_eq!(sizes(&texts(1, 1)), [1]);
        assert_eq!(sizes(&texts(N, 1)), [N]);
        assert_eq!(sizes(&texts(2 * N + 6, 1)), [N, N, 6]);
        // 100 KiB each: ten fit in 1 MiB, the eleventh starts the next batch.
        assert_eq!(sizes(&texts(12, 100 * 1024)), [10, 2]);
        assert!(sizes(&[]).is_empty());
        let inputs = texts(2 * N + 6, 3);
        let joined: Vec<String> = embed_batches(&inputs).concat();
        assert_eq!(joined, inputs, "every text once, in order");
        // The answer of a full batch of the largest vectors fits the message limit.
        let answer = pb::EmbedAnswer::from(&EmbedResponse {
            model: "e".into(),
            vectors: vec![vec![0.5; 8192]; N],
            prompt_tokens: 1,
        });
        let bytes = prost::Message::encoded_len(&answer);
        assert!(bytes < 4 * super::super::MAX_MESSAGE_BYTES, "{bytes} bytes");
    }

    #[tokio::test]
    async fn a_peers_out_of_range_generation_setting_is_refused_naming_the_field() {
        let service = ModelsService::new(Arc::new(ChatService::new(
            Arc::new(ModelRegistry::new(Vec::new(), Default::default())),
            Arc::new(Admission::new(
                test_capabilities(),
                Arc::default(),
                mesh_domain::Tier::Write,
            )),
            Arc::new(RemoteModels::new(super::super::PeerChannels::new(
                mesh_tls::Dialer::Plain,
            ))),
        )));
        let chat = ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        };
        let call = |sampling: Sampling| pb::ChatCall {
            target: "m".into(),
            request: Some(
                (&ChatRequest {
                    sampling,
                    ..chat.clone()
                })
                    .into(),
            ),
        };
        let Err(status) = service
            .chat(Request::new(call(Sampling {
                temperature: Some(9.0),
                ..Sampling::default()
            })))
            .await
        else {
            panic!("an out-of-range temperature was accepted");
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with("request.sampling.temperature"),
            "{}",
            status.message()
        );
        // In range, the check passes and the call gets as far as "not served here".
        let Err(status) = service
            .chat(Request::new(call(Sampling {
                temperature: Some(0.5),
                stop: vec!["x".into()],
                ..Sampling::default()
            })))
            .await
        else {
            panic!("an empty registry served a chat");
        };
        assert_eq!(status.code(), tonic::Code::NotFound, "{}", status.message());
    }

    /// A model that never answers; counts the calls still running (a call stops when its
    /// future is dropped), and all calls.
    #[derive(Debug, Default)]
    struct Silent(
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    /// Counts one running call until dropped.
    struct Running(Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Running {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl crate::llm::ChatModel for Silent {
        fn name(&self) -> &str {
            "m"
        }

        fn context_window(&self) -> usize {
            8192
        }

        fn chat<'a>(
            &'a self,
            _request: &'a ChatRequest,
            _deltas: &'a Deltas,
        ) -> BoxFuture<'a, Result<ChatResponse, crate::llm::ModelError>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let running = Running(self.0.clone());
            Box::pin(async move {
                let _running = running;
                std::future::pending().await
            })
        }

        fn probe(&self) -> BoxFuture<'_, Result<(), crate::llm::ModelError>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn chat_service(models: Vec<Arc<dyn crate::llm::ChatModel>>) -> Arc<ChatService> {
        Arc::new(ChatService::new(
            Arc::new(ModelRegistry::new(models, Default::default())),
            Arc::new(Admission::new(
                test_capabilities(),
                Arc::default(),
                mesh_domain::Tier::Write,
            )),
            Arc::new(RemoteModels::new(super::super::PeerChannels::new(
                mesh_tls::Dialer::Plain,
            ))),
        ))
    }

    /// Issue 30, item 5: a draining node takes no chat or embeddings from a peer: it answers
    /// `UNAVAILABLE` (the peer tries its next node) before its model is called.
    #[tokio::test]
    async fn a_draining_node_refuses_a_peers_chat_and_embeddings_as_unavailable() {
        let silent = Silent::default();
        let calls = silent.1.clone();
        let caps = test_capabilities();
        let service = ModelsService::new(Arc::new(ChatService::new(
            Arc::new(ModelRegistry::new(
                vec![Arc::new(silent)],
                Default::default(),
            )),
            Arc::new(Admission::new(
                caps.clone(),
                Arc::default(),
                mesh_domain::Tier::Write,
            )),
            Arc::new(RemoteModels::new(super::super::PeerChannels::new(
                mesh_tls::Dialer::Plain,
            ))),
        )));
        let call = || {
            Request::new(pb::ChatCall {
                target: "m".into(),
                request: Some(
                    (&ChatRequest {
                        messages: vec![Message::text(Role::User, "hi")],
                        ..Default::default()
                    })
                        .into(),
                ),
            })
        };
        caps.set_draining(true);
        let Err(status) = service.chat(call()).await else {
            panic!("a draining node took a chat");
        };
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("me is draining"),
            "{}",
            status.message()
        );
        let embed = service
            .embed(Request::new(pb::EmbedCall {
                model: "m".into(),
                inputs: vec!["hi".into()],
            }))
            .await
            .expect_err("a draining node took embeddings");
        assert_eq!(embed.code(), tonic::Code::Unavailable);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);

        caps.set_draining(false);
        assert!(service.chat(call()).await.is_ok(), "undrained, it serves");
    }

    /// Issue 16, point 8: a chat forwarded to a peer whose model never answers held the front
    /// door's request for ever. It ends at its deadline, and the peer's model stops too.
    #[tokio::test]
    async fn a_chat_on_a_peer_ends_at_its_deadline_and_the_peers_model_stops() {
        let silent = Silent::default();
        let (running, calls) = (silent.0.clone(), silent.1.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let stop = tokio_util::sync::CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(ModelsService::new(chat_service(vec![Arc::new(silent)])).into_server())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            );
        let server = tokio::spawn(server);

        let remote = RemoteModels::new(
            super::super::PeerChannels::new(mesh_tls::Dialer::Plain).with_deadlines(
                mesh_tls::deadline::Deadlines {
                    chat: Duration::from_millis(300),
                    ..mesh_tls::deadline::DEADLINES
                },
            ),
        );
        let request = ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        };
        let (deltas, _rx) = delta_channel();
        let error = tokio::time::timeout(
            Duration::from_secs(5),
            remote.chat(&addr, &Target::Model("m".into()), &request, &deltas),
        )
        .await
        .expect("the chat ends by its deadline")
        .expect_err("no answer comes");
        assert!(
            error.message.contains("no answer within"),
            "{}",
            error.message
        );
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The peer notices the reset stream and drops its model call.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while running.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the peer's model is still generating"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll until the deadline
        }
        stop.cancel();
        server.await.expect("server task").expect("server");
    }
}
