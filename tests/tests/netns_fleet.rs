//! `deploy/netns-fleet.sh`: three hosts in network namespaces on one bridge, finding each other
//! by mDNS. Cutting one host's link partitions it (both sides mark the other down), writes on
//! both sides of the partition converge after the heal, and `down` leaves no namespace behind.
//! Needs root.

use std::{path::PathBuf, process::Command, time::Duration};

use mesh_tests::{require_root, wait_for};
use serde_json::Value;

/// Generous: link-cut detection takes a few seconds by design (suspect, then down).
const DEADLINE: Duration = Duration::from_secs(30);

struct Fleet {
    name: String,
    dir: tempfile::TempDir,
}

impl Fleet {
    /// A fleet whose namespaces are named after `prefix` and this test process (so parallel
    /// tests never share one), with files in a temporary directory. Needs root.
    fn new(prefix: &str) -> Self {
        require_root();
        Self {
            name: format!("{prefix}{}", std::process::id()),
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/netns-fleet.sh")
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        let bins = mesh_tests::bin("mesh-node");
        Command::new(Self::script())
            .args(args)
            .env("FLEET_NAME", &self.name)
            .env("FLEET_DIR", self.dir.path().join("fleet"))
            .env("FLEET_BIN", bins.parent().expect("bin dir"))
            .output()
            .expect("run deploy/netns-fleet.sh")
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "netns-fleet.sh {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The state host `observer` has for host `subject`.
    fn state(&self, observer: usize, subject: usize) -> Option<String> {
        let output = self.run(&["cli", &observer.to_string(), "status", "--json"]);
        let status: Value = serde_json::from_slice(&output.stdout).ok()?;
        status["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == format!("host{subject}"))
            .and_then(|n| n["state"].as_str())
            .map(str::to_owned)
    }

    fn wait_state(&self, observer: usize, subject: usize, want: &str) {
        wait_for(
            &format!("host{observer} to see host{subject} {want}"),
            DEADLINE,
            || (self.state(observer, subject).as_deref() == Some(want)).then_some(()),
        )
        .expect("state");
    }

    fn get(&self, host: usize, key: &str) -> Option<String> {
        let output = self.run(&["cli", &host.to_string(), "memory", "get", "notes", key]);
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

/// A failed test still takes its fleet down.
impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

fn namespaces_named(prefix: &str) -> usize {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with(&format!("{prefix}-")))
        .count()
}

#[test]
fn a_cut_link_partitions_a_host_and_writes_on_both_sides_converge_after_the_heal() {
    let fleet = Fleet::new("amt");
    fleet.ok(&["up", "3"]);
    assert_eq!(namespaces_named(&fleet.name), 4, "a hub and three hosts");
    fleet.ok(&["cli", "1", "memory", "put", "notes", "before", "all"]);

    fleet.ok(&["cut", "2"]);
    fleet.wait_state(1, 2, "down");
    fleet.wait_state(2, 1, "down");
    // Writes on both sides, one key written on both (the later write wins everywhere).
    fleet.ok(&["cli", "1", "memory", "put", "notes", "majority", "1"]);
    fleet.ok(&["cli", "2", "memory", "put", "notes", "minority", "2"]);
    fleet.ok(&["cli", "2", "memory", "put", "notes", "both", "first"]);
    fleet.ok(&["cli", "3", "memory", "put", "notes", "both", "second"]);
    assert_eq!(
        fleet.get(2, "majority"),
        None,
        "the cut host cannot see the others' writes"
    );

    fleet.ok(&["heal", "2"]);
    for host in 1..=3 {
        for other in (1..=3).filter(|o| *o != host) {
            fleet.wait_state(host, other, "up");
        }
    }
    for host in 1..=3 {
        for (key, want) in [
            ("before", "all"),
            ("majority", "1"),
            ("minority", "2"),
            ("both", "second"),
        ] {
            wait_for(
                &format!("host{host} to hold {key} = {want}"),
                DEADLINE,
                || (fleet.get(host, key).as_deref() == Some(want)).then_some(()),
            )
            .expect("converged");
        }
    }

    fleet.ok(&["down"]);
    assert_eq!(
        namespaces_named(&fleet.name),
        0,
        "down removes every namespace"
    );
}

#[test]
fn bad_commands_name_the_problem() {
    let fleet = Fleet::new("amb");
    for (args, want) in [
        (&["up", "0"][..], "give the number of hosts"),
        (&["status"][..], "no fleet"),
        (&["launch"][..], "unknown command"),
    ] {
        let output = fleet.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    // `down` with FLEET_DIR naming a directory the script did not make leaves it alone.
    let mine = fleet.dir.path().join("fleet");
    std::fs::create_dir_all(&mine).expect("dir");
    std::fs::write(mine.join("precious.txt"), "keep").expect("file");
    fleet.ok(&["down"]);
    assert!(
        mine.join("precious.txt").exists(),
        "down removed a directory it did not make"
    );
}

#[test]
fn a_node_that_sleeps_is_marked_down_and_catches_up_when_it_wakes_and_a_slow_link_still_replicates()
{
    let fleet = Fleet::new("ams");
    fleet.ok(&["up", "3"]);
    // host3's link is slow: 256 kbit/s with up to 500 ms of queue (tc tbf in its namespace).
    // (Loss is a_lossy_link_…: netem, which this kernel lacks, is not needed for it.)
    fleet.ok(&[
        "exec", "3", "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "256kbit",
        "burst", "16kbit", "latency", "500ms",
    ]);
    fleet.ok(&["cli", "1", "memory", "put", "notes", "slow", "arrives"]);
    wait_for("host3 to get a write over the slow link", DEADLINE, || {
        (fleet.get(3, "slow").as_deref() == Some("arrives")).then_some(())
    })
    .expect("replicated");

    // host2 sleeps (SIGSTOP): its peers stop hearing it and mark it down.
    fleet.ok(&["kill", "2", "STOP"]);
    fleet.wait_state(1, 2, "down");
    fleet.ok(&[
        "cli",
        "1",
        "memory",
        "put",
        "notes",
        "while-asleep",
        "written",
    ]);
    fleet.ok(&["kill", "2", "CONT"]);
    fleet.wait_state(1, 2, "up");
    wait_for(
        "host2 to catch up on the write made while it slept",
        DEADLINE,
        || (fleet.get(2, "while-asleep").as_deref() == Some("written")).then_some(()),
    )
    .expect("caught up");
    assert_eq!(fleet.get(3, "while-asleep").as_deref(), Some("written"));
}

/// host3 drops 20% of the packets on its link each way, at random (nftables `numgen random` in its
/// namespace; netem is not in this kernel): writes on either side still reach the other, every
/// one of them, through TCP's retransmits and the sync rounds.
#[test]
fn a_lossy_link_still_replicates_every_write_both_ways() {
    let fleet = Fleet::new("aml");
    fleet.ok(&["up", "3"]);
    for rule in [
        "add table inet loss",
        "add chain inet loss in { type filter hook input priority 0; }",
        "add chain inet loss out { type filter hook output priority 0; }",
        "add rule inet loss in iifname eth0 numgen random mod 100 < 20 counter drop",
        "add rule inet loss out oifname eth0 numgen random mod 100 < 20 counter drop",
    ] {
        fleet.ok(&["exec", "3", "nft", rule]);
    }
    const WRITES: usize = 20;
    for i in 0..WRITES {
        fleet.ok(&[
            "cli",
            "1",
            "memory",
            "put",
            "notes",
            &format!("to-lossy-{i}"),
            "v",
        ]);
        fleet.ok(&[
            "cli",
            "3",
            "memory",
            "put",
            "notes",
            &format!("from-lossy-{i}"),
            "v",
        ]);
    }
    let count = |host: usize, prefix: &str| -> Option<usize> {
        let output = fleet.run(&[
            "cli",
            &host.to_string(),
            "memory",
            "ls",
            "notes",
            "--prefix",
            prefix,
            "--json",
        ]);
        let list: Value = serde_json::from_slice(&output.stdout).ok()?;
        Some(list["records"].as_array()?.len())
    };
    wait_for(
        "every write to cross the lossy link both ways",
        DEADLINE * 2,
        || {
            (count(3, "to-lossy-")? == WRITES
                && count(1, "from-lossy-")? == WRITES
                && count(2, "from-lossy-")? == WRITES)
                .then_some(())
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: host3 has {:?} of host1's, host1 {:?} and host2 {:?} of host3's",
            count(3, "to-lossy-"),
            count(1, "from-lossy-"),
            count(2, "from-lossy-")
        )
    });
    // The rules did drop packets: nftables counts them.
    let ruleset = fleet.ok(&["exec", "3", "nft", "list", "table", "inet", "loss"]);
    let dropped: Vec<u64> = ruleset
        .lines()
        .filter(|l| l.contains("numgen random"))
        .filter_map(|l| l.split("packets ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        dropped.len() == 2 && dropped.iter().all(|n| *n > 0),
        "no packet was dropped: {ruleset}"
    );
    eprintln!("dropped packets (in, out): {dropped:?}");
}
