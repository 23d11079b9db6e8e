//! `mesh-cli run`: submits a task (role `chat` when nothing else is named and the fleet serves
//! it), streams its events, and talks with the person at the terminal: the approvals the task
//! waits for, and Ctrl-C, which asks whether to cancel the task (a second Ctrl-C cancels it) and
//! otherwise leaves it running and says how to cancel it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, IsTerminal, Write};

use anyhow::anyhow;
use clap::Args;
use mesh_proto::v1 as pb;
use pb::task_event::Kind;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::{
    ConnArgs, channel, nodes, print_table, status_words,
    tasks::{Client, Reported, TaskArgs, describe, evaluated_json},
};

/// The role a task runs on when `run` is given no --role, --model or --persona.
const DEFAULT_ROLE: &str = "chat";

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    task: TaskArgs,
    /// Continue (or start) a conversation session: earlier turns are sent along, and this one
    /// is kept, so the next turn can run on any node.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// Print how the node would route the task (every candidate with its score or why it is
    /// excluded) and run nothing.
    #[arg(long)]
    explain: bool,
    /// Print one JSON object when the task ends instead of streaming:
    /// {"task_id", "status", "output", "executed_on", "error", ...}
    /// (docs/src/operations/mesh-cli.md).
    #[arg(long)]
    json: bool,
    /// Print the task's id as soon as a node took it, and return: the task runs on without
    /// this terminal (`mesh-cli tasks watch ID` on any node follows it; `tasks show ID` shows
    /// it).
    #[arg(long, conflicts_with = "explain")]
    detach: bool,
    /// What the agent should do.
    #[arg(required = true)]
    prompt: Vec<String>,
}

pub(crate) async fn run(conn: &ConnArgs, args: RunArgs) -> anyhow::Result<()> {
    let mut task = args.task;
    let defaulted = task.role.is_none() && task.model.is_none() && task.persona.is_none();
    if defaulted {
        task.role = Some(default_role(conn).await?);
    }
    let request = task.request(args.prompt.join(" "), args.session);
    // An evaluated task streams each attempt's text, but its output is the best attempt's:
    // print that at the end instead.
    let stream_output = !args.json && request.evaluate.is_none();
    let channel = channel(conn).await?;
    let mut client = pb::tasks_client::TasksClient::new(channel.clone());
    if args.explain {
        return explain(&mut client, request, args.json).await;
    }
    let mut stream = match client.submit(request).await {
        Ok(response) => response.into_inner(),
        // Scripts get the one JSON object even when the task was never admitted.
        Err(status) if args.json => {
            let object = json!({
                "task_id": "",
                "status": "failed",
                "output": "",
                "executed_on": "",
                "error": status.message(),
                "error_kind": "rejected",
                "error_fields": {"code": format!("{:?}", status.code())},
            });
            out!("{}", serde_json::to_string_pretty(&object)?);
            return Err(Reported.into());
        }
        Err(status) => {
            return Err(anyhow!(
                "{} refused the task: {}",
                conn.node,
                status_words(&status)
            ));
        }
    };

    if args.detach {
        return detach(conn, &mut stream, args.json).await;
    }
    let shown = Shown {
        json: args.json,
        stream_output,
        defaulted,
    };
    follow(conn, channel, client, stream, shown).await
}

/// `tasks watch ID`: follows task `id` on the asked node to its end, as `run` does.
pub(crate) async fn watch(conn: &ConnArgs, id: String, json: bool) -> anyhow::Result<()> {
    let channel = channel(conn).await?;
    let mut client = pb::tasks_client::TasksClient::new(channel.clone());
    let stream = client
        .watch(pb::WatchRequest {
            task_id: id,
            follow: true,
        })
        .await
        .map_err(|s| anyhow!("{}: {}", conn.node, status_words(&s)))?
        .into_inner();
    let shown = Shown {
        json,
        stream_output: !json,
        defaulted: false,
    };
    follow(conn, channel, client, stream, shown).await
}

