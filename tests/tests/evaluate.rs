//! The evaluator loop across real nodes (`run --evaluate ROLE`): the task runs on `worker` (role
//! `chat`, one scripted fake model) and its answers are scored by the model of role `judge`,
//! served only by the node `judge` (another scripted fake), so every verdict travels through the
//! mesh. Scores, critiques, the attempt bound, the budget and the deadline across attempts, a
//! malformed verdict, bad input, and a schedule that carries an evaluation.

use std::time::Duration;

use mesh_proto::v1 as pb;
use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    wait_for,
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// A node whose model `j`, serving role `judge`, is `fake`.
fn judge_config(fake: &FakeOpenAi) -> String {
    format!(
        "[[models]]\nname = \"j\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[roles]\njudge = [\"j\"]\n",
        fake.base_url()
    )
}

/// A verdict as the fake judge answers it.
fn verdict(score: f64, critique: &str) -> Scripted {
    Scripted::text(&json!({"score": score, "critique": critique}).to_string())
}

/// Two fakes and two nodes that see each other: `worker` serves `chat` with `work`, `judge`
/// serves `judge` with `judging`.
struct Fleet {
    work: FakeOpenAi,
    judging: FakeOpenAi,
    harness: Harness,
    worker: NodeProcess,
    judge: NodeProcess,
}

impl Fleet {
    fn start() -> Self {
        let (work, judging) = (FakeOpenAi::start(), FakeOpenAi::start());
        let harness = Harness::new().expect("harness");
        let worker = harness
            .spawn(NodeOptions::new("worker").extra(&work.node_config("")))
            .expect("worker");
        let judge = harness
            .spawn(
                NodeOptions::new("judge")
                    .peer(&worker.addr)
                    .extra(&judge_config(&judging)),
            )
            .expect("judge");
        harness
            .wait_all_up(&[&worker, &judge], DEADLINE)
            .expect("mesh");
        Self {
            work,
            judging,
            harness,
            worker,
            judge,
        }
    }

    /// `mesh-cli run --json` on the judge node (the task is placed on the worker).
    fn run(&self, args: &[&str]) -> (Option<i32>, Value) {
        self.harness.run_json(&self.judge, args).expect("run")
    }

    /// `tasks show ID --json` on `node`: the events.
    fn events(&self, node: &NodeProcess, id: &str) -> Vec<Value> {
        self.harness.task_events(node, id)
    }

    /// Exit code and stderr of `mesh-cli ARGS` on the judge node.
    fn cli_fails(&self, args: &[&str]) -> (Option<i32>, String) {
        let output = self.harness.cli(&self.judge, args).expect("mesh-cli");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn scores(run: &Value) -> Vec<Value> {
    run["evaluations"]
        .as_array()
        .map(|list| list.iter().map(|e| e["score"].clone()).collect())
        .unwrap_or_default()
}

#[test]
fn a_low_score_runs_the_task_again_with_the_critique_and_the_better_answer_wins() {
    let fleet = Fleet::start();
    fleet.judging.push([
        verdict(0.2, "mention the weather"),
        verdict(0.9, "good enough"),
    ]);
    fleet
        .work
        .push([Scripted::text("answer one"), Scripted::text("answer two")]);
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--threshold",
        "0.8",
        "--attempts",
        "3",
        "plan a picnic",
    ]);
    assert_eq!(code, Some(0), "{run:#}");
    assert_eq!(run["output"], "answer two", "{run:#}");
    assert_eq!(run["executed_on"], "worker");
    assert_eq!(scores(&run), [json!(0.2), json!(0.9)], "{run:#}");
    let first = &run["evaluations"][0];
    assert_eq!(first["critique"], "mention the weather");
    // The verdict came from the judge node's model, through the mesh.
    assert_eq!(
        (&first["node"], &first["model"]),
        (&json!("judge"), &json!("j"))
    );

    // Two attempts; the second was told the first answer and the critique.
    assert_eq!(fleet.work.requests().len(), 2);
    let second = fleet.work.request_text(1);
    assert!(second.contains("plan a picnic"), "{second}");
    assert!(second.contains("answer one"), "{second}");
    assert!(second.contains("mention the weather"), "{second}");
    assert!(!fleet.work.request_text(0).contains("critique"));
    // The evaluator was asked for a JSON-schema verdict on the task and its answer.
    let asked = fleet.judging.requests();
    assert_eq!(asked.len(), 2);
    assert_eq!(
        asked[0]["response_format"]["type"], "json_schema",
        "{}",
        asked[0]
    );
    assert_eq!(
        asked[0]["response_format"]["json_schema"]["schema"]["required"],
        json!(["score", "critique"])
    );
    let judged = fleet.judging.request_text(0);
    assert!(
        judged.contains("plan a picnic") && judged.contains("answer one"),
        "{judged}"
    );

