//! Measures discovery time (a node starts → another node's peer table has it up) and failure
//! detection time (SIGTERM / SIGKILL → down), from the nodes' own JSON log timestamps, over
//! repeated runs; prints min / median / max per figure.
//!
//! Run: `cargo build --release --bins && target/release/liveness-bench [RUNS]` (default 10).
//! As root it also measures discovery by mDNS inside a network namespace; otherwise it measures
//! static-peer discovery only.

use std::{
    process::ExitCode,
    time::{Duration, SystemTime},
};

use anyhow::Context;
use mesh_tests::{Harness, Netns, NodeOptions, NodeProcess, wait_for};
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

fn main() -> ExitCode {
    let runs = mesh_tests::arg(1, 10);
    match run(runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(runs: usize) -> anyhow::Result<()> {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    println!("runs per figure: {runs}");
    measure("static peer", runs, None)?;
    if root {
        let ns = Netns::new()?;
        measure("mdns (netns loopback)", runs, Some(&ns))?;
    } else {
        println!("(not root: skipping mDNS discovery, which needs a network namespace)");
    }
    Ok(())
}

fn measure(label: &str, runs: usize, ns: Option<&Netns>) -> anyhow::Result<()> {
    let harness = Harness::new()?;
    let options = |name: &str| {
        let options = NodeOptions::new(name);
        match ns {
            Some(ns) => options.mdns_in(ns),
            None => options,
        }
    };
    let observer = harness.spawn(options("observer"))?;
    let mut discovery = Vec::new();
    let mut term = Vec::new();
    let mut kill = Vec::new();
    for run in 0..runs {
        for signal in ["TERM", "KILL"] {
            let mut opts = options("subject");
            if ns.is_none() {
                opts = opts.peer(&observer.addr);
            }
            let started = SystemTime::now();
            let mut subject = harness.spawn(opts)?;
            let joined = wait_log(
                &observer,
                |line| {
                    is_event(line, "peer joined", "subject") || is_event(line, "peer up", "subject")
                },
                started,
            )?;
            discovery.push(joined);
            let sent = SystemTime::now();
            subject.signal(signal)?;
            let down = wait_log(&observer, |line| is_state(line, "subject", "down"), sent)?;
            if signal == "TERM" {
                term.push(down);
            } else {
                kill.push(down);
            }
            subject.wait_exit(Duration::from_secs(10))?;
        }
        eprint!("\r{label}: run {}/{runs}", run + 1);
    }
    eprintln!();
    report(&format!("discovery, {label}"), &mut discovery);
    report(&format!("SIGTERM -> down, {label}"), &mut term);
    report(&format!("SIGKILL -> down, {label}"), &mut kill);
    Ok(())
}

fn is_event(line: &serde_json::Value, message: &str, peer: &str) -> bool {
    line["fields"]["message"] == message && line["fields"]["peer"] == peer
}

fn is_state(line: &serde_json::Value, peer: &str, to: &str) -> bool {
    line["fields"]["message"] == "peer state"
        && line["fields"]["peer"] == peer
        && line["fields"]["to"] == to
}

/// Waits for a log line of `node` matching `matches` stamped after `since`; returns the delay.
fn wait_log(
    node: &NodeProcess,
    matches: impl Fn(&serde_json::Value) -> bool,
    since: SystemTime,
) -> anyhow::Result<Duration> {
    let since_odt = OffsetDateTime::from(since);
    wait_for("log event", Duration::from_secs(20), || {
        node.log_text().lines().find_map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).ok()?;
            let stamp = OffsetDateTime::parse(line["timestamp"].as_str()?, &Rfc3339).ok()?;
            (stamp >= since_odt && matches(&line)).then(|| (stamp - since_odt).unsigned_abs())
        })
    })
    .with_context(|| {
        let log = node.log_text();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        format!(
            "the observer never logged the event; its last lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })
}

fn report(label: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = samples[samples.len() / 2];
    println!(
        "{label:<40} median {:>7.1} ms   min {:>7.1} ms   max {:>7.1} ms   (n={})",
        ms(median),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}