/// `run --detach`: the task's id once the node took it (its first event), then return.
async fn detach(
    conn: &ConnArgs,
    stream: &mut tonic::Streaming<pb::TaskEvent>,
    json: bool,
) -> anyhow::Result<()> {
    let first = stream
        .message()
        .await
        .map_err(|s| {
            anyhow!(
                "{} ended the task's stream: {}",
                conn.node,
                status_words(&s)
            )
        })?
        .ok_or_else(|| anyhow!("{} took the task but sent no event", conn.node))?;
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({"task_id": first.task_id}))?
        );
    } else {
        out!("{}", first.task_id);
        eshow!(
            "· the task runs on; follow it with `mesh-cli tasks watch {}` (on any node), cancel it with `mesh-cli tasks cancel {}`",
            first.task_id,
            first.task_id
        );
    }
    Ok(())
}

/// How [`follow`] shows a task.
#[derive(Debug, Clone, Copy)]
struct Shown {
    /// One JSON object at the end instead of the stream.
    json: bool,
    /// Print the model's text as it streams.
    stream_output: bool,
    /// The role was the default one (said in the first line).
    defaulted: bool,
}

/// Follows a task's event stream to its end: its text, its events on stderr, the approvals it
/// waits for and Ctrl-C; then its outcome (or, with `json`, one object). `run` and
/// `tasks watch` both end here.
async fn follow(
    conn: &ConnArgs,
    channel: Channel,
    client: Client,
    mut stream: tonic::Streaming<pb::TaskEvent>,
    shown: Shown,
) -> anyhow::Result<()> {
    let Shown {
        json,
        stream_output,
        defaulted,
    } = shown;
    let mut person = Person::new(conn, channel, client);
    let mut interrupts = Interrupts::new()?;
    let mut completed: Option<pb::Completed> = None;
    let mut error: Option<pb::TaskError> = None;
    let mut streamed = false;
    let mut evaluations = Vec::new();
    loop {
        let next = tokio::select! {
            () = interrupts.recv() => {
                match person.interrupted() {
                    Flow::Follow => continue,
                    Flow::Detach => return person.detach(),
                }
            }
            line = person.lines.recv(), if !person.questions.is_empty() => {
                match person.answered(line) {
                    Flow::Follow => continue,
                    Flow::Detach => return person.detach(),
                }
            }
            next = stream.message() => next,
        };
        let event = match next {
            Ok(Some(event)) => event,
            Ok(None) => break,
            // The transport's words (`h2 protocol error: …`) say nothing to a person.
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal
                ) =>
            {
                return Err(anyhow!(
                    "{} went away mid-task (the connection to it closed); the task may have ended with it: see `{}` once it is back",
                    conn.node,
                    person.command("tasks show")
                ));
            }
            Err(status) => {
                return Err(anyhow!(
                    "{} ended the task's stream: {}",
                    conn.node,
                    status_words(&status)
                ));
            }
        };
        if person.task_id.is_empty() && !event.task_id.is_empty() {
            person.task_id.clone_from(&event.task_id);
            if !json {
                let default = if defaulted {
                    format!(
                        ": role {DEFAULT_ROLE} (the default: no --role, --model or --persona given)"
                    )
                } else {
                    String::new()
                };
                eshow!("· task {}{default}", person.task_id);
            }
        }
        match event.kind {
            Some(Kind::OutputDelta(delta)) if stream_output => {
                let mut stdout = std::io::stdout();
                stdout.write_all(crate::shown(&delta.text).as_bytes()).ok();
                stdout.flush().ok();
                streamed = true;
            }
            Some(Kind::Completed(done)) => completed = Some(done),
            Some(Kind::Failed(failed)) => error = failed.error,
            // Asked even with --json (on stderr): the task waits for an answer.
            Some(Kind::ApprovalRequested(request)) => person.approval_requested(&request),
            Some(Kind::ApprovalDecided(decided)) => {
                person.approval_decided(&decided.approval_id);
                if !json && let Some(line) = describe(&Kind::ApprovalDecided(decided)) {
                    eshow!("{line}");
                }
            }
            Some(Kind::Evaluated(evaluated)) if json => {
                evaluations.push(evaluated_json(&evaluated));
            }
            Some(kind) => {
                match &kind {
                    Kind::Accepted(a) => person.on = a.node.clone(),
                    Kind::Delegated(d) => person.on = d.node.clone(),
                    Kind::Started(s) => person.on = s.node.clone(),
                    _ => {}
                }
                if !json && let Some(line) = describe(&kind) {
                    eshow!("{line}");
                }
            }
            None => {}
        }
    }

    let task_id = person.task_id.clone();
    let cancelled = error.as_ref().is_some_and(|e| e.kind == "cancelled");
    if json {
        let mut object = json!({
            "task_id": task_id,
            "status": match (&completed, cancelled) {
                (Some(_), _) => "completed",
                (None, true) => "cancelled",
                (None, false) => "failed",
            },
            "output": completed.as_ref().map(|c| c.output.clone()).unwrap_or_default(),
            "executed_on": completed.as_ref().map(|c| c.executed_on.clone()).unwrap_or_default(),
        });
        if !evaluations.is_empty() {
            object["evaluations"] = json!(evaluations);
        }
        if let Some(error) = &error {
            object["error"] = json!(error.message);
            object["error_kind"] = json!(error.kind);
            object["error_fields"] = json!(error.fields);
        }
        out!("{}", serde_json::to_string_pretty(&object)?);
    } else if streamed {
        show!();
    } else if let Some(done) = &completed {
        show!("{}", done.output);
    }
    match (completed, error) {
        (Some(done), _) => {
            // The outcome comes last, after the answer.
            if !json && let Some(line) = describe(&Kind::Completed(done)) {
                eshow!("{line}");
            }
            Ok(())
        }
        (None, _) if json => Err(Reported.into()),
        (None, Some(error)) if cancelled => {
            eshow!("✗ task {task_id} cancelled: {}", error.message);
            Err(Reported.into())
        }
        (None, Some(error)) => Err(anyhow!("task {task_id} failed: {}", error.message)),
        (None, None) => Err(anyhow!("task {task_id} ended without an outcome")),
    }
}