    // Every score and critique is an event, on the node that ran it and on the one it was
    // submitted to (relayed), and in `tasks show`.
    let id = run["task_id"].as_str().expect("id");
    for node in [&fleet.worker, &fleet.judge] {
        let events = fleet.events(node, id);
        let evaluated = of_type(&events, "evaluated");
        assert_eq!(evaluated.len(), 2, "{events:#?}");
        assert_eq!(evaluated[0]["evaluation"]["score"], 0.2);
        assert_eq!(
            evaluated[0]["evaluation"]["critique"],
            "mention the weather"
        );
        assert_eq!(evaluated[1]["evaluation"]["score"], 0.9);
        let again = of_type(&events, "attempt_started");
        assert_eq!(again.len(), 1, "{events:#?}");
        assert_eq!(
            (&again[0]["attempt"], &again[0]["attempts"]),
            (&json!(2), &json!(3))
        );
        let last = events.last().expect("events");
        assert_eq!(last["type"], "completed");
        assert!(last["text"].as_str().is_some_and(|t| t.contains("worker")));
    }
    let shown = fleet
        .harness
        .cli(&fleet.judge, &["tasks", "show", id])
        .expect("tasks show");
    let text = String::from_utf8_lossy(&shown.stdout);
    for part in [
        "evaluate: role judge, threshold 0.80, at most 3 attempts",
        "attempt 1 scored 0.20 by j on judge: mention the weather",
        "attempt 2 of 3: attempt 1 scored 0.20, below the threshold 0.80",
        "attempt 2 scored 0.90",
    ] {
        assert!(text.contains(part), "`{part}` missing:\n{text}");
    }
    let listed = fleet
        .harness
        .cli(&fleet.judge, &["tasks", "--json"])
        .expect("tasks");
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("json");
    assert_eq!(
        listed["tasks"][0]["evaluate"],
        json!({"role": "judge", "threshold": 0.8, "attempts": 3})
    );

    // The plain form prints the chosen answer, not every attempt's text.
    fleet
        .judging
        .push([verdict(0.1, "no"), verdict(0.0, "worse")]);
    fleet
        .work
        .push([Scripted::text("kept"), Scripted::text("dropped")]);
    let output = fleet
        .harness
        .cli(
            &fleet.judge,
            &[
                "run",
                "--role",
                "chat",
                "--evaluate",
                "judge",
                "--attempts",
                "2",
                "go",
            ],
        )
        .expect("run");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "kept");
    let progress = String::from_utf8_lossy(&output.stderr);
    assert!(
        progress.contains("attempt 2 scored 0.00 by j on judge: worse"),
        "{progress}"
    );
}

