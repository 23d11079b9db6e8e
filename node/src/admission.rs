//! Admission: the one door every task and every chat goes through, whichever way it arrives
//! (gRPC `Tasks.Submit`, the front door's chats and its `/mcp` tools, the `delegate` tool, a
//! cron firing), and every call of this node's MCP tools from another node (`Tools.Call`). It
//! decides whether a task may run at all (the hop limit, the tier this node allows its caller,
//! an evaluator role some node serves when it asks for one) and where it runs (the router's
//! ranking of this node and its peers, and the choice; a draining node takes nothing new), and
//! counts the decision in the metrics. It also decides who may operate this node (change its
//! settings and the fleet's keys, drain it) and approve a call. Edges map its typed errors to
//! gRPC or HTTP once.
//!
//! It decides only: it runs, queues and forwards nothing (that is `tasks` and `chat`).

use std::sync::{Arc, Mutex};

use mesh_domain::{
    CertRole, NodeId, Principal, Requirements, Target, TaskSpec, Tier, sync::MutexExt,
};

use crate::{
    capabilities::Capabilities,
    metrics::metrics,
    peers::PeerTable,
    router::{self, Destination, Placement, Ranked},
};

/// Most forwards and sub-task levels a task may go through.
pub(crate) const MAX_HOPS: u32 = 4;

/// How a task reached this node, as far as this node can tell: what it may ask of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A certificate calling this node directly (`Tasks.Submit`, `Cron.Add`): an operator's
    /// client certificate, another node's (forwarding a task, or `mesh-cli` with a node
    /// certificate), or a legacy one without a role.
    Certificate(Principal),
    /// A caller without a certificate (insecure mode, loopback experiments): no identities, so
    /// only a task that says it was forwarded or nested (hops above 0) is capped, as remote.
    Unauthenticated {
        /// Whether the task says it was forwarded or nested.
        forwarded: bool,
    },
    /// A sub-task of a task running here (the `delegate` tool): it acts for whoever started
    /// its parent.
    Subtask,
    /// A firing of a schedule: it acts for the schedule's creator. `written_here` when this node
    /// wrote the schedule (a client called its `Cron.Add`); otherwise the schedule came from
    /// another node, and so does the task.
    Schedule {
        /// Whether this node wrote the schedule's record.
        written_here: bool,
    },
    /// A caller of the front door's `/mcp` tools: no certificate, only an API key (or nothing,
    /// on an open door), so it is capped by `security.mcp_max_tier` whatever it asks for.
    FrontDoor,
}

/// What a node lets each kind of caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierPolicy {
    /// `security.remote_max_tier`: anything not started by this node's operators.
    pub remote_max_tier: Tier,
    /// `security.client_max_tier`: an operator's client certificate.
    pub client_max_tier: Tier,
    /// `security.mcp_max_tier`: a caller of the front door's `/mcp` tools.
    pub mcp_max_tier: Tier,
}

impl TierPolicy {
    /// The highest tier a task that reached this node as `caller`, started by `starter` (its
    /// lineage's claim), may run at; `None` when nothing caps it. Every rule only lowers: a
    /// claim can never raise what the way in allows, and a task that came through another node
    /// never gets more than `remote_max_tier`, whoever it says started it.
    pub fn cap(&self, caller: &Caller, starter: Option<&Principal>) -> Option<Tier> {
        self.cap_by(caller, starter).map(|(tier, _)| tier)
    }