/// Role `chat` when a node that is up serves it; otherwise an error that lists the roles the
/// fleet serves and where.
async fn default_role(conn: &ConnArgs) -> anyhow::Result<String> {
    let nodes = nodes::fleet(conn).await?;
    let mut served: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in nodes.iter().filter(|n| n["state"] == "up") {
        let name = node["name"].as_str().unwrap_or_default();
        for role in node["roles"].as_array().into_iter().flatten() {
            if let Some(role) = role.as_str() {
                served
                    .entry(role.to_owned())
                    .or_default()
                    .push(name.to_owned());
            }
        }
    }
    if served.contains_key(DEFAULT_ROLE) {
        return Ok(DEFAULT_ROLE.to_owned());
    }
    if served.is_empty() {
        return Err(anyhow!(
            "no --role, --model or --persona given, and no node of the fleet serves a role to run it on \
             (`mesh-cli status` shows what each node serves): give a node a model \
             (docs/src/operations/config.md, `[[models]]`), or run deploy/fetch-model.sh on one for \
             the embedded model (it serves role `{DEFAULT_ROLE}`)"
        ));
    }
    let list: Vec<String> = served
        .iter()
        .map(|(role, nodes)| format!("{role} (on {})", nodes.join(", ")))
        .collect();
    Err(anyhow!(
        "no --role, --model or --persona given, and no node serves role `{DEFAULT_ROLE}`, the default; \
         the fleet serves {}: run again with --role ROLE",
        list.join(", ")
    ))
}

/// What to do after the person said something (or pressed Ctrl-C).
enum Flow {
    /// Go on following the task.
    Follow,
    /// Stop following it; it keeps running.
    Detach,
}

/// A question to the person at the terminal, asked one at a time.
enum Question {
    /// Whether to cancel the task (after a Ctrl-C).
    Cancel,
    /// Whether to approve approval `id`.
    Approve(String),
    /// Why approval `id` is denied (after a no).
    DenyReason(String),
}

impl Question {
    fn prompt(&self, task_id: &str) -> String {
        match self {
            Self::Cancel => format!(
                "? cancel task {task_id}? [y/N] (Ctrl-C again cancels it; no leaves it running) "
            ),
            Self::Approve(_) => "  approve? [y/N] ".into(),
            Self::DenyReason(_) => "  reason (the model sees it): ".into(),
        }
    }
}

