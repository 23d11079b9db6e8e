//! The SIGKILL loop: a front node with no models and two workers serving `coder` through slow
//! scripted models. Each round submits a batch of tasks on the front node and writes to one
//! worker's memory, SIGKILLs that worker while it executes tasks and takes writes, restarts
//! it with the same certificate and data dir, and checks: every task got exactly one answer
//! (its tasks fail over to the other worker), every acknowledged write survived the kill, and
//! the worker rejoined. The victim is a worker executing tasks that round, alternating between
//! the two when the router used both.
//!
//! `tests/tests/faults.rs` runs a few rounds in CI; `soak` (tests/src/bin/soak.rs) runs it for
//! as long as asked and prints the figures.

use std::{
    collections::BTreeSet,
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use mesh_node::tls::TlsFiles;
use serde_json::Value;

use crate::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    wait_for,
};

/// How long anything in a round may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// How a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Stop after this many rounds…
    pub rounds: usize,
    /// …or once this much time has passed, whichever comes first.
    pub duration: Duration,
    /// Tasks submitted at once in each round.
    pub tasks_per_round: usize,
    /// How long the scripted models take to answer.
    pub model_delay: Duration,
}

/// What a soak saw.
#[derive(Debug, Default, Clone)]
pub struct SoakReport {
    /// Rounds run (one SIGKILL each).
    pub rounds: usize,
    /// SIGKILLs per worker.
    pub kills: std::collections::BTreeMap<String, usize>,
    /// Tasks submitted.
    pub tasks: usize,
    /// Tasks that completed.
    pub completed: usize,
    /// Completed tasks that ran on a worker other than the first one chosen (failed over).
    pub failed_over: usize,
    /// Errors of the tasks that did not complete.
    pub failures: Vec<String>,
    /// Longest submit → answer time of a task.
    pub slowest_task: Duration,
    /// Memory writes acknowledged by the victims before they were killed.
    pub writes_acked: usize,
    /// Acknowledged writes missing after the restart.
    pub writes_lost: usize,
    /// Longest time from SIGKILL to the restarted worker being `up` on the front node again.
    pub slowest_rejoin: Duration,
    /// Wall time.
    pub elapsed: Duration,
}

struct Worker {
    node: NodeProcess,
    tls: TlsFiles,
    fake: FakeOpenAi,
}

fn worker_options(name: &str, tls: &TlsFiles, fake: &FakeOpenAi, front: &str) -> NodeOptions {
    let mut options = NodeOptions::new(name).peer(front).extra(&format!(
        "[[models]]\nname = \"coder-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\n\
         model = \"scripted\"\n\n[roles]\ncoder = [\"coder-model\"]\n",
        fake.base_url()
    ));
    options.tls = Some(tls.clone());
    options
}

/// Runs the SIGKILL loop on a fresh three-node mesh.
pub fn run(options: &SoakOptions) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let h = Harness::new()?;
    let front = h.spawn(NodeOptions::new("front"))?;
    let mut workers = Vec::new();
    for name in ["w1", "w2"] {
        let tls = h.issue(name)?;
        let fake = FakeOpenAi::start();
        fake.otherwise(Scripted::text(&format!("answer from {name}")).after(options.model_delay));
        let node = h.spawn(worker_options(name, &tls, &fake, &front.addr))?;
        workers.push(Worker { node, tls, fake });
    }
    h.wait_all_up(
        &[&front, &workers[0].node, &workers[1].node],
        Duration::from_secs(20),
    )?;

    let mut report = SoakReport::default();
    let mut answered = BTreeSet::new();
    while report.rounds < options.rounds && started.elapsed() < options.duration {
        round(
            &h,
            &front,
            &mut workers,
            options,
            &mut report,
            &mut answered,
        )
        .with_context(|| format!("round {}", report.rounds + 1))?;
        report.rounds += 1;
    }
    let listed = h.cli(&front, &["tasks", "--limit", "1000", "--json"])?;
    let tasks: Value = serde_json::from_slice(&listed.stdout).context("tasks ls")?;
    report.failed_over = tasks
        .as_array()
        .or_else(|| tasks["tasks"].as_array())
        .map_or(0, |tasks| {
            tasks
                .iter()
                .filter(|t| t["route"].as_array().is_some_and(|r| r.len() > 1))
                .count()
        });
    report.elapsed = started.elapsed();
    Ok(report)
}

