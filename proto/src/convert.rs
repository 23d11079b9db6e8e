//! Conversions between the wire types and the domain types of `mesh-domain`, in both
//! directions. Everything that comes from the network is bounded and checked here: a bad value
//! becomes `INVALID_ARGUMENT` with a message that starts with the field's name.

use std::{collections::BTreeMap, time::Duration};

use mesh_domain::{
    CertRole, Evaluation, EventKind, Gpu, Health, HealthStatus, KeyLimits, KeyPolicy, Lineage,
    Load, ModelInfo, NodeId, NodeInfo, PeerState, PersonaInfo, Principal, Requirements, Resources,
    Target, TaskError, TaskEvent, TaskSpec, TaskStatus, Tier, Usage,
    mcp::{self, McpToolInfo},
    statement::Signed,
    task::MAX_TIMEOUT_S,
};
use tonic::Status;

use crate::v1 as pb;

/// Limits on lists and strings inside `NodeInfo`.
const MAX_LIST: usize = 256;
const MAX_STRING: usize = 1024;

impl From<Tier> for pb::Tier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Read => pb::Tier::Read,
            Tier::Write => pb::Tier::Write,
            Tier::Shell => pb::Tier::Shell,
        }
    }
}

impl From<PeerState> for pb::PeerState {
    fn from(state: PeerState) -> Self {
        match state {
            PeerState::Up => pb::PeerState::Up,
            PeerState::Suspect => pb::PeerState::Suspect,
            PeerState::Down => pb::PeerState::Down,
            PeerState::Revoked => pb::PeerState::Revoked,
        }
    }
}

/// A tier from the wire where an unknown value must not fail (what a node advertises, what a
/// task record says): `read`, the least.
pub fn tier_or_read(tier: i32) -> Tier {
    match pb::Tier::try_from(tier) {
        Ok(pb::Tier::Shell) => Tier::Shell,
        Ok(pb::Tier::Write) => Tier::Write,
        _ => Tier::Read,
    }
}

/// A peer state from the wire; anything unknown counts as `down`.
pub fn peer_state(state: i32) -> PeerState {
    match pb::PeerState::try_from(state) {
        Ok(pb::PeerState::Up) => PeerState::Up,
        Ok(pb::PeerState::Suspect) => PeerState::Suspect,
        Ok(pb::PeerState::Revoked) => PeerState::Revoked,
        _ => PeerState::Down,
    }
}

impl From<&Principal> for pb::Principal {
    fn from(principal: &Principal) -> Self {
        Self {
            id: principal.id.to_string(),
            name: principal.name.clone(),
            role: match principal.role {
                None => pb::CertRole::Unspecified,
                Some(CertRole::Node) => pb::CertRole::Node,
                Some(CertRole::Client) => pb::CertRole::Client,
            } as i32,
        }
    }
}

impl TryFrom<pb::Principal> for Principal {
    type Error = Status;

    fn try_from(principal: pb::Principal) -> Result<Self, Status> {
        check_len("lineage.started_by.name", &principal.name, 63)?;
        Ok(Self {
            id: NodeId::parse(&principal.id)
                .map_err(|e| Status::invalid_argument(format!("lineage.started_by.id: {e}")))?,
            name: principal.name,
            role: match pb::CertRole::try_from(principal.role) {
                Ok(pb::CertRole::Node) => Some(CertRole::Node),
                Ok(pb::CertRole::Client) => Some(CertRole::Client),
                // Unknown values count as the least trusted: a legacy certificate.
                _ => None,
            },
        })
    }
}

impl From<&Signed> for pb::SignedStatement {
    fn from(signed: &Signed) -> Self {
        Self {
            statement: signed.statement.clone(),
            signature: signed.signature.clone(),
            certificate: signed.certificate.clone(),
        }
    }
}

/// Sizes are checked where the statement is verified (`mesh_cert::statement`).
impl From<pb::SignedStatement> for Signed {
    fn from(signed: pb::SignedStatement) -> Self {
        Self {
            statement: signed.statement,
            signature: signed.signature,
            certificate: signed.certificate,
        }
    }
}

impl From<TaskStatus> for pb::TaskStatus {
    fn from(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Queued => pb::TaskStatus::Queued,
            TaskStatus::Running => pb::TaskStatus::Running,
            TaskStatus::Completed => pb::TaskStatus::Completed,
            TaskStatus::Failed => pb::TaskStatus::Failed,
            TaskStatus::InputRequired => pb::TaskStatus::InputRequired,
            TaskStatus::Cancelled => pb::TaskStatus::Cancelled,
        }
    }
}

impl From<&TaskError> for pb::TaskError {
    fn from(error: &TaskError) -> Self {
        Self {
            kind: error.kind().into(),
            message: error.to_string(),
            fields: error.fields().into_iter().collect(),
        }
    }
}

impl From<&Target> for pb::submit_request::Target {
    fn from(target: &Target) -> Self {
        match target {
            Target::Role(r) => Self::Role(r.clone()),
            Target::Model(m) => Self::Model(m.clone()),
            Target::Persona(p) => Self::Persona(p.clone()),
        }
    }
}

