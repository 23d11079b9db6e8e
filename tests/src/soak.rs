//! The SIGKILL loop: a front node with no models and two workers serving `coder` through slow
//! scripted models. Each round submits a batch of tasks on the front node and writes to one
//! worker's memory, SIGKILLs that worker while it executes tasks and takes writes, restarts
//! it with the same certificate and data dir, and checks: every task got exactly one answer
//! (its tasks fail over to the other worker), every acknowledged write survived the kill on the
//! worker's own disk (checked with the worker restarted alone, before any peer could hand
//! writes back), and the worker rejoined. The victim is a worker executing tasks that round, alternating between
//! the two when the router used both.
//!
//! `tests/tests/faults.rs` runs a few rounds in CI; `soak` (tests/src/bin/soak.rs) runs it for
//! as long as asked and prints the figures.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use mesh_tls::TlsFiles;
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
    /// Side-effecting steps per task (each a `shell_exec` appending a line to one file); 0:
    /// tasks that only answer.
    pub tool_steps: usize,
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
    /// Longest time from a worker's restart to it being `up` on the front node again.
    pub slowest_rejoin: Duration,
    /// Side effects of the tasks' steps that happened (lines appended).
    pub side_effects: usize,
    /// Side effects that happened more than once (a step repeated).
    pub side_effects_repeated: usize,
    /// Wall time.
    pub elapsed: Duration,
}

struct Worker {
    node: NodeProcess,
    tls: TlsFiles,
    fake: FakeOpenAi,
}

/// Who may run shell-tier tools, when the tasks have side-effecting steps.
const SHELL_TIER: &str = "client_max_tier = \"shell\"\nremote_max_tier = \"shell\"\n";

/// A worker's options; with no `front` it starts alone (on a new port nobody knows).
fn worker_options(
    name: &str,
    tls: &TlsFiles,
    fake: &FakeOpenAi,
    front: Option<&str>,
    effects: &Path,
) -> NodeOptions {
    let mut options = NodeOptions::new(name).security(SHELL_TIER).extra(&format!(
        "[tools]\nroots = [{:?}]\n\n[[models]]\nname = \"coder-model\"\nbackend = \"openai\"\nbase_url = \"{}\"\n\
         model = \"scripted\"\n\n[roles]\ncoder = [\"coder-model\"]\n",
        effects.parent().unwrap_or(effects),
        fake.base_url()
    ));
    options.tls = Some(tls.clone());
    options.static_peers = front.into_iter().map(str::to_owned).collect();
    options
}

