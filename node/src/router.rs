//! Routing: which node should run a task. A pure function of the task's requirements and a
//! snapshot of the fleet, with no I/O, so it is tested table-driven and benchmarked directly.
//!
//! Hard filters, in order (the first that fails is the reason a node is excluded): the node is
//! up; it is not draining (`mesh-cli drain`: reason `draining`, this node's own flag included);
//! it is the node asked for (`on`: its name, else its id or a prefix of at least 12 hex
//! digits that no other node's id starts with, [`requested`]); it serves the role, model or
//! persona; it has a GPU and
//! enough VRAM when required; it carries the required labels; it accepts the task's tier (for
//! remote nodes, their `security.remote_max_tier`); its queue is not full.
//!
//! Ranking of the eligible, best first: lower load (running + queued per worker), then more
//! VRAM (free where known), then a faster model (the measured tokens/s of the model that would
//! serve the task there), then lower round-trip time; the local node wins when everything else
//! is equal. The score shown by
//! `--explain` is that order folded into one number.

use mesh_domain::{NodeId, NodeInfo, PeerState, Requirements, Target, Tier};

use crate::peers::Peer;

/// One node as the router sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Its latest info.
    pub info: &'a NodeInfo,
    /// Its liveness (the local node is always up).
    pub state: PeerState,
    /// Whether it is this node.
    pub local: bool,
    /// Round-trip time, when measured.
    pub rtt_ms: Option<f64>,
    /// `host:port` it is reached at (empty for this node).
    pub addr: &'a str,
}

/// The router's verdict on one node, borrowing the candidate's name, id and address (ranking
/// runs for every task, so it allocates nothing per node but the reasons).
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked<'a> {
    /// Node name.
    pub node: &'a str,
    /// Node id.
    pub id: &'a NodeId,
    /// Whether it is this node.
    pub local: bool,
    /// `host:port` it is reached at (empty for this node).
    pub addr: &'a str,
    /// `Ok(score)` when eligible (higher is better), `Err(reason)` when excluded.
    pub verdict: Result<f64, String>,
}

/// Why a draining node is excluded (`mesh-cli drain`), exactly as `--explain` shows it.
pub(crate) const DRAINING: &str = "draining";

