//! Failover of front-door chats when the node serving them dies mid-answer (issue 30, item 6):
//! a laptop without models places a chat on one of three nodes serving model `m`, each backed
//! by its own fake model that trickles `tick ` every 100 ms for ever, and the serving node is
//! SIGKILLed once the client has read some of the answer. A streamed chat goes on on the next
//! node, asked to continue the text already streamed (sent as an assistant message): the
//! official `openai` and `anthropic` clients read one answer, that text once and the
//! continuation after it. With `x-agentmesh-failover: off` the stream ends with the error and no
//! other node is asked. A chat that is not streamed is asked again whole on the next node and
//! its usage counts what the lost node spent. `agentmesh_chat_failovers_total` counts each kind.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use mesh_tests::{
    Harness, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    http_request, python3, wait_for,
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
/// How often a serving node's model sends a piece of text (`tick `).
const TICK: Duration = Duration::from_millis(100);
/// What a node asked to continue a chat answers.
const CONTINUATION: &str = " And then the story ended.";
/// Deltas the client reads before the serving node is killed.
const READ_BEFORE_KILL: usize = 3;

/// A laptop without models and three nodes serving model `m`, each from its own fake model,
/// which trickles for ever and answers [`CONTINUATION`] to a request to continue.
struct Fleet {
    laptop: NodeProcess,
    gpus: Vec<NodeProcess>,
    fakes: Vec<FakeOpenAi>,
    /// Indexes of the nodes killed so far.
    killed: Vec<usize>,
    /// Declared last: the nodes stop before its temp dir goes.
    h: Harness,
}

fn fleet() -> Fleet {
    let h = Harness::new().expect("harness");
    let laptop = h.spawn(NodeOptions::new("laptop")).expect("laptop");
    let fakes: Vec<FakeOpenAi> = (0..3).map(|_| FakeOpenAi::start()).collect();
    let gpus: Vec<NodeProcess> = fakes
        .iter()
        .enumerate()
        .map(|(i, fake)| {
            fake.otherwise(Scripted::trickle(TICK));
            fake.continuing(Scripted::text(CONTINUATION));
            h.spawn(
                NodeOptions::new(&format!("gpu{i}"))
                    .peer(&laptop.addr)
                    .extra(&fake.node_config("")),
            )
            .expect("gpu")
        })
        .collect();
    let mut all = vec![&laptop];
    all.extend(&gpus);
    h.wait_all_up(&all, DEADLINE).expect("the fleet is up");
    Fleet {
        laptop,
        gpus,
        fakes,
        killed: Vec::new(),
        h,
    }
}

impl Fleet {
    /// Chat requests each fake received so far.
    fn asked(&self) -> Vec<usize> {
        self.fakes.iter().map(|f| f.requests().len()).collect()
    }

    /// The node whose model got the chat started after [`Fleet::asked`] said `before`.
    fn serving(&self, before: &[usize]) -> usize {
        wait_for("a node to serve the chat", DEADLINE, || {
            (0..self.fakes.len()).find(|&i| self.fakes[i].requests().len() > before[i])
        })
        .expect("some node serves the chat")
    }

    /// SIGKILLs node `i`.
    fn kill(&mut self, i: usize) {
        self.gpus[i].signal("KILL").expect("kill the serving node");
        self.killed.push(i);
    }

    /// Waits until the laptop has every killed node down, so the next chat is placed on live
    /// nodes only.
    fn wait_killed_down(&self) {
        for &i in &self.killed {
            let name = &self.gpus[i].name;
            wait_for(&format!("the laptop to see {name} down"), DEADLINE, || {
                (self.h.state_of(&self.laptop, name).as_deref() == Some("down")).then_some(())
            })
            .expect("a killed node goes down");
        }
    }