impl From<pb::submit_request::Target> for Target {
    fn from(target: pb::submit_request::Target) -> Self {
        match target {
            pb::submit_request::Target::Role(r) => Self::Role(r),
            pb::submit_request::Target::Model(m) => Self::Model(m),
            pb::submit_request::Target::Persona(p) => Self::Persona(p),
        }
    }
}

impl From<&NodeInfo> for pb::NodeInfo {
    fn from(info: &NodeInfo) -> Self {
        Self {
            name: info.name.clone(),
            id: info.id.to_string(),
            version: info.version.clone(),
            protocol: info.protocol,
            addrs: info.addrs.clone(),
            roles: info.roles.clone(),
            labels: info.labels.clone().into_iter().collect(),
            personas: info
                .personas
                .iter()
                .map(|p| pb::Persona {
                    name: p.name.clone(),
                    role: p.role.clone(),
                })
                .collect(),
            models: info
                .models
                .iter()
                .map(|m| pb::Model {
                    name: m.name.clone(),
                    backend: m.backend.clone(),
                    model: m.model.clone(),
                    base_url: m.base_url.clone(),
                    tokens_per_s: m.tokens_per_s,
                    embeds: m.embeds,
                })
                .collect(),
            role_chains: info
                .role_chains
                .iter()
                .map(|(role, models)| pb::RoleChain {
                    role: role.clone(),
                    models: models.clone(),
                })
                .collect(),
            resources: Some(pb::Resources {
                cpu_count: info.resources.cpu_count,
                memory_total_bytes: info.resources.memory_total_bytes,
                memory_available_bytes: info.resources.memory_available_bytes,
                cpu_load: info.resources.cpu_load,
                gpus: info
                    .resources
                    .gpus
                    .iter()
                    .map(|g| pb::Gpu {
                        name: g.name.clone(),
                        vram_mb: g.vram_mb,
                        vram_free_mb: g.vram_free_mb,
                        source: g.source.clone(),
                    })
                    .collect(),
            }),
            load: Some(pb::Load {
                running: info.load.running,
                queued: info.load.queued,
                workers: info.load.workers,
                queue_capacity: info.load.queue_capacity,
            }),
            health: Some(pb::Health {
                status: match info.health.status {
                    HealthStatus::Healthy => pb::HealthStatus::Healthy,
                    HealthStatus::Degraded => pb::HealthStatus::Degraded,
                    HealthStatus::Unhealthy => pb::HealthStatus::Unhealthy,
                } as i32,
                reasons: info.health.reasons.clone(),
            }),
            cert_fingerprint: info.cert_fingerprint.clone(),
            started_at_ms: info.started_at_ms,
            remote_max_tier: pb::Tier::from(info.remote_max_tier) as i32,
            memory_seq: info.memory_seq,
            mcp_tools: info
                .mcp_tools
                .iter()
                .map(|tool| pb::McpTool {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    input_schema: tool.input_schema.to_string(),
                    tier: pb::Tier::from(tool.tier) as i32,
                })
                .collect(),
        }
    }
}

/// A peer's advertised MCP tools, checked: at most [`mcp::MAX_ADVERTISED_TOOLS`] and
/// [`mcp::MAX_ADVERTISED_BYTES`] in all, each a valid namespaced name, a bounded description
/// and an object schema of at most [`mcp::MAX_SCHEMA_BYTES`].
fn mcp_tools(tools: Vec<pb::McpTool>) -> Result<Vec<McpToolInfo>, Status> {
    if tools.len() > mcp::MAX_ADVERTISED_TOOLS {
        return Err(Status::invalid_argument(format!(
            "mcp_tools: {} entries, at most {} allowed",
            tools.len(),
            mcp::MAX_ADVERTISED_TOOLS
        )));
    }
    let total: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.input_schema.len())
        .sum();
    if total > mcp::MAX_ADVERTISED_BYTES {
        return Err(Status::invalid_argument(format!(
            "mcp_tools: {total} bytes of names, descriptions and schemas, at most {} allowed",
            mcp::MAX_ADVERTISED_BYTES
        )));
    }
    let mut checked = Vec::with_capacity(tools.len());
    for tool in tools {
        if !(mcp::is_function_name(&tool.name) && mcp::split_tool_name(&tool.name).is_some()) {
            return Err(Status::invalid_argument(format!(
                "mcp_tools.name: `{}` is not `<server>__<tool>` of 1-64 letters, digits, `_` or `-`",
                tool.name.chars().take(80).collect::<String>()
            )));
        }
        check_len(
            "mcp_tools.description",
            &tool.description,
            mcp::MAX_DESCRIPTION,
        )?;
        check_len(
            "mcp_tools.input_schema",
            &tool.input_schema,
            mcp::MAX_SCHEMA_BYTES,
        )?;
        let schema: serde_json::Value = serde_json::from_str(&tool.input_schema).map_err(|e| {
            Status::invalid_argument(format!("mcp_tools.input_schema: not JSON ({e})"))
        })?;
        if !schema.is_object() {
            return Err(Status::invalid_argument(
                "mcp_tools.input_schema: must be a JSON object",
            ));
        }
        checked.push(McpToolInfo {
            name: tool.name,
            description: tool.description,
            input_schema: schema.into(),
            tier: tier_or_shell(tool.tier),
        });
    }
    Ok(checked)
}

