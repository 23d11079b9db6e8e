//! Memory tools: `memory_get`, `memory_search` (read) and `memory_put` (write) on the fleet's
//! shared memory. `memory_put` refuses the node's own namespaces. Each answer is made once, by
//! [`get`], [`search_text`] and [`put`], which the front door's `/mcp` reaches through the
//! gateway's `MeshData` port (`super::data`).

use std::sync::Arc;

use mesh_domain::{Tier, ToolSpec, text::truncate};
use serde_json::{Value, json};

use crate::{
    agent::tools::framework::{Tool, ToolContext, ToolError, cap, str_arg},
    gateway::{MemoryQuery, MeshDataError},
    memory::{Memory, readable_by_callers, writable_by_callers},
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

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let (ns, key) = (str_arg(args, "namespace")?, str_arg(args, "key")?);
        Ok(get(&self.memory, ns, key)?)
    }
}

/// `memory_get`'s answer: the value of `ns`/`key` as text, cut to the tools' output cap.
pub(crate) fn get(memory: &Memory, ns: &str, key: &str) -> Result<String, MeshDataError> {
    readable_by_callers(ns)?;
    match memory.get(ns, key)? {
        Some(record) if !record.tombstone => {
            Ok(cap(String::from_utf8_lossy(&record.value).into_owned()))
        }
        _ => Err(MeshDataError::NoKey {
            namespace: ns.to_owned(),
            key: key.to_owned(),
        }),
    }
}

/// Most bytes of hits one `memory_search` answer carries: the model's context pays for them.
const SEARCH_BYTES: usize = 32 * 1024;
/// Most bytes of one value in a hit; a longer value is cut (`memory_get` reads more of it).
const HIT_VALUE_BYTES: usize = 2 * 1024;
/// Most keys one search looks at, so a search for a rare word in a huge namespace ends.
const SEARCH_SCAN: usize = 10_000;
/// Keys read from the store at once while searching (and at most 1 MiB of them).
const SEARCH_PAGE: usize = 256;

/// `memory_search`: keys of a namespace by prefix and/or substring.
#[derive(Debug)]
pub(crate) struct MemorySearch {
    pub(crate) memory: Arc<Memory>,
}

impl Tool for MemorySearch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_search".into(),
            description: "Search the fleet's shared memory: entries of a namespace whose key starts with `prefix` and whose key or value contains `contains` (both optional), in key order. A long answer is cut and says which `after` key continues it.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string"},
                    "prefix": {"type": "string"},
                    "contains": {"type": "string"},
                    "after": {"type": "string", "description": "continue after this key"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                "required": ["namespace"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let text = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let query = MemoryQuery {
            namespace: str_arg(args, "namespace")?.to_owned(),
            prefix: text("prefix"),
            contains: text("contains"),
            after: text("after"),
            limit: args.get("limit").and_then(Value::as_u64),
        };
        Ok(search_text(&self.memory, &query)?)
    }
}

/// `memory_search`'s answer: the entries of `query` as a JSON list, and where to continue when
/// it was cut.
pub(crate) fn search_text(memory: &Memory, query: &MemoryQuery) -> Result<String, MeshDataError> {
    let ns = query.namespace.as_str();
    readable_by_callers(ns)?;
    let limit = query.limit.unwrap_or(20).clamp(1, 100) as usize;
    let found = search(
        memory,
        ns,
        &query.prefix,
        &query.contains,
        &query.after,
        limit,
    )?;
    let mut answer = Value::Array(found.hits).to_string();
    if let Some((why, after)) = found.cut {
        answer.push_str(&format!(
            "\n[cut: {why}; more entries may match: call memory_search again with \"after\": {}]",
            Value::String(after)
        ));
    }
    Ok(answer)
}

/// What one search found.
struct Found {
    /// `{"key", "value"}` objects (a value cut to [`HIT_VALUE_BYTES`] also has `"value_cut"`).
    hits: Vec<Value>,
    /// When the search stopped before the end: why, and the key to continue after.
    cut: Option<(String, String)>,
}

/// Reads `ns` page by page from after `after`, keeping the entries that match, until `limit`
/// hits, [`SEARCH_BYTES`] of them or [`SEARCH_SCAN`] keys looked at: the memory held and the
/// answer are bounded whatever the namespace holds.
fn search(
    memory: &Memory,
    ns: &str,
    prefix: &str,
    contains: &str,
    after: &str,
    limit: usize,
) -> Result<Found, crate::memory::MemoryError> {
    let mut found = Found {
        hits: Vec::new(),
        cut: None,
    };
    let (mut bytes, mut scanned, mut last) = (0, 0, after.to_owned());
    loop {
        let page = memory.page(ns, prefix, &last, SEARCH_PAGE, 1024 * 1024)?;
        for entry in page.entries {
            if scanned == SEARCH_SCAN {
                found.cut = Some((format!("looked at {SEARCH_SCAN} keys"), last));
                return Ok(found);
            }
            scanned += 1;
            let value = String::from_utf8_lossy(&entry.record.value);
            if contains.is_empty() || entry.key.contains(contains) || value.contains(contains) {
                let mut hit = json!({"key": entry.key, "value": truncate(&value, HIT_VALUE_BYTES)});
                if value.len() > HIT_VALUE_BYTES {
                    hit["value_cut"] = Value::Bool(true);
                }
                let size = hit.to_string().len();
                if found.hits.len() == limit {
                    found.cut = Some((format!("{limit} entries (the limit)"), last));
                    return Ok(found);
                }
                if bytes + size > SEARCH_BYTES {
                    let why = format!(
                        "{} entries, the {SEARCH_BYTES}-byte budget",
                        found.hits.len()
                    );
                    found.cut = Some((why, last));
                    return Ok(found);
                }
                bytes += size;
                found.hits.push(hit);
            }
            last = entry.key;
        }
        if page.next_after.is_none() {
            return Ok(found);
        }
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

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let (ns, key) = (str_arg(args, "namespace")?, str_arg(args, "key")?);
        let value = str_arg(args, "value")?;
        Ok(put(&self.memory, ns, key, value).await?)
    }
}

