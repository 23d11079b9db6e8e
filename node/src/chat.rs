//! Chats with models, wherever they run: falling through a chain of models on this node
//! ([`fall_through`], which the agent loop and the front door both use), and running one chat
//! where the mesh places it ([`ChatService`]): here, or on the best peers in turn through the
//! [`RemoteChat`] port (implemented by `rpc` over `agentmesh.v1.Models/Chat`). Embeddings take
//! the same way ([`ChatService::place_embed`], [`ChatService::run_embed`]), to the nodes whose
//! model makes them, over `agentmesh.v1.Models/Embed`.
//!
//! When the peer serving a chat fails, the next peer takes over ([`Failover`]): with the whole
//! request when nothing was passed on yet, and, once text was, by continuing from that text
//! (sent to it as the assistant's message so far) or answering the whole request again, as the
//! caller asks. The peers tried are the placement's, at most [`MAX_CHAT_TRIES`].
//!
//! It decides where a chat may go through `admission`, and it never runs tools or creates
//! tasks; it speaks no protobuf and no HTTP.

use std::{sync::Arc, time::Instant};

use mesh_domain::{
    BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Message, Role, Target,
    Usage, chat::estimate_text_tokens,
};

use crate::{
    admission::{Admission, AdmissionError},
    llm::{ChatModel, Deltas, ModelError, ModelRegistry},
    metrics::{labels, metrics},
    router::Placement,
};

/// Most peers one chat is tried on (the best and two more), as for tasks.
pub(crate) const MAX_CHAT_TRIES: usize = 3;

/// What the caller of [`fall_through`] hears while a chain runs (its text goes to the
/// chain's [`Deltas`]).
pub(crate) trait ChainObserver: Send {
    /// A model of the chain is about to be called (`attempt` counts from 1).
    fn attempt(&mut self, _model: &str, _attempt: u32) {}
    /// A call failed; `falling_through` says whether the next model is tried.
    fn failed(&mut self, _model: &str, _error: &ModelError, _falling_through: bool) {}
}

/// Every model of a chain failed, or the last one failed in a way the next would not fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainFailure {
    /// Each attempt: the model and how it failed, in order (empty for an empty chain).
    pub attempts: Vec<(String, ModelError)>,
}

impl ChainFailure {
    /// The last attempt: which model, and how it failed.
    pub(crate) fn last(&self) -> Option<&(String, ModelError)> {
        self.attempts.last()
    }
}

/// Calls the chain in order until one model answers; a transient failure (connect error, 5xx,
/// timeout) falls through to the next model, anything else ends the chain. The models' text
/// goes to `deltas` as they generate it. The answer names the model that gave it.
pub(crate) async fn fall_through(
    chain: &[Arc<dyn ChatModel>],
    request: &ChatRequest,
    deltas: &Deltas,
    observer: &mut dyn ChainObserver,
) -> Result<ChatResponse, ChainFailure> {
    let mut attempts = Vec::new();
    for (i, model) in chain.iter().enumerate() {
        observer.attempt(model.name(), i as u32 + 1);
        let started = Instant::now();
        let result = model.chat(request, deltas).await;
        metrics().model_call(model.name(), started.elapsed().as_secs_f64());
        match result {
            Ok(response) => {
                return Ok(ChatResponse {
                    model: model.name().to_owned(),
                    ..response
                });
            }
            Err(error) => {
                let falling_through = error.falls_through() && i + 1 < chain.len();
                observer.failed(model.name(), &error, falling_through);
                attempts.push((model.name().to_owned(), error));
                if !falling_through {
                    break;
                }
            }
        }
    }
    Err(ChainFailure { attempts })
}

/// Why a chat on a peer failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteChatError {
    pub message: String,
    /// The text of the answer already passed on (empty: none).
    pub streamed: String,
    /// The peer refused the request itself: no node would take it.
    pub invalid_request: bool,
}

