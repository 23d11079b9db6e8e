//! `NodeInfo` and what it carries (resources, models, personas, MCP tools, health), bounded as
//! it comes from the network.

use std::collections::BTreeMap;

use mesh_domain::{
    Gpu, Health, HealthStatus, Load, ModelInfo, NodeId, NodeInfo, PersonaInfo, Resources, Tier,
    mcp::{self, McpToolInfo},
};
use tonic::Status;

use crate::v1 as pb;

use super::{MAX_STRING, check_count, check_len, check_list, tier_or_read};

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
            draining: info.draining,
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
            draining: info.draining,
        })
    }
}