/// `memory_put`: writes `value` to `ns`/`key`, durably, and says what it stored.
pub(crate) async fn put(
    memory: &Memory,
    ns: &str,
    key: &str,
    value: &str,
) -> Result<String, MeshDataError> {
    // The node's own namespaces: only their own services write them.
    writable_by_callers(ns)?;
    memory.put(ns, key, Some(value.as_bytes().to_vec())).await?;
    Ok(format!("stored {ns}/{key} ({} bytes)", value.len()))
}

#[cfg(test)]
mod tests {
    use mesh_domain::keys::SYSTEM_NAMESPACES;

    use super::*;
    use crate::{
        agent::tools::framework::test_support::ctx, memory::MemoryOptions, storage::SledStore,
    };

    fn memory() -> (tempfile::TempDir, Arc<Memory>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = Memory::open(
            Arc::new(store),
            Arc::new(mesh_cert::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_cert::OriginVerifier::self_certified()),
            MemoryOptions::default(),
        );
        (dir, memory)
    }

    /// `memory_search` over a namespace larger than its budget answers at most the budget,
    /// tells the model it was cut and where to continue, and continuing finds the rest; a huge
    /// value comes back cut and marked.
    #[tokio::test]
    async fn memory_search_stops_at_its_byte_budget_and_says_where_to_continue() {
        let (_dir, memory) = memory();
        let mut want = Vec::new();
        for i in 0..100 {
            let key = format!("k{i:03}");
            let value = format!("needle {}", "v".repeat(1000));
            memory
                .put("notes", &key, Some(value.into_bytes()))
                .await
                .expect("put");
            want.push(key);
        }
        memory
            .put(
                "notes",
                "k999",
                Some(vec![b'h'; mesh_domain::keys::MAX_VALUE]),
            )
            .await
            .expect("put");
        want.push("k999".into());
        let search = MemorySearch { memory };
        let (mut got, mut after, mut answers) = (Vec::new(), String::new(), 0);
        loop {
            let answer = search
                .call(
                    &json!({"namespace": "notes", "limit": 100, "after": after}),
                    &ctx(),
                )
                .await
                .expect("search");
            answers += 1;
            let (hits, note) = answer.split_once('\n').unwrap_or((&answer, ""));
            assert!(
                hits.len() <= SEARCH_BYTES,
                "answer {answers}: {} bytes",
                hits.len()
            );
            let hits: Vec<Value> = serde_json::from_str(hits).expect("a JSON array");
            for hit in &hits {
                let cut = hit.get("value_cut").is_some();
                assert_eq!(cut, hit["key"] == "k999", "{}", hit["key"]);
            }
            got.extend(
                hits.iter()
                    .map(|h| h["key"].as_str().expect("key").to_owned()),
            );
            if note.is_empty() {
                break;
            }
            assert!(note.starts_with("[cut: "), "{note}");
            let (_, rest) = note.split_once("\"after\": ").expect("names the key");
            after = serde_json::from_str(rest.trim_end_matches(']')).expect("a JSON string");
            assert_eq!(Some(&after), got.last(), "{note}");
        }
        assert!(answers >= 3, "the answer was never cut by its byte budget");
        assert_eq!(got, want, "every entry once, in order");
    }

    #[tokio::test]
    async fn memory_put_refuses_the_nodes_own_namespaces() {
        let (_dir, memory) = memory();
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
                .expect_err("a system namespace is refused")
                .to_string();
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

    /// The private namespaces (clients' stored conversations) are not readable by an agent,
    /// whose task may be prompt-injected into asking for them; without the check both tools
    /// return the record.
    #[tokio::test]
    async fn memory_get_and_search_refuse_the_private_namespaces() {
        let (_dir, memory) = memory();
        for ns in mesh_domain::keys::PRIVATE_NAMESPACES {
            memory
                .put(ns, "resp_1", Some(b"a client's conversation".to_vec()))
                .await
                .expect("the node's own service writes it");
            let get = MemoryGet {
                memory: memory.clone(),
            };
            let refused = get
                .call(&json!({"namespace": ns, "key": "resp_1"}), &ctx())
                .await
                .expect_err("get refused")
                .to_string();
            assert!(refused.contains("private"), "{refused}");
            let search = MemorySearch {
                memory: memory.clone(),
            };
            let refused = search
                .call(&json!({"namespace": ns}), &ctx())
                .await
                .expect_err("search refused")
                .to_string();
            assert!(refused.contains("private"), "{refused}");
        }
    }
}
