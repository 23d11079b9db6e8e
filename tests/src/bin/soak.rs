//! The SIGKILL soak (see `mesh_tests::soak`): a worker is SIGKILLed while it executes tasks and
//! takes memory writes, then restarted, round after round, alternating between two workers.
//! Prints what it saw; fails if a task went unanswered or was answered twice, or an
//! acknowledged write was lost.
//!
//! Each task is TOOL_STEPS side-effecting steps (shell appends to one file) and an answer: a
//! task whose worker is killed is resumed on the other, and no step's side effect may happen
//! twice.
//!
//! Run: `cargo build --release --bins && target/release/soak [MINUTES] [TASKS_PER_ROUND]
//! [TOOL_STEPS]` (defaults 10, 8 and 4). Needs nothing but loopback.

use std::{process::ExitCode, time::Duration};

use mesh_tests::soak::{SoakOptions, run};

fn main() -> ExitCode {
    let minutes = mesh_tests::arg(1, 10) as u64;
    let options = SoakOptions {
        rounds: usize::MAX,
        duration: Duration::from_secs(minutes * 60),
        tasks_per_round: mesh_tests::arg(2, 8),
        model_delay: Duration::from_millis(500),
        tool_steps: mesh_tests::arg(3, 4),
    };
    println!(
        "soak: {minutes} min, {} tasks per round, models answer after {:?}",
        options.tasks_per_round, options.model_delay
    );
    match run(&options) {
        Ok(report) => {
            println!(
                "rounds (SIGKILLs)        {} {:?}",
                report.rounds, report.kills
            );
            println!("tasks                    {}", report.tasks);
            println!("completed                {}", report.completed);
            println!("failed over              {}", report.failed_over);
            println!("not completed            {}", report.failures.len());
            for failure in report.failures.iter().take(10) {
                println!("  {failure}");
            }
            println!("slowest task             {:?}", report.slowest_task);
            println!("writes acked before kill {}", report.writes_acked);
            println!("acked writes lost        {}", report.writes_lost);
            println!("step side effects        {}", report.side_effects);
            println!("  happened twice         {}", report.side_effects_repeated);
            println!("slowest rejoin           {:?}", report.slowest_rejoin);
            println!("elapsed                  {:?}", report.elapsed);
            if report.failures.is_empty()
                && report.writes_lost == 0
                && report.side_effects_repeated == 0
            {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
