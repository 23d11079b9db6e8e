//! The data dir's disk fills up (a 24 MiB tmpfs under the node's data dir). Below the free-space
//! floor the node refuses writes with `RESOURCE_EXHAUSTED` naming the setting, turns `degraded`
//! and takes writes again once there is room. With the floor off, a write that really meets
//! ENOSPC stops the store (the node turns `unhealthy`, later writes are refused at once rather
//! than hanging) and after the space is freed and the node restarted, every acknowledged write
//! is there. Needs root (mount).

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use mesh_tests::{Harness, NodeOptions, NodeProcess, require_root, wait_for};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);
/// A flush that meets a full disk may take sled's flush deadline (30 s) to give up.
const FAILURE_DEADLINE: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// A tmpfs mounted at a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size_mib: u64) -> Self {
        fs::create_dir_all(dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}", dir.display());
        Self(dir.to_owned())
    }

    fn free(&self) -> u64 {
        let stat = rustix::fs::statvfs(&self.0).expect("statvfs");
        stat.f_bavail * stat.f_frsize
    }

    /// Writes a file of zeros until at most `leave` bytes are free (or the disk is full).
    fn fill(&self, name: &str, leave: u64) -> PathBuf {
        let path = self.0.join(name);
        let mut file = fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 64 * 1024];
        while self.free() > leave {
            let want = (self.free() - leave).min(chunk.len() as u64) as usize;
            if file.write_all(&chunk[..want]).is_err() {
                break;
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn put(h: &Harness, node: &NodeProcess, key: &str, value: &str) -> std::process::Output {
    h.cli(node, &["memory", "put", "notes", key, value])
        .expect("cli")
}

fn health(h: &Harness, node: &NodeProcess) -> Option<(String, Vec<String>)> {
    let status = h.status(node).ok()?;
    let me = status["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == node.name.as_str())?
        .clone();
    let reasons = me["health"]["reasons"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    Some((me["health"]["status"].as_str()?.to_owned(), reasons))
}

fn wait_health(h: &Harness, node: &NodeProcess, want: &str, reason: &str, deadline: Duration) {
    wait_for(&format!("{} to be {want}", node.name), deadline, || {
        let (status, reasons) = health(h, node)?;
        (status == want && reasons.iter().any(|r| r.contains(reason))).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: last seen {:?}", health(h, node)));
}

#[test]
fn a_full_disk_refuses_writes_clearly_degrades_the_node_and_loses_nothing() {
    require_root();
    let h = Harness::new().expect("harness");
    let disk = Tmpfs::mount(&h.path().join("data-solo"), 24);
    let options = NodeOptions::new("solo").node_key("min_free_disk_mb = 8");
    let mut node = h.spawn(options).expect("node");
    let mut acked = Vec::new();
    for i in 0..20 {
        let key = format!("before-{i}");
        assert!(put(&h, &node, &key, "v").status.success(), "put {key}");
        acked.push(key);
    }

    // Below the floor: refused with the setting named, degraded, reads go on.
    let filler = disk.fill("filler", 4 * MIB);
    let refused = put(&h, &node, "refused", "v");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a put below the floor succeeded");
    assert!(
        stderr.contains("disk full") && stderr.contains("node.min_free_disk_mb"),
        "{stderr}"
    );
    wait_health(&h, &node, "degraded", "disk full", DEADLINE);
    let read = h
        .cli(&node, &["memory", "get", "notes", "before-0"])
        .expect("get");
    assert!(read.status.success(), "reads go on below the floor");

    // Room again: writes resume by themselves.
    fs::remove_file(&filler).expect("free space");
    wait_for("writes to resume", DEADLINE, || {
        put(&h, &node, "after-room", "v")
            .status
            .success()
            .then_some(())
    })
    .expect("resume");
    acked.push("after-room".into());
    wait_for("the disk reason to clear", DEADLINE, || {
        let (_, reasons) = health(&h, &node)?;
        (!reasons.iter().any(|r| r.starts_with("disk"))).then_some(())
    })
    .expect("healthy again");

    // The floor off and the disk really full: the store stops, writes fail fast, nothing hangs.
    node.signal("TERM").expect("sigterm");
    assert_eq!(node.wait_exit(DEADLINE).expect("exit"), Some(0));
    let mut node = h
        .spawn(NodeOptions::new("solo").node_key("min_free_disk_mb = 0"))
        .expect("restart without a floor");
    let _filler = disk.fill("filler", 0);
    let big = h.path().join("big-value");
    fs::write(&big, "x".repeat(256 * 1024)).expect("value file");
    let failed = wait_for("a write to meet the full disk", FAILURE_DEADLINE, || {
        let key = format!("big-{}", acked.len());
        let output = h
            .cli(
                &node,
                &[
                    "memory",
                    "put",
                    "notes",
                    &key,
                    "--file",
                    &big.to_string_lossy(),
                ],
            )
            .expect("cli");
        if output.status.success() {
            acked.push(key);
            return None;
        }
        Some(String::from_utf8_lossy(&output.stderr).into_owned())
    })
    .expect("the disk fills");
    assert!(
        failed.contains("No space left on device") || failed.contains("did not finish"),
        "{failed}"
    );
    assert!(failed.contains("restart the node"), "{failed}");
    eprintln!("the write that met the full disk: {failed}");
    wait_health(&h, &node, "unhealthy", "restart the node", FAILURE_DEADLINE);
    let again = put(&h, &node, "after-failure", "v");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && stderr.contains("restart the node"),
        "{stderr}"
    );

    // Free the space and restart: every acknowledged write is there.
    fs::remove_file(disk.0.join("filler")).expect("free space");
    node.signal("TERM").expect("sigterm");
    node.wait_exit(DEADLINE)
        .unwrap_or_else(|e| panic!("a node whose store failed must still stop on SIGTERM: {e}"));
    let node = h
        .spawn(NodeOptions::new("solo").node_key("min_free_disk_mb = 8"))
        .expect("restart");
    let listed = h
        .cli(
            &node,
            &["memory", "ls", "notes", "--limit", "10000", "--json"],
        )
        .expect("ls");
    let list: Value = serde_json::from_slice(&listed.stdout).expect("json");
    let stored: Vec<&str> = list["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["key"].as_str())
        .collect();
    for key in &acked {
        assert!(
            stored.contains(&key.as_str()),
            "acknowledged {key} was lost"
        );
    }
    assert!(
        put(&h, &node, "after-restart", "v").status.success(),
        "writes after the restart"
    );
}