/// Which node a task's `on` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requested<'a> {
    /// The node(s) of this name (a name is held by one live node, but a node that is down may
    /// still be listed under it).
    Name(&'a str),
    /// The node of this id (given whole, or as a prefix only its id starts with).
    Id(&'a NodeId),
    /// A prefix several nodes' ids start with.
    Ambiguous {
        prefix: &'a str,
        /// How many ids start with it.
        count: usize,
    },
    /// No node of that name, id or id prefix.
    Nobody(&'a str),
}

/// Shortest id prefix `on` may give: the short id `mesh-cli status` shows. A shorter one would be
/// easy to make a key for (a node that is away, named `cafe`, must not be reachable as `--on
/// cafe` by whoever made a key whose id starts with `cafe`).
pub(crate) const MIN_ID_PREFIX: usize = NodeId::SHORT_LEN;

/// What `on` names among `candidates`: a name first (names are what users type), else a whole
/// id, else an id prefix of at least [`MIN_ID_PREFIX`] hex digits.
pub(crate) fn requested<'a>(on: &'a str, candidates: &[Candidate<'a>]) -> Requested<'a> {
    if candidates.iter().any(|c| c.info.name == on) {
        return Requested::Name(on);
    }
    let hex = on.len() >= MIN_ID_PREFIX
        && on
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Requested::Nobody(on);
    }
    let mut ids = candidates
        .iter()
        .map(|c| &c.info.id)
        .filter(|id| id.as_str().starts_with(on));
    let Some(first) = ids.next() else {
        return Requested::Nobody(on);
    };
    // The same id twice is one node (it cannot be listed twice); several ids are ambiguous.
    let others = ids.filter(|id| *id != first).count();
    if others == 0 {
        Requested::Id(first)
    } else {
        Requested::Ambiguous {
            prefix: on,
            count: others + 1,
        }
    }
}

impl Requested<'_> {
    /// Why `info` is not the node asked for, or `None` when it is.
    fn excludes(&self, info: &NodeInfo) -> Option<String> {
        match self {
            Self::Name(name) if info.name == *name => None,
            Self::Id(id) if info.id == **id => None,
            Self::Name(on) | Self::Nobody(on) => Some(format!("not the requested node `{on}`")),
            Self::Id(id) => Some(format!("not the requested node `{}`", id.short())),
            Self::Ambiguous { prefix, count } => Some(format!(
                "`{prefix}` starts the ids of {count} nodes; give more of the id"
            )),
        }
    }
}

/// Ranks `candidates` for a task: eligible ones best first, then the excluded ones by name.
pub fn rank<'a>(
    target: &Target,
    tier: Tier,
    require: &Requirements,
    candidates: &[Candidate<'a>],
) -> Vec<Ranked<'a>> {
    let on = require.on.as_deref().map(|on| requested(on, candidates));
    let mut ranked: Vec<(Ranked<'a>, Key)> = candidates
        .iter()
        .map(|c| {
            let verdict = exclusion(target, tier, on.as_ref(), require, c);
            let key = Key::of(c, target);
            let ranked = Ranked {
                node: &c.info.name,
                id: &c.info.id,
                local: c.local,
                addr: c.addr,
                verdict: match verdict {
                    Some(reason) => Err(reason),
                    None => Ok(key.score()),
                },
            };
            (ranked, key)
        })
        .collect();
    ranked.sort_by(|(a, ka), (b, kb)| match (&a.verdict, &b.verdict) {
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.node.cmp(b.node),
        (Ok(_), Ok(_)) => ka.cmp(kb).then_with(|| a.node.cmp(b.node)),
    });
    ranked.into_iter().map(|(r, _)| r).collect()
}

/// Ranks this node (`own`, always up) and its `peers`: what task routing and the front door
/// both ask.
pub(crate) fn rank_fleet<'a>(
    own: &'a NodeInfo,
    peers: &'a [Peer],
    target: &Target,
    tier: Tier,
    require: &Requirements,
) -> Vec<Ranked<'a>> {
    rank(
        target,
        tier,
        require,
        &fleet(own, peers).collect::<Vec<_>>(),
    )
}

/// Ranks, for embeddings with `model` (read tier, no requirements), only the nodes whose
/// `model` makes embeddings: a node that has the model for chats only is no candidate at all,
/// so an embedding never lands there. Empty when no node's `model` embeds.
pub(crate) fn rank_embedders<'a>(
    own: &'a NodeInfo,
    peers: &'a [Peer],
    model: &str,
) -> Vec<Ranked<'a>> {
    let embedders: Vec<_> = fleet(own, peers)
        .filter(|c| c.info.models.iter().any(|m| m.name == model && m.embeds))
        .collect();
    if embedders.is_empty() {
        return Vec::new();
    }
    rank(
        &Target::Model(model.to_owned()),
        Tier::Read,
        &Requirements::default(),
        &embedders,
    )
}

/// This node (always up) and its peers, as candidates.
fn fleet<'a>(own: &'a NodeInfo, peers: &'a [Peer]) -> impl Iterator<Item = Candidate<'a>> {
    std::iter::once(Candidate {
        info: own,
        state: PeerState::Up,
        local: true,
        rtt_ms: None,
        addr: "",
    })
    .chain(peers.iter().map(|p| Candidate {
        info: &p.info,
        state: p.state,
        local: false,
        rtt_ms: p.rtt_ms,
        addr: &p.addr,
    }))
}

