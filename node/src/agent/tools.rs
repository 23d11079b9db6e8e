//! The tool table: every tool an agent can call, registered once with its permission tier.
//!
//! Only tools that really work are registered. File tools are confined to the configured roots
//! (`tools.roots`): a path is resolved and canonicalised before use, so `..` and symlinks cannot
//! leave them. Tools return text for the model; `Err` means the call failed (the model sees the
//! message, and the supervisor counts the failure). Tier checks happen before a call, in the
//! supervisor's hooks, not here.

use std::{
    collections::BTreeMap,
    path::{Component, Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mesh_domain::{
    BoxFuture, Lineage, NodeInfo, Requirements, Target, TaskSpec, Tier, ToolSpec, text::truncate,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::{capabilities::Capabilities, memory::Memory, peers::PeerTable};

/// Cap on what one tool returns to the model (and on `shell_exec` output).
pub const MAX_TOOL_OUTPUT: usize = 64 * 1024;

/// A tool.
pub trait Tool: Send + Sync + std::fmt::Debug {
    /// Name, description and argument schema.
    fn spec(&self) -> ToolSpec;
    /// Permission tier.
    fn tier(&self) -> Tier;
    /// Runs the tool with already-parsed JSON arguments.
    fn call<'a>(
        &'a self,
        args: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>>;
    /// The tier this call counts as (default: the tool's tier). `delegate` counts as the tier
    /// of the sub-task it asks for.
    fn effective_tier(&self, _args: &Value) -> Tier {
        self.tier()
    }
}

/// What a tool call knows about the task that makes it.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The task's id.
    pub task_id: String,
    /// The task's spec (tier, lineage, deadline).
    pub spec: TaskSpec,
}

/// Runs sub-tasks on the mesh for the `delegate` tool: routes them like any submitted task and
/// waits for the outcome. Set once the Tasks service exists (it needs the tool table first).
pub trait Mesh: Send + Sync + std::fmt::Debug {
    /// Runs `spec` to an outcome: its output, or why it failed.
    fn run_subtask(&self, spec: TaskSpec) -> BoxFuture<'static, Result<String, String>>;
}

/// Where the `delegate` tool finds the mesh.
pub type MeshSlot = Arc<std::sync::OnceLock<Arc<dyn Mesh>>>;

/// The one table of tools.
#[derive(Debug, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl ToolRegistry {
    /// Registers every tool this node has.
    pub fn new(
        caps: Arc<Capabilities>,
        peers: Arc<PeerTable>,
        roots: Vec<PathBuf>,
        mesh: MeshSlot,
        memory: Arc<Memory>,
    ) -> Self {
        let roots = Arc::new(Roots::new(roots));
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(Delegate { mesh }),
            Arc::new(MemoryGet {
                memory: memory.clone(),
            }),
            Arc::new(MemorySearch {
                memory: memory.clone(),
            }),
            Arc::new(MemoryPut { memory }),
            Arc::new(ListNodes { caps, peers }),
            Arc::new(FileRead {
                roots: roots.clone(),
            }),
            Arc::new(FileWrite {
                roots: roots.clone(),
            }),
            Arc::new(ShellExec { roots }),
        ];
        Self {
            tools: tools
                .into_iter()
                .map(|tool| (tool.spec().name, tool))
                .collect(),
        }
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// Specs of the tools with tier ≤ `tier` and, when `allowed` is given, named in it.
    pub fn specs(&self, tier: Tier, allowed: Option<&[String]>) -> Vec<ToolSpec> {
        self.tools
            .values()
            .filter(|tool| tool.tier() <= tier)
            .map(|tool| tool.spec())
            .filter(|spec| allowed.is_none_or(|names| names.contains(&spec.name)))
            .collect()
    }

    /// Names of all tools.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }
}

/// Directories file tools may use.
#[derive(Debug)]
struct Roots {
    roots: Vec<PathBuf>,
}

impl Roots {
    fn new(roots: Vec<PathBuf>) -> Self {
        for root in &roots {
            if let Err(e) = std::fs::create_dir_all(root) {
                tracing::warn!(root = %root.display(), error = %e, "cannot create tool root");
            }
        }
        Self { roots }
    }

    fn default_dir(&self) -> Result<PathBuf, String> {
        self.roots
            .first()
            .cloned()
            .ok_or_else(|| "no tool roots configured".to_owned())
    }

    /// Resolves `path` (relative to the first root, or absolute) to a location inside a root.
    /// The longest existing ancestor is canonicalised, so symlinks and `..` are followed before
    /// the check; the rest must be plain names.
    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        if path.is_empty() {
            return Err("`path` is empty".into());
        }
        let requested = Path::new(path);
        let joined = if requested.is_absolute() {
            requested.to_path_buf()
        } else {
            self.default_dir()?.join(requested)
        };
        let mut existing = joined.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            let name = existing
                .file_name()
                .ok_or_else(|| format!("`{path}` has no existing parent directory"))?;
            rest.push(name.to_owned());
            existing = existing
                .parent()
                .ok_or_else(|| format!("`{path}` has no existing parent directory"))?;
        }
        let mut resolved = existing
            .canonicalize()
            .map_err(|e| format!("cannot resolve `{path}`: {e}"))?;
        for name in rest.into_iter().rev() {
            if Path::new(&name)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                return Err(format!("`{path}` is not a plain path"));
            }
            resolved.push(name);
        }
        let inside = self.roots.iter().any(|root| {
            root.canonicalize()
                .map(|root| resolved.starts_with(root))
                .unwrap_or(false)
        });
        if inside {
            Ok(resolved)
        } else {
            Err(format!(
                "`{path}` is outside the directories this node allows ({})",
                self.roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// Namespaces the node keeps for itself, which `memory_put` refuses: cron schedules and their
/// firings, and conversation sessions.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    crate::cron::SCHEDULES,
    crate::cron::FIRINGS,
    crate::agent::SESSIONS,
];

/// Writes a file that must not exist yet: `create_new` (O_CREAT|O_EXCL) fails on anything
/// already there, a symlink included, so a link planted beside the target cannot redirect the
/// write outside the roots.
async fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    file.write_all(bytes).await?;
    file.flush().await
}

fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, String> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string argument `{name}`"))
}

