//! Smoke test of the SWIM simulation (`mesh_tests::swim_sim`, run at scale by the `swim-sim`
//! bench): a small fleet, a few simulated seconds. A killed member ends up down on every live
//! member, no live member is declared down on a loss-free network, every member probes (sends),
//! and the same seed replays the same run.

use std::time::Duration;

use mesh_tests::swim_sim::{Sim, SimParams, detect};

/// Runs 20 members for 10 simulated seconds, then kills member 7 and waits for every live
/// member to declare it down; returns the simulation and when each member learned it.
fn run(seed: u64) -> (Sim, Vec<Option<Duration>>) {
    let mut sim = Sim::new(SimParams::lan(20, 0.0, seed));
    sim.run_for(Duration::from_secs(10));
    let detection = detect(&mut sim, 7, Duration::from_secs(60));
    (sim, detection.learned)
}

#[test]
fn a_killed_member_is_down_everywhere_and_no_live_one_is() {
    let (sim, learned) = run(1);
    assert_eq!(learned.len(), 19, "every live member is counted");
    assert!(
        learned.iter().all(Option::is_some),
        "every live member declares the killed one down within 60 simulated s: {learned:?}"
    );
    let wrong: Vec<_> = sim
        .downs()
        .iter()
        .filter(|v| sim.is_alive(v.subject))
        .collect();
    assert!(wrong.is_empty(), "live members declared down: {wrong:?}");
    assert!(
        sim.traffic()
            .iter()
            .enumerate()
            .all(|(m, t)| t.messages > 0 && t.bytes > 0 || m == 7),
        "every member sent probes: {:?}",
        sim.traffic()
    );
    assert_eq!(sim.errors, 0, "foca accepted every datagram and timer");
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let (first, first_learned) = run(3);
    let (second, second_learned) = run(3);
    assert_eq!(first_learned, second_learned);
    assert_eq!(first.downs(), second.downs());
    assert_eq!(first.now(), second.now());
}

#[test]
fn a_member_that_announces_itself_to_one_becomes_known_to_all() {
    let mut sim = Sim::new(SimParams::lan(20, 0.0, 5));
    sim.run_for(Duration::from_secs(5));
    let joined = mesh_tests::swim_sim::join(&mut sim, 0, Duration::from_secs(60));
    assert_eq!(
        joined.learned.len(),
        20,
        "the 20 members before it are counted"
    );
    assert!(
        joined.everyone().is_some(),
        "every member learned of the newcomer within 60 simulated s: {:?}",
        joined.learned
    );
}