/// The tier of an advertised tool; an unknown value counts as the highest, so a call of it is
/// never thought harmless.
fn tier_or_shell(tier: i32) -> Tier {
    match pb::Tier::try_from(tier) {
        Ok(pb::Tier::Read) => Tier::Read,
        Ok(pb::Tier::Write) => Tier::Write,
        _ => Tier::Shell,
    }
}

impl TryFrom<pb::NodeInfo> for NodeInfo {
    type Error = Status;

    fn try_from(info: pb::NodeInfo) -> Result<Self, Status> {
        check_len("name", &info.name, 63)?;
        if info.name.is_empty() {
            return Err(Status::invalid_argument("name: must not be empty"));
        }
        let id =
            NodeId::parse(&info.id).map_err(|e| Status::invalid_argument(format!("id: {e}")))?;
        check_len("version", &info.version, 64)?;
        check_len("cert_fingerprint", &info.cert_fingerprint, 64)?;
        check_list("addrs", &info.addrs)?;
        check_list("roles", &info.roles)?;
        check_count("personas", info.personas.len())?;
        check_count("models", info.models.len())?;
        check_count("role_chains", info.role_chains.len())?;
        check_count("labels", info.labels.len())?;
        for (k, v) in &info.labels {
            check_len("labels key", k, 63)?;
            check_len("labels value", v, 253)?;
        }
        let resources = info.resources.unwrap_or_default();
        check_count("resources.gpus", resources.gpus.len())?;
        let health = info.health.unwrap_or_default();
        check_list("health.reasons", &health.reasons)?;
        let load = info.load.unwrap_or_default();
        let mut role_chains = BTreeMap::new();
        for chain in info.role_chains {
            check_len("role_chains.role", &chain.role, 63)?;
            check_list("role_chains.models", &chain.models)?;
            role_chains.insert(chain.role, chain.models);
        }
        let mut models = Vec::with_capacity(info.models.len());
        for m in info.models {
            for (field, value) in [
                ("models.name", &m.name),
                ("models.backend", &m.backend),
                ("models.model", &m.model),
                ("models.base_url", &m.base_url),
            ] {
                check_len(field, value, MAX_STRING)?;
            }
            if !(m.tokens_per_s.is_finite() && m.tokens_per_s >= 0.0) {
                return Err(Status::invalid_argument(format!(
                    "models.tokens_per_s: {} is not a speed (a finite number, 0 or more)",
                    m.tokens_per_s
                )));
            }
            models.push(ModelInfo {
                name: m.name,
                backend: m.backend,
                model: m.model,
                base_url: m.base_url,
                tokens_per_s: m.tokens_per_s,
                embeds: m.embeds,
            });
        }
        let mut personas = Vec::with_capacity(info.personas.len());
        for p in info.personas {
            check_len("personas.name", &p.name, 63)?;
            check_len("personas.role", &p.role, 63)?;
            personas.push(PersonaInfo {
                name: p.name,
                role: p.role,
            });
        }
        let mut gpus = Vec::with_capacity(resources.gpus.len());
        for g in resources.gpus {
            check_len("resources.gpus.name", &g.name, 128)?;
            check_len("resources.gpus.source", &g.source, 32)?;
            gpus.push(Gpu {
                name: g.name,
                vram_mb: g.vram_mb,
                vram_free_mb: g.vram_free_mb,
                source: g.source,
            });
        }
        Ok(Self {
            name: info.name,
            id,
            version: info.version,
            protocol: info.protocol,
            addrs: info.addrs,
            roles: info.roles,
            labels: info.labels.into_iter().collect(),
            personas,
            models,
            role_chains,
            resources: Resources {
                cpu_count: resources.cpu_count,
                memory_total_bytes: resources.memory_total_bytes,
                memory_available_bytes: resources.memory_available_bytes,
                cpu_load: if resources.cpu_load.is_finite() {
                    resources.cpu_load
                } else {
                    0.0
                },
                gpus,
            },
            load: Load {
                running: load.running,
                queued: load.queued,
                workers: load.workers,
                queue_capacity: load.queue_capacity,
            },
            health: Health {
                status: match pb::HealthStatus::try_from(health.status) {
                    Ok(pb::HealthStatus::Healthy) => HealthStatus::Healthy,
                    Ok(pb::HealthStatus::Degraded) => HealthStatus::Degraded,
                    _ => HealthStatus::Unhealthy,
                },
                reasons: health.reasons,
            },
            cert_fingerprint: info.cert_fingerprint,
            started_at_ms: info.started_at_ms,
            remote_max_tier: tier_or_read(info.remote_max_tier),
            memory_seq: info.memory_seq,
            mcp_tools: mcp_tools(info.mcp_tools)?.into(),
        })
    }
}

