//! Memory tools: `memory_get`, `memory_search` (read) and `memory_put` (write) on the fleet's
//! shared memory. `memory_put` refuses the node's own namespaces.

use std::sync::Arc;

use mesh_domain::{BoxFuture, Tier, ToolSpec};
use serde_json::{Value, json};

use crate::{
    agent::tools::framework::{Tool, ToolContext, cap, str_arg},
    memory::{Memory, writable_by_callers},
};

/// `memory_get`: one value from the shared memory.
#[derive(Debug)]
pub(crate) struct MemoryGet {
    pub(crate) memory: Arc<Memory>,
}

impl Tool for MemoryGet {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_get".into(),
            description: "Read one value from the fleet's shared memory.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"namespace": {"type": "string"}, "key": {"type": "string"}},
                "required": ["namespace", "key"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let (ns, key) = (str_arg(args, "namespace")?, str_arg(args, "key")?);
            match self.memory.get(ns, key).map_err(|e| e.to_string())? {
                Some(record) if !record.tombstone => {
                    Ok(cap(String::from_utf8_lossy(&record.value).into_owned()))
                }
                _ => Err(format!("no key `{key}` in namespace `{ns}`")),
            }
        })
    }
}

/// `memory_search`: keys of a namespace by prefix and/or substring.
#[derive(Debug)]
pub(crate) struct MemorySearch {
    pub(crate) memory: Arc<Memory>,
}

impl Tool for MemorySearch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_search".into(),
            description: "Search the fleet's shared memory: entries of a namespace whose key starts with `prefix` and whose key or value contains `contains` (both optional).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string"},
                    "prefix": {"type": "string"},
                    "contains": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                "required": ["namespace"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let ns = str_arg(args, "namespace")?;
            let prefix = args.get("prefix").and_then(Value::as_str).unwrap_or("");
            let contains = args.get("contains").and_then(Value::as_str).unwrap_or("");
            let limit = args
                .get("limit")
                .and_then(Value::as_u64)
                .unwrap_or(20)
                .min(100) as usize;
            let entries = self
                .memory
                .list(ns, prefix, 10_000)
                .map_err(|e| e.to_string())?;
            let hits: Vec<Value> = entries
                .into_iter()
                .filter(|e| {
                    contains.is_empty()
                        || e.key.contains(contains)
                        || String::from_utf8_lossy(&e.record.value).contains(contains)
                })
                .take(limit)
                .map(|e| json!({"key": e.key, "value": String::from_utf8_lossy(&e.record.value)}))
                .collect();
            Ok(cap(Value::Array(hits).to_string()))
        })
    }
}

/// `memory_put`: writes a value to the shared memory.
#[derive(Debug)]
pub(crate) struct MemoryPut {
    pub(crate) memory: Arc<Memory>,
}

impl Tool for MemoryPut {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_put".into(),
            description: "Store a value in the fleet's shared memory (every node will know it)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string"},
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                },
                "required": ["namespace", "key", "value"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Write
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let (ns, key) = (str_arg(args, "namespace")?, str_arg(args, "key")?);
            let value = str_arg(args, "value")?;
            // The node's own namespaces: only their own services write them.
            writable_by_callers(ns).map_err(|e| e.to_string())?;
            self.memory
                .put(ns, key, Some(value.as_bytes().to_vec()))
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("stored {ns}/{key} ({} bytes)", value.len()))
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::keys::SYSTEM_NAMESPACES;

    use super::*;
    use crate::{
        agent::tools::framework::test_support::ctx, memory::MemoryOptions, storage::SledStore,
    };

    #[tokio::test]
    async fn memory_put_refuses_the_nodes_own_namespaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(mesh_identity::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_identity::OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        let put = MemoryPut {
            memory: memory.clone(),
        };
        let schedule = r#"{"name": "x", "expression": "* * * * *", "task": {"tier": "shell"}}"#;
        for ns in SYSTEM_NAMESPACES {
            let refused = put
                .call(
                    &json!({"namespace": ns, "key": "x", "value": schedule}),
                    &ctx(),
                )
                .await
                .expect_err("a system namespace is refused");
            assert!(refused.contains("belongs to the node"), "{refused}");
            assert!(memory.get(ns, "x").expect("get").is_none());
        }
        put.call(
            &json!({"namespace": "notes", "key": "x", "value": "fine"}),
            &ctx(),
        )
        .await
        .expect("an ordinary namespace is written");
    }
}