/// Runs the SIGKILL loop on a fresh three-node mesh.
pub fn run(options: &SoakOptions) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let h = Harness::new()?;
    let dir = tempfile::tempdir()?;
    let effects = dir.path().join("effects.log");
    let front = h.spawn(NodeOptions::new("front").security(SHELL_TIER))?;
    let mut workers = Vec::new();
    for name in ["w1", "w2"] {
        let tls = h.issue(name)?;
        let fake = FakeOpenAi::start();
        let answer = if options.tool_steps > 0 {
            Scripted::steps(options.tool_steps, &effects)
        } else {
            Scripted::text(&format!("answer from {name}"))
        };
        fake.otherwise(answer.after(options.model_delay));
        let node = h.spawn(worker_options(
            name,
            &tls,
            &fake,
            Some(&front.addr),
            &effects,
        ))?;
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
            &effects,
        )
        .with_context(|| format!("round {}", report.rounds + 1))?;
        report.rounds += 1;
    }
    // Each step's line at most once: a completed step is never run again, an interrupted
    // side effect never repeated.
    let mut lines: BTreeMap<String, usize> = BTreeMap::new();
    for line in std::fs::read_to_string(&effects)
        .unwrap_or_default()
        .lines()
    {
        *lines.entry(line.to_owned()).or_default() += 1;
    }
    report.side_effects = lines.len();
    report.side_effects_repeated = lines.values().filter(|n| **n > 1).count();
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
    effects: &Path,
) -> anyhow::Result<()> {
    let calls_before: Vec<usize> = workers.iter().map(|w| w.fake.requests().len()).collect();
    let submitted = Instant::now();
    let rounds = (options.tool_steps + 2).to_string();
    let callers: Vec<Child> = (0..options.tasks_per_round)
        .map(|i| {
            let prompt = format!("soak-r{}-t{i}", report.rounds);
            h.cli_command(
                front,
                &[
                    "run",
                    "--role",
                    "coder",
                    "--tier",
                    "shell",
                    "--max-rounds",
                    &rounds,
                    "--json",
                    &prompt,
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
    let prefix = |worker: &Worker| format!("r{}-{}-", report.rounds, worker.node.name);
    let (victim, writes_acked) = std::thread::scope(|s| -> anyhow::Result<(usize, usize)> {
        let writers: Vec<_> = workers
            .iter()
            .zip(&acked)
            .map(|(worker, acked)| {
                let (acked, dead, prefix) = (acked.clone(), dead.clone(), prefix(worker));
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
                    let requests = workers[i].fake.requests();
                    // With side-effecting steps, once one of its tasks has run a step there:
                    // the kill then lands after a side effect (a task is resumed, not re-run).
                    let stepped = options.tool_steps == 0
                        || requests.iter().skip(calls_before[i]).any(|r| {
                            r["messages"]
                                .as_array()
                                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
                        });
                    requests.len() > calls_before[i]
                        && stepped
                        && acked[i].load(Ordering::SeqCst) >= 3
                })
                .collect();
            busy.contains(&preferred)
                .then_some(preferred)
                .or_else(|| busy.first().copied())
        });
        let killed = chosen.and_then(|v| workers[v].node.signal("KILL").map(|()| v));
        dead.store(true, Ordering::SeqCst);
        for writer in writers {
            writer
                .join()
                .map_err(|_| anyhow::anyhow!("writer panicked"))?;
        }
        let victim = killed?;
        Ok((victim, acked[victim].load(Ordering::SeqCst)))
    })?;
    let name = workers[victim].node.name.clone();
    let written = prefix(&workers[victim]);
    *report.kills.entry(name.clone()).or_default() += 1;
    workers[victim].node.wait_exit(DEADLINE)?;
    report.writes_acked += writes_acked;

    // Every caller gets one answer.
    let mut this_round = BTreeSet::new();
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
            this_round.insert(id);
            report.completed += 1;
        } else {
            report
                .failures
                .push(result["error"].as_str().unwrap_or("?").to_owned());
        }
    }

    // Which of this round's tasks ran on a second worker (the newest tasks are this round's).
    let limit = options.tasks_per_round.to_string();
    let listed = h.cli(front, &["tasks", "--limit", &limit, "--json"])?;
    let tasks: Value = serde_json::from_slice(&listed.stdout).context("tasks --json")?;
    report.failed_over += tasks["tasks"].as_array().map_or(0, |tasks| {
        tasks
            .iter()
            .filter(|t| {
                t["task_id"]
                    .as_str()
                    .is_some_and(|id| this_round.contains(id))
            })
            .filter(|t| t["route"].as_array().is_some_and(|r| r.len() > 1))
            .count()
    });

    // Back alone first, with the same certificate and data dir on a new port no peer knows:
    // what it holds now survived the kill on its own disk (no peer handed it back).
    let (tls, fake) = (&workers[victim].tls, &workers[victim].fake);
    let mut alone = h.spawn(worker_options(&name, tls, fake, None, effects))?;
    let listed = h.cli(
        &alone,
        &[
            "memory", "ls", "soak", "--prefix", &written, "--limit", "10000", "--json",
        ],
    )?;
    let list: Value = serde_json::from_slice(&listed.stdout).context("memory ls")?;
    let kept = list["records"].as_array().map_or(0, Vec::len);
    report.writes_lost += writes_acked.saturating_sub(kept);
    alone.signal("TERM")?;
    alone.wait_exit(DEADLINE)?;

    // Then back in the mesh.
    let restarted_at = Instant::now();
    workers[victim].node = h.spawn(worker_options(&name, tls, fake, Some(&front.addr), effects))?;
    wait_for(&format!("{name} to be up again"), DEADLINE, || {
        (h.state_of(front, &name).as_deref() == Some("up")).then_some(())
    })?;
    report.slowest_rejoin = report.slowest_rejoin.max(restarted_at.elapsed());
    if report.writes_lost > 0 {
        bail!("{name} lost {} acknowledged writes", report.writes_lost);
    }
    Ok(())
}