    /// [`TierPolicy::cap`], with the setting that made it (`security.remote_max_tier`,
    /// `security.client_max_tier` or `security.mcp_max_tier`), for the error a refused caller
    /// sees.
    pub fn cap_by(
        &self,
        caller: &Caller,
        starter: Option<&Principal>,
    ) -> Option<(Tier, &'static str)> {
        const REMOTE: &str = "security.remote_max_tier";
        const CLIENT: &str = "security.client_max_tier";
        const MCP: &str = "security.mcp_max_tier";
        let (remote, client) = (
            (self.remote_max_tier, REMOTE),
            (self.client_max_tier, CLIENT),
        );
        let mut cap: Option<(Tier, &'static str)> = None;
        let mut lower = |limit: (Tier, &'static str)| {
            if cap.is_none_or(|(tier, _)| limit.0 < tier) {
                cap = Some(limit);
            }
        };
        let by_role = |role: Option<CertRole>, lower: &mut dyn FnMut((Tier, &'static str))| {
            match role {
                Some(CertRole::Client) => lower(client),
                Some(CertRole::Node) => lower(remote),
                // A legacy certificate is trusted least: both caps.
                None => {
                    lower(remote);
                    lower(client);
                }
            }
        };
        match caller {
            Caller::Certificate(principal) => by_role(principal.role, &mut lower),
            Caller::Unauthenticated { forwarded: true } => lower(remote),
            Caller::Unauthenticated { forwarded: false } | Caller::Subtask => {}
            Caller::FrontDoor => lower((self.mcp_max_tier, MCP)),
            Caller::Schedule { written_here } => {
                if !written_here {
                    lower(remote);
                }
                // A schedule stored without its creator (written before creators were kept)
                // is trusted least.
                if starter.is_none() {
                    by_role(None, &mut lower);
                }
            }
        }
        if let Some(starter) = starter {
            by_role(starter.role, &mut lower);
        }
        cap
    }
}

/// Why a task or a chat may not run, or cannot run anywhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// It went through too many forwards or sub-task levels.
    #[error(
        "hop limit: this task has been forwarded or nested {hops} times (at most {MAX_HOPS}); a delegation loop?"
    )]
    HopLimit {
        /// Hops so far.
        hops: u32,
    },
    /// It asks this node for more than it allows its caller.
    #[error(
        "this node runs tasks from this caller up to tier `{cap}` ({setting}), and this one needs `{asked}`{}",
        raise_with(setting, *asked)
    )]
    TierCap {
        /// What this node allows.
        cap: Tier,
        /// What the task asks for.
        asked: Tier,
        /// The setting that says so.
        setting: &'static str,
    },
    /// No node can run it; the message names every node and why.
    #[error("{0}")]
    Nowhere(String),
    /// A chat for a model or role that no node of the mesh serves.
    #[error("the model `{0}` does not exist on any node of the mesh; GET /v1/models lists them")]
    UnknownModel(String),
    /// A task asks for an evaluation (`--evaluate ROLE`) that no node of the mesh can run.
    #[error("evaluate.role: no node of the mesh can run the evaluator role `{role}`: {why}")]
    NoEvaluator {
        /// The evaluator's role.
        role: String,
        /// Why each node is excluded.
        why: String,
    },
    /// Embeddings with a model that exists but makes none on any node.
    #[error(
        "model `{0}` does not support embeddings on any node of the mesh; GET /v1/models lists the models whose capabilities include `embeddings`"
    )]
    CannotEmbed(String),
    /// This node is draining: it takes no new task from another node, and no chat (the node
    /// that sent it tries its next candidate).
    #[error(
        "{node} is draining: it takes no new tasks or chats (`mesh-cli undrain {node}` returns it to service)"
    )]
    Draining {
        /// This node's name.
        node: String,
    },
}

/// How an operator raises the cap `setting` to `tier`, when a command can.
fn raise_with(setting: &str, tier: Tier) -> String {
    if setting.starts_with("security.") {
        format!(
            "; an operator of this node can allow it with `mesh-cli config set {setting} {tier}`"
        )
    } else {
        String::new()
    }
}

/// What only an operator of a node may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Change its runtime settings (`Settings.Set`) or the fleet's front-door keys (`Keys`).
    Settings,
    /// Drain it or end a drain (`Node.Drain`, `Node.Undrain`).
    Drain,
}

