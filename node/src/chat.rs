//! Chats with models, wherever they run: falling through a chain of models on this node
//! ([`fall_through`], which the agent loop and the front door both use), and running one chat
//! where the mesh places it ([`ChatService`]): here, or on the best peers in turn through the
//! [`RemoteChat`] port (implemented by `rpc` over `agentmesh.v1.Models/Chat`). Embeddings take
//! the same way ([`ChatService::place_embed`], [`ChatService::run_embed`]), to the nodes whose
//! model makes them, over `agentmesh.v1.Models/Embed`.
//!
//! It decides where a chat may go through `admission`, and it never runs tools or creates
//! tasks; it speaks no protobuf and no HTTP.

use std::{sync::Arc, time::Instant};

use mesh_domain::{BoxFuture, ChatRequest, ChatResponse, EmbedRequest, EmbedResponse, Target};

use crate::{
    admission::{Admission, AdmissionError},
    llm::{ChatModel, Deltas, ModelError, ModelRegistry},
    metrics::metrics,
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
    /// Some of the answer was already passed on.
    pub streamed: bool,
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
    /// On peers, the next is tried when one fails before passing anything on.
    pub async fn run(
        &self,
        placement: Placement,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
    ) -> Result<ChatResponse, ChatError> {
        self.run_on(placement, target, request, deltas)
            .await
            .map(|(response, _)| response)
    }

    /// [`ChatService::run`], also naming the peer that answered (`None`: this node).
    pub async fn run_on(
        &self,
        placement: Placement,
        target: &Target,
        request: &ChatRequest,
        deltas: &Deltas,
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
        let mut failed = Vec::new();
        for peer in peers {
            let error = match self.remote.chat(&peer.addr, target, request, deltas).await {
                Ok(response) => return Ok((response, Some(peer.name))),
                Err(error) => error,
            };
            // The request itself was refused before anything went out: the client's fault (a
            // 400 at the front door), and another node would refuse it too.
            if error.invalid_request && !error.streamed {
                return Err(ChatError::Model(ModelError::Refused {
                    status: 400,
                    message: format!("node {}: {}", peer.name, error.message),
                }));
            }
            failed.push(format!("node {}: {}", peer.name, error.message));
            // Once text went out, another node would not do better.
            if error.streamed {
                break;
            }
            tracing::warn!(node = %peer.name, error = %error.message, "front door: a chat failed before answering; trying the next node");
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
    }

    impl RemoteChat for ScriptedPeers {
        fn chat<'a>(
            &'a self,
            addr: &'a str,
            _target: &'a Target,
            _request: &'a ChatRequest,
            _deltas: &'a Deltas,
        ) -> BoxFuture<'a, Result<ChatResponse, RemoteChatError>> {
            self.tried.lock().expect("lock").push(addr.to_owned());
            let fail = |invalid_request| RemoteChatError {
                message: format!("{addr} said no"),
                streamed: false,
                invalid_request,
            };
            let result = match addr {
                "down" => Err(fail(false)),
                "refuses" => Err(fail(true)),
                _ => Ok(ChatResponse {
                    model: "m".into(),
                    content: format!("from {addr}"),
                    ..ChatResponse::default()
                }),
            };
            Box::pin(async move { result })
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
                streamed: false,
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

    /// Embeddings on peers fail over like chats: a peer that fails is skipped, a peer whose
    /// model refused the request is the answer (another would refuse it too).
    #[tokio::test]
    async fn embeddings_skip_a_failing_peer_and_stop_at_a_refusing_one() {
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
        let target = Target::Model("m".into());
        let (deltas, _) = crate::llm::delta_channel();
        let request = ChatRequest::default();
        let answer = service
            .run(peers(&["down", "up"]), &target, &request, &deltas)
            .await
            .expect("the second peer answers");
        assert_eq!(answer.content, "from up");
        let error = service
            .run(peers(&["refuses", "up"]), &target, &request, &deltas)
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
