//! Child processes that never outlive their owner: [`ProcessGroup`] is a child started in a
//! process group of its own (`Command::process_group(0)`), killed with everything it started
//! (SIGKILL to the group) when the owner drops it. The `shell_exec` tool and stdio MCP servers
//! start their children this way, so a command's background jobs or a launcher's own child
//! (`uvx` starts the server as its child) end with the call or the server. This module starts
//! nothing itself.

/// A process group, killed (SIGKILL) on drop.
#[derive(Debug)]
pub(crate) struct ProcessGroup(rustix::process::Pid);

impl ProcessGroup {
    /// The group of `child`, which must have been started with `process_group(0)` (its pid is
    /// its group's id); `None` once the child has been reaped.
    pub(crate) fn of(child: &tokio::process::Child) -> Option<Self> {
        child
            .id()
            .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
            .map(Self)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // ESRCH (already gone) is the usual case.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

#[cfg(test)]
mod tests {
    use std::{process::Stdio, time::Duration};

    use tokio::io::AsyncBufReadExt;

    use super::*;

    /// What the group kills includes what the child started in the background: `sh` prints the
    /// pid of a `sleep` it left running, and after the drop that pid is gone.
    #[tokio::test]
    async fn dropping_the_group_kills_what_the_child_started() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 300 & echo $!; wait"])
            .process_group(0)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("sh");
        let group = ProcessGroup::of(&child).expect("a running child");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let sleeper: i32 = lines
            .next_line()
            .await
            .expect("read")
            .expect("a pid")
            .parse()
            .expect("a number");
        // Running: its /proc entry exists and it is not a zombie (a dead child nobody reaped).
        let running = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
        };
        assert!(running(sleeper));
        drop(group);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while running(sleeper) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the background sleep survived the group"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll interval; deadline above
        }
        child.wait().await.expect("sh ends with its group");
    }
}
