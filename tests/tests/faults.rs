//! The SIGKILL loop in CI: four rounds, each killing a worker while it executes tasks and takes
//! memory writes (`mesh_tests::soak`; the long run is `target/release/soak`). Each task is two
//! side-effecting steps (shell appends to one file) and an answer. No task may go unanswered,
//! be answered twice or fail (a task whose node is killed is resumed on the other), no step's
//! side effect may happen twice, and no acknowledged write may be lost.

use std::time::Duration;

use mesh_tests::soak::{SoakOptions, run};

#[test]
fn sigkill_loop_on_executing_nodes_loses_no_task_repeats_no_step_and_loses_no_acknowledged_write() {
    let report = run(&SoakOptions {
        rounds: 4,
        duration: Duration::from_secs(600),
        tasks_per_round: 6,
        model_delay: Duration::from_secs(1),
        tool_steps: 2,
    })
    .expect("soak");
    eprintln!("{report:#?}");
    assert_eq!(report.rounds, 4);
    assert_eq!(report.tasks, 24);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.completed, report.tasks);
    assert!(
        report.failed_over > 0,
        "no task was failed over: {report:#?}"
    );
    assert!(report.side_effects >= report.tasks, "{report:#?}");
    assert_eq!(report.side_effects_repeated, 0, "{report:#?}");
    assert!(report.writes_acked >= 4 * 3);
    assert_eq!(report.writes_lost, 0);
}