/// Runs a chat or embeddings on a peer's models (a port: `rpc` implements it with
/// `Models/Chat` and `Models/Embed`).
pub trait RemoteChat: Send + Sync + std::fmt::Debug {
    /// Runs `request` for `target` on the node at `addr`, passing its text on to `deltas` (as
    /// fast as they are read: a slow reader slows the peer); the complete answer at the end.
    fn chat<'a>(
        &'a self,
        addr: &'a str,
        target: &'a Target,
        request: &'a ChatRequest,
        deltas: &'a Deltas,
    ) -> BoxFuture<'a, Result<ChatResponse, RemoteChatError>>;

    /// Embeds `request` with `model` on the node at `addr`.
    fn embed<'a>(
        &'a self,
        addr: &'a str,
        model: &'a str,
        request: &'a EmbedRequest,
    ) -> BoxFuture<'a, Result<EmbedResponse, RemoteChatError>>;
}

/// Why a placed chat did not produce an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    /// This node's model (or every model of its chain) failed.
    #[error("{0}")]
    Model(ModelError),
    /// This node was chosen but does not have the model loaded (its advert was stale).
    #[error("this node advertised the model but does not have it loaded")]
    NotLoaded,
    /// Every peer tried failed; one line per peer.
    #[error("{0}")]
    Peers(String),
}

/// What a chat on peers does when the peer serving it fails after passing text on (its node
/// died, its model broke off mid-answer). A peer that fails before passing anything on is
/// skipped for the next whatever this says, as it always was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failover {
    /// The next peer continues the answer: the text passed on so far is sent to it as the
    /// assistant's message, and what it writes follows that text. For a caller that passes the
    /// text on as it comes (a streamed answer).
    Continue,
    /// The next peer answers the whole request again, and the text passed on is dropped. For a
    /// caller that waits for the whole answer, so never showed that text.
    Whole,
    /// The chat ends with the failure: for a client that asked for strict behaviour.
    #[default]
    Off,
}

/// How the next peer took over a chat (the `kind` of `agentmesh_chat_failovers_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takeover {
    /// It was asked the whole request.
    Whole,
    /// It was asked to continue the text already passed on.
    MidStream,
}

impl Takeover {
    fn as_str(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::MidStream => "mid_stream",
        }
    }
}

/// A chat's way over the peers it is tried on: what the next one is asked, and what the lost
/// ones passed on and spent.
#[derive(Debug)]
struct Attempts<'a> {
    /// The request as the caller made it.
    original: &'a ChatRequest,
    failover: Failover,
    /// What the next peer is asked, once that is not `original`.
    next: Option<ChatRequest>,
    /// The text lost peers passed on that the next one continues ([`Failover::Continue`]).
    prefix: String,
    /// Bytes of text every lost peer passed on; taken off `max_tokens`, so that over however
    /// many peers an answer never grows past what its caller (or its key) granted it.
    passed: usize,
    /// The estimate of what the lost peers spent: each its prompt and the text it passed on.
    lost: Usage,
}

impl<'a> Attempts<'a> {
    fn new(original: &'a ChatRequest, failover: Failover) -> Self {
        Self {
            original,
            failover,
            next: None,
            prefix: String::new(),
            passed: 0,
            lost: Usage::default(),
        }
    }

    /// What the next peer is asked.
    fn request(&self) -> &ChatRequest {
        self.next.as_ref().unwrap_or(self.original)
    }

    /// The peer asked [`Attempts::request`] failed after passing `streamed` on: how the next
    /// peer takes over, or `None` when it does not (the caller wants no failover once text went
    /// out, or the text passed on already took all of `max_tokens`).
    fn lost(&mut self, streamed: &str) -> Option<Takeover> {
        if !streamed.is_empty() {
            if self.failover == Failover::Off {
                return None;
            }
            let passed = self.passed + streamed.len();
            let max_tokens = match self.original.sampling.max_tokens {
                Some(granted) => {
                    let used = u32::try_from(estimate_text_tokens(passed)).unwrap_or(u32::MAX);
                    match granted.saturating_sub(used) {
                        0 => return None,
                        left => Some(left),
                    }
                }
                None => None,
            };
            self.lost
                .add(self.request().estimate_cut_off(streamed.len()));
            self.passed = passed;
            let mut next = self.original.clone();
            next.sampling.max_tokens = max_tokens;
            if self.failover == Failover::Continue {
                self.prefix.push_str(streamed);
                match next.messages.last_mut() {
                    // The client's own start of the answer (a prefill): the text follows it.
                    Some(last) if last.role == Role::Assistant && last.tool_calls.is_empty() => {
                        last.content.push_str(&self.prefix);
                    }
                    _ => next
                        .messages
                        .push(Message::text(Role::Assistant, self.prefix.clone())),
                }
            }
            self.next = Some(next);
        }
        Some(if self.prefix.is_empty() {
            Takeover::Whole
        } else {
            Takeover::MidStream
        })
    }