/// Why `c` cannot run the task, or `None` when it can.
fn exclusion(
    target: &Target,
    tier: Tier,
    on: Option<&Requested<'_>>,
    require: &Requirements,
    c: &Candidate<'_>,
) -> Option<String> {
    let info = c.info;
    if c.state != PeerState::Up {
        return Some(c.state.as_str().to_owned());
    }
    if info.draining {
        return Some(DRAINING.to_owned());
    }
    if let Some(why) = on.and_then(|on| on.excludes(info)) {
        return Some(why);
    }
    match target {
        Target::Role(role) => {
            if info.role_chains.get(role).is_none_or(Vec::is_empty) {
                return Some(format!("serves no model for role `{role}`"));
            }
        }
        Target::Model(model) => {
            if !info.models.iter().any(|m| m.name == *model) {
                return Some(format!("has no model `{model}`"));
            }
        }
        Target::Persona(persona) => {
            if !info.personas.iter().any(|p| p.name == *persona) {
                return Some(format!("has no persona `{persona}`"));
            }
        }
    }
    let gpus = &info.resources.gpus;
    if require.gpu && gpus.is_empty() {
        return Some("has no GPU".into());
    }
    if let Some(min) = require.min_vram_mb {
        let best = gpus
            .iter()
            .map(|g| g.vram_free_mb.unwrap_or(g.vram_mb))
            .max()
            .unwrap_or(0);
        if best < min {
            return Some(format!("has {best} MiB of VRAM, needs {min}"));
        }
    }
    for (key, value) in &require.labels {
        if info.labels.get(key) != Some(value) {
            return Some(format!("lacks label {key}={value}"));
        }
    }
    if !c.local && tier > info.remote_max_tier {
        return Some(format!(
            "accepts remote tasks up to tier `{}`, this one asks for `{tier}`",
            info.remote_max_tier
        ));
    }
    if info.load.queue_capacity > 0 && info.load.queued >= info.load.queue_capacity {
        return Some(format!("queue full ({} waiting)", info.load.queued));
    }
    None
}

/// The ranking order as a sortable key (smaller is better).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key {
    load: f64,
    vram_mb: u64,
    tokens_per_s: f64,
    rtt_ms: f64,
    local: bool,
}

/// The measured decode speed (tokens/s) of the model that would serve `target` on the node
/// `info` describes: the primary of the role's chain (the persona's role's chain), or the named
/// model; 0 when not measured or not served.
fn target_speed(info: &NodeInfo, target: &Target) -> f64 {
    let model = match target {
        Target::Role(role) => info.role_chains.get(role).and_then(|chain| chain.first()),
        Target::Model(model) => Some(model),
        Target::Persona(persona) => info
            .personas
            .iter()
            .find(|p| p.name == *persona)
            .and_then(|p| info.role_chains.get(&p.role))
            .and_then(|chain| chain.first()),
    };
    model
        .and_then(|name| info.models.iter().find(|m| m.name == *name))
        .map_or(0.0, |m| m.tokens_per_s)
}