impl From<&KeyPolicy> for pb::KeyPolicy {
    fn from(policy: &KeyPolicy) -> Self {
        let limits = policy.limits;
        Self {
            models: policy.models.clone(),
            roles: policy.roles.clone(),
            max_tokens_per_day: limits.max_tokens_per_day,
            max_tokens_per_month: limits.max_tokens_per_month,
            requests_per_minute: limits.requests_per_minute,
            tokens_per_minute: limits.tokens_per_minute,
            mcp: policy.mcp,
        }
    }
}

impl TryFrom<pb::KeyPolicy> for KeyPolicy {
    type Error = Status;

    /// Bounded like every list from the network; the policy's own rules (no empty name, no
    /// zero limit) are the node's key registry's.
    fn try_from(policy: pb::KeyPolicy) -> Result<Self, Status> {
        check_list("policy.models", &policy.models)?;
        check_list("policy.roles", &policy.roles)?;
        Ok(Self {
            models: policy.models,
            roles: policy.roles,
            limits: KeyLimits {
                max_tokens_per_day: policy.max_tokens_per_day,
                max_tokens_per_month: policy.max_tokens_per_month,
                requests_per_minute: policy.requests_per_minute,
                tokens_per_minute: policy.tokens_per_minute,
            },
            mcp: policy.mcp,
        })
    }
}

/// `INVALID_ARGUMENT` naming `field` when `value` is longer than `max` bytes.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        Err(Status::invalid_argument(format!(
            "{field}: {} bytes, at most {max} allowed",
            value.len()
        )))
    } else {
        Ok(())
    }
}

fn check_count(field: &str, count: usize) -> Result<(), Status> {
    if count > MAX_LIST {
        Err(Status::invalid_argument(format!(
            "{field}: {count} entries, at most {MAX_LIST} allowed"
        )))
    } else {
        Ok(())
    }
}

fn check_list(field: &str, values: &[String]) -> Result<(), Status> {
    check_count(field, values.len())?;
    values
        .iter()
        .try_for_each(|v| check_len(field, v, MAX_STRING))
}

impl TryFrom<pb::SubmitRequest> for TaskSpec {
    type Error = Status;

    fn try_from(request: pb::SubmitRequest) -> Result<Self, Status> {
        let target = match request.target {
            Some(target) => Target::from(target),
            None => {
                return Err(Status::invalid_argument(
                    "target: set one of role, model or persona",
                ));
            }
        };
        let tier = match pb::Tier::try_from(request.tier) {
            Ok(pb::Tier::Unspecified | pb::Tier::Read) => Tier::Read,
            Ok(pb::Tier::Write) => Tier::Write,
            Ok(pb::Tier::Shell) => Tier::Shell,
            Err(_) => return Err(Status::invalid_argument("tier: unknown value")),
        };
        // Bounds that need no decoding first, so nothing oversized is copied.
        if request.timeout_s > MAX_TIMEOUT_S {
            return Err(Status::invalid_argument(format!(
                "timeout_s: at most {MAX_TIMEOUT_S}"
            )));
        }
        let require = request.require.unwrap_or_default();
        let lineage = request.lineage.unwrap_or_default();
        let spec = TaskSpec {
            prompt: request.prompt,
            target,
            tier,
            timeout: (request.timeout_s > 0)
                .then(|| Duration::from_secs(u64::from(request.timeout_s))),
            max_rounds: (request.max_rounds > 0).then_some(request.max_rounds),
            token_budget: (request.token_budget > 0).then_some(request.token_budget),
            require: Requirements {
                gpu: require.gpu,
                min_vram_mb: (require.min_vram_mb > 0).then_some(require.min_vram_mb),
                labels: require.labels.into_iter().collect(),
                on: Some(request.on).filter(|on| !on.is_empty()),
            },
            lineage: Lineage {
                task_id: Some(lineage.task_id).filter(|id| !id.is_empty()),
                parent_id: Some(lineage.parent_id).filter(|id| !id.is_empty()),
                origin: lineage.origin_node,
                hops: lineage.hops,
                started_by: lineage.started_by.map(Principal::try_from).transpose()?,
            },
            session: Some(request.session).filter(|s| !s.is_empty()),
            evaluate: request.evaluate.map(Evaluation::from),
            tool: Some(request.tool).filter(|t| !t.is_empty()),
        };
        spec.check().map_err(Status::invalid_argument)?;
        Ok(spec)
    }
}

/// Unset threshold and attempts take the defaults; the bounds are [`Evaluation::check`]'s (run
/// by [`TaskSpec::check`]), so an explicit 0 attempts is refused rather than defaulted.
impl From<pb::Evaluation> for Evaluation {
    fn from(evaluation: pb::Evaluation) -> Self {
        Self {
            role: evaluation.role,
            threshold: evaluation
                .threshold
                .unwrap_or(Evaluation::DEFAULT_THRESHOLD),
            attempts: evaluation.attempts.unwrap_or(Evaluation::DEFAULT_ATTEMPTS),
        }
    }
}