fn cap(text: String) -> String {
    if text.len() <= MAX_TOOL_OUTPUT {
        return text;
    }
    format!("{}\n[truncated]", truncate(&text, MAX_TOOL_OUTPUT))
}

/// `list_nodes`: the peer table.
#[derive(Debug)]
struct ListNodes {
    caps: Arc<Capabilities>,
    peers: Arc<PeerTable>,
}

impl Tool for ListNodes {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_nodes".into(),
            description:
                "List the nodes of the mesh with their state, roles, models, GPUs and load.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn call<'a>(
        &'a self,
        _args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let own = self.caps.snapshot();
            let row = |info: &NodeInfo, state: &str| {
                json!({
                    "name": info.name,
                    "state": state,
                    "roles": info.roles,
                    "models": info.models.iter().map(|m| &m.name).collect::<Vec<_>>(),
                    "gpus": info.resources.gpus.iter().map(|g| json!({"name": g.name, "vram_mb": g.vram_mb})).collect::<Vec<_>>(),
                    "load": {"running": info.load.running, "queued": info.load.queued},
                })
            };
            let mut nodes = vec![row(&own, "up")];
            nodes.extend(
                self.peers
                    .snapshot()
                    .iter()
                    .map(|peer| row(&peer.info, peer.state.as_str())),
            );
            Ok(Value::Array(nodes).to_string())
        })
    }
}

/// `file_read`: a file's text.
#[derive(Debug)]
struct FileRead {
    roots: Arc<Roots>,
}

impl Tool for FileRead {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "file_read".into(),
            description: "Read a text file (at most 64 KiB are returned).".into(),
            parameters: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path, relative to the workspace"}},
                "required": ["path"],
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
            let path = self.roots.resolve(str_arg(args, "path")?)?;
            let bytes = tokio::fs::read(&path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            Ok(cap(String::from_utf8_lossy(&bytes).into_owned()))
        })
    }
}

/// `file_write`: writes a file, keeping a backup of the one it replaces.
#[derive(Debug)]
struct FileWrite {
    roots: Arc<Roots>,
}

impl Tool for FileWrite {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "file_write".into(),
            description: "Write a text file; an existing file is kept as <name>.<time>.bak first."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace"},
                    "content": {"type": "string"},
                },
                "required": ["path", "content"],
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
            let path = self.roots.resolve(str_arg(args, "path")?)?;
            let content = str_arg(args, "content")?;
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            let mut note = String::new();
            if path.exists() {
                let stamp = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                let mut backup = path.clone().into_os_string();
                backup.push(format!(".{stamp}.bak"));
                let backup = PathBuf::from(backup);
                let previous = tokio::fs::read(&path)
                    .await
                    .map_err(|e| format!("cannot back up {}: {e}", path.display()))?;
                write_new(&backup, &previous)
                    .await
                    .map_err(|e| format!("cannot back up {}: {e}", path.display()))?;
                note = format!(" (previous version kept as {})", backup.display());
            }
            // Write beside the target and rename, so a crash never leaves half a file.
            let mut temp = path.clone().into_os_string();
            temp.push(format!(".{}.agentmesh-tmp", uuid::Uuid::now_v7().simple()));
            let temp = PathBuf::from(temp);
            write_new(&temp, content.as_bytes())
                .await
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            tokio::fs::rename(&temp, &path)
                .await
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(format!(
                "wrote {} bytes to {}{note}",
                content.len(),
                path.display()
            ))
        })
    }
}

