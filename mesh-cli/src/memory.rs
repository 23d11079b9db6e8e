//! `mesh-cli memory`: read and write the fleet's shared memory.

use std::io::Write;

use anyhow::{Context, anyhow};
use clap::Subcommand;
use mesh_proto::v1 as pb;
use serde_json::json;

use crate::{ConnArgs, channel, print_table};

#[derive(Debug, Subcommand)]
pub(crate) enum MemoryCommand {
    /// Store a value (durable on the node before this returns; replicated to the fleet).
    Put {
        /// Namespace, e.g. `notes`.
        namespace: String,
        /// The key within the namespace (1-512 bytes).
        #[arg(id = "memory_key", value_name = "KEY")]
        key: String,
        /// The value (or use --file).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
    /// Print a value alone (exit 1 when the key is absent or deleted).
    Get {
        /// The namespace, e.g. `notes` (letters, digits, `-`, `_`, `.`).
        namespace: String,
        /// The key within the namespace (1-512 bytes).
        #[arg(id = "memory_key", value_name = "KEY")]
        key: String,
        /// Print the whole record (timestamp, origin, sequence) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a key (a tombstone, replicated like any write).
    Rm {
        /// The namespace, e.g. `notes` (letters, digits, `-`, `_`, `.`).
        namespace: String,
        /// The key within the namespace (1-512 bytes).
        #[arg(id = "memory_key", value_name = "KEY")]
        key: String,
    },
    /// List keys of a namespace, with who wrote each; without a namespace, the namespaces.
    Ls {
        /// The namespace, e.g. `notes` (letters, digits, `-`, `_`, `.`). Without it: the
        /// namespaces the node holds, each `shared`, `local` or `system`.
        namespace: Option<String>,
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many (the node also cuts an answer at 4 MiB of keys and values).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue after this key: the one a cut answer names.
        #[arg(long, default_value = "")]
        after: String,
        /// Print JSON (`{"records": [...], "next_after"}`: `next_after` is the key to continue
        /// after, null when nothing is left; without a namespace, `{"namespaces": [...]}`).
        #[arg(long)]
        json: bool,
    },
}

/// A record as `--json` prints it; `origin_name` is the writer's name where the node knows it.
fn record_json(r: &pb::MemoryRecord, names: &[(String, String)]) -> serde_json::Value {
    json!({
        "namespace": r.namespace,
        "key": r.key,
        "value": String::from_utf8_lossy(&r.value),
        "hlc": r.hlc,
        "origin": r.origin,
        "origin_name": name_of(&r.origin, names),
        "seq": r.seq,
        "tombstone": r.tombstone,
    })
}

/// The name of node `id` among `names` (id, name), if known.
fn name_of<'a>(id: &str, names: &'a [(String, String)]) -> Option<&'a str> {
    names
        .iter()
        .find(|(known, _)| known == id)
        .map(|(_, name)| name.as_str())
}

pub(crate) async fn run(conn: &ConnArgs, command: MemoryCommand) -> anyhow::Result<()> {
    // Names of the writers for `WRITTEN BY`; without them (an old node), the short ids.
    let names = match &command {
        MemoryCommand::Get { json: true, .. } | MemoryCommand::Ls { .. } => {
            crate::nodes::names(conn).await.unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let mut client = pb::memory_client::MemoryClient::new(channel(conn).await?)
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(8 * 1024 * 1024);
    let fail = |s: tonic::Status| anyhow!("{}", s.message());
    match command {
        MemoryCommand::Put {
            namespace,
            key,
            value,
            file,
        } => {
            let value = match (value, file) {
                (Some(v), _) => v.into_bytes(),
                (None, Some(path)) => {
                    std::fs::read(&path).with_context(|| format!("read {}", path.display()))?
                }
                (None, None) => return Err(anyhow!("give a VALUE or --file")),
            };
            client
                .put(pb::MemoryPutRequest {
                    namespace,
                    key,
                    value,
                })
                .await
                .map_err(fail)?;
        }
        MemoryCommand::Get {
            namespace,
            key,
            json,
        } => {
            let record = client
                .get(pb::MemoryGetRequest {
                    namespace: namespace.clone(),
                    key: key.clone(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .record;
            match record {
                Some(r) if json => out!(
                    "{}",
                    serde_json::to_string_pretty(&record_json(&r, &names))?
                ),
                Some(r) if !r.tombstone => {
                    let mut out = std::io::stdout();
                    // The exact bytes into a pipe or a file; on a terminal, the value (which
                    // an agent may have written) as text with its control characters escaped.
                    if std::io::IsTerminal::is_terminal(&out) {
                        let text = String::from_utf8_lossy(&r.value);
                        out.write_all(crate::shown(&text).as_bytes())?;
                        if !r.value.ends_with(b"\n") {
                            out.write_all(b"\n")?;
                        }
                    } else {
                        out.write_all(&r.value)?;
                    }
                }
                _ => return Err(anyhow!("no key `{key}` in namespace `{namespace}`")),
            }
        }
        MemoryCommand::Rm { namespace, key } => {
            client
                .delete(pb::MemoryDeleteRequest { namespace, key })
                .await
                .map_err(fail)?;
        }
        MemoryCommand::Ls {
            namespace: None,
            json,
            ..
        } => {
            let namespaces = client
                .namespaces(pb::MemoryNamespacesRequest {})
                .await
                .map_err(fail)?
                .into_inner()
                .namespaces;
            if json {
                let list: Vec<_> = namespaces
                    .iter()
                    .map(|n| json!({"name": n.name, "kind": n.kind}))
                    .collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "namespaces": list }))?
                );
            } else {
                let rows: Vec<[String; 2]> =
                    namespaces.into_iter().map(|n| [n.name, n.kind]).collect();
                print_table(&["NAMESPACE", "KIND"], &rows);
            }
        }
        MemoryCommand::Ls {
            namespace: Some(namespace),
            prefix,
            limit,
            after,
            json,
        } => {
            let answer = client
                .list(pb::MemoryListRequest {
                    namespace,
                    prefix,
                    limit,
                    after,
                })
                .await
                .map_err(fail)?
                .into_inner();
            let records = answer.records;
            let next_after = Some(answer.next_after).filter(|key| !key.is_empty());
            if json {
                let list: Vec<_> = records.iter().map(|r| record_json(r, &names)).collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(
                        &json!({ "records": list, "next_after": next_after })
                    )?
                );
            } else {
                let rows: Vec<[String; 3]> = records
                    .iter()
                    .map(|r| {
                        let value: String =
                            String::from_utf8_lossy(&r.value).chars().take(60).collect();
                        [
                            r.key.clone(),
                            value.replace('\n', " "),
                            name_of(&r.origin, &names)
                                .map_or_else(|| r.origin.chars().take(12).collect(), str::to_owned),
                        ]
                    })
                    .collect();
                print_table(&["KEY", "VALUE", "WRITTEN BY"], &rows);
                if let Some(key) = next_after {
                    eshow!(
                        "cut after {} records: more keys match; continue with --after {key}",
                        records.len()
                    );
                }
            }
        }
    }
    Ok(())
}