impl Operation {
    /// What doing it needs, in words.
    fn needs(self) -> &'static str {
        match self {
            Self::Settings => {
                "changing a node's runtime settings and the fleet's front-door keys is for the mesh's operators: the mesh-cli certificate of the node's own machine (the one a zero-config node made in its data dir, or the one `mesh-cli join` wrote for the user it runs as), or a client certificate the node lets run `shell` tasks (security.client_max_tier = \"shell\", which an operator sets with `mesh-cli config set security.client_max_tier shell`)"
            }
            Self::Drain => {
                "drain needs a client certificate the node allows the `shell` tier (security.client_max_tier = \"shell\", which an operator sets with `mesh-cli config set security.client_max_tier shell`), or the mesh-cli certificate of the node's own machine"
            }
        }
    }
}

/// Why a certificate may not do an [`Operation`] on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}; {why}", operation.needs())]
pub struct OperatorError {
    operation: Operation,
    why: String,
}

/// Why a certificate may not approve or deny a tool call waiting for approval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApproverError {
    /// Only an operator's client certificate may decide: a node certificate (even a valid
    /// one, lent or stolen) or a legacy one without a role may not.
    #[error(
        "only an operator's client certificate (mesh-cli, `mesh-cli ca issue --role client`) may approve or deny a tool call; this caller presents {0}"
    )]
    NotAClient(String),
    /// The client may not run the call's tier here itself, so it may not let an agent run it.
    #[error("{approver} may not approve a `{tier}` call: {cap}")]
    TierCap {
        /// Who asked, as the certificate reads.
        approver: String,
        /// The call's tier.
        tier: Tier,
        /// The cap that applies (`security.client_max_tier`).
        cap: AdmissionError,
    },
}

/// The door: this node's description, its view of the fleet and its policy.
#[derive(Debug)]
pub struct Admission {
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
    /// `security.client_max_tier` and `security.mcp_max_tier`, which runtime settings change
    /// (`remote_max_tier` is advertised, so it is read from the capabilities).
    tiers: Mutex<(Tier, Tier)>,
    /// The client certificates of this node's own machine (see [`Admission::may_operate`]).
    operators: Operators,
}

/// Where the ids of this node's own machine's client certificates come from: asked at each
/// decision, so a `mesh-cli join` made after the node started counts at once.
struct Operators(Box<dyn Fn() -> Vec<NodeId> + Send + Sync>);

impl std::fmt::Debug for Operators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Operators")
    }
}

impl Admission {
    /// Decides with this node's capabilities, peer table and `security.client_max_tier`;
    /// `/mcp` callers get `read` until [`Admission::with_mcp_max_tier`] says otherwise.
    pub fn new(caps: Arc<Capabilities>, peers: Arc<PeerTable>, client_max_tier: Tier) -> Self {
        Self {
            caps,
            peers,
            tiers: Mutex::new((client_max_tier, Tier::Read)),
            operators: Operators(Box::new(Vec::new)),
        }
    }

    /// The same door with `security.mcp_max_tier`.
    pub fn with_mcp_max_tier(self, mcp_max_tier: Tier) -> Self {
        self.tiers.lock_unpoisoned().1 = mcp_max_tier;
        self
    }

    /// The same door with `operators`, which says the ids of this node's own machine's client
    /// certificates each time it is asked (they are files a person may add while it runs).
    pub fn with_operators(
        self,
        operators: impl Fn() -> Vec<NodeId> + Send + Sync + 'static,
    ) -> Self {
        Self {
            operators: Operators(Box::new(operators)),
            ..self
        }
    }

    /// Changes `security.client_max_tier` and `security.mcp_max_tier` (a runtime setting).
    pub fn set_tiers(&self, client_max_tier: Tier, mcp_max_tier: Tier) {
        *self.tiers.lock_unpoisoned() = (client_max_tier, mcp_max_tier);
    }