/// `shell_exec`: runs a shell command with a timeout.
#[derive(Debug)]
struct ShellExec {
    roots: Arc<Roots>,
}

impl Tool for ShellExec {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "shell_exec".into(),
            description: "Run a shell command (sh -c). Returns the exit code and the combined stdout and stderr (at most 64 KiB).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout_s": {"type": "integer", "minimum": 1, "maximum": 120, "description": "default 30"},
                    "cwd": {"type": "string", "description": "working directory, default the workspace"},
                },
                "required": ["command"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Shell
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let command = str_arg(args, "command")?;
            let timeout_s = match args.get("timeout_s") {
                None | Some(Value::Null) => 30,
                Some(v) => v
                    .as_u64()
                    .filter(|t| (1..=120).contains(t))
                    .ok_or("`timeout_s` must be an integer from 1 to 120")?,
            };
            let cwd = match args.get("cwd").and_then(Value::as_str) {
                Some(dir) => self.roots.resolve(dir)?,
                None => self.roots.default_dir()?,
            };
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                // Route stderr into stdout inside the shell so the output keeps its order.
                .arg(format!("exec 2>&1\n{command}"))
                .current_dir(&cwd)
                // Not the node's environment (it may hold model API keys): only these.
                .env_clear()
                .envs(
                    SHELL_ENV
                        .iter()
                        .filter_map(|k| Some((k, std::env::var_os(k)?))),
                )
                // Its own process group, so everything it starts can be killed with it.
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start sh: {e}"))?;
            // However the call ends (done, timed out, task cancelled), `sh` and whatever it
            // left running in its group are killed (tokio reaps the dropped child).
            let _group = child
                .id()
                .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
                .map(ProcessGroup);
            let mut stdout = child.stdout.take().ok_or("no stdout pipe")?;
            let run = async {
                let mut output = Vec::new();
                let mut buf = [0u8; 8192];
                let mut truncated = false;
                loop {
                    let n = stdout.read(&mut buf).await.map_err(|e| e.to_string())?;
                    if n == 0 {
                        break;
                    }
                    let room = MAX_TOOL_OUTPUT.saturating_sub(output.len());
                    truncated |= n > room;
                    output.extend_from_slice(&buf[..n.min(room)]);
                }
                let status = child.wait().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((status, output, truncated))
            };
            match tokio::time::timeout(Duration::from_secs(timeout_s), run).await {
                Err(_) => Err(format!(
                    "timed out after {timeout_s} s (the command was killed)"
                )),
                Ok(Err(e)) => Err(e),
                Ok(Ok((status, output, truncated))) => {
                    let result = json!({
                        "exit_code": status.code(),
                        "output": String::from_utf8_lossy(&output),
                        "truncated": truncated,
                    });
                    if status.success() {
                        Ok(result.to_string())
                    } else {
                        Err(result.to_string())
                    }
                }
            }
        })
    }
}

/// The variables of the node's environment that `shell_exec` commands get; no others.
const SHELL_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// A process group, killed (SIGKILL) on drop.
struct ProcessGroup(rustix::process::Pid);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // ESRCH (already gone) is the usual case.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

/// `memory_get`: one value from the shared memory.
#[derive(Debug)]
struct MemoryGet {
    memory: Arc<Memory>,
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
struct MemorySearch {
    memory: Arc<Memory>,
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
struct MemoryPut {
    memory: Arc<Memory>,
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
            // The node's own namespaces: a schedule written here would run its task as a local
            // caller at whatever tier it names, past this task's tier and remote_max_tier.
            if SYSTEM_NAMESPACES.contains(&ns) {
                return Err(format!(
                    "namespace `{ns}` belongs to the node ({}); agents cannot write it (use another namespace)",
                    SYSTEM_NAMESPACES.join(", ")
                ));
            }
            self.memory
                .put(ns, key, Some(value.as_bytes().to_vec()))
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("stored {ns}/{key} ({} bytes)", value.len()))
        })
    }
}

/// `delegate`: runs a sub-task on the mesh and returns its output.
#[derive(Debug)]
struct Delegate {
    mesh: MeshSlot,
}

