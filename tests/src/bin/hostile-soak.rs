//! The hostile soak (see `mesh_tests::hostile_soak`): on a 3-node mesh, a connection flood, a
//! hostile member and a normal workload hit one node together for N minutes. Prints what it
//! saw; fails if an acknowledged write was lost, a forgery was accepted, `mesh-cli status`
//! failed, or the victim's descriptors or memory kept growing.
//!
//! Run: `cargo build --release --bins && target/release/hostile-soak [MINUTES] [IDLE_SOCKETS]`
//! (defaults 10 and 1000 idle sockets per port). Needs nothing but loopback.

use std::{process::ExitCode, time::Duration};

use mesh_tests::hostile_soak::{HostileSoakOptions, run};

fn main() -> ExitCode {
    let minutes = mesh_tests::arg(1, 10) as u64;
    let options = HostileSoakOptions {
        duration: Duration::from_secs(minutes * 60),
        idle_sockets: mesh_tests::arg(2, 1_000),
        connection_timeout_s: 10,
    };
    println!(
        "hostile soak: {minutes} min, {} idle sockets per port, timeouts {} s",
        options.idle_sockets, options.connection_timeout_s
    );
    let report = match run(&options) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let ((fds_early, rss_early), (fds_late, rss_late)) = report.halves();
    println!("requests served          {}", report.served());
    println!("  writes acknowledged    {}", report.writes_acked);
    println!("  writes not acknowledged {}", report.writes_failed);
    println!("  reads answered         {}", report.reads);
    println!("  mesh-cli status        {}", report.status.len());
    println!(
        "status latency           p50 {:?}  p99 {:?}  max {:?}",
        report.status_percentile(50),
        report.status_percentile(99),
        report.status_percentile(100)
    );
    println!("status failures          {}", report.status_failures.len());
    for failure in report.status_failures.iter().take(5) {
        println!("  {failure}");
    }
    for (port, flood) in ["gRPC", "front door"].iter().zip(&report.flood) {
        println!(
            "flood on {port:<10}       {} sockets opened, {} closed by the node, {} attempts refused",
            flood.opened, flood.closed, flood.refused
        );
    }
    println!(
        "hostile member           {} calls, {} forgeries accepted; the victim's calls to it: Sync {} ({} at once at most), Push {} ({} at once)",
        report.hostile_calls,
        report.forgeries_accepted,
        report.calls_to_hostile.0.0,
        report.calls_to_hostile.0.1,
        report.calls_to_hostile.1.0,
        report.calls_to_hostile.1.1
    );
    println!("victim open fds (max)    first half {fds_early}, second half {fds_late}");
    println!(
        "victim RSS (max)         first half {} MiB, second half {} MiB",
        rss_early / 1024,
        rss_late / 1024
    );
    println!("victim over time (every ~minute: s, fds, RSS MiB):");
    for sample in report.samples.iter().step_by(60) {
        println!(
            "  {:>5} {:>6} {:>6}",
            sample.at.as_secs(),
            sample.fds,
            sample.rss_kib / 1024
        );
    }
    println!("acknowledged writes lost {}", report.writes_lost);
    println!("elapsed                  {:?}", report.elapsed);
    let bounded = fds_late <= fds_early + fds_early / 10 + 50 && rss_late <= rss_early * 3 / 2;
    if report.writes_lost == 0
        && report.forgeries_accepted == 0
        && report.status_failures.is_empty()
        && bounded
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