/// The person following the task: the questions asked, the lines they type, and what they
/// decided.
struct Person<'a> {
    conn: &'a ConnArgs,
    /// For approvals decided inline.
    channel: Channel,
    /// For the cancel.
    client: Client,
    task_id: String,
    /// The node the task is on, as its events last said.
    on: String,
    /// Whether stdin is a terminal (questions are asked only there).
    terminal: bool,
    /// The questions, the one being asked first.
    questions: VecDeque<Question>,
    /// Lines typed, read on a thread started at the first question.
    lines: Lines,
    /// A cancel was sent.
    cancelling: bool,
}

impl<'a> Person<'a> {
    fn new(conn: &'a ConnArgs, channel: Channel, client: Client) -> Self {
        Self {
            conn,
            channel,
            client,
            task_id: String::new(),
            on: conn.node.clone(),
            terminal: std::io::stdin().is_terminal(),
            questions: VecDeque::new(),
            lines: Lines::default(),
            cancelling: false,
        }
    }

    /// `mesh-cli [--node X] WHAT ID`, to type later.
    fn command(&self, what: &str) -> String {
        let node = self
            .conn
            .asked
            .as_deref()
            .map(|node| format!("--node {node} "))
            .unwrap_or_default();
        format!("mesh-cli {node}{what} {}", self.task_id)
    }

    /// Asks `question` now, ahead of the others (`first`) or after them.
    fn ask(&mut self, question: Question, first: bool) {
        let prompt = question.prompt(&self.task_id);
        if first {
            self.questions.push_front(question);
        } else {
            self.questions.push_back(question);
        }
        if first || self.questions.len() == 1 {
            self.lines.start();
            eprint!("{prompt}");
            std::io::stderr().flush().ok();
        }
    }

    /// The question now first is asked again (after the one before it was answered).
    fn ask_next(&self) {
        if let Some(next) = self.questions.front() {
            eprint!("{}", next.prompt(&self.task_id));
            std::io::stderr().flush().ok();
        }
    }

    fn interrupted(&mut self) -> Flow {
        if self.task_id.is_empty() || self.cancelling {
            // Nothing to cancel yet, or already cancelling: stop waiting.
            return Flow::Detach;
        }
        if matches!(self.questions.front(), Some(Question::Cancel)) {
            // The second Ctrl-C.
            eshow!();
            self.questions.pop_front();
            self.cancel();
            return Flow::Follow;
        }
        if !self.terminal {
            return Flow::Detach;
        }
        eshow!();
        self.ask(Question::Cancel, true);
        Flow::Follow
    }

    /// A line typed (`None`: the terminal closed).
    fn answered(&mut self, line: Option<String>) -> Flow {
        let Some(question) = self.questions.pop_front() else {
            return Flow::Follow;
        };
        let Some(line) = line else {
            // Nobody can answer any more: the task is left running, and approvals to be
            // decided elsewhere.
            return Flow::Detach;
        };
        let yes = matches!(line.trim(), "y" | "Y" | "yes");
        match question {
            Question::Cancel if yes => self.cancel(),
            Question::Cancel => return Flow::Detach,
            Question::Approve(id) if yes => self.decide(id, true, String::new()),
            Question::Approve(id) => {
                self.questions.push_front(Question::DenyReason(id));
            }
            Question::DenyReason(id) => self.decide(id, false, line.trim().to_owned()),
        }
        self.ask_next();
        Flow::Follow
    }

    fn cancel(&mut self) {
        self.cancelling = true;
        eshow!("· cancelling task {}", self.task_id);
        let mut client = self.client.clone();
        let task_id = self.task_id.clone();
        tokio::spawn(async move {
            if let Err(status) = client.cancel(pb::CancelRequest { task_id }).await {
                eshow!("! could not cancel: {}", status_words(&status));
            }
        });
    }

