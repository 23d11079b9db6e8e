//! `mesh-cli keys`: the front door's API keys, added and revoked at run time, and their usage
//! over the fleet. The key is made here and printed once; the node gets only its SHA-256.

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use mesh_cert::statement::sign;
use mesh_domain::{KeyPolicy, api_key::KeyStatement, statement::StatementKind};
use mesh_proto::v1 as pb;
use rand::TryRng;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{ConnArgs, channel, print_table, signer, unix_ms};

/// How a key made here starts (the node accepts any key it is given the hash of).
const KEY_PREFIX: &str = "sk-mesh-";

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Make a new key, store its hash and policy in the fleet's memory, and print the key once
    /// (it cannot be shown again). Every node accepts it within seconds, without a restart.
    /// The fleet's first key closes every front door to callers without a key, loopback
    /// included (see `http.loopback_without_key`). Operators only: the mesh-cli certificate of
    /// the node's own machine, or a client certificate the node lets run `shell` tasks.
    Add(AddArgs),
    /// Revoke a key added with `keys add`: every node refuses it within seconds.
    Rm {
        /// The key's name.
        name: String,
    },
    /// List the keys the node accepts (never the keys or their hashes).
    List {
        /// Print JSON (`{"keys": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Each key's usage over the whole fleet, per model: requests and tokens today and this
    /// month (UTC), its limits, and when they reset.
    Usage {
        /// Print JSON (`{"keys": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The key's name: 1-64 letters, digits, `-`, `_`, `.`.
    name: String,
    /// Models it may use (comma-separated). With --roles unset too: every model and role.
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Roles it may use (comma-separated). With --models unset too: every model and role.
    #[arg(long, value_delimiter = ',')]
    roles: Vec<String>,
    /// Prompt plus completion tokens per UTC day, over the fleet.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    tokens_per_day: Option<u64>,
    /// Prompt plus completion tokens per UTC month, over the fleet.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    tokens_per_month: Option<u64>,
    /// Requests per minute, over the fleet.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests_per_minute: Option<u64>,
    /// Prompt plus completion tokens per minute, over the fleet.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    tokens_per_minute: Option<u64>,
    /// Give it the `mcp` scope: it may use the front door's `/mcp` (tasks run by agents, the
    /// fleet, the shared memory's user namespaces). Without it the key reaches models only.
    #[arg(long)]
    mcp: bool,
    /// Print JSON (`{"name", "key", ...}`) instead of text.
    #[arg(long)]
    json: bool,
}

/// A new key: the prefix and 32 random bytes in hex.
fn new_key() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| anyhow!("cannot read the system's random numbers: {e}"))?;
    Ok(format!("{KEY_PREFIX}{}", hex::encode(bytes)))
}

fn policy_json(policy: Option<&pb::KeyPolicy>) -> Value {
    let policy = policy.cloned().unwrap_or_default();
    json!({
        "models": policy.models,
        "roles": policy.roles,
        "max_tokens_per_day": policy.max_tokens_per_day,
        "max_tokens_per_month": policy.max_tokens_per_month,
        "requests_per_minute": policy.requests_per_minute,
        "tokens_per_minute": policy.tokens_per_minute,
        "mcp": policy.mcp,
    })
}

fn info_json(key: &pb::KeyInfo) -> Value {
    json!({
        "name": key.name,
        "source": key.source,
        "policy": policy_json(key.policy.as_ref()),
        "created_ms": key.created_ms,
    })
}