impl From<&Evaluation> for pb::Evaluation {
    fn from(evaluation: &Evaluation) -> Self {
        Self {
            role: evaluation.role.clone(),
            threshold: Some(evaluation.threshold),
            attempts: Some(evaluation.attempts),
        }
    }
}

impl From<&TaskEvent> for pb::TaskEvent {
    fn from(event: &TaskEvent) -> Self {
        use pb::task_event::Kind;
        let kind = match &event.kind {
            EventKind::Accepted {
                node,
                queue_position,
            } => Kind::Accepted(pb::Accepted {
                node: node.clone(),
                queue_position: *queue_position,
            }),
            EventKind::Started { node } => Kind::Started(pb::Started { node: node.clone() }),
            EventKind::ModelCall {
                model,
                round,
                attempt,
            } => Kind::ModelCall(pb::ModelCall {
                model: model.clone(),
                round: *round,
                attempt: *attempt,
            }),
            EventKind::ModelFailed {
                model,
                error,
                falling_through,
            } => Kind::ModelFailed(pb::ModelFailed {
                model: model.clone(),
                error: error.clone(),
                falling_through: *falling_through,
            }),
            EventKind::ToolCalled {
                call_id,
                name,
                arguments,
            } => Kind::ToolCalled(pb::ToolCalled {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            EventKind::ToolResult {
                call_id,
                name,
                ok,
                output,
                consecutive_failures,
            } => Kind::ToolResult(pb::ToolResult {
                call_id: call_id.clone(),
                name: name.clone(),
                ok: *ok,
                output: output.clone(),
                consecutive_failures: *consecutive_failures,
            }),
            EventKind::Intervention { rule, message } => Kind::Intervention(pb::Intervention {
                rule: rule.clone(),
                message: message.clone(),
            }),
            EventKind::Warning { message } => Kind::Warning(pb::Warning {
                message: message.clone(),
            }),
            EventKind::OutputDelta { text } => {
                Kind::OutputDelta(pb::OutputDelta { text: text.clone() })
            }
            EventKind::Completed {
                output,
                usage,
                executed_on,
                rounds,
            } => Kind::Completed(pb::Completed {
                output: output.clone(),
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
                executed_on: executed_on.clone(),
                rounds: *rounds,
            }),
            EventKind::Failed { error, usage } => Kind::Failed(pb::Failed {
                error: Some(pb::TaskError::from(error)),
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                }),
            }),
            EventKind::ApprovalRequested {
                approval_id,
                tool,
                arguments,
                node,
                expires_at_ms,
            } => Kind::ApprovalRequested(pb::ApprovalRequested {
                approval_id: approval_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                node: node.clone(),
                expires_at_ms: *expires_at_ms,
            }),
            EventKind::ApprovalDecided {
                approval_id,
                approved,
                by,
                reason,
            } => Kind::ApprovalDecided(pb::ApprovalDecided {
                approval_id: approval_id.clone(),
                approved: *approved,
                by: by.clone(),
                reason: reason.clone(),
            }),
            EventKind::Evaluated {
                attempt,
                score,
                critique,
                model,
                node,
                error,
            } => Kind::Evaluated(pb::Evaluated {
                attempt: *attempt,
                score: *score,
                critique: critique.clone(),
                model: model.clone(),
                node: node.clone(),
                error: error.clone().unwrap_or_default(),
            }),
            EventKind::AttemptStarted {
                attempt,
                attempts,
                reason,
            } => Kind::AttemptStarted(pb::AttemptStarted {
                attempt: *attempt,
                attempts: *attempts,
                reason: reason.clone(),
            }),
            EventKind::Delegated {
                node,
                attempt,
                reason,
            } => Kind::Delegated(pb::Delegated {
                node: node.clone(),
                attempt: *attempt,
                reason: reason.clone(),
            }),
        };
        Self {
            task_id: event.task_id.clone(),
            seq: event.seq,
            at_ms: event.at_ms,
            kind: Some(kind),
        }
    }
}