    fn decide(&self, id: String, approve: bool, reason: String) {
        let signer = match crate::signer(self.conn) {
            Ok(signer) => signer,
            Err(e) => {
                eshow!("! cannot sign a decision: {e:#}");
                return;
            }
        };
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let mut client = pb::approvals_client::ApprovalsClient::new(channel);
            if let Err(e) =
                crate::approvals::decide(&mut client, signer.as_ref(), &id, approve, reason).await
            {
                eshow!("! could not decide {id}: {e}");
            }
        });
    }

    /// An approval the task waits for: asked in a terminal, else how to decide it is said.
    fn approval_requested(&mut self, request: &pb::ApprovalRequested) {
        let id = request.approval_id.clone();
        let left = request.expires_at_ms.saturating_sub(crate::unix_ms()) / 1000;
        eshow!(
            "? `{}` on {} waits for approval (id {id}, denied in {left} s unless decided): {}",
            request.tool,
            request.node,
            request.arguments
        );
        if self.terminal {
            self.ask(Question::Approve(id), false);
        } else {
            eshow!(
                "  approve with `mesh-cli --node {node} approvals approve {id}`, or deny with `mesh-cli --node {node} approvals deny {id} --reason \"…\"`",
                node = self.conn.asked.as_deref().unwrap_or(&self.conn.node)
            );
        }
    }

    /// An approval was decided (here, elsewhere, or by its timeout): no question about it
    /// any more.
    fn approval_decided(&mut self, id: &str) {
        let asking = |q: &Question| matches!(q, Question::Approve(a) | Question::DenyReason(a) if a.as_str() == id);
        let was_first = self.questions.front().is_some_and(asking);
        self.questions.retain(|q| !asking(q));
        if was_first {
            eshow!();
            self.ask_next();
        }
    }

    /// Stops following: says the task keeps running and how to cancel it.
    fn detach(&self) -> anyhow::Result<()> {
        if self.task_id.is_empty() {
            eshow!(
                "stopped before {} named the task; `mesh-cli tasks` lists it if it started",
                self.conn.node
            );
        } else if self.cancelling {
            eshow!(
                "stopped waiting; the cancel of task {} was sent (see `{}`)",
                self.task_id,
                self.command("tasks show")
            );
        } else {
            eshow!(
                "task {} keeps running on {}; follow it with `{}`, cancel it with `{}`",
                self.task_id,
                self.on,
                self.command("tasks show"),
                self.command("tasks cancel")
            );
        }
        Err(Reported.into())
    }
}

/// Lines typed on the terminal, read on a plain thread of their own (a blocking read the
/// runtime would wait for at exit if nobody answers) from the first question on.
#[derive(Default)]
struct Lines(Option<mpsc::Receiver<String>>);

impl Lines {
    fn start(&mut self) {
        if self.0.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel(4);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { return };
                if tx.blocking_send(line).is_err() {
                    return;
                }
            }
        });
        self.0 = Some(rx);
    }

    /// The next line; `None` when the terminal closed.
    async fn recv(&mut self) -> Option<String> {
        match &mut self.0 {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }
}

/// Ctrl-C (SIGINT) while the task runs. Listened to from when the task's stream opens, so a
/// Ctrl-C between two events is not lost.
struct Interrupts(#[cfg(unix)] tokio::signal::unix::Signal);

impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .map_err(|e| anyhow!("cannot listen for Ctrl-C: {e}"))?;
            Ok(Self(signal))
        }
        #[cfg(not(unix))]
        Ok(Self())
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn explain(
    client: &mut Client,
    request: pb::SubmitRequest,
    json: bool,
) -> anyhow::Result<()> {
    let candidates = client
        .explain(request)
        .await
        .map_err(|s| anyhow!("explain: {}", s.message()))?
        .into_inner()
        .candidates;
    if json {
        let list: Vec<Value> = candidates
            .iter()
            .map(|c| json!({"node": c.node, "node_id": c.node_id, "local": c.local, "eligible": c.eligible,
                            "score": c.eligible.then_some(c.score), "reason": c.reason}))
            .collect();
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "candidates": list }))?
        );
        return Ok(());
    }
    let rows: Vec<[String; 4]> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = if c.local {
                format!("{} (this node)", c.node)
            } else {
                c.node.clone()
            };
            if c.eligible {
                [
                    format!("{}", i + 1),
                    name,
                    format!("{:.2}", c.score),
                    if i == 0 {
                        "chosen".into()
                    } else {
                        "eligible".into()
                    },
                ]
            } else {
                [
                    "-".into(),
                    name,
                    "-".into(),
                    format!("excluded: {}", c.reason),
                ]
            }
        })
        .collect();
    print_table(&["RANK", "NODE", "SCORE", "VERDICT"], &rows);
    Ok(())
}