    /// The answer of the peer that took over, as the caller's: its text after the text it
    /// continued, and its usage with what the lost peers spent added (reported, so the caller
    /// charges it).
    fn answer(self, response: ChatResponse) -> ChatResponse {
        if self.passed == 0 {
            return response;
        }
        let mut usage = self.lost;
        usage.add(response.usage_or_estimate(self.request()));
        ChatResponse {
            content: self.prefix + &response.content,
            usage: Some(usage),
            ..response
        }
    }
}

/// Runs chats on this node's models, or on the peers the mesh places them on.
#[derive(Debug)]
pub struct ChatService {
    models: Arc<ModelRegistry>,
    admission: Arc<Admission>,
    remote: Arc<dyn RemoteChat>,
}

/// Logs a local chain's fall-throughs.
struct LogFallThrough;

impl ChainObserver for LogFallThrough {
    fn failed(&mut self, model: &str, error: &ModelError, falling_through: bool) {
        if falling_through {
            tracing::warn!(
                model,
                %error,
                "front door: model failed, trying the next in the chain"
            );
        }
    }
}

impl ChatService {
    /// Chats on `models` here, and through `remote` on the peers `admission` chooses.
    pub fn new(
        models: Arc<ModelRegistry>,
        admission: Arc<Admission>,
        remote: Arc<dyn RemoteChat>,
    ) -> Self {
        Self {
            models,
            admission,
            remote,
        }
    }

    /// The chain that serves `target` on this node; `None` when this node serves neither the
    /// role nor the model (personas run tasks, not chats).
    fn chain(&self, target: &Target) -> Option<Vec<Arc<dyn ChatModel>>> {
        match target {
            Target::Role(role) => self.models.chain(role),
            Target::Model(name) => Some(vec![self.models.model(name)?]),
            Target::Persona(_) => None,
        }
    }

    /// Whether this node takes a chat or embeddings from another node now: not while it
    /// drains (the sender tries its next node).
    pub fn takes_new_work(&self) -> Result<(), AdmissionError> {
        self.admission.takes_new_work()
    }

    /// Whether this node serves `target`.
    pub fn serves(&self, target: &Target) -> bool {
        self.chain(target).is_some()
    }

    /// Runs a chat on this node's model, or its role's chain with fall-through, streaming
    /// deltas to `deltas`. `None` when this node serves neither.
    pub async fn serve_here(
        &self,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
    ) -> Option<Result<ChatResponse, ModelError>> {
        let chain = self.chain(target)?;
        match fall_through(&chain, request, deltas, &mut LogFallThrough).await {
            Ok(response) => Some(Ok(response)),
            Err(failure) => failure.attempts.into_iter().last().map(|(_, e)| Err(e)),
        }
    }

    /// Where a chat for `target` goes: here, or the best peers (at most [`MAX_CHAT_TRIES`]).
    pub fn place(&self, target: &Target) -> Result<Placement, AdmissionError> {
        Ok(match self.admission.place_chat(target)? {
            Placement::Remote(mut peers) => {
                peers.truncate(MAX_CHAT_TRIES);
                Placement::Remote(peers)
            }
            local => local,
        })
    }

    /// Runs `request` where `placement` says, streaming deltas; the complete answer at the end.
    /// On peers, the next is tried when one fails before passing anything on, and after that
    /// as `failover` says.
    pub async fn run(
        &self,
        placement: Placement,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
        failover: Failover,
    ) -> Result<ChatResponse, ChatError> {
        self.run_with(placement, target, request, deltas, failover)
            .await
            .map(|(response, _)| response)
    }

    /// [`ChatService::run`] without failover once text went out, also naming the peer that
    /// answered (`None`: this node).
    pub async fn run_on(
        &self,
        placement: Placement,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
    ) -> Result<(ChatResponse, Option<String>), ChatError> {
        self.run_with(placement, target, request, deltas, Failover::Off)
            .await
    }

