//! Projects SWIM membership (foca, with `Config::new_lan` or faster timings) onto fleets too large
//! to run here: for each size, the per-member message rate when idle, the time until every
//! member knows a new member is up (KILLS joins, each announcing itself to one member) and a
//! killed one is down (KILLS kills), and how many live members get declared down over a long
//! run with 1% and 5% packet loss. Deterministic: the same arguments print the same numbers.
//! The simulation is [`mesh_tests::swim_sim`].
//!
//! Run: `cargo build --release --bins && target/release/swim-sim [LONG_SECS] [KILLS] [SIZES]
//! [PERIOD_MS] [SUSPECT_MS]` (defaults: a 600-s simulated run per loss rate, 20 kills, sizes
//! `100,500,1000`, and `Config::new_lan`'s probe period and suspicion timeout). PERIOD_MS sets
//! the probe period (the direct-probe timeout stays half of it, as in `new_lan`) and SUSPECT_MS
//! the suspect → down timeout, to try a faster configuration against the same losses.

use std::{process::ExitCode, time::Duration, time::Instant};

use foca::Config;
use mesh_tests::swim_sim::{Detection, Sim, SimParams, detect, join, node_config};
use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};

/// Seed of every run, so the printed projections can be reproduced.
const SEED: u64 = 17;
/// Simulated warm-up before anything is measured: the first probes and announces settle.
const WARM_UP: Duration = Duration::from_secs(10);
/// Simulated window over which the idle message rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Longest simulated wait for every member to declare a killed one down.
const DETECT_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let long = Duration::from_secs(mesh_tests::arg(1, 600) as u64);
    let kills = mesh_tests::arg(2, 20);
    let sizes: Vec<usize> = match std::env::args().nth(3) {
        None => vec![100, 500, 1000],
        Some(list) => match list.split(',').map(str::parse).collect() {
            Ok(sizes) => sizes,
            Err(_) => {
                eprintln!(
                    "error: SIZES must be member counts separated by commas (e.g. 100,500), not `{list}`"
                );
                return ExitCode::FAILURE;
            }
        },
    };
    if let Some(bad) = sizes.iter().find(|&&n| n < 3) {
        eprintln!("error: a fleet needs at least 3 members to simulate a kill, not {bad}");
        return ExitCode::FAILURE;
    }
    let period = std::env::args()
        .nth(4)
        .map(|_| mesh_tests::arg(4, 0) as u64);
    let suspect = std::env::args()
        .nth(5)
        .map(|_| mesh_tests::arg(5, 0) as u64);
    if period == Some(0) || suspect == Some(0) {
        eprintln!("error: PERIOD_MS and SUSPECT_MS must be whole milliseconds above 0");
        return ExitCode::FAILURE;
    }
    for n in sizes {
        let mut config = node_config(n);
        if let Some(ms) = period {
            config.probe_period = Duration::from_millis(ms);
            config.probe_rtt = Duration::from_millis(ms) / 2;
        }
        if let Some(ms) = suspect {
            config.suspect_to_down_after = Duration::from_millis(ms);
        }
        simulate(n, &config, kills, long);
    }
    ExitCode::SUCCESS
}