fn models_json(models: &[pb::ModelUsage]) -> Value {
    models
        .iter()
        .map(|m| {
            (
                m.model.clone(),
                json!({
                    "requests": m.requests,
                    "prompt_tokens": m.prompt_tokens,
                    "completion_tokens": m.completion_tokens,
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn usage_json(usage: &pb::KeyUsage) -> Value {
    json!({
        "name": usage.name,
        "limits": policy_json(usage.policy.as_ref()),
        "today": models_json(&usage.today),
        "month": models_json(&usage.month),
        "tokens_today": usage.tokens_today,
        "tokens_month": usage.tokens_month,
        "requests_this_minute": usage.requests_this_minute,
        "tokens_this_minute": usage.tokens_this_minute,
        "day_resets_at_ms": usage.day_resets_at_ms,
        "month_resets_at_ms": usage.month_resets_at_ms,
        "minute_resets_at_ms": usage.minute_resets_at_ms,
    })
}

/// `used/limit`, or `used` when there is no limit.
fn of(used: u64, limit: Option<u64>) -> String {
    limit.map_or(used.to_string(), |limit| format!("{used}/{limit}"))
}

/// A policy in one cell.
fn policy_cell(policy: Option<&pb::KeyPolicy>) -> String {
    let policy = policy.cloned().unwrap_or_default();
    let mut parts = Vec::new();
    if policy.models.is_empty() && policy.roles.is_empty() {
        parts.push("all models".to_owned());
    } else {
        parts.extend(policy.models.iter().cloned());
        parts.extend(policy.roles.iter().map(|r| format!("role:{r}")));
    }
    for (name, value) in [
        ("tokens/day", policy.max_tokens_per_day),
        ("tokens/month", policy.max_tokens_per_month),
        ("requests/min", policy.requests_per_minute),
        ("tokens/min", policy.tokens_per_minute),
    ] {
        if let Some(value) = value {
            parts.push(format!("{value} {name}"));
        }
    }
    if policy.mcp {
        parts.push("mcp".to_owned());
    }
    parts.join(", ")
}

pub(crate) async fn run(conn: &ConnArgs, command: KeysCommand) -> anyhow::Result<()> {
    let mut client = pb::keys_client::KeysClient::new(channel(conn).await?);
    let fail = |call: &'static str| {
        let node = conn.node.clone();
        move |s: tonic::Status| crate::refused(call, &node, &s)
    };
    match command {
        KeysCommand::Add(args) => {
            let key = new_key()?;
            let policy = pb::KeyPolicy {
                models: args.models,
                roles: args.roles,
                max_tokens_per_day: args.tokens_per_day,
                max_tokens_per_month: args.tokens_per_month,
                requests_per_minute: args.requests_per_minute,
                tokens_per_minute: args.tokens_per_minute,
                mcp: args.mcp,
            };
            let sha256 = hex::encode(Sha256::digest(key.as_bytes()));
            // The operator's own statement of the key, which every node checks before it
            // stores it (none with --insecure, where nobody has a key to sign with).
            let grant = match signer(conn)? {
                Some(signer) => {
                    let statement = KeyStatement {
                        name: args.name.clone(),
                        sha256: sha256.clone(),
                        policy: KeyPolicy::try_from(policy.clone())
                            .map_err(|s| anyhow!("{}", s.message()))?,
                        signed_ms: unix_ms(),
                    };
                    let signed = sign(
                        &signer,
                        StatementKind::KeyAdd,
                        serde_json::to_vec(&statement)?,
                    )
                    .context("sign the key with mesh-cli's key")?;
                    Some(pb::SignedStatement::from(&signed))
                }
                None => None,
            };
            let added = client
                .add(pb::KeyAddRequest {
                    name: args.name,
                    sha256,
                    policy: Some(policy),
                    grant,
                })
                .await
                .map_err(fail("Keys.Add"))?
                .into_inner();
            if added.first {
                eprintln!(
                    "warning: this is the fleet's first front-door key: from now on every node's front door (/v1, /api, /mcp) refuses a request without a key, loopback included, except on a node set with `mesh-cli config set http.loopback_without_key true` (programs on that node's own machine then need none); give the key to every client"
                );
            }
            if args.json {
                let mut out = info_json(&added);
                out["key"] = json!(key);
                out["first"] = json!(added.first);
                out!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                show!(
                    "added key {} ({})\n\n  {key}\n\nthis is the only time it is shown: give it to its user now (Authorization: Bearer <key>, or x-api-key)",
                    added.name,
                    policy_cell(added.policy.as_ref())
                );
            }
        }
        KeysCommand::Rm { name } => {
            client
                .remove(pb::KeyRemoveRequest { name: name.clone() })
                .await
                .map_err(fail("Keys.Remove"))?;
            show!("revoked key {name}; every node refuses it within seconds");
        }
        KeysCommand::List { json } => {
            let keys = client
                .list(pb::KeyListRequest {})
                .await
                .map_err(fail("Keys.List"))?
                .into_inner()
                .keys;
            if json {
                let keys: Vec<Value> = keys.iter().map(info_json).collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "keys": keys }))?
                );
            } else {
                let rows: Vec<[String; 3]> = keys
                    .iter()
                    .map(|k| {
                        [
                            k.name.clone(),
                            k.source.clone(),
                            policy_cell(k.policy.as_ref()),
                        ]
                    })
                    .collect();
                print_table(&["NAME", "SOURCE", "POLICY"], &rows);
            }
        }
        KeysCommand::Usage { json } => {
            let keys = client
                .usage(pb::KeyUsageRequest {})
                .await
                .map_err(fail("Keys.Usage"))?
                .into_inner()
                .keys;
            if json {
                let keys: Vec<Value> = keys.iter().map(usage_json).collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "keys": keys }))?
                );
                return Ok(());
            }
            let mut rows: Vec<[String; 7]> = Vec::new();
            for key in &keys {
                let limits = key.policy.clone().unwrap_or_default();
                rows.push([
                    key.name.clone(),
                    "(all)".into(),
                    key.today
                        .iter()
                        .map(|m| m.requests)
                        .sum::<u64>()
                        .to_string(),
                    of(key.tokens_today, limits.max_tokens_per_day),
                    of(key.tokens_month, limits.max_tokens_per_month),
                    of(key.requests_this_minute, limits.requests_per_minute),
                    of(key.tokens_this_minute, limits.tokens_per_minute),
                ]);
                for model in &key.month {
                    let today = key.today.iter().find(|m| m.model == model.model);
                    rows.push([
                        String::new(),
                        model.model.clone(),
                        today.map_or(0, |m| m.requests).to_string(),
                        today
                            .map_or(0, |m| m.prompt_tokens + m.completion_tokens)
                            .to_string(),
                        (model.prompt_tokens + model.completion_tokens).to_string(),
                        String::new(),
                        String::new(),
                    ]);
                }
            }
            print_table(
                &[
                    "KEY",
                    "MODEL",
                    "REQUESTS TODAY",
                    "TOKENS TODAY",
                    "TOKENS MONTH",
                    "REQUESTS/MIN",
                    "TOKENS/MIN",
                ],
                &rows,
            );
            if keys.is_empty() {
                return Ok(());
            }
            let first = &keys[0];
            let when = |ms: u64| {
                chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(0))
                    .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                    .context("a reset time")
            };
            show!(
                "\nday resets {}, month {}, minute limits {} (tokens include running requests' reservations)",
                when(first.day_resets_at_ms)?,
                when(first.month_resets_at_ms)?,
                when(first.minute_resets_at_ms)?
            );
        }
    }
    Ok(())
}