#[test]
fn attempts_budget_and_deadline_bound_the_loop_and_bad_verdicts_and_input_are_clear() {
    let fleet = Fleet::start();

    // Never good enough: exactly the attempts asked for, and the best answer (the earliest of
    // the best) is returned. A fourth attempt would find an answer and a verdict waiting.
    fleet
        .judging
        .push([verdict(0.1, "a"), verdict(0.3, "b"), verdict(0.1, "c")]);
    fleet.judging.otherwise(verdict(0.1, "again"));
    fleet.work.push([
        Scripted::text("a1"),
        Scripted::text("a2"),
        Scripted::text("a3"),
    ]);
    fleet.work.otherwise(Scripted::text("one too many"));
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--attempts",
        "3",
        "x",
    ]);
    assert_eq!(code, Some(0), "{run:#}");
    assert_eq!(run["output"], "a2");
    assert_eq!(scores(&run), [json!(0.1), json!(0.3), json!(0.1)]);
    assert_eq!(fleet.work.requests().len(), 3, "exactly three attempts");
    assert_eq!(fleet.judging.requests().len(), 3);

    // A verdict that is not one: one retry (told why), then the attempt is unscored, with the
    // reason in its event, and the next attempt runs the task as asked. Here the second
    // attempt is scored and wins over the unscored first.
    fleet.judging.push([
        Scripted::text("I liked it"),
        Scripted::text("{\"score\": 7}"),
    ]);
    fleet.judging.push([verdict(0.95, "fine")]);
    fleet
        .work
        .push([Scripted::text("first try"), Scripted::text("second try")]);
    let (work_before, judge_before) = (fleet.work.requests().len(), fleet.judging.requests().len());
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--attempts",
        "2",
        "y",
    ]);
    assert_eq!(code, Some(0), "{run:#}");
    assert_eq!(run["output"], "second try");
    let unscored = &run["evaluations"][0];
    assert_eq!(unscored["score"], Value::Null, "{run:#}");
    let why = unscored["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("no valid score") && why.contains("between 0 and 1"),
        "{why}"
    );
    assert_eq!(run["evaluations"][1]["score"], 0.95);
    assert_eq!(fleet.judging.requests().len() - judge_before, 3);
    assert!(
        fleet
            .judging
            .request_text(judge_before + 1)
            .contains("That reply is not valid"),
        "the retry says what was wrong"
    );
    assert_eq!(fleet.work.requests().len() - work_before, 2);
    let rerun = fleet.work.requests()[work_before + 1]["messages"].clone();
    let last = rerun.as_array().and_then(|m| m.last()).cloned();
    assert_eq!(
        last.map(|m| m["content"].clone()),
        Some(json!("y")),
        "{rerun}"
    );
    let events = fleet.events(&fleet.worker, run["task_id"].as_str().expect("id"));
    let again = of_type(&events, "attempt_started");
    assert!(
        again[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("unscored")),
        "{again:?}"
    );

    // The token budget covers the attempts and the evaluator together: 500 tokens of answer and
    // 550 of verdict spend a budget of 1000, so the loop stops with the best answer so far
    // and says why; no second attempt runs.
    fleet
        .work
        .push([Scripted::text("within budget").usage(300, 200)]);
    fleet
        .judging
        .push([verdict(0.2, "more please").usage(300, 250)]);
    let work_before = fleet.work.requests().len();
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--token-budget",
        "1000",
        "z",
    ]);
    assert_eq!(code, Some(0), "{run:#}");
    assert_eq!(run["output"], "within budget");
    assert_eq!(fleet.work.requests().len() - work_before, 1);
    let events = fleet.events(&fleet.worker, run["task_id"].as_str().expect("id"));
    let warning = of_type(&events, "warning");
    assert!(
        warning.iter().any(|w| w["text"]
            .as_str()
            .is_some_and(|t| t.contains("token budget is spent: 1050 of 1000"))),
        "{events:#?}"
    );
    assert!(of_type(&events, "attempt_started").is_empty());
    let completed = of_type(&events, "completed");
    assert!(
        completed[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("1050 tokens")),
        "the usage counts the evaluator: {completed:?}"
    );
    // A first attempt that spends the budget alone fails the task, as without an evaluation,
    // and the evaluator is not called.
    fleet
        .work
        .push([Scripted::text("too long").usage(800, 400)]);
    let judge_before = fleet.judging.requests().len();
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--token-budget",
        "1000",
        "w",
    ]);
    assert_eq!(code, Some(1), "{run:#}");
    assert_eq!(run["error_kind"], "budget", "{run:#}");
    assert_eq!(fleet.judging.requests().len(), judge_before);

    // The deadline covers every attempt: each takes 3 s, the task has 5 (4 on the worker, which
    // gets what is left after forwarding), so the first is scored and the second cut off. A
    // deadline per attempt would let both finish, and the answers waiting above would then
    // complete the task.
    fleet.work.push([
        Scripted::text("slow one").after(Duration::from_secs(3)),
        Scripted::text("slow two").after(Duration::from_secs(3)),
    ]);
    fleet.judging.push([verdict(0.1, "again")]);
    let (code, run) = fleet.run(&[
        "--role",
        "chat",
        "--evaluate",
        "judge",
        "--timeout",
        "5",
        "v",
    ]);
    assert_eq!(code, Some(1), "{run:#}");
    assert_eq!(run["error_kind"], "deadline", "{run:#}");
    let events = fleet.events(&fleet.worker, run["task_id"].as_str().expect("id"));
    assert_eq!(of_type(&events, "evaluated").len(), 1, "{events:#?}");
    assert_eq!(of_type(&events, "attempt_started").len(), 1, "{events:#?}");

    // Bad input: the CLI's own errors (exit 2) name the flag; an evaluator role nobody serves
    // is refused before anything runs, naming it.
    for (args, says) in [
        (vec!["--threshold", "1.5"], "1.5 is not between 0 and 1"),
        (vec!["--threshold", "much"], "not a number"),
        (vec!["--attempts", "0"], "0 is not between 1 and 5"),
        (vec!["--attempts", "6"], "6 is not between 1 and 5"),
    ] {
        let mut full = vec!["run", "--role", "chat", "--evaluate", "judge"];
        full.extend(args);
        full.push("x");
        let (code, stderr) = fleet.cli_fails(&full);
        assert_eq!(code, Some(2), "{full:?}: {stderr}");
        assert!(stderr.contains(says), "{full:?}: {stderr}");
    }
    let (code, stderr) = fleet.cli_fails(&["run", "--role", "chat", "--attempts", "2", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--evaluate"), "{stderr}");
    let work_before = fleet.work.requests().len();
    let (code, stderr) = fleet.cli_fails(&["run", "--role", "chat", "--evaluate", "nobody", "x"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("evaluate.role: no node of the mesh can run the evaluator role `nobody`"),
        "{stderr}"
    );
    assert_eq!(fleet.work.requests().len(), work_before, "nothing ran");

    // The same bounds over gRPC: INVALID_ARGUMENT naming the field.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let channel = fleet
            .harness
            .member_channel(&fleet.judge)
            .await
            .expect("channel");
        let mut tasks = pb::tasks_client::TasksClient::new(channel);
        for (evaluation, field) in [
            (
                pb::Evaluation {
                    role: "judge".into(),
                    threshold: Some(-0.5),
                    attempts: None,
                },
                "evaluate.threshold",
            ),
            (
                pb::Evaluation {
                    role: "judge".into(),
                    threshold: None,
                    attempts: Some(0),
                },
                "evaluate.attempts",
            ),
            (
                pb::Evaluation {
                    role: "judge".into(),
                    threshold: None,
                    attempts: Some(100),
                },
                "evaluate.attempts",
            ),
            (pb::Evaluation::default(), "evaluate.role"),
        ] {
            let status = tasks
                .submit(pb::SubmitRequest {
                    prompt: "x".into(),
                    target: Some(pb::submit_request::Target::Role("chat".into())),
                    evaluate: Some(evaluation),
                    ..Default::default()
                })
                .await
                .map(drop)
                .expect_err(field);
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            assert!(status.message().starts_with(field), "{}", status.message());
        }
    });
}