impl Key {
    fn of(c: &Candidate<'_>, target: &Target) -> Self {
        let load = c.info.load;
        let workers = f64::from(load.workers.max(1));
        Self {
            load: f64::from(load.running + load.queued) / workers,
            vram_mb: c
                .info
                .resources
                .gpus
                .iter()
                .map(|g| g.vram_free_mb.unwrap_or(g.vram_mb))
                .sum(),
            tokens_per_s: target_speed(c.info, target),
            rtt_ms: c.rtt_ms.unwrap_or(0.0),
            local: c.local,
        }
    }

    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.load
            .total_cmp(&other.load)
            .then(other.vram_mb.cmp(&self.vram_mb))
            .then(other.tokens_per_s.total_cmp(&self.tokens_per_s))
            .then(self.rtt_ms.total_cmp(&other.rtt_ms))
            .then(other.local.cmp(&self.local))
    }

    /// A display score that orders like `cmp` for realistic values (higher is better).
    fn score(&self) -> f64 {
        let vram_gib = self.vram_mb as f64 / 1024.0;
        1000.0 - 100.0 * self.load + vram_gib.min(99.0) + self.tokens_per_s.min(999.0) / 1000.0
            - self.rtt_ms.min(999.0) / 10_000.0
            + if self.local { 0.00001 } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use mesh_domain::{Gpu, Health, Load, ModelInfo, PersonaInfo, Resources};

    fn node(name: &str, roles: &[&str], gpus: &[u64], load: (u32, u32)) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            id: NodeId::from_spki_der(name.as_bytes()),
            version: "0".into(),
            protocol: 1,
            addrs: vec![],
            roles: roles.iter().map(|r| (*r).into()).collect(),
            labels: BTreeMap::new(),
            personas: vec![PersonaInfo {
                name: "reviewer".into(),
                role: "coder".into(),
            }],
            models: vec![ModelInfo {
                name: "m".into(),
                backend: "openai".into(),
                model: "m".into(),
                base_url: String::new(),
                tokens_per_s: 0.0,
                embeds: false,
            }],
            role_chains: roles
                .iter()
                .map(|r| ((*r).into(), vec!["m".into()]))
                .collect(),
            resources: Resources {
                gpus: gpus
                    .iter()
                    .map(|v| Gpu {
                        name: "gpu".into(),
                        vram_mb: *v,
                        vram_free_mb: None,
                        source: "declared".into(),
                    })
                    .collect(),
                ..Resources::default()
            },
            load: Load {
                running: load.0,
                queued: load.1,
                workers: 2,
                queue_capacity: 4,
            },
            health: Health::default(),
            cert_fingerprint: String::new(),
            started_at_ms: 0,
            remote_max_tier: Tier::Read,
            memory_seq: 0,
            mcp_tools: Default::default(),
            draining: false,
        }
    }

    fn up(info: &NodeInfo, local: bool) -> Candidate<'_> {
        Candidate {
            info,
            state: PeerState::Up,
            local,
            rtt_ms: None,
            addr: if local { "" } else { &info.name },
        }
    }

    fn names<'a>(ranked: &[Ranked<'a>]) -> Vec<&'a str> {
        ranked
            .iter()
            .filter(|r| r.verdict.is_ok())
            .map(|r| r.node)
            .collect()
    }

    fn reason<'a>(ranked: &'a [Ranked<'_>], node: &str) -> &'a str {
        ranked
            .iter()
            .find(|r| r.node == node)
            .and_then(|r| r.verdict.as_ref().err())
            .map(String::as_str)
            .unwrap_or("")
    }

    #[test]
    fn filters_name_the_reason_for_every_excluded_node() {
        let laptop = node("laptop", &[], &[], (0, 0));
        let gpu = node("gpu", &["coder"], &[24576], (0, 0));
        let small = node("small", &["coder"], &[4096], (0, 0));
        let mut full = node("full", &["coder"], &[24576], (2, 4));
        full.labels.insert("site".into(), "home".into());
        let down = node("down", &["coder"], &[24576], (0, 0));
        let candidates = vec![
            up(&laptop, true),
            up(&gpu, false),
            up(&small, false),
            up(&full, false),
            Candidate {
                state: PeerState::Down,
                ..up(&down, false)
            },
        ];
        let require = Requirements {
            gpu: true,
            min_vram_mb: Some(8192),
            ..Requirements::default()
        };
        let ranked = rank(
            &Target::Role("coder".into()),
            Tier::Read,
            &require,
            &candidates,
        );
        assert_eq!(names(&ranked), ["gpu"]);
        assert_eq!(
            reason(&ranked, "laptop"),
            "serves no model for role `coder`"
        );
        assert_eq!(reason(&ranked, "small"), "has 4096 MiB of VRAM, needs 8192");
        assert_eq!(reason(&ranked, "full"), "queue full (4 waiting)");
        assert_eq!(reason(&ranked, "down"), "down");
        assert_eq!(ranked.len(), 5, "every node is listed");
    }

    /// Issue 30, item 5: a draining node, this one or a peer, takes nothing new: it is
    /// excluded with the reason `draining`, which the no-candidate error names too.
    #[test]
    fn a_draining_node_is_excluded_here_and_elsewhere() {
        let mut here = node("here", &["coder"], &[], (0, 0));
        let mut gpu = node("gpu", &["coder"], &[24576], (0, 0));
        let other = node("other", &["coder"], &[], (0, 0));
        gpu.draining = true;
        let coder = Target::Role("coder".into());
        let ranked = rank(
            &coder,
            Tier::Read,
            &Requirements::default(),
            &[up(&here, true), up(&gpu, false), up(&other, false)],
        );
        assert_eq!(names(&ranked), ["here", "other"]);
        assert_eq!(reason(&ranked, "gpu"), "draining");

        here.draining = true;
        let on_gpu = Requirements {
            on: Some("gpu".into()),
            ..Requirements::default()
        };
        let ranked = rank(
            &coder,
            Tier::Read,
            &on_gpu,
            &[up(&here, true), up(&gpu, false), up(&other, false)],
        );
        assert_eq!(reason(&ranked, "here"), "draining");
        let Err(why) = choose(&ranked, false) else {
            panic!("a draining node was chosen");
        };
        assert!(why.contains("gpu: draining"), "{why}");
        assert!(why.contains("here (this node): draining"), "{why}");
    }

    /// A node of name `name` whose id is `id` (64 hex digits).
    fn with_id(name: &str, id: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId::parse(id).expect("an id"),
            ..node(name, &["coder"], &[], (0, 0))
        }
    }

    /// Issue 26: `on` takes a name, a whole id, or an id prefix of at least 12 hex digits that
    /// only one node's id starts with; a name wins over an id prefix, and a short or shared
    /// prefix picks nobody (each node excluded with the reason).
    #[test]
    fn on_takes_a_name_an_id_or_a_unique_id_prefix() {
        let a = with_id("a", &format!("{}{}", "abcdef012345", "0".repeat(52)));
        let b = with_id("b", &format!("{}{}", "abcdef012346", "0".repeat(52)));
        // A node named like a hex prefix of another's id.
        let named_hex = with_id("abcdef012346", &"9".repeat(64));
        let candidates = vec![up(&a, true), up(&b, false)];
        let coder = Target::Role("coder".into());
        let ranked_on = |on: &str, candidates: &[Candidate<'_>]| -> Vec<String> {
            let require = Requirements {
                on: Some(on.into()),
                ..Requirements::default()
            };
            names(&rank(&coder, Tier::Read, &require, candidates))
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        for (on, expected) in [
            ("b", vec!["b"]),
            (b.id.as_str(), vec!["b"]),
            ("abcdef012346", vec!["b"]),
            ("abcdef0123460", vec!["b"]),
            ("abcdef012345", vec!["a"]),
            // Shared by both, or shorter than a short id: nobody.
            ("abcdef01234", vec![]),
            ("abcdef", vec![]),
            ("ABCDEF012346", vec![]),
            ("c", vec![]),
        ] {
            assert_eq!(ranked_on(on, &candidates), expected, "on = {on}");
        }
        let require = Requirements {
            on: Some("abcdef01234".into()),
            ..Requirements::default()
        };
        let ranked = rank(&coder, Tier::Read, &require, &candidates);
        assert_eq!(reason(&ranked, "a"), "not the requested node `abcdef01234`");
        let shared = vec![up(&a, true), up(&b, false), up(&b, false)];
        assert_eq!(
            requested("abcdef012346", &shared),
            Requested::Id(&b.id),
            "one node listed twice is one node"
        );
        let c = with_id("c", &format!("{}{}", "abcdef0123", "f".repeat(54)));
        let long = vec![up(&a, true), up(&b, false), up(&c, false)];
        let twelve = "abcdef012300";
        assert!(matches!(requested(twelve, &long), Requested::Nobody(_)));
        let ranked = rank(
            &coder,
            Tier::Read,
            &Requirements {
                on: Some("abcdef0123".into()),
                ..Requirements::default()
            },
            &long,
        );
        assert_eq!(reason(&ranked, "b"), "not the requested node `abcdef0123`");
        // A name is what users type: it wins over another node's id prefix.
        let with_named = vec![up(&a, true), up(&b, false), up(&named_hex, false)];
        assert_eq!(ranked_on("abcdef012346", &with_named), ["abcdef012346"]);
    }

    #[test]
    fn ambiguous_id_prefixes_are_named_as_such() {
        let a = with_id("a", &format!("{}{}", "abcdef0123456", "0".repeat(51)));
        let b = with_id("b", &format!("{}{}", "abcdef0123456", "1".repeat(51)));
        let candidates = vec![up(&a, true), up(&b, false)];
        assert_eq!(
            requested("abcdef012345", &candidates),
            Requested::Ambiguous {
                prefix: "abcdef012345",
                count: 2
            }
        );
        let ranked = rank(
            &Target::Role("coder".into()),
            Tier::Read,
            &Requirements {
                on: Some("abcdef0123456".into()),
                ..Requirements::default()
            },
            &candidates,
        );
        assert_eq!(
            reason(&ranked, "b"),
            "`abcdef0123456` starts the ids of 2 nodes; give more of the id"
        );
    }

    #[test]
    fn on_labels_tier_model_and_persona_filters() {
        let mut a = node("a", &["coder"], &[], (0, 0));
        a.labels.insert("site".into(), "home".into());
        let b = node("b", &["coder"], &[], (0, 0));
        let candidates = vec![up(&a, false), up(&b, false)];
        let coder = Target::Role("coder".into());
        let on_b = Requirements {
            on: Some("b".into()),
            ..Requirements::default()
        };
        assert_eq!(names(&rank(&coder, Tier::Read, &on_b, &candidates)), ["b"]);
        let home = Requirements {
            labels: [("site".to_owned(), "home".to_owned())].into(),
            ..Requirements::default()
        };
        let ranked = rank(&coder, Tier::Read, &home, &candidates);
        assert_eq!(names(&ranked), ["a"]);
        assert_eq!(reason(&ranked, "b"), "lacks label site=home");
        let ranked = rank(&coder, Tier::Shell, &Requirements::default(), &candidates);
        assert!(names(&ranked).is_empty());
        assert!(reason(&ranked, "a").contains("up to tier `read`"));
        // The local node runs any tier it is asked for: the caller is its own operator.
        let local = vec![up(&a, true)];
        assert_eq!(
            names(&rank(&coder, Tier::Shell, &Requirements::default(), &local)),
            ["a"]
        );
        let model = rank(
            &Target::Model("m".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        assert_eq!(names(&model).len(), 2);
        let ghost = rank(
            &Target::Model("ghost".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        assert_eq!(reason(&ghost, "a"), "has no model `ghost`");
        let persona = rank(
            &Target::Persona("reviewer".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        assert_eq!(names(&persona).len(), 2);
    }

    #[test]
    fn with_everything_else_equal_the_nearer_node_ranks_first() {
        let far = node("far", &["coder"], &[24576], (0, 0));
        let near = node("near", &["coder"], &[24576], (0, 0));
        let candidates = vec![
            Candidate {
                rtt_ms: Some(40.0),
                ..up(&far, false)
            },
            Candidate {
                rtt_ms: Some(0.4),
                ..up(&near, false)
            },
        ];
        let ranked = rank(
            &Target::Role("coder".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        assert_eq!(names(&ranked), ["near", "far"]);
    }

    #[test]
    fn ranking_prefers_lower_load_then_more_vram_then_local() {
        let busy = node("busy", &["coder"], &[81920], (2, 1));
        let idle_small = node("idle-small", &["coder"], &[8192], (0, 0));
        let idle_big = node("idle-big", &["coder"], &[24576], (0, 0));
        let local_big = node("local-big", &["coder"], &[24576], (0, 0));
        let candidates = vec![
            up(&busy, false),
            up(&idle_small, false),
            up(&idle_big, false),
            up(&local_big, true),
        ];
        let ranked = rank(
            &Target::Role("coder".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        assert_eq!(
            names(&ranked),
            ["local-big", "idle-big", "idle-small", "busy"]
        );
        let scores: Vec<f64> = ranked
            .iter()
            .map(|r| *r.verdict.as_ref().expect("eligible"))
            .collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    }

    /// A node for the speed table: name, GPUs (VRAM MiB), load (running, queued), tokens/s.
    type SpeedNode = (&'static str, &'static [u64], (u32, u32), f64);

    #[test]
    fn a_faster_model_wins_between_equal_nodes_and_loses_to_load_and_vram() {
        let with_speed = |name: &str, gpus: &[u64], load: (u32, u32), speed: f64| {
            let mut info = node(name, &["coder"], gpus, load);
            info.models[0].tokens_per_s = speed;
            info
        };
        let cases: &[(&[SpeedNode], &[&str])] = &[
            // Equal otherwise: the faster model first, an unmeasured one (0) last.
            (
                &[
                    ("slow", &[], (0, 0), 40.0),
                    ("fast", &[], (0, 0), 120.0),
                    ("new", &[], (0, 0), 0.0),
                ],
                &["fast", "slow", "new"],
            ),
            // Load decides before speed.
            (
                &[
                    ("fast-busy", &[], (1, 0), 500.0),
                    ("slow-idle", &[], (0, 0), 10.0),
                ],
                &["slow-idle", "fast-busy"],
            ),
            // VRAM decides before speed.
            (
                &[
                    ("fast-cpu", &[], (0, 0), 500.0),
                    ("slow-gpu", &[8192], (0, 0), 10.0),
                ],
                &["slow-gpu", "fast-cpu"],
            ),
        ];
        for (nodes, expected) in cases {
            let infos: Vec<NodeInfo> = nodes
                .iter()
                .map(|(name, gpus, load, speed)| with_speed(name, gpus, *load, *speed))
                .collect();
            let candidates: Vec<Candidate<'_>> = infos.iter().map(|i| up(i, false)).collect();
            for target in [
                Target::Role("coder".into()),
                Target::Model("m".into()),
                Target::Persona("reviewer".into()),
            ] {
                let ranked = rank(&target, Tier::Read, &Requirements::default(), &candidates);
                assert_eq!(names(&ranked), *expected, "{target:?}");
                let scores: Vec<f64> = ranked
                    .iter()
                    .map(|r| *r.verdict.as_ref().expect("eligible"))
                    .collect();
                assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
            }
        }
    }

    #[test]
    fn the_choice_prefers_the_best_and_keeps_forwarded_tasks_where_they_landed() {
        let here = node("here", &["coder"], &[], (1, 0));
        let idle = node("idle", &["coder"], &[], (0, 0));
        let other = node("other", &["coder"], &[], (0, 1));
        let candidates = vec![up(&here, true), up(&idle, false), up(&other, false)];
        let coder = Target::Role("coder".into());
        let ranked = rank(&coder, Tier::Read, &Requirements::default(), &candidates);
        let peers = |names: &[&str]| {
            Placement::Remote(
                names
                    .iter()
                    .map(|n| Destination {
                        name: (*n).into(),
                        addr: (*n).into(),
                    })
                    .collect(),
            )
        };
        // A busier local node sends the task to the idle peers, best first, never to itself.
        assert_eq!(choose(&ranked, false), Ok(peers(&["idle", "other"])));
        // A task forwarded here stays here while this node can run it.
        assert_eq!(choose(&ranked, true), Ok(Placement::Local));
        // Nobody eligible: every node is named with its reason.
        let ranked = rank(
            &Target::Role("painter".into()),
            Tier::Read,
            &Requirements::default(),
            &candidates,
        );
        let why = choose(&ranked, false).expect_err("nobody paints");
        assert!(
            why.contains("here (this node): serves no model for role `painter`"),
            "{why}"
        );
        assert!(why.contains("idle: serves no model"), "{why}");
    }

    #[test]
    fn embeddings_are_ranked_only_among_the_nodes_whose_model_embeds() {
        let peer = |name: &str, load: (u32, u32), embeds: bool| {
            let mut info = node(name, &["coder"], &[], load);
            info.models[0].embeds = embeds;
            Peer {
                info,
                addr: format!("{name}:1"),
                state: PeerState::Up,
                last_seen: std::time::SystemTime::UNIX_EPOCH,
                source: crate::discovery::PeerSource::Static,
                rtt_ms: None,
            }
        };
        // This node is idlest but has `m` for chats only; of the two that embed, the idler
        // one comes first.
        let own = node("here", &["coder"], &[], (0, 0));
        let peers = vec![
            peer("busy", (3, 0), true),
            peer("chat-only", (0, 0), false),
            peer("idle", (1, 0), true),
        ];
        let ranked = rank_embedders(&own, &peers, "m");
        let names: Vec<_> = ranked.iter().map(|r| r.node).collect();
        assert_eq!(names, ["idle", "busy"]);
        assert_eq!(
            choose(&ranked, false),
            Ok(Placement::Remote(vec![
                Destination {
                    name: "idle".into(),
                    addr: "idle:1".into()
                },
                Destination {
                    name: "busy".into(),
                    addr: "busy:1".into()
                },
            ]))
        );
        assert!(rank_embedders(&own, &peers[1..2], "m").is_empty());
        assert!(rank_embedders(&own, &peers, "other").is_empty());
    }

    #[test]
    fn the_speed_is_that_of_the_model_that_would_serve_the_target() {
        let mut info = node("n", &["coder"], &[], (0, 0));
        info.models[0].tokens_per_s = 80.0;
        info.models.push(ModelInfo {
            name: "backup".into(),
            backend: "embedded".into(),
            model: "b.gguf".into(),
            base_url: String::new(),
            tokens_per_s: 300.0,
            embeds: false,
        });
        info.role_chains
            .insert("coder".into(), vec!["m".into(), "backup".into()]);
        assert_eq!(
            target_speed(&info, &Target::Role("coder".into())),
            80.0,
            "the primary"
        );
        assert_eq!(target_speed(&info, &Target::Model("backup".into())), 300.0);
        assert_eq!(
            target_speed(&info, &Target::Persona("reviewer".into())),
            80.0
        );
        assert_eq!(target_speed(&info, &Target::Role("painter".into())), 0.0);
        assert_eq!(target_speed(&info, &Target::Persona("nobody".into())), 0.0);
    }
}

/// Where a task or a chat runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On this node.
    Local,
    /// On these nodes, best first: the first, then (after a failure) the next.
    Remote(Vec<Destination>),
}

/// A node a task or chat is sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub name: String,
    /// `host:port` it is reached at.
    pub addr: String,
}

/// Picks from a ranking; `Err` says why no node can run it (every node with its reason). A task
/// another node forwarded here runs here whenever this node is eligible, so delegation does not
/// bounce around the fleet.
pub(crate) fn choose(ranked: &[Ranked<'_>], forwarded: bool) -> Result<Placement, String> {
    let eligible: Vec<&Ranked<'_>> = ranked.iter().filter(|r| r.verdict.is_ok()).collect();
    if eligible.is_empty() {
        let reasons: Vec<String> = ranked
            .iter()
            .map(|r| {
                let why = r
                    .verdict
                    .as_ref()
                    .err()
                    .map(String::as_str)
                    .unwrap_or("eligible");
                format!(
                    "{}{}: {why}",
                    r.node,
                    if r.local { " (this node)" } else { "" }
                )
            })
            .collect();
        return Err(format!("no node can run this task: {}", reasons.join("; ")));
    }
    if eligible[0].local || (forwarded && eligible.iter().any(|r| r.local)) {
        return Ok(Placement::Local);
    }
    Ok(Placement::Remote(
        eligible
            .iter()
            .filter(|r| !r.local)
            .map(|r| Destination {
                name: r.node.to_owned(),
                addr: r.addr.to_owned(),
            })
            .collect(),
    ))
}