impl From<&TaskSpec> for pb::SubmitRequest {
    fn from(spec: &TaskSpec) -> Self {
        use pb::submit_request::Target as T;
        Self {
            prompt: spec.prompt.clone(),
            target: Some(T::from(&spec.target)),
            tier: pb::Tier::from(spec.tier) as i32,
            timeout_s: spec
                .timeout
                .map(|t| t.as_secs().clamp(1, u64::from(MAX_TIMEOUT_S)) as u32)
                .unwrap_or(0),
            max_rounds: spec.max_rounds.unwrap_or(0),
            token_budget: spec.token_budget.unwrap_or(0),
            require: Some(pb::Requirements {
                gpu: spec.require.gpu,
                min_vram_mb: spec.require.min_vram_mb.unwrap_or(0),
                labels: spec.require.labels.clone().into_iter().collect(),
            }),
            on: spec.require.on.clone().unwrap_or_default(),
            lineage: Some(pb::Lineage {
                task_id: spec.lineage.task_id.clone().unwrap_or_default(),
                parent_id: spec.lineage.parent_id.clone().unwrap_or_default(),
                origin_node: spec.lineage.origin.clone(),
                hops: spec.lineage.hops,
                started_by: spec.lineage.started_by.as_ref().map(pb::Principal::from),
            }),
            session: spec.session.clone().unwrap_or_default(),
            evaluate: spec.evaluate.as_ref().map(pb::Evaluation::from),
            tool: spec.tool.clone().unwrap_or_default(),
        }
    }
}

/// A task event from another node, checked like any network input.
impl TryFrom<pb::TaskEvent> for TaskEvent {
    type Error = Status;

    fn try_from(event: pb::TaskEvent) -> Result<Self, Status> {
        use pb::task_event::Kind;
        const TEXT: usize = 256 * 1024;
        let text = |field: &str, value: String| check_len(field, &value, TEXT).map(|()| value);
        let kind = match event
            .kind
            .ok_or_else(|| Status::invalid_argument("kind: missing"))?
        {
            Kind::Accepted(a) => EventKind::Accepted {
                node: text("accepted.node", a.node)?,
                queue_position: a.queue_position,
            },
            Kind::Started(s) => EventKind::Started {
                node: text("started.node", s.node)?,
            },
            Kind::ModelCall(m) => EventKind::ModelCall {
                model: text("model_call.model", m.model)?,
                round: m.round,
                attempt: m.attempt,
            },
            Kind::ModelFailed(m) => EventKind::ModelFailed {
                model: text("model_failed.model", m.model)?,
                error: text("model_failed.error", m.error)?,
                falling_through: m.falling_through,
            },
            Kind::ToolCalled(t) => EventKind::ToolCalled {
                call_id: text("tool_called.call_id", t.call_id)?,
                name: text("tool_called.name", t.name)?,
                arguments: text("tool_called.arguments", t.arguments)?,
            },
            Kind::ToolResult(t) => EventKind::ToolResult {
                call_id: text("tool_result.call_id", t.call_id)?,
                name: text("tool_result.name", t.name)?,
                ok: t.ok,
                output: text("tool_result.output", t.output)?,
                consecutive_failures: t.consecutive_failures,
            },
            Kind::Intervention(i) => EventKind::Intervention {
                rule: text("intervention.rule", i.rule)?,
                message: text("intervention.message", i.message)?,
            },
            Kind::Warning(w) => EventKind::Warning {
                message: text("warning.message", w.message)?,
            },
            Kind::OutputDelta(d) => EventKind::OutputDelta {
                text: text("output_delta.text", d.text)?,
            },
            Kind::Completed(c) => EventKind::Completed {
                output: text("completed.output", c.output)?,
                usage: c
                    .usage
                    .map(|u| Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                    })
                    .unwrap_or_default(),
                executed_on: text("completed.executed_on", c.executed_on)?,
                rounds: c.rounds,
            },
            Kind::Failed(f) => EventKind::Failed {
                error: task_error_from_wire(f.error.unwrap_or_default()),
                usage: f
                    .usage
                    .map(|u| Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                    })
                    .unwrap_or_default(),
            },
            Kind::ApprovalRequested(a) => EventKind::ApprovalRequested {
                approval_id: text("approval_requested.approval_id", a.approval_id)?,
                tool: text("approval_requested.tool", a.tool)?,
                arguments: text("approval_requested.arguments", a.arguments)?,
                node: text("approval_requested.node", a.node)?,
                expires_at_ms: a.expires_at_ms,
            },
            Kind::ApprovalDecided(a) => EventKind::ApprovalDecided {
                approval_id: text("approval_decided.approval_id", a.approval_id)?,
                approved: a.approved,
                by: text("approval_decided.by", a.by)?,
                reason: text("approval_decided.reason", a.reason)?,
            },
            Kind::Evaluated(e) => EventKind::Evaluated {
                attempt: e.attempt,
                score: match e.score {
                    Some(score) if !(0.0..=1.0).contains(&score) => {
                        return Err(Status::invalid_argument(format!(
                            "evaluated.score: {score} is not between 0 and 1"
                        )));
                    }
                    score => score,
                },
                critique: text("evaluated.critique", e.critique)?,
                model: text("evaluated.model", e.model)?,
                node: text("evaluated.node", e.node)?,
                error: Some(text("evaluated.error", e.error)?).filter(|e| !e.is_empty()),
            },
            Kind::AttemptStarted(a) => EventKind::AttemptStarted {
                attempt: a.attempt,
                attempts: a.attempts,
                reason: text("attempt_started.reason", a.reason)?,
            },
            Kind::Delegated(d) => EventKind::Delegated {
                node: text("delegated.node", d.node)?,
                attempt: d.attempt,
                reason: text("delegated.reason", d.reason)?,
            },
        };
        Ok(Self {
            task_id: event.task_id,
            seq: event.seq,
            at_ms: event.at_ms,
            kind,
        })
    }
}