    /// The laptop's count of failovers of `kind` (0 before the first).
    fn failovers(&self, kind: &str) -> u64 {
        let metrics = self.laptop.metrics().expect("metrics");
        let series = format!("agentmesh_chat_failovers_total{{kind=\"{kind}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }
}

/// A chat by an official client (`openai` streamed, `anthropic` streamed, or `whole`: `openai`
/// not streamed) in a process of its own; what it reads comes as JSON lines: `{"delta"}` per
/// piece of text, then `{"done"}` or `{"error"}`; a whole answer is one `{"answer", "usage"}`.
const CLIENT: &str = r#"
import json, sys
dialect, url, failover = sys.argv[1:4]
headers = {} if failover == "-" else {"x-agentmesh-failover": failover}
ask = [{"role": "user", "content": "tell a long story"}]
def say(**event):
    print(json.dumps(event), flush=True)
try:
    if dialect == "anthropic":
        import anthropic
        client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=60)
        with client.messages.stream(model="m", max_tokens=1000, messages=ask,
                                    extra_headers=headers) as stream:
            for text in stream.text_stream:
                say(delta=text)
        say(done=True)
    else:
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        if dialect == "whole":
            r = client.chat.completions.create(model="m", messages=ask, extra_headers=headers)
            say(answer=r.choices[0].message.content,
                usage=[r.usage.prompt_tokens, r.usage.completion_tokens])
        else:
            for chunk in client.chat.completions.create(model="m", stream=True, messages=ask,
                                                        extra_headers=headers):
                for choice in chunk.choices:
                    if choice.delta.content:
                        say(delta=choice.delta.content)
            say(done=True)
except Exception as e:
    say(error=f"{type(e).__name__}: {e}")
"#;

/// A running [`CLIENT`] and the events it printed.
struct Client {
    child: Child,
    events: mpsc::Receiver<Value>,
}

impl Client {
    fn start(dialect: &str, url: &str, failover: Option<&str>) -> Self {
        let mut child = Command::new(python3())
            .arg("-c")
            .arg(CLIENT)
            .args([dialect, url, failover.unwrap_or("-")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run python3 (deploy/test.sh --setup-only installs `openai` and `anthropic`)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let event = serde_json::from_str(&line)
                    .unwrap_or_else(|_| json!({"error": format!("not JSON: {line}")}));
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        Self { child, events }
    }

    /// The next event.
    fn next(&self) -> Value {
        self.events
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("the client said nothing within {DEADLINE:?}: {e}"))
    }

    /// The text of the first `pieces` deltas (the answer must not end before).
    fn read(&self, pieces: usize) -> String {
        let mut text = String::new();
        for _ in 0..pieces {
            let event = self.next();
            let delta = event["delta"]
                .as_str()
                .unwrap_or_else(|| panic!("the answer ended early: {event}"));
            text.push_str(delta);
        }
        text
    }

    /// The text of the deltas up to the end, and the event that ended it.
    fn read_to_end(&self) -> (String, Value) {
        let mut text = String::new();
        loop {
            let event = self.next();
            match event["delta"].as_str() {
                Some(delta) => text.push_str(delta),
                None => return (text, event),
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The node serving a streamed chat dies after the client read its first pieces: the stream
/// goes on, for the official `openai` client and then for the official `anthropic` client (the
/// same path under both dialects). Each client reads the text the lost node streamed once and
/// the continuation after it; the node that took over was asked to continue exactly that text,
/// as an assistant message, with what is left of `max_tokens` (Anthropic's 1,000 less what was
/// streamed); the laptop logs and counts each failover.
#[test]
fn a_streamed_chat_whose_node_is_killed_goes_on_on_the_next_node() {
    let mut fleet = fleet();
    let url = fleet.laptop.http_url().expect("front door");
    for (round, dialect) in ["openai", "anthropic"].into_iter().enumerate() {
        fleet.wait_killed_down();
        let before = fleet.asked();
        let client = Client::start(dialect, &url, None);
        let seen = client.read(READ_BEFORE_KILL);
        let lost = fleet.serving(&before);
        fleet.kill(lost);
        let (rest, end) = client.read_to_end();
        assert_eq!(end, json!({"done": true}), "{dialect}: the stream broke");
        let text = seen + &rest;

        let now = fleet.asked();
        let took_over: Vec<usize> = (0..now.len())
            .filter(|&i| i != lost && now[i] > before[i])
            .collect();
        assert_eq!(took_over.len(), 1, "{dialect}: one node took over: {now:?}");
        let asked = fleet.fakes[took_over[0]].requests();
        let asked = asked.last().expect("the request that took over");
        let messages = asked["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 2, "{dialect}: {asked}");
        assert_eq!(messages[0]["content"], "tell a long story", "{dialect}");
        assert_eq!(messages[1]["role"], "assistant", "{dialect}: {asked}");
        let prefix = messages[1]["content"].as_str().expect("the text so far");
        assert!(
            prefix.len() >= READ_BEFORE_KILL * "tick ".len()
                && prefix.replace("tick ", "").is_empty(),
            "{dialect}: the prefix is the lost node's text: {prefix:?}"
        );
        assert_eq!(
            text,
            format!("{prefix}{CONTINUATION}"),
            "{dialect}: the client read the text so far once and the continuation after it"
        );
        if dialect == "anthropic" {
            let left = asked["max_tokens"].as_u64().expect("max_tokens");
            assert!(
                left < 1000,
                "{dialect}: what was streamed is taken off: {asked}"
            );
        }
        assert_eq!(fleet.failovers("mid_stream"), round as u64 + 1);
        let log = fleet.laptop.log_text();
        let said = log
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["level"] == "WARN")
            .map(|line| line["fields"].clone())
            .find(|fields| {
                fields["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("continuing on the next node"))
                    && fields["lost"] == fleet.gpus[lost].name.as_str()
            })
            .unwrap_or_else(|| panic!("{dialect}: no warning of the failover:\n{log}"));
        assert_eq!(
            said["node"],
            fleet.gpus[took_over[0]].name.as_str(),
            "{said}"
        );
        assert_eq!(said["model"], "m", "{said}");
        assert_eq!(said["streamed_bytes"], prefix.len(), "{said}");
    }
    assert_eq!(fleet.failovers("whole"), 0);
}

/// With `x-agentmesh-failover: off`, a streamed chat whose node dies mid-answer ends with the
/// error, as before failover existed, and no other node is asked (an unknown value of the
/// header is a 400 naming it). A chat that is not streamed, whose node dies mid-answer, is
/// asked again whole on the next node; its answer is that node's alone, and its usage is that
/// node's report plus the estimate of what the lost node spent (its prompt and the text it
/// had generated), charged once.
#[test]
fn a_strict_chat_ends_with_the_error_and_one_not_streamed_is_asked_again_whole() {
    let mut fleet = fleet();
    let url = fleet.laptop.http_url().expect("front door");
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    let (status, _, answer) = http_request(
        &fleet.laptop,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-agentmesh-failover", "sometimes"),
        ],
        body,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("x-agentmesh-failover: `sometimes` is neither `on` nor `off`"),
        "{answer}"
    );
    assert_eq!(
        fleet.asked(),
        [0, 0, 0],
        "a refused request reached no model"
    );

    let before = fleet.asked();
    let client = Client::start("openai", &url, Some("off"));
    client.read(READ_BEFORE_KILL);
    let lost = fleet.serving(&before);
    fleet.kill(lost);
    let (_, end) = client.read_to_end();
    assert!(
        end["error"].is_string(),
        "the stream ends with the error: {end}"
    );
    let mut expected = before.clone();
    expected[lost] += 1;
    assert_eq!(fleet.asked(), expected, "no other node was asked");
    assert_eq!(fleet.failovers("mid_stream"), 0);

    fleet.wait_killed_down();
    let before = fleet.asked();
    let client = Client::start("whole", &url, None);
    let lost = fleet.serving(&before);
    let ticks = 5;
    wait_for("the model to have answered a while", DEADLINE, || {
        (fleet.fakes[lost].trickled() >= ticks).then_some(())
    })
    .expect("the model trickles");
    let next = (0..3)
        .find(|i| *i != lost && !fleet.killed.contains(i))
        .expect("a live node");
    fleet.fakes[next].push([Scripted::text("A whole answer.").usage(10, 5)]);
    fleet.kill(lost);
    let answer = client.next();
    assert_eq!(answer["answer"], "A whole answer.", "{answer}");
    let (prompt, completion) = (
        answer["usage"][0].as_u64().expect("prompt tokens"),
        answer["usage"][1].as_u64().expect("completion tokens"),
    );
    assert!(
        prompt > 10 && completion > 5,
        "the lost node's prompt and text are counted besides the retry's 10 + 5: {answer}"
    );
    let asked = fleet.fakes[next].requests();
    let asked = asked.last().expect("the retry");
    let messages = asked["messages"].as_array().expect("messages");
    assert_eq!(
        (
            messages.len(),
            &messages[0]["role"],
            &messages[0]["content"]
        ),
        (1, &json!("user"), &json!("tell a long story")),
        "the whole request, nothing streamed added: {asked}"
    );
    assert_eq!(fleet.failovers("whole"), 1);
    assert_eq!(fleet.failovers("mid_stream"), 0);
}