    /// This node's policy.
    pub fn policy(&self) -> TierPolicy {
        let (client_max_tier, mcp_max_tier) = *self.tiers.lock_unpoisoned();
        TierPolicy {
            remote_max_tier: self.caps.remote_max_tier(),
            client_max_tier,
            mcp_max_tier,
        }
    }

    /// Whether `who` may do `operation` here (change this node's runtime settings and the
    /// fleet's front-door keys, drain it): an operator. That is a client certificate of this
    /// node's own machine (whoever holds its key is the user the node runs as, who owns the
    /// node's data dir and config anyway), or one this node lets run `shell` tasks (which could
    /// change anything here through a task). The one decision about operators: `rpc::keys`,
    /// `rpc::settings` and `rpc::drain` ask it.
    pub fn may_operate(&self, who: &Principal, operation: Operation) -> Result<(), OperatorError> {
        let refuse = |why: String| OperatorError { operation, why };
        if who.role != Some(CertRole::Client) {
            return Err(refuse(format!(
                "this caller presents {who}, which is not a client certificate"
            )));
        }
        if (self.operators.0)().contains(&who.id) {
            return Ok(());
        }
        self.allows(Tier::Shell, &Caller::Certificate(who.clone()), None)
            .map_err(|_| {
                let (client, _) = *self.tiers.lock_unpoisoned();
                refuse(format!(
                    "{who} is neither: it is not of this node's machine, and this node lets client certificates run up to `{client}` (security.client_max_tier)"
                ))
            })
    }