fn round(
    h: &Harness,
    front: &NodeProcess,
    workers: &mut [Worker],
    options: &SoakOptions,
    report: &mut SoakReport,
    answered: &mut BTreeSet<String>,
) -> anyhow::Result<()> {
    let calls_before: Vec<usize> = workers.iter().map(|w| w.fake.requests().len()).collect();
    let submitted = Instant::now();
    let callers: Vec<Child> = (0..options.tasks_per_round)
        .map(|i| {
            h.cli_command(
                front,
                &[
                    "run",
                    "--role",
                    "coder",
                    "--json",
                    &format!("soak task {i}"),
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("start mesh-cli run")
        })
        .collect::<anyhow::Result<_>>()?;
    report.tasks += callers.len();

    // Both workers take writes until the victim dies; each acknowledged one must survive.
    let acked: Vec<Arc<AtomicUsize>> = workers.iter().map(|_| Arc::default()).collect();
    let dead = Arc::new(AtomicBool::new(false));
    let prefix = format!("r{}-", report.rounds);
    let (victim, writes_acked) = std::thread::scope(|s| -> anyhow::Result<(usize, usize)> {
        let writers: Vec<_> = workers
            .iter()
            .zip(&acked)
            .map(|(worker, acked)| {
                let (acked, dead, prefix) = (acked.clone(), dead.clone(), prefix.clone());
                let node = &worker.node;
                s.spawn(move || {
                    for i in 0.. {
                        if dead.load(Ordering::SeqCst) {
                            break;
                        }
                        let key = format!("{prefix}{i:05}");
                        match h.cli(node, &["memory", "put", "soak", &key, "v"]) {
                            Ok(o) if o.status.success() => acked.store(i + 1, Ordering::SeqCst),
                            _ => break,
                        }
                    }
                })
            })
            .collect();
        // The victim: a worker whose model got calls this round (so it executes tasks; the
        // router decides which), the one after last round's victim when both do, once it has
        // acknowledged a few writes.
        let preferred = report.rounds % workers.len();
        let chosen = wait_for("a worker to execute tasks", DEADLINE, || {
            let busy: Vec<usize> = (0..workers.len())
                .filter(|&i| {
                    workers[i].fake.requests().len() > calls_before[i]
                        && acked[i].load(Ordering::SeqCst) >= 3
                })
                .collect();
            busy.contains(&preferred)
                .then_some(preferred)
                .or_else(|| busy.first().copied())
        });
        let victim = match chosen {
            Ok(victim) => {
                workers[victim].node.signal("KILL")?;
                victim
            }
            Err(e) => {
                dead.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        dead.store(true, Ordering::SeqCst);
        for writer in writers {
            writer
                .join()
                .map_err(|_| anyhow::anyhow!("writer panicked"))?;
        }
        Ok((victim, acked[victim].load(Ordering::SeqCst)))
    })?;
    let name = workers[victim].node.name.clone();
    *report.kills.entry(name.clone()).or_default() += 1;
    let killed_at = Instant::now();
    workers[victim].node.wait_exit(DEADLINE)?;
    report.writes_acked += writes_acked;

    // Every caller gets one answer.
    for caller in callers {
        let output = caller.wait_with_output()?;
        report.slowest_task = report.slowest_task.max(submitted.elapsed());
        let result: Value = serde_json::from_slice(&output.stdout).with_context(|| {
            format!(
                "a caller printed no JSON: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        if output.status.success() {
            let id = result["task_id"].as_str().unwrap_or_default().to_owned();
            ensure!(answered.insert(id.clone()), "task {id} was answered twice");
            report.completed += 1;
        } else {
            report
                .failures
                .push(result["error"].as_str().unwrap_or("?").to_owned());
        }
    }

    // Back with the same certificate and data dir: rejoins, and kept every acknowledged write.
    let restarted = h.spawn(worker_options(
        &name,
        &workers[victim].tls,
        &workers[victim].fake,
        &front.addr,
    ))?;
    workers[victim].node = restarted;
    wait_for(&format!("{name} to be up again"), DEADLINE, || {
        (h.state_of(front, &name).as_deref() == Some("up")).then_some(())
    })?;
    report.slowest_rejoin = report.slowest_rejoin.max(killed_at.elapsed());
    let listed = h.cli(
        &workers[victim].node,
        &[
            "memory", "ls", "soak", "--prefix", &prefix, "--limit", "10000", "--json",
        ],
    )?;
    let list: Value = serde_json::from_slice(&listed.stdout).context("memory ls")?;
    let kept = list["records"].as_array().map_or(0, Vec::len);
    if kept < writes_acked {
        report.writes_lost += writes_acked - kept;
    }
    if report.writes_lost > 0 {
        bail!("{name} lost {} acknowledged writes", report.writes_lost);
    }
    Ok(())
}
