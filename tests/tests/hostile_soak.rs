//! The hostile soak (issue 16), short: a connection flood, a hostile member and a normal
//! workload on one node of a 3-node mesh for a few seconds. `hostile-soak` runs it for minutes
//! (docs/src/benchmarks/tasks.md, "Hostile soak").

use std::time::Duration;

use mesh_tests::hostile_soak::{HostileSoakOptions, run};

/// Under the flood (its idle sockets closed after 2 s and reopened), the hostile member and
/// the workload, the victim answers every `mesh-cli status`, accepts no forgery, makes at most
/// one call at a time of each kind to the hostile member, and every write it acknowledged
/// reaches all three nodes.
#[test]
fn a_flooded_node_under_a_hostile_member_keeps_serving_and_loses_nothing() -> anyhow::Result<()> {
    let options = HostileSoakOptions {
        duration: Duration::from_secs(12),
        idle_sockets: 300,
        connection_timeout_s: 2,
    };
    let report = run(&options)?;
    eprintln!("{report:?}");
    anyhow::ensure!(
        report.writes_acked > 0,
        "no write was acknowledged: {report:?}"
    );
    anyhow::ensure!(
        report.writes_lost == 0,
        "acknowledged writes lost: {report:?}"
    );
    anyhow::ensure!(
        report.forgeries_accepted == 0,
        "forgeries accepted: {report:?}"
    );
    anyhow::ensure!(
        report.status_failures.is_empty() && !report.status.is_empty(),
        "mesh-cli status failed under the flood: {:?}",
        report.status_failures
    );
    for (port, flood) in ["gRPC", "front door"].iter().zip(&report.flood) {
        anyhow::ensure!(
            flood.closed >= options.idle_sockets * 95 / 100,
            "the node closed {} of the idle sockets on its {port} port: {report:?}",
            flood.closed
        );
    }
    let (sync_most, push_most) = (report.calls_to_hostile.0.1, report.calls_to_hostile.1.1);
    anyhow::ensure!(
        sync_most <= 1 && push_most <= 1,
        "calls piled up on the hostile member: {report:?}"
    );
    Ok(())
}