#[test]
fn a_schedule_with_an_evaluation_scores_each_firings_task() {
    let fleet = Fleet::start();
    fleet
        .judging
        .push([verdict(0.3, "add the totals"), verdict(0.95, "complete")]);
    fleet.work.push([
        Scripted::text("draft"),
        Scripted::text("report with totals"),
    ]);
    let added = fleet
        .harness
        .cli(
            &fleet.judge,
            &[
                "cron",
                "add",
                "--name",
                "report",
                "--schedule",
                "0 0 1 1 *",
                "--role",
                "chat",
                "--evaluate",
                "judge",
                "--attempts",
                "2",
                "write the report",
            ],
        )
        .expect("cron add");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let listed = fleet
        .harness
        .cli(&fleet.judge, &["cron", "ls", "--json"])
        .expect("cron ls");
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("json");
    assert_eq!(
        listed[0]["evaluate"],
        json!({"role": "judge", "threshold": 0.8, "attempts": 2})
    );
    let fired = fleet
        .harness
        .cli(&fleet.judge, &["cron", "run-now", "report", "--json"])
        .expect("run-now");
    assert!(fired.status.success());
    let done = wait_for("the firing done", DEADLINE, || {
        let output = fleet
            .harness
            .cli(&fleet.judge, &["cron", "history", "report", "--json"])
            .ok()?;
        let firings: Value = serde_json::from_slice(&output.stdout).ok()?;
        firings
            .as_array()?
            .iter()
            .find(|f| f["status"] == "done")
            .cloned()
    })
    .expect("fired");
    assert_eq!(done["executed_on"], "worker", "{done}");
    let events = fleet.events(&fleet.worker, done["task_id"].as_str().expect("task id"));
    let evaluated = of_type(&events, "evaluated");
    assert_eq!(evaluated.len(), 2, "{events:#?}");
    assert_eq!(evaluated[0]["evaluation"]["critique"], "add the totals");
    assert_eq!(evaluated[1]["evaluation"]["score"], 0.95);
    let completed = of_type(&events, "completed");
    assert_eq!(completed.len(), 1);
    assert!(fleet.work.request_text(1).contains("add the totals"));
}