    async fn run_with(
        &self,
        placement: Placement,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
        failover: Failover,
    ) -> Result<(ChatResponse, Option<String>), ChatError> {
        let peers = match placement {
            Placement::Local => {
                return match self.serve_here(target, request, deltas).await {
                    Some(Ok(response)) => Ok((response, None)),
                    Some(Err(error)) => Err(ChatError::Model(error)),
                    None => Err(ChatError::NotLoaded),
                };
            }
            Placement::Remote(peers) => peers,
        };
        let mut attempts = Attempts::new(request, failover);
        let mut failed = Vec::new();
        let mut peers = peers.into_iter().peekable();
        while let Some(peer) = peers.next() {
            let asked = attempts.request();
            let error = match self.remote.chat(&peer.addr, target, asked, deltas).await {
                Ok(response) => return Ok((attempts.answer(response), Some(peer.name))),
                Err(error) => error,
            };
            // The request itself was refused before anything went out: the client's fault (a
            // 400 at the front door), and another node would refuse it too.
            if error.invalid_request && error.streamed.is_empty() {
                return Err(ChatError::Model(ModelError::Refused {
                    status: 400,
                    message: format!("node {}: {}", peer.name, error.message),
                }));
            }
            failed.push(format!("node {}: {}", peer.name, error.message));
            let Some(next) = peers.peek() else { break };
            let Some(takeover) = attempts.lost(&error.streamed) else {
                break;
            };
            metrics()
                .chat_failovers
                .get_or_create(&labels(&[("kind", takeover.as_str())]))
                .inc();
            let (model, streamed_bytes) = (target.model_id(), attempts.passed);
            match takeover {
                Takeover::Whole => tracing::warn!(
                    lost = %peer.name, node = %next.name, model, streamed_bytes,
                    error = %error.message,
                    "front door: a chat failed on a node; trying the next node with the whole request"
                ),
                Takeover::MidStream => tracing::warn!(
                    lost = %peer.name, node = %next.name, model, streamed_bytes,
                    error = %error.message,
                    "front door: a chat failed mid-answer; continuing on the next node from the text already streamed"
                ),
            }
        }
        Err(ChatError::Peers(failed.join("; ")))
    }

    /// Embeds `request` with this node's `model`. `None` when this node does not have the
    /// model; a model that does not make embeddings refuses, naming itself.
    pub async fn embed_here(
        &self,
        model: &str,
        request: &EmbedRequest,
    ) -> Option<Result<EmbedResponse, ModelError>> {
        let model = self.models.model(model)?;
        let started = Instant::now();
        let result = model.embed(request).await;
        metrics().model_call(model.name(), started.elapsed().as_secs_f64());
        Some(result.map(|response| EmbedResponse {
            model: model.name().to_owned(),
            ..response
        }))
    }

    /// Where embeddings with `model` go: here, or the best peers whose model makes them (at
    /// most [`MAX_CHAT_TRIES`]).
    pub fn place_embed(&self, model: &str) -> Result<Placement, AdmissionError> {
        Ok(match self.admission.place_embed(model)? {
            Placement::Remote(mut peers) => {
                peers.truncate(MAX_CHAT_TRIES);
                Placement::Remote(peers)
            }
            local => local,
        })
    }