    /// Whether a task at `tier` that reached this node as `caller`, started by `starter`, may
    /// run here at all (the tier cap alone).
    pub fn allows(
        &self,
        tier: Tier,
        caller: &Caller,
        starter: Option<&Principal>,
    ) -> Result<(), AdmissionError> {
        match self.policy().cap_by(caller, starter) {
            Some((cap, setting)) if tier > cap => Err(AdmissionError::TierCap {
                cap,
                asked: tier,
                setting,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `approver` may approve or deny a tool call of `tier` waiting for approval on
    /// this node: only a client certificate, and only one this node would let run a task of
    /// that tier itself (an approver who could not run the tool may not let an agent run it).
    /// The one decision about approvers: the node answering `Approvals.Decide` asks it, and so
    /// does the node running the task before it acts on a decision.
    pub fn may_approve(&self, approver: &Principal, tier: Tier) -> Result<(), ApproverError> {
        if approver.role != Some(CertRole::Client) {
            return Err(ApproverError::NotAClient(approver.to_string()));
        }
        self.allows(tier, &Caller::Certificate(approver.clone()), None)
            .map_err(|cap| ApproverError::TierCap {
                approver: approver.to_string(),
                tier,
                cap,
            })
    }

    /// Whether a call of an MCP tool of tier `tool` hosted here, made by a task at tier `task`
    /// that reached this node as `caller` (`Tools.Call`), started by `starter`, may run: the
    /// same caps as a task at the tool's tier, and never above the calling task's own tier.
    pub fn allows_tool_call(
        &self,
        tool: Tier,
        task: Tier,
        caller: &Caller,
        starter: Option<&Principal>,
    ) -> Result<(), AdmissionError> {
        self.allows(tool, caller, starter)?;
        if tool > task {
            return Err(AdmissionError::TierCap {
                cap: task,
                asked: tool,
                setting: "the calling task's tier",
            });
        }
        Ok(())
    }

    /// Every node ranked for a task, handed to `read` (what `--explain` shows).
    pub fn rank<R>(
        &self,
        target: &Target,
        tier: Tier,
        require: &Requirements,
        read: impl FnOnce(&[Ranked<'_>]) -> R,
    ) -> R {
        let (own, peers) = (self.caps.snapshot(), self.peers.snapshot());
        read(&router::rank_fleet(&own, &peers, target, tier, require))
    }

    /// Whether `spec`, arriving as `caller`, may run, and where. It also records in the lineage
    /// who started the task: a client (or legacy) certificate calling directly is the starter
    /// whatever the request claims; a node's claim is kept (it can only lower the tier), else
    /// the node is the starter.
    pub fn admit(&self, spec: &mut TaskSpec, caller: &Caller) -> Result<Placement, AdmissionError> {
        if spec.lineage.hops > MAX_HOPS {
            return Err(AdmissionError::HopLimit {
                hops: spec.lineage.hops,
            });
        }
        if let Caller::Certificate(principal) = caller
            && (principal.role != Some(CertRole::Node) || spec.lineage.started_by.is_none())
        {
            spec.lineage.started_by = Some(principal.clone());
        }
        self.allows(spec.tier, caller, spec.lineage.started_by.as_ref())?;
        if let Some(evaluation) = &spec.evaluate {
            // Refused now rather than after a first attempt whose answer no one can score.
            let role = Target::Role(evaluation.role.clone());
            self.rank(&role, Tier::Read, &Requirements::default(), |ranked| {
                router::choose(ranked, false).map(|_| ())
            })
            .map_err(|why| AdmissionError::NoEvaluator {
                role: evaluation.role.clone(),
                why,
            })?;
        }
        let forwarded =
            !matches!(caller, Caller::Schedule { .. }) && spec.lineage.task_id.is_some();
        if forwarded {
            // Passed on from here it would keep this node in its way; refused, it goes to the
            // sender's next candidate.
            self.takes_new_work()?;
        }
        let choice = self.rank(&spec.target, spec.tier, &spec.require, |ranked| {
            router::choose(ranked, forwarded)
        });
        record("task", &choice);
        choice.map_err(AdmissionError::Nowhere)
    }

    /// Whether this node takes new work from elsewhere: not while it drains.
    pub fn takes_new_work(&self) -> Result<(), AdmissionError> {
        if self.caps.draining() {
            return Err(AdmissionError::Draining {
                node: self.caps.name().to_owned(),
            });
        }
        Ok(())
    }

    /// Where a task queued here may go instead while this node drains, as if it were submitted
    /// again: the best nodes that can run it but this one and those in `exclude` (the node it
    /// came from, which holds it under the same id). `Nowhere` when no other node can.
    pub fn place_elsewhere(
        &self,
        spec: &TaskSpec,
        exclude: &[&str],
    ) -> Result<Vec<Destination>, AdmissionError> {
        let choice = self.rank(&spec.target, spec.tier, &spec.require, |ranked| {
            let others: Vec<Ranked<'_>> = ranked
                .iter()
                .filter(|r| !r.local && !exclude.contains(&r.node))
                .cloned()
                .collect();
            router::choose(&others, false)
        });
        record("task", &choice);
        match choice {
            Ok(Placement::Remote(candidates)) => Ok(candidates),
            Ok(Placement::Local) => Err(AdmissionError::Nowhere(
                "only this node can run the task".into(),
            )),
            Err(why) => Err(AdmissionError::Nowhere(why)),
        }
    }

    /// Where a chat for `target` may run (read tier, no requirements): here or on the best peers.
    pub fn place_chat(&self, target: &Target) -> Result<Placement, AdmissionError> {
        let own = self.caps.snapshot();
        let peers = self.peers.snapshot();
        let ranked = router::rank_fleet(&own, &peers, target, Tier::Read, &Requirements::default());
        let choice = router::choose(&ranked, false);
        record("chat", &choice);
        choice.map_err(|why| {
            let known = std::iter::once(&own)
                .chain(peers.iter().map(|p| &p.info))
                .any(|info| match target {
                    Target::Model(m) => info.models.iter().any(|x| x.name == *m),
                    Target::Role(r) => info.role_chains.get(r).is_some_and(|ch| !ch.is_empty()),
                    Target::Persona(_) => false,
                });
            if known {
                AdmissionError::Nowhere(why)
            } else {
                AdmissionError::UnknownModel(target.model_id())
            }
        })
    }
}

impl Admission {
    /// Where embeddings with `model` may run (read tier, no requirements): here or on the best
    /// peers whose `model` makes embeddings. A model no node has is `UnknownModel`, as for
    /// chats; one that only chats is `CannotEmbed`, naming it.
    pub fn place_embed(&self, model: &str) -> Result<Placement, AdmissionError> {
        let own = self.caps.snapshot();
        let peers = self.peers.snapshot();
        let ranked = router::rank_embedders(&own, &peers, model);
        if ranked.is_empty() {
            let exists = std::iter::once(&own)
                .chain(peers.iter().map(|p| &p.info))
                .any(|info| info.models.iter().any(|m| m.name == model));
            record("embed", &Err(String::new()));
            return Err(if exists {
                AdmissionError::CannotEmbed(model.to_owned())
            } else {
                AdmissionError::UnknownModel(model.to_owned())
            });
        }
        let choice = router::choose(&ranked, false);
        record("embed", &choice);
        choice.map_err(AdmissionError::Nowhere)
    }
}

/// Counts a placement decision (`kind`: `task`, `chat` or `embed`) in the metrics.
fn record(kind: &str, choice: &Result<Placement, String>) {
    metrics().routed(
        kind,
        match choice {
            Ok(Placement::Local) => "local",
            Ok(Placement::Remote(_)) => "remote",
            Err(_) => "nowhere",
        },
    );
}

#[cfg(test)]
mod tests {
    use mesh_domain::NodeId;

    use super::*;

    fn principal(role: Option<CertRole>) -> Principal {
        Principal {
            id: NodeId::from_spki_der(b"someone"),
            name: "someone".into(),
            role,
        }
    }

    /// A node whose config has `name` (an openai model, embedding or not), for placements.
    fn admission_with(models: &str) -> Admission {
        let config = crate::config::RawConfig::parse(
            &format!("[node]\nname = \"me\"\n{models}"),
            std::path::Path::new("test.toml"),
        )
        .and_then(|raw| raw.validate(None, &Default::default()))
        .expect("valid config");
        Admission::new(
            Arc::new(Capabilities::new(
                &config,
                NodeId::from_spki_der(b"me"),
                String::new(),
                Vec::new(),
            )),
            Arc::default(),
            Tier::Write,
        )
    }

    #[test]
    fn embeddings_go_only_to_a_model_that_makes_them_and_a_chat_model_is_named() {
        let openai = |name: &str, embeds: bool| {
            format!(
                "[[models]]\nname = \"{name}\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\nembeddings = {embeds}\n"
            )
        };
        let admission = admission_with(&(openai("chatty", false) + &openai("embedder", true)));
        assert_eq!(admission.place_embed("embedder"), Ok(Placement::Local));
        let error = admission
            .place_embed("chatty")
            .expect_err("a chat-only model");
        assert_eq!(error, AdmissionError::CannotEmbed("chatty".into()));
        assert!(
            error
                .to_string()
                .starts_with("model `chatty` does not support embeddings"),
            "{error}"
        );
        assert_eq!(
            admission.place_embed("nothing"),
            Err(AdmissionError::UnknownModel("nothing".into()))
        );
        // Chats still go to the chat-only model.
        assert_eq!(
            admission.place_chat(&Target::Model("chatty".into())),
            Ok(Placement::Local)
        );
    }

    /// Issue 30, item 5: a draining node refuses a task another node sends (`Draining`, which
    /// the sender takes as "try the next"), and its own callers' tasks and chats find no place
    /// here, the router saying why.
    #[test]
    fn a_draining_node_takes_nothing_new() {
        let admission = admission_with(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n[roles]\nchat = [\"m\"]\n",
        );
        let chat = Target::Role("chat".into());
        let sent = || {
            let mut spec = TaskSpec::new("hi", chat.clone());
            spec.lineage.task_id = Some("t".into());
            spec.lineage.origin = "laptop".into();
            spec.lineage.hops = 1;
            spec
        };
        let node = Caller::Certificate(principal(Some(CertRole::Node)));
        let client = Caller::Certificate(principal(Some(CertRole::Client)));
        assert_eq!(admission.admit(&mut sent(), &node), Ok(Placement::Local));

        admission.caps.set_draining(true);
        let refused = admission
            .admit(&mut sent(), &node)
            .expect_err("a draining node takes no task from elsewhere");
        assert_eq!(refused, AdmissionError::Draining { node: "me".into() });
        assert!(
            refused.to_string().contains("`mesh-cli undrain me`"),
            "{refused}"
        );
        assert_eq!(admission.takes_new_work(), Err(refused));
        let nowhere = |result: Result<Placement, AdmissionError>| match result {
            Err(AdmissionError::Nowhere(why)) => why,
            other => panic!("placed: {other:?}"),
        };
        let own = nowhere(admission.admit(&mut TaskSpec::new("hi", chat.clone()), &client));
        assert!(own.contains("me (this node): draining"), "{own}");
        let chats = nowhere(admission.place_chat(&chat));
        assert!(chats.contains("draining"), "{chats}");

        admission.caps.set_draining(false);
        assert_eq!(admission.admit(&mut sent(), &node), Ok(Placement::Local));
        assert_eq!(admission.place_chat(&chat), Ok(Placement::Local));
    }

    /// Draining needs an operator, as the settings do, and the refusal says what it needs.
    #[test]
    fn only_an_operator_may_drain_and_the_refusal_says_what_is_needed() {
        // `admission_with` leaves `security.client_max_tier` at `write`.
        let admission = admission_with("");
        let error = admission
            .may_operate(&principal(Some(CertRole::Client)), Operation::Drain)
            .expect_err("a client allowed `write` only");
        let text = error.to_string();
        assert!(
            text.starts_with("drain needs a client certificate the node allows the `shell` tier"),
            "{text}"
        );
        assert!(
            text.contains("lets client certificates run up to `write`"),
            "{text}"
        );
        for role in [Some(CertRole::Node), None] {
            let text = admission
                .may_operate(&principal(role), Operation::Drain)
                .expect_err("not a client")
                .to_string();
            assert!(text.contains("not a client certificate"), "{text}");
        }
        admission.set_tiers(Tier::Shell, Tier::Read);
        assert_eq!(
            admission.may_operate(&principal(Some(CertRole::Client)), Operation::Drain),
            Ok(())
        );
    }

    #[test]
    fn only_a_client_allowed_the_calls_tier_may_approve_it() {
        // `admission_with` leaves `security.client_max_tier` at `write`.
        let admission = admission_with("");
        let client = principal(Some(CertRole::Client));
        assert_eq!(admission.may_approve(&client, Tier::Write), Ok(()));
        let error = admission
            .may_approve(&client, Tier::Shell)
            .expect_err("above the client's tier");
        assert!(
            matches!(
                error,
                ApproverError::TierCap {
                    tier: Tier::Shell,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("security.client_max_tier"),
            "{error}"
        );
        for role in [Some(CertRole::Node), None] {
            let error = admission
                .may_approve(&principal(role), Tier::Read)
                .expect_err("not a client");
            assert!(matches!(error, ApproverError::NotAClient(_)), "{error:?}");
            assert!(error.to_string().contains("client certificate"), "{error}");
        }
    }

    #[test]
    fn a_tool_call_from_elsewhere_is_capped_like_a_task_and_by_the_calling_tasks_tier() {
        // `remote_max_tier` read (the default), `client_max_tier` write.
        let admission = admission_with("");
        let node = Caller::Certificate(principal(Some(CertRole::Node)));
        let client = Caller::Certificate(principal(Some(CertRole::Client)));
        let reader = Some(principal(Some(CertRole::Node)));
        use Tier::{Read, Shell, Write};
        assert_eq!(admission.allows_tool_call(Read, Read, &node, None), Ok(()));
        let refused = admission
            .allows_tool_call(Write, Shell, &node, None)
            .expect_err("a node's task may not run a write tool here");
        assert_eq!(
            refused,
            AdmissionError::TierCap {
                cap: Read,
                asked: Write,
                setting: "security.remote_max_tier"
            }
        );
        assert_eq!(
            admission.allows_tool_call(Write, Write, &client, None),
            Ok(())
        );
        // The calling task's tier and its starter only lower what the caller may do.
        assert!(matches!(
            admission.allows_tool_call(Write, Read, &client, None),
            Err(AdmissionError::TierCap {
                setting: "the calling task's tier",
                ..
            })
        ));
        assert!(
            admission
                .allows_tool_call(Write, Write, &client, reader.as_ref())
                .is_err()
        );
        assert!(
            admission
                .allows_tool_call(Shell, Shell, &client, None)
                .is_err()
        );
    }

    #[test]
    fn every_way_in_is_capped_by_who_started_the_task_and_how_it_came() {
        let client = Some(principal(Some(CertRole::Client)));
        let node = Some(principal(Some(CertRole::Node)));
        let legacy = Some(principal(None));
        let cert = |p: &Option<Principal>| Caller::Certificate(p.clone().expect("principal"));
        let here = Caller::Schedule { written_here: true };
        let elsewhere = Caller::Schedule {
            written_here: false,
        };
        use Tier::{Read, Shell, Write};
        /// remote_max_tier, client_max_tier, way in, starter, cap.
        type Case<'a> = (Tier, Tier, Caller, &'a Option<Principal>, Option<Tier>);
        let cases: Vec<Case<'_>> = vec![
            (Read, Write, cert(&client), &None, Some(Write)),
            (Read, Write, cert(&node), &None, Some(Read)),
            (Read, Write, cert(&legacy), &None, Some(Read)),
            (Shell, Write, cert(&legacy), &None, Some(Write)),
            // A node's claim that a client started it can only lower its cap.
            (Shell, Write, cert(&node), &client, Some(Write)),
            (Read, Shell, cert(&node), &client, Some(Read)),
            (Read, Write, Caller::Subtask, &client, Some(Write)),
            (Read, Write, Caller::Subtask, &node, Some(Read)),
            (Read, Write, Caller::Subtask, &None, None),
            (Read, Write, here.clone(), &client, Some(Write)),
            (Read, Shell, here.clone(), &client, Some(Shell)),
            (Read, Shell, elsewhere.clone(), &client, Some(Read)),
            (Shell, Write, elsewhere, &client, Some(Write)),
            (Read, Write, here.clone(), &node, Some(Read)),
            // A schedule kept without its creator is trusted least.
            (Shell, Write, here, &None, Some(Write)),
            (
                Read,
                Write,
                Caller::Unauthenticated { forwarded: true },
                &None,
                Some(Read),
            ),
            (
                Read,
                Write,
                Caller::Unauthenticated { forwarded: false },
                &None,
                None,
            ),
            // An `/mcp` caller gets `security.mcp_max_tier` (`read` here), whatever the other
            // caps say.
            (Shell, Shell, Caller::FrontDoor, &None, Some(Read)),
        ];
        for (remote, client_max, caller, starter, expected) in cases {
            let policy = TierPolicy {
                remote_max_tier: remote,
                client_max_tier: client_max,
                mcp_max_tier: Read,
            };
            assert_eq!(
                policy.cap(&caller, starter.as_ref()),
                expected,
                "remote {remote}, client {client_max}, {caller:?}, started by {starter:?}"
            );
        }
    }
}