fn tier_arg(args: &Value) -> Result<Tier, String> {
    match args.get("tier").and_then(Value::as_str) {
        None => Ok(Tier::Read),
        Some(text) => {
            Tier::parse(text).ok_or_else(|| format!("`tier` is `{text}`: use read, write or shell"))
        }
    }
}

impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Run a sub-task on the mesh (wherever it fits best) and get its answer. Name exactly one of role, model or persona.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string"},
                    "role": {"type": "string"},
                    "model": {"type": "string"},
                    "persona": {"type": "string"},
                    "tier": {"type": "string", "enum": ["read", "write", "shell"], "description": "default read; at most this task's tier"},
                    "on": {"type": "string", "description": "a node name"},
                },
                "required": ["prompt"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    fn effective_tier(&self, args: &Value) -> Tier {
        tier_arg(args).unwrap_or(Tier::Shell)
    }

    fn call<'a>(
        &'a self,
        args: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let mesh = self
                .mesh
                .get()
                .cloned()
                .ok_or("the mesh is not ready yet")?;
            let prompt = str_arg(args, "prompt")?.to_owned();
            let pick = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
            let target = match (pick("role"), pick("model"), pick("persona")) {
                (Some(r), None, None) => Target::Role(r),
                (None, Some(m), None) => Target::Model(m),
                (None, None, Some(p)) => Target::Persona(p),
                _ => return Err("name exactly one of `role`, `model` or `persona`".into()),
            };
            let tier = tier_arg(args)?;
            if tier > ctx.spec.tier {
                return Err(format!(
                    "a sub-task may not ask for tier `{tier}`: this task runs at `{}`",
                    ctx.spec.tier
                ));
            }
            let spec = TaskSpec {
                prompt,
                target,
                tier,
                timeout: ctx.spec.timeout,
                max_rounds: None,
                token_budget: ctx.spec.token_budget,
                require: Requirements {
                    on: pick("on"),
                    ..Default::default()
                },
                lineage: Lineage {
                    task_id: None,
                    parent_id: Some(ctx.task_id.clone()),
                    origin: ctx.spec.lineage.origin.clone(),
                    hops: ctx.spec.lineage.hops + 1,
                },
                session: None,
            };
            mesh.run_subtask(spec).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ToolContext {
        ToolContext {
            task_id: "t".into(),
            spec: TaskSpec {
                prompt: String::new(),
                target: Target::Role("chat".into()),
                tier: Tier::Read,
                timeout: None,
                max_rounds: None,
                token_budget: None,
                require: Default::default(),
                lineage: Default::default(),
                session: None,
            },
        }
    }

    fn roots() -> (tempfile::TempDir, Arc<Roots>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Arc::new(Roots::new(vec![dir.path().join("ws")]));
        (dir, roots)
    }

    #[test]
    fn paths_outside_the_roots_are_refused() {
        let (dir, roots) = roots();
        assert!(roots.resolve("notes/a.txt").is_ok());
        assert!(roots.resolve("../escape.txt").is_err());
        assert!(roots.resolve("a/../../escape.txt").is_err());
        assert!(roots.resolve("/etc/passwd").is_err());
        std::os::unix::fs::symlink("/etc", dir.path().join("ws/etc-link")).expect("symlink");
        assert!(
            roots.resolve("etc-link/passwd").is_err(),
            "symlinks are followed before the check"
        );
    }

    #[tokio::test]
    async fn file_write_keeps_a_backup_and_file_read_reads_back() {
        let (_dir, roots) = roots();
        let write = FileWrite {
            roots: roots.clone(),
        };
        let read = FileRead {
            roots: roots.clone(),
        };
        write
            .call(&json!({"path": "a.txt", "content": "one"}), &ctx())
            .await
            .expect("first write");
        let note = write
            .call(&json!({"path": "a.txt", "content": "two"}), &ctx())
            .await
            .expect("second write");
        assert!(note.contains(".bak"), "{note}");
        assert_eq!(
            read.call(&json!({"path": "a.txt"}), &ctx())
                .await
                .expect("read"),
            "two"
        );
        let backups: Vec<_> = std::fs::read_dir(roots.default_dir().expect("dir"))
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bak"))
            .collect();
        assert_eq!(backups.len(), 1);
        assert_eq!(
            std::fs::read_to_string(backups[0].path()).expect("backup"),
            "one"
        );
    }

    #[tokio::test]
    async fn memory_put_refuses_the_nodes_own_namespaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::storage::SledStore::new(sled::open(dir.path()).expect("db"));
        let (memory, _writes) = crate::memory::Memory::open(
            Arc::new(store),
            mesh_domain::NodeId::from_spki_der(b"me"),
            crate::memory::MemoryOptions::default(),
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

    #[tokio::test]
    async fn a_symlink_planted_beside_the_target_cannot_redirect_a_write() {
        let (dir, roots) = roots();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "untouched").expect("outside");
        let ws = roots.default_dir().expect("dir");
        // The names a write used to put beside its target, and a backup-like name.
        for planted in ["a.txt.agentmesh-tmp", "b.txt.agentmesh-tmp"] {
            std::os::unix::fs::symlink(&outside, ws.join(planted)).expect("symlink");
        }
        let write = FileWrite {
            roots: roots.clone(),
        };
        write
            .call(&json!({"path": "a.txt", "content": "new"}), &ctx())
            .await
            .expect("write");
        assert_eq!(
            std::fs::read_to_string(&outside).expect("read"),
            "untouched"
        );
        assert!(
            !std::fs::symlink_metadata(ws.join("a.txt"))
                .expect("a.txt")
                .file_type()
                .is_symlink(),
            "the target is a plain file"
        );
        // write_new itself refuses anything already there, a symlink included.
        let planted = ws.join("b.txt.agentmesh-tmp");
        assert!(write_new(&planted, b"x").await.is_err());
        assert_eq!(
            std::fs::read_to_string(&outside).expect("read"),
            "untouched"
        );
    }

    #[tokio::test]
    async fn shell_exec_reports_exit_code_output_and_timeouts() {
        let (_dir, roots) = roots();
        let shell = ShellExec { roots };
        let ok = shell
            .call(&json!({"command": "echo out; echo err >&2"}), &ctx())
            .await
            .expect("success");
        let ok: Value = serde_json::from_str(&ok).expect("json");
        assert_eq!(ok["exit_code"], 0);
        assert_eq!(ok["output"], "out\nerr\n");
        let failed = shell
            .call(&json!({"command": "exit 3"}), &ctx())
            .await
            .expect_err("exit 3");
        assert!(failed.contains("\"exit_code\":3"), "{failed}");
        let slow = shell
            .call(&json!({"command": "sleep 5", "timeout_s": 1}), &ctx())
            .await
            .expect_err("timeout");
        assert!(slow.contains("timed out after 1 s"), "{slow}");
        assert!(
            shell
                .call(&json!({"command": "true", "timeout_s": 0}), &ctx())
                .await
                .is_err()
        );
        assert!(
            shell
                .call(&json!({"command": "true", "timeout_s": 121}), &ctx())
                .await
                .is_err()
        );
        let big = shell
            .call(
                &json!({"command": "head -c 200000 /dev/zero | tr '\\0' x"}),
                &ctx(),
            )
            .await
            .expect("big output");
        let big: Value = serde_json::from_str(&big).expect("json");
        assert_eq!(big["truncated"], true);
        assert_eq!(big["output"].as_str().expect("text").len(), MAX_TOOL_OUTPUT);
    }

    #[tokio::test]
    async fn shell_exec_kills_what_the_command_started_and_keeps_the_node_environment_out() {
        let (dir, roots) = roots();
        let shell = ShellExec { roots };
        let pidfile = dir.path().join("bg.pid");
        let slow = shell
            .call(
                &json!({
                    "command": format!("sleep 60 & echo $! > {}; wait", pidfile.display()),
                    "timeout_s": 1,
                }),
                &ctx(),
            )
            .await
            .expect_err("timeout");
        assert!(slow.contains("timed out"), "{slow}");
        let pid = std::fs::read_to_string(&pidfile).expect("pid file");
        let stat = format!("/proc/{}/stat", pid.trim());
        // SIGKILL is delivered at once; the orphan is reaped by init soon after (poll with a
        // deadline for it to be gone or a zombie).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match std::fs::read_to_string(&stat) {
                Err(_) => break,
                Ok(s) if s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')) => break,
                Ok(s) => assert!(
                    std::time::Instant::now() < deadline,
                    "the background sleep survived the timeout: {s}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // poll interval
        }

        let env = shell
            .call(&json!({"command": "env"}), &ctx())
            .await
            .expect("env");
        let env: Value = serde_json::from_str(&env).expect("json");
        let names: Vec<&str> = env["output"]
            .as_str()
            .expect("text")
            .lines()
            .filter_map(|l| l.split('=').next())
            .collect();
        assert!(names.contains(&"PATH"), "{names:?}");
        for name in names {
            assert!(
                SHELL_ENV.contains(&name) || ["PWD", "SHLVL", "_", "OLDPWD"].contains(&name),
                "the node's {name} reached the command"
            );
        }
    }
}
