//! `shell_exec`: a shell command with a timeout (1-120 s), in a working directory inside the
//! roots, with a cleared environment, its own process group (killed with everything it started
//! when the call ends), its exit code and its combined output, capped.

use std::{process::Stdio, sync::Arc, time::Duration};

use mesh_domain::{Tier, ToolSpec};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::{
    agent::tools::{
        framework::{MAX_TOOL_OUTPUT, Tool, ToolContext, ToolError, str_arg},
        roots::Roots,
    },
    process::ProcessGroup,
};

/// `shell_exec`: runs a shell command with a timeout.
#[derive(Debug)]
pub(crate) struct ShellExec {
    pub(crate) roots: Arc<Roots>,
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

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let command = str_arg(args, "command")?;
        let timeout_s = match args.get("timeout_s") {
            None | Some(Value::Null) => 30,
            Some(v) => v
                .as_u64()
                .filter(|t| (1..=120).contains(t))
                .ok_or_else(|| {
                    ToolError::Arguments("`timeout_s` must be an integer from 1 to 120".into())
                })?,
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
            .map_err(|source| ToolError::Io {
                what: "cannot start sh".into(),
                source,
            })?;
        // However the call ends (done, timed out, task cancelled), `sh` and whatever it
        // left running in its group are killed (tokio reaps the dropped child).
        let _group = ProcessGroup::of(&child);
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| ToolError::Failed("no stdout pipe".into()))?;
        let run = async {
            let mut output = Vec::new();
            let mut buf = [0u8; 8192];
            let mut truncated = false;
            loop {
                let n = stdout
                    .read(&mut buf)
                    .await
                    .map_err(|source| ToolError::Io {
                        what: "read the command's output".into(),
                        source,
                    })?;
                if n == 0 {
                    break;
                }
                let room = MAX_TOOL_OUTPUT.saturating_sub(output.len());
                truncated |= n > room;
                output.extend_from_slice(&buf[..n.min(room)]);
            }
            let status = child.wait().await.map_err(|source| ToolError::Io {
                what: "wait for the command".into(),
                source,
            })?;
            Ok::<_, ToolError>((status, output, truncated))
        };
        match tokio::time::timeout(Duration::from_secs(timeout_s), run).await {
            Err(_) => Err(ToolError::TimedOut(timeout_s)),
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
                    Err(ToolError::Failed(result.to_string()))
                }
            }
        }
    }
}

/// The variables of the node's environment that `shell_exec` commands get; no others.
const SHELL_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tools::{framework::test_support::ctx, roots::test_support::roots};

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
        let failed = failed.to_string();
        assert!(failed.contains("\"exit_code\":3"), "{failed}");
        let slow = shell
            .call(&json!({"command": "sleep 5", "timeout_s": 1}), &ctx())
            .await
            .expect_err("timeout");
        let slow = slow.to_string();
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
        let slow = slow.to_string();
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