fn simulate(n: usize, config: &Config, kills: usize, long: Duration) {
    let params = |loss| SimParams {
        config: config.clone(),
        ..SimParams::lan(n, loss, SEED)
    };
    println!(
        "== {n} members: foca Config::new_lan({n}){}: probe every {:?}, probe rtt {:?}, {} indirect probes, suspect -> down after {:.1} s, {} transmissions per update, gossip {:?}, announce {:?}",
        if config.probe_period == node_config(n).probe_period
            && config.suspect_to_down_after == node_config(n).suspect_to_down_after
        {
            ""
        } else {
            " with the changes given"
        },
        config.probe_period,
        config.probe_rtt,
        config.num_indirect_probes,
        config.suspect_to_down_after.as_secs_f64(),
        config.max_transmissions,
        config
            .periodic_gossip
            .as_ref()
            .map(|p| (p.frequency, p.num_members)),
        config
            .periodic_announce
            .as_ref()
            .map(|p| (p.frequency, p.num_members)),
    );
    let wall = Instant::now();

    // Idle traffic and detection without loss.
    let mut sim = Sim::new(params(0.0));
    sim.run_for(WARM_UP);
    sim.reset_traffic();
    sim.run_for(RATE_WINDOW);
    rate(&sim, RATE_WINDOW, "0% loss, idle");
    let joins: Vec<Detection> = (0..kills)
        .map(|_| join(&mut sim, 0, DETECT_TIMEOUT))
        .collect();
    spread_report("new member (announces to one) -> up", &joins);
    let mut victims = Xoshiro256PlusPlus::seed_from_u64(SEED);
    let mut detections: Vec<Detection> = Vec::new();
    for _ in 0..kills.min(n - 2) {
        let victim = loop {
            let m = victims.random_range(0..sim.len());
            if sim.is_alive(m) {
                break m;
            }
        };
        detections.push(detect(&mut sim, victim, DETECT_TIMEOUT));
    }
    spread_report("SIGKILL -> down", &detections);

    for loss in [0.01, 0.05] {
        let mut sim = Sim::new(params(loss));
        sim.run_for(WARM_UP);
        sim.reset_traffic();
        sim.run_for(long);
        let label = format!("{:.0}% loss", loss * 100.0);
        rate(&sim, long, &label);
        let wrong: Vec<_> = sim
            .downs()
            .iter()
            .filter(|v| sim.is_alive(v.subject))
            .collect();
        let mut subjects: Vec<usize> = wrong.iter().map(|v| v.subject).collect();
        subjects.sort_unstable();
        subjects.dedup();
        println!(
            "  {label}: {} s simulated: {} `down` verdicts on live members ({} distinct members; {:.2} per member-hour); foca refused {} calls",
            long.as_secs(),
            wrong.len(),
            subjects.len(),
            wrong.len() as f64 / n as f64 / (long.as_secs_f64() / 3600.0),
            sim.errors
        );
    }
    println!("  (simulated in {:.1} s)", wall.elapsed().as_secs_f64());
}

/// Prints the per-member send rate over the last `window`.
fn rate(sim: &Sim, window: Duration, label: &str) {
    let secs = window.as_secs_f64();
    let live: Vec<_> = sim
        .traffic()
        .iter()
        .enumerate()
        .filter(|(m, _)| sim.is_alive(*m))
        .map(|(_, t)| *t)
        .collect();
    let msgs: Vec<f64> = live.iter().map(|t| t.messages as f64 / secs).collect();
    let bytes: Vec<f64> = live.iter().map(|t| t.bytes as f64 / secs).collect();
    println!(
        "  {label}: sent per member: {} messages/s, {} bytes/s (foca payload)",
        spread(&msgs),
        spread(&bytes)
    );
}

/// Prints how fast news of members (kills, joins) spread.
fn spread_report(what: &str, detections: &[Detection]) {
    let everyone: Vec<f64> = detections
        .iter()
        .filter_map(Detection::everyone)
        .map(|d| d.as_secs_f64())
        .collect();
    let first: Vec<f64> = detections
        .iter()
        .filter_map(|d| d.learned.iter().flatten().min())
        .map(|d| d.as_secs_f64())
        .collect();
    let each: Vec<f64> = detections
        .iter()
        .flat_map(|d| d.learned.iter().flatten())
        .map(|d| d.as_secs_f64())
        .collect();
    let missed = detections.len() - everyone.len();
    println!(
        "  {what}, {} times: first member knows {}; each member knows {}; every member knows {}{}",
        detections.len(),
        spread_s(&first),
        spread_s(&each),
        spread_s(&everyone),
        if missed > 0 {
            format!(
                " ({missed} not known everywhere within {} s)",
                DETECT_TIMEOUT.as_secs()
            )
        } else {
            String::new()
        }
    );
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn spread(values: &[f64]) -> String {
    let v = sorted(values);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    format!(
        "mean {mean:.1}, p50 {:.1}, max {:.1}",
        percentile(&v, 0.5),
        v.last().copied().unwrap_or(f64::NAN)
    )
}

fn spread_s(values: &[f64]) -> String {
    let v = sorted(values);
    format!(
        "p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN)
    )
}