/// Rebuilds a task error from its wire form (kind + fields); unknown kinds become `internal`.
fn task_error_from_wire(error: pb::TaskError) -> TaskError {
    let mut fields: serde_json::Map<String, serde_json::Value> = error
        .fields
        .into_iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            (k, value)
        })
        .collect();
    fields.insert("kind".into(), serde_json::Value::String(error.kind));
    serde_json::from_value(serde_json::Value::Object(fields)).unwrap_or(TaskError::Internal {
        message: error.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeInfo {
        NodeInfo {
            name: "alpha".into(),
            id: NodeId::from_spki_der(b"alpha"),
            version: "0.1.0".into(),
            protocol: 1,
            addrs: vec!["127.0.0.1:7700".into()],
            roles: vec!["coder".into()],
            labels: [("site".to_owned(), "home".to_owned())].into(),
            personas: vec![PersonaInfo {
                name: "reviewer".into(),
                role: "coder".into(),
            }],
            models: vec![ModelInfo {
                name: "qwen".into(),
                backend: "openai".into(),
                model: "qwen2.5".into(),
                base_url: "http://x/v1".into(),
                tokens_per_s: 42.5,
                embeds: true,
            }],
            role_chains: [("coder".to_owned(), vec!["qwen".to_owned()])].into(),
            resources: Resources {
                cpu_count: 8,
                memory_total_bytes: 1 << 34,
                memory_available_bytes: 1 << 33,
                cpu_load: 0.5,
                gpus: vec![Gpu {
                    name: "RTX".into(),
                    vram_mb: 24576,
                    vram_free_mb: Some(100),
                    source: "declared".into(),
                }],
            },
            load: Load {
                running: 1,
                queued: 2,
                workers: 2,
                queue_capacity: 16,
            },
            health: Health {
                status: HealthStatus::Degraded,
                reasons: vec!["mdns: off".into()],
            },
            cert_fingerprint: "ab".repeat(32),
            started_at_ms: 42,
            remote_max_tier: Tier::Write,
            memory_seq: 9,
            mcp_tools: vec![McpToolInfo {
                name: "time__get_current_time".into(),
                description: "Now, in a time zone.".into(),
                input_schema: serde_json::json!({"type": "object", "properties": {"timezone": {"type": "string"}}}).into(),
                tier: Tier::Read,
            }]
            .into(),
        }
    }

    #[test]
    fn node_info_round_trips_through_protobuf() {
        let info = sample();
        let back = NodeInfo::try_from(pb::NodeInfo::from(&info)).expect("valid");
        assert_eq!(back, info);
    }

    #[test]
    fn malformed_node_info_names_the_field() {
        type Mutation = Box<dyn Fn(&mut pb::NodeInfo)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|i| i.id = "nope".into()), "id"),
            (Box::new(|i| i.name = String::new()), "name"),
            (Box::new(|i| i.name = "x".repeat(64)), "name"),
            (Box::new(|i| i.roles = vec!["r".into(); 1000]), "roles"),
            (Box::new(|i| i.addrs = vec!["a".repeat(5000)]), "addrs"),
            (
                Box::new(|i| i.mcp_tools[0].name = "no_server".into()),
                "mcp_tools.name",
            ),
            (
                Box::new(|i| i.mcp_tools[0].name = "fs__read.file".into()),
                "mcp_tools.name",
            ),
            (
                Box::new(|i| i.mcp_tools[0].input_schema = "[1]".into()),
                "mcp_tools.input_schema",
            ),
            (
                Box::new(|i| i.mcp_tools[0].input_schema = "{".into()),
                "mcp_tools.input_schema",
            ),
            (
                Box::new(|i| {
                    i.mcp_tools[0].input_schema =
                        format!(r#"{{"description": "{}"}}"#, "x".repeat(9000))
                }),
                "mcp_tools.input_schema",
            ),
            (
                Box::new(|i| i.mcp_tools[0].description = "d".repeat(2000)),
                "mcp_tools.description",
            ),
            (
                Box::new(|i| {
                    let tool = i.mcp_tools[0].clone();
                    i.mcp_tools = vec![tool; 129];
                }),
                "mcp_tools",
            ),
            (
                Box::new(|i| {
                    let mut tool = i.mcp_tools[0].clone();
                    tool.input_schema = format!(r#"{{"description": "{}"}}"#, "x".repeat(7000));
                    i.mcp_tools = vec![tool; 10];
                }),
                "mcp_tools",
            ),
        ];
        for (mutate, field) in cases {
            let mut wire = pb::NodeInfo::from(&sample());
            mutate(&mut wire);
            let status = NodeInfo::try_from(wire).expect_err(field);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(field), "{}", status.message());
        }
    }

    #[test]
    fn submit_requests_are_validated_field_by_field() {
        let good = pb::SubmitRequest {
            prompt: "hi".into(),
            target: Some(pb::submit_request::Target::Role("chat".into())),
            ..Default::default()
        };
        let spec = TaskSpec::try_from(good.clone()).expect("valid");
        assert_eq!(spec.tier, Tier::Read);
        assert_eq!(spec.timeout, None);

        let cases: Vec<(pb::SubmitRequest, &str)> = vec![
            (
                pb::SubmitRequest {
                    prompt: " ".into(),
                    ..good.clone()
                },
                "prompt",
            ),
            (
                pb::SubmitRequest {
                    target: None,
                    ..good.clone()
                },
                "target",
            ),
            (
                pb::SubmitRequest {
                    target: Some(pb::submit_request::Target::Role("r".repeat(64))),
                    ..good.clone()
                },
                "role",
            ),
            (
                pb::SubmitRequest {
                    tier: 42,
                    ..good.clone()
                },
                "tier",
            ),
            (
                pb::SubmitRequest {
                    timeout_s: 90_000,
                    ..good.clone()
                },
                "timeout_s",
            ),
            (
                pb::SubmitRequest {
                    prompt: "x".repeat(mesh_domain::task::MAX_PROMPT_BYTES + 1),
                    ..good.clone()
                },
                "prompt",
            ),
            (
                pb::SubmitRequest {
                    lineage: Some(pb::Lineage {
                        task_id: "victim/../x".into(),
                        ..Default::default()
                    }),
                    ..good.clone()
                },
                "lineage.task_id",
            ),
            (
                pb::SubmitRequest {
                    lineage: Some(pb::Lineage {
                        parent_id: "0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d\0".into(),
                        ..Default::default()
                    }),
                    ..good.clone()
                },
                "lineage.parent_id",
            ),
            (
                pb::SubmitRequest {
                    evaluate: Some(pb::Evaluation {
                        role: "judge".into(),
                        threshold: Some(1.5),
                        attempts: None,
                    }),
                    ..good.clone()
                },
                "evaluate.threshold",
            ),
            (
                pb::SubmitRequest {
                    evaluate: Some(pb::Evaluation {
                        role: "judge".into(),
                        threshold: None,
                        attempts: Some(0),
                    }),
                    ..good.clone()
                },
                "evaluate.attempts",
            ),
            (
                pb::SubmitRequest {
                    evaluate: Some(pb::Evaluation {
                        role: "judge".into(),
                        threshold: None,
                        attempts: Some(6),
                    }),
                    ..good.clone()
                },
                "evaluate.attempts",
            ),
            (
                pb::SubmitRequest {
                    evaluate: Some(pb::Evaluation::default()),
                    ..good.clone()
                },
                "evaluate.role",
            ),
            (
                pb::SubmitRequest {
                    tool: "rm -rf /".into(),
                    ..good.clone()
                },
                "tool",
            ),
            (
                pb::SubmitRequest {
                    tool: "t".repeat(65),
                    ..good.clone()
                },
                "tool",
            ),
        ];
        for (request, field) in cases {
            let status = TaskSpec::try_from(request).expect_err(field);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(field), "{}", status.message());
        }
    }

    /// An evaluation's unset threshold and attempts take the defaults, and it and the demanded
    /// tool survive the trip a forwarded task takes (spec → request → spec).
    #[test]
    fn an_evaluation_defaults_and_a_forwarded_spec_round_trips() {
        let request = pb::SubmitRequest {
            prompt: "hi".into(),
            target: Some(pb::submit_request::Target::Role("chat".into())),
            evaluate: Some(pb::Evaluation {
                role: "judge".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = TaskSpec::try_from(request).expect("valid");
        assert_eq!(spec.evaluate, Some(Evaluation::new("judge")));
        let custom = TaskSpec {
            evaluate: Some(Evaluation {
                role: "judge".into(),
                threshold: 0.0,
                attempts: 5,
            }),
            tool: Some("time__get_current_time".into()),
            ..spec
        };
        let back = TaskSpec::try_from(pb::SubmitRequest::from(&custom)).expect("valid");
        assert_eq!(back, custom);
    }

    /// A relayed `Evaluated` event is checked like every event from a peer.
    #[test]
    fn a_relayed_score_out_of_range_is_refused() {
        let event = |score| pb::TaskEvent {
            kind: Some(pb::task_event::Kind::Evaluated(pb::Evaluated {
                attempt: 1,
                score,
                ..Default::default()
            })),
            ..Default::default()
        };
        for bad in [1.5, -0.5, f64::NAN] {
            let status = TaskEvent::try_from(event(Some(bad))).expect_err("out of range");
            assert!(
                status.message().starts_with("evaluated.score"),
                "{status:?}"
            );
        }
        let unscored = TaskEvent::try_from(event(None)).expect("an unscored attempt");
        assert!(matches!(
            unscored.kind,
            EventKind::Evaluated {
                score: None,
                error: None,
                ..
            }
        ));
    }
}