    /// Embeds `request` with `model` where `placement` says. On peers, the next is tried when
    /// one fails (nothing was passed on yet), except when a peer's model refused the request
    /// itself: that refusal is the answer, as it would be here.
    pub async fn run_embed(
        &self,
        placement: Placement,
        model: &str,
        request: &EmbedRequest,
    ) -> Result<EmbedResponse, ChatError> {
        let peers = match placement {
            Placement::Local => {
                return match self.embed_here(model, request).await {
                    Some(Ok(response)) => Ok(response),
                    Some(Err(error)) => Err(ChatError::Model(error)),
                    None => Err(ChatError::NotLoaded),
                };
            }
            Placement::Remote(peers) => peers,
        };
        let mut failed = Vec::new();
        for peer in peers {
            let error = match self.remote.embed(&peer.addr, model, request).await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            if error.invalid_request {
                return Err(ChatError::Model(ModelError::Refused {
                    status: 400,
                    message: error.message,
                }));
            }
            tracing::warn!(node = %peer.name, error = %error.message, "front door: embeddings failed on a node; trying the next");
            failed.push(format!("node {}: {}", peer.name, error.message));
        }
        Err(ChatError::Peers(failed.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{capabilities::test_support::test_capabilities, router::Destination};

    /// A fleet of peers whose `Models.Chat` and `Models.Embed` answers are scripted by address;
    /// records the addresses tried, in order.
    #[derive(Debug, Default)]
    struct ScriptedPeers {
        tried: Mutex<Vec<String>>,
        /// The chat requests each peer was asked, in order.
        asked: Mutex<Vec<ChatRequest>>,
    }

    /// What a peer at `breaks` passes on before it fails.
    const BROKEN_OFF: &str = "Once upon";

    impl RemoteChat for ScriptedPeers {
        fn chat<'a>(
            &'a self,
            addr: &'a str,
            _target: &'a Target,
            request: &'a ChatRequest,
            deltas: &'a Deltas,
        ) -> BoxFuture<'a, Result<ChatResponse, RemoteChatError>> {
            self.tried.lock().expect("lock").push(addr.to_owned());
            self.asked.lock().expect("lock").push(request.clone());
            let fail = move |invalid_request| RemoteChatError {
                message: format!("{addr} said no"),
                streamed: String::new(),
                invalid_request,
            };
            Box::pin(async move {
                match addr {
                    "down" => Err(fail(false)),
                    "refuses" => Err(fail(true)),
                    "breaks" => {
                        let _ = deltas.send(BROKEN_OFF.into()).await;
                        Err(RemoteChatError {
                            streamed: BROKEN_OFF.into(),
                            ..fail(false)
                        })
                    }
                    _ => {
                        let content = format!(" from {addr}");
                        let _ = deltas.send(content.clone()).await;
                        Ok(ChatResponse {
                            model: "m".into(),
                            content,
                            ..ChatResponse::default()
                        })
                    }
                }
            })
        }

        fn embed<'a>(
            &'a self,
            addr: &'a str,
            model: &'a str,
            request: &'a EmbedRequest,
        ) -> BoxFuture<'a, Result<EmbedResponse, RemoteChatError>> {
            self.tried.lock().expect("lock").push(addr.to_owned());
            let fail = |invalid_request| RemoteChatError {
                message: format!("{addr} said no"),
                streamed: String::new(),
                invalid_request,
            };
            let result = match addr {
                "down" => Err(fail(false)),
                "refuses" => Err(fail(true)),
                _ => Ok(EmbedResponse {
                    model: model.to_owned(),
                    vectors: vec![vec![1.0]; request.inputs.len()],
                    prompt_tokens: 1,
                }),
            };
            Box::pin(async move { result })
        }
    }

    /// A chat service with no models of its own whose peers are [`ScriptedPeers`].
    fn scripted_service() -> (ChatService, Arc<ScriptedPeers>) {
        let remote = Arc::new(ScriptedPeers::default());
        let service = ChatService::new(
            Arc::new(ModelRegistry::default()),
            Arc::new(Admission::new(
                test_capabilities(),
                Arc::default(),
                mesh_domain::Tier::Write,
            )),
            remote.clone(),
        );
        (service, remote)
    }

    fn peers(addrs: &[&str]) -> Placement {
        Placement::Remote(
            addrs
                .iter()
                .map(|a| Destination {
                    name: (*a).to_owned(),
                    addr: (*a).to_owned(),
                })
                .collect(),
        )
    }

    fn hello(max_tokens: Option<u32>) -> ChatRequest {
        ChatRequest {
            messages: vec![Message::text(Role::User, "tell a story")],
            sampling: mesh_domain::Sampling {
                max_tokens,
                ..Default::default()
            },
            ..ChatRequest::default()
        }
    }

    /// Continuing: each lost peer's text is added to the one assistant message the next peer
    /// continues, `max_tokens` shrinks by what went out, and the answer is the whole text with
    /// what every lost peer spent in its usage. A peer that failed before passing anything on
    /// leaves the request as it was.
    #[test]
    fn a_continued_chat_sends_the_text_so_far_as_one_assistant_message() {
        let original = hello(Some(100));
        let mut attempts = Attempts::new(&original, Failover::Continue);
        assert_eq!(attempts.lost("Once upon"), Some(Takeover::MidStream));
        let first = attempts.request().clone();
        assert_eq!(first.messages.len(), 2);
        assert_eq!(
            first.messages[1],
            Message::text(Role::Assistant, "Once upon")
        );
        assert_eq!(first.sampling.max_tokens, Some(100 - 3));
        assert_eq!(attempts.lost(""), Some(Takeover::MidStream));
        assert_eq!(
            *attempts.request(),
            first,
            "nothing went out: the same request"
        );
        assert_eq!(attempts.lost(" a time"), Some(Takeover::MidStream));
        let second = attempts.request().clone();
        assert_eq!(
            second.messages.len(),
            2,
            "one assistant message, not one per node"
        );
        assert_eq!(second.messages[1].content, "Once upon a time");
        assert_eq!(second.sampling.max_tokens, Some(100 - 4));
        let lost = {
            let mut lost = original.estimate_cut_off("Once upon".len());
            lost.add(first.estimate_cut_off(" a time".len()));
            lost
        };
        let answer = attempts.answer(ChatResponse {
            model: "m".into(),
            content: ", there was".into(),
            usage: Some(Usage {
                prompt_tokens: 30,
                completion_tokens: 3,
            }),
            ..ChatResponse::default()
        });
        assert_eq!(answer.content, "Once upon a time, there was");
        assert_eq!(
            answer.usage,
            Some(Usage {
                prompt_tokens: lost.prompt_tokens + 30,
                completion_tokens: lost.completion_tokens + 3,
            })
        );
        assert_eq!(
            original,
            hello(Some(100)),
            "the caller's request is untouched"
        );
    }

    /// A client's own start of the answer (a prefill: the conversation ends with an assistant
    /// message) is continued, not followed by a second assistant message.
    #[test]
    fn a_continued_prefill_gets_the_text_appended() {
        let mut original = hello(None);
        original
            .messages
            .push(Message::text(Role::Assistant, "{\"story\": "));
        let mut attempts = Attempts::new(&original, Failover::Continue);
        assert_eq!(attempts.lost("\"Once"), Some(Takeover::MidStream));
        let next = attempts.request();
        assert_eq!(next.messages.len(), 2);
        assert_eq!(next.messages[1].content, "{\"story\": \"Once");
        assert_eq!(next.sampling.max_tokens, None);
    }

    /// Whole: the next peer gets the caller's request again (with what is left of
    /// `max_tokens`), the text that went out is dropped from the answer but its cost is in the
    /// usage. Off: no failover once text went out, but still before. And no failover when the
    /// text that went out took all of `max_tokens`.
    #[test]
    fn a_whole_retry_asks_again_and_strict_or_spent_chats_do_not_fail_over() {
        let original = hello(Some(100));
        let mut attempts = Attempts::new(&original, Failover::Whole);
        assert_eq!(attempts.lost("Once upon"), Some(Takeover::Whole));
        assert_eq!(*attempts.request(), hello(Some(97)));
        let answer = attempts.answer(ChatResponse {
            content: "A story.".into(),
            ..ChatResponse::default()
        });
        assert_eq!(answer.content, "A story.");
        let mut spent = original.estimate_cut_off("Once upon".len());
        spent.add(original.estimate_cut_off("A story.".len()));
        assert_eq!(answer.usage, Some(spent));

        let mut strict = Attempts::new(&original, Failover::Off);
        assert_eq!(strict.lost(""), Some(Takeover::Whole), "before any text");
        assert_eq!(strict.lost("Once"), None);

        let tight = hello(Some(2));
        let mut spent = Attempts::new(&tight, Failover::Continue);
        assert_eq!(spent.lost("12345678"), None, "two tokens went out of two");

        let untouched = Attempts::new(&original, Failover::Continue).answer(ChatResponse {
            content: "x".into(),
            ..ChatResponse::default()
        });
        assert_eq!(untouched.usage, None, "no failover: the answer as it came");
    }

    /// Through the service: a peer that breaks off mid-answer is followed by the next, which
    /// continues (the deltas carry the text once), or answers again (`Whole`), or nobody
    /// (`Off`: the failure, naming the node).
    #[tokio::test]
    async fn a_chat_broken_off_mid_answer_goes_on_as_its_failover_says() {
        let (service, remote) = scripted_service();
        let target = Target::Model("m".into());
        let request = hello(None);
        for (failover, content, asked) in [
            (Failover::Continue, "Once upon from up", Some(BROKEN_OFF)),
            (Failover::Whole, " from up", None),
        ] {
            remote.asked.lock().expect("lock").clear();
            let (deltas, mut rx) = crate::llm::delta_channel();
            let answer = service
                .run(
                    peers(&["breaks", "up"]),
                    &target,
                    &request,
                    &deltas,
                    failover,
                )
                .await
                .expect("the next peer answers");
            assert_eq!(answer.content, content, "{failover:?}");
            drop(deltas);
            let mut streamed = String::new();
            while let Some(text) = rx.recv().await {
                streamed.push_str(&text);
            }
            assert_eq!(streamed, "Once upon from up", "{failover:?}");
            let second = remote.asked.lock().expect("lock")[1].clone();
            let last = second.messages.last().expect("messages");
            match asked {
                Some(prefix) => assert_eq!(*last, Message::text(Role::Assistant, prefix)),
                None => assert_eq!(second, request),
            }
        }
        let (deltas, _rx) = crate::llm::delta_channel();
        let error = service
            .run(
                peers(&["breaks", "up"]),
                &target,
                &request,
                &deltas,
                Failover::Off,
            )
            .await
            .expect_err("strict: no failover after text");
        assert!(
            matches!(&error, ChatError::Peers(m) if m.contains("node breaks")),
            "{error:?}"
        );
    }

    /// Embeddings on peers fail over like chats: a peer that fails is skipped, a peer whose
    /// model refused the request is the answer (another would refuse it too).
    #[tokio::test]
    async fn embeddings_skip_a_failing_peer_and_stop_at_a_refusing_one() {
        let (service, remote) = scripted_service();
        let request = EmbedRequest {
            inputs: vec!["a".into(), "b".into()],
        };
        let answer = service
            .run_embed(peers(&["down", "up"]), "e", &request)
            .await
            .expect("the second peer answers");
        assert_eq!(answer.vectors.len(), 2);
        let error = service
            .run_embed(peers(&["refuses", "up"]), "e", &request)
            .await
            .expect_err("a refusal is the answer");
        assert_eq!(
            error,
            ChatError::Model(ModelError::Refused {
                status: 400,
                message: "refuses said no".into()
            })
        );
        let error = service
            .run_embed(peers(&["down", "down"]), "e", &request)
            .await
            .expect_err("every peer failed");
        assert!(
            matches!(&error, ChatError::Peers(m) if m.contains("node down")),
            "{error:?}"
        );
        assert_eq!(
            *remote.tried.lock().expect("lock"),
            ["down", "up", "refuses", "down", "down"]
        );
    }

    /// A chat on peers: a peer that fails before answering is skipped; a peer that refused the
    /// request itself (its model's 400, say a `tool_choice` it cannot honour) ends the chat as
    /// a refusal, which the front door answers as a 400 (without this it was a 502 after
    /// trying every peer).
    #[tokio::test]
    async fn a_chat_skips_a_failing_peer_and_a_refusing_peer_is_a_refusal() {
        let (service, remote) = scripted_service();
        let target = Target::Model("m".into());
        let (deltas, _) = crate::llm::delta_channel();
        let request = ChatRequest::default();
        let answer = service
            .run(
                peers(&["down", "up"]),
                &target,
                &request,
                &deltas,
                Failover::Off,
            )
            .await
            .expect("the second peer answers");
        assert_eq!(answer.content, " from up");
        let error = service
            .run(
                peers(&["refuses", "up"]),
                &target,
                &request,
                &deltas,
                Failover::Off,
            )
            .await
            .expect_err("a refusal is the answer");
        assert_eq!(
            error,
            ChatError::Model(ModelError::Refused {
                status: 400,
                message: "node refuses: refuses said no".into()
            })
        );
        assert_eq!(
            *remote.tried.lock().expect("lock"),
            ["down", "up", "refuses"]
        );
    }
}
