//! Claude Code and Codex, the real command-line clients from npm (at the versions
//! `deploy/test.sh --setup-only` pins), through a two-node mesh exactly as the README says: the
//! test reads the README's sections "Claude Code and Anthropic's clients" and "Codex and the
//! OpenAI Responses API" and runs their setup and their `claude -p` / `codex exec` lines, with
//! only the node's address and key filled in. A laptop node without models and a gpu node whose
//! model is the scripted fake; each client talks to the laptop. Checked for each: a plain
//! answer, a streamed answer, a tool round trip (Claude Code's Bash tool, Codex's shell tool:
//! `$((6*7))` comes back as 42 only if a shell ran it), and Claude Code calling the mesh's own
//! `/mcp` `run_task` and its model receiving the task's answer; and, without `ANTHROPIC_MODEL`,
//! Claude Code's own model name reaching the fleet through the README's `http.model_aliases`.
//!
//! Everything (both nodes, the fake model, the clients) runs in one network namespace whose
//! only interface is its loopback, so the clients reach nothing but the mesh, whatever they
//! try; their telemetry is off by their own settings, which are in the README. Needs root (the
//! namespace), as CI runs.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Output},
    time::Duration,
};

use mesh_tests::{
    Harness, Netns, NodeOptions, NodeProcess,
    fake_openai::{FakeOpenAi, Scripted},
    npm_bin,
};
use serde_json::Value;

/// The laptop's front-door key, written where the README has a placeholder.
const KEY: &str = "coding-agents-key-3c1f9e0a7b5d";
/// How long one client command may take.
const CLIENT_TIMEOUT_S: u64 = 120;
const DEADLINE: Duration = Duration::from_secs(30);

/// A namespace with the laptop and the gpu in it, the fake model, and a home and a working
/// directory for the clients.
struct Mesh {
    /// Owns the nodes' directories: bound for as long as the test runs.
    _h: Harness,
    ns: Netns,
    fake: FakeOpenAi,
    laptop: NodeProcess,
    _gpu: NodeProcess,
    /// The clients' `HOME` and working directory.
    dir: tempfile::TempDir,
}

/// The mesh, with `laptop_config` appended to the laptop's config.
fn mesh(laptop_config: &str) -> Mesh {
    let ns = Netns::new().expect("namespace");
    let fake = FakeOpenAi::start_in(&ns);
    let h = Harness::new().expect("harness");
    let laptop = h
        .spawn(
            NodeOptions::new("laptop")
                .in_netns(&ns)
                .http_keys(&[KEY])
                .extra(laptop_config),
        )
        .expect("laptop");
    let gpu = h
        .spawn(
            NodeOptions::new("gpu")
                .in_netns(&ns)
                .peer(&laptop.addr)
                .extra(&fake.node_config("coder = [\"m\"]\n")),
        )
        .expect("gpu");
    h.wait_all_up(&[&laptop, &gpu], DEADLINE).expect("mesh");
    let dir = tempfile::Builder::new()
        .prefix("agentmesh-clients")
        .tempdir()
        .expect("temp dir");
    fs::create_dir_all(dir.path().join("work")).expect("work dir");
    Mesh {
        _h: h,
        ns,
        fake,
        laptop,
        _gpu: gpu,
        dir,
    }
}

/// The text of the README's section `heading` (`### heading`), up to the next heading.
fn readme_section(heading: &str) -> String {
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme
        .find(&format!("### {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no section `### {heading}`"));
    let rest = &readme[start + heading.len() + 5..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min();
    rest[..end.unwrap_or(rest.len())].to_owned()
}

/// The fenced code blocks of `lang` in `section`, in order.
fn blocks(section: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut found = Vec::new();
    let mut rest = section;
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("a closed code block");
        found.push(body[..end].to_owned());
        rest = &body[end..];
    }
    found
}

/// `text` with the README's address of the front door and its key placeholder replaced by the
/// laptop's.
fn filled_in(text: &str, url: &str) -> String {
    text.replace("http://127.0.0.1:7780", url)
        .replace("<one of http.api_keys>", KEY)
}

/// A README shell block as (the `export` lines, the command lines starting with `command`).
fn shell_lines(block: &str, command: &str) -> (String, Vec<String>) {
    let mut exports = String::new();
    let mut commands = Vec::new();
    for line in block.lines() {
        if line.starts_with("export ") {
            exports.push_str(line);
            exports.push('\n');
        } else if line.starts_with(&format!("{command} ")) {
            commands.push(line.to_owned());
        }
    }
    (exports, commands)
}

/// Runs `script` with bash inside the mesh's namespace, in the clients' working directory,
/// with a clean environment: `HOME` the test's, `PATH` the system's after the npm clients'.
fn run(mesh: &Mesh, script: &str) -> Output {
    let home = mesh.dir.path();
    let bin_dir: PathBuf = npm_bin("claude")
        .parent()
        .expect("the clients' directory")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
    );
    let output = Command::new("ip")
        .args(["netns", "exec", mesh.ns.name()])
        .args(["timeout", "-k", "5", &CLIENT_TIMEOUT_S.to_string()])
        .args(["bash", "-c", script])
        .current_dir(home.join("work"))
        .env_clear()
        .env("HOME", home)
        .env("PATH", path)
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        output.status.success(),
        "{script}\nfailed with {}:\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The last message of each chat request the fake received after `before` (what a failed check
/// shows: the whole requests carry every tool's schema).
fn last_messages(fake: &FakeOpenAi, before: usize) -> Vec<Value> {
    fake.requests()
        .iter()
        .skip(before)
        .map(|r| {
            r["messages"]
                .as_array()
                .and_then(|m| m.last())
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// The index of the first chat request the fake received after `before`, whose messages hold
/// a tool result containing `text`.
fn tool_result_with(fake: &FakeOpenAi, before: usize, text: &str) -> Option<usize> {
    fake.requests()
        .iter()
        .enumerate()
        .skip(before)
        .find_map(|(i, request)| {
            request["messages"]
                .as_array()?
                .iter()
                .any(|m| {
                    m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.contains(text))
                })
                .then_some(i)
        })
}

/// Claude Code 2.1.197 through the fleet: its own setup lines from the README, then each of its
/// `claude -p` lines. Regression (issue 27): every turn failed with `API Error: 400
/// messages.1.role: Input should be 'user' or 'assistant'` (Claude Code puts system messages
/// in the conversation for a model name it does not know), and `run_task`'s answer never
/// reached Claude Code's model (it reads the structured part of an MCP result).
#[test]
fn claude_code_works_through_the_fleet_as_the_readme_says() {
    let section = readme_section("Claude Code and Anthropic's clients");
    // The node config the section gives, for Claude Code's own model names.
    let aliases = blocks(&section, "toml")
        .into_iter()
        .next()
        .expect("a toml block (http.model_aliases) in the Claude Code section");
    let mesh = mesh(&aliases);
    let url = mesh.laptop.http_url().expect("front door");
    let block = blocks(&section, "sh")
        .into_iter()
        .next()
        .expect("a sh block in the Claude Code section");
    let (exports, commands) = shell_lines(&filled_in(&block, &url), "claude");
    assert!(
        exports.contains("DISABLE_TELEMETRY=1")
            && exports.contains("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"),
        "the README turns Claude Code's telemetry off: {exports}"
    );
    let mut seen = Vec::new();
    for command in &commands {
        let script = format!("{exports}{command}");
        let before = mesh.fake.requests().len();
        if command.contains(" mcp add ") {
            run(&mesh, &script);
            seen.push("mcp add");
        } else if command.contains("stream-json") {
            mesh.fake
                .push([Scripted::text("streamed answer from the fleet")]);
            let output = stdout(&run(&mesh, &script));
            let events: Vec<Value> = output
                .lines()
                .map(|line| serde_json::from_str(line).expect("a JSON event per line"))
                .collect();
            let deltas: Vec<&str> = events
                .iter()
                .filter(|e| e["event"]["delta"]["type"] == "text_delta")
                .filter_map(|e| e["event"]["delta"]["text"].as_str())
                .collect();
            assert!(deltas.len() >= 2, "the answer came in pieces: {output}");
            assert_eq!(deltas.concat(), "streamed answer from the fleet");
            let result = events.last().expect("events");
            assert_eq!(
                result["result"], "streamed answer from the fleet",
                "{result}"
            );
            seen.push("streamed");
        } else if command.contains("--allowedTools Bash") {
            mesh.fake.push([
                Scripted::tool(
                    "Bash",
                    r#"{"command": "echo mesh-$((6*7))", "description": "print a number"}"#,
                ),
                Scripted::text("the shell said mesh-42"),
            ]);
            let output = stdout(&run(&mesh, &script));
            assert_eq!(output, "the shell said mesh-42");
            assert!(
                tool_result_with(&mesh.fake, before, "mesh-42").is_some(),
                "the Bash tool's output reached the model: {:#?}",
                last_messages(&mesh.fake, before)
            );
            seen.push("bash");
        } else if command.contains("mcp__mesh__run_task") {
            mesh.fake.push([
                Scripted::tool(
                    "mcp__mesh__run_task",
                    r#"{"prompt": "What does the fleet say?", "role": "chat"}"#,
                ),
                // The task's own agent, on the gpu, asks the same model.
                Scripted::text("forty-two, from the fleet"),
                Scripted::text("the fleet said forty-two"),
            ]);
            let output = stdout(&run(&mesh, &script));
            assert_eq!(output, "the fleet said forty-two");
            assert!(
                tool_result_with(&mesh.fake, before, "forty-two, from the fleet").is_some(),
                "run_task's answer reached Claude Code's model: {:#?}",
                last_messages(&mesh.fake, before)
            );
            seen.push("run_task");
        } else if command.starts_with("claude -p ") {
            mesh.fake
                .push([Scripted::text("plain answer from the fleet")]);
            assert_eq!(stdout(&run(&mesh, &script)), "plain answer from the fleet");
            // The first turn is the one that failed: Claude Code sends system messages in the
            // conversation, and they reached the model as system turns.
            let first = &mesh.fake.requests()[before];
            let roles: Vec<&str> = first["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .filter_map(|m| m["role"].as_str())
                .collect();
            let user = roles
                .iter()
                .position(|r| *r == "user")
                .expect("a user turn");
            assert!(
                roles[user..].contains(&"system"),
                "Claude Code sent a system message after the first user turn: {roles:?}"
            );
            seen.push("plain");
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        ["bash", "mcp add", "plain", "run_task", "streamed"],
        "the README's Claude Code lines: {commands:#?}"
    );
    // Without ANTHROPIC_MODEL, Claude Code asks for a model name of its own, which the
    // README's http.model_aliases maps to the fleet.
    let plain = commands
        .iter()
        .find(|c| c.starts_with("claude -p ") && !c.contains("--"))
        .expect("a plain claude -p line");
    mesh.fake
        .push([Scripted::text("an answer for Claude's own model name")]);
    let before = mesh.fake.requests().len();
    let script = format!("{exports}unset ANTHROPIC_MODEL ANTHROPIC_DEFAULT_HAIKU_MODEL\n{plain}");
    assert_eq!(
        stdout(&run(&mesh, &script)),
        "an answer for Claude's own model name"
    );
    let asked = &mesh.fake.requests()[before];
    assert!(asked["messages"].is_array(), "{asked}");
}

/// Codex 0.171.0 through the fleet: the README's `config.toml` and its `codex exec` lines.
/// Regression (issue 27): every request failed with `400 client_metadata: unrecognized
/// request argument`, and then on Codex's `namespace` and `web_search` tools.
#[test]
fn codex_works_through_the_fleet_as_the_readme_says() {
    let mesh = mesh("");
    let url = mesh.laptop.http_url().expect("front door");
    let section = readme_section("Codex and the OpenAI Responses API");
    let config = blocks(&section, "toml")
        .into_iter()
        .next()
        .expect("a toml block in the Codex section");
    let config = filled_in(&config, &url);
    assert!(
        config.contains("[analytics]\nenabled = false"),
        "the README turns Codex's analytics off: {config}"
    );
    let codex_home = mesh.dir.path().join(".codex");
    fs::create_dir_all(&codex_home).expect("~/.codex");
    fs::write(codex_home.join("config.toml"), &config).expect("config.toml");
    let block = blocks(&section, "sh")
        .into_iter()
        .next()
        .expect("a sh block in the Codex section");
    let (exports, commands) = shell_lines(&filled_in(&block, &url), "codex");
    let mut seen = Vec::new();
    for command in commands.iter().filter(|c| c.starts_with("codex exec ")) {
        let script = format!("{exports}{command}");
        let before = mesh.fake.requests().len();
        if command.contains("--json") {
            mesh.fake
                .push([Scripted::text("streamed answer from the fleet").usage(11, 7)]);
            let output = stdout(&run(&mesh, &script));
            let events: Vec<Value> = output
                .lines()
                .map(|line| serde_json::from_str(line).expect("a JSON event per line"))
                .collect();
            let message = events
                .iter()
                .find(|e| e["type"] == "item.completed" && e["item"]["type"] == "agent_message")
                .unwrap_or_else(|| panic!("an agent message: {output}"));
            assert_eq!(message["item"]["text"], "streamed answer from the fleet");
            let done = events
                .iter()
                .find(|e| e["type"] == "turn.completed")
                .unwrap_or_else(|| panic!("the turn's end: {output}"));
            assert_eq!(done["usage"]["input_tokens"], 11, "{done}");
            assert_eq!(done["usage"]["output_tokens"], 7, "{done}");
            seen.push("streamed");
        } else if command.contains("echo mesh-") {
            mesh.fake.push([
                Scripted::tool("exec_command", r#"{"cmd": "echo mesh-$((6*7))"}"#),
                Scripted::text("the shell said mesh-42"),
            ]);
            let output = stdout(&run(&mesh, &script));
            assert!(output.ends_with("the shell said mesh-42"), "{output}");
            assert!(
                tool_result_with(&mesh.fake, before, "mesh-42").is_some(),
                "the shell tool's output reached the model: {:#?}",
                last_messages(&mesh.fake, before)
            );
            seen.push("shell");
        } else {
            mesh.fake
                .push([Scripted::text("plain answer from the fleet")]);
            let output = stdout(&run(&mesh, &script));
            assert!(output.ends_with("plain answer from the fleet"), "{output}");
            // Codex's own tools reached the model as functions: its sub-agent namespace's
            // flattened, its hosted web search left out.
            let tools: Vec<String> = mesh.fake.requests()[before]["tools"]
                .as_array()
                .expect("tools")
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect();
            assert!(tools.iter().any(|t| t == "exec_command"), "{tools:?}");
            assert!(
                tools.iter().any(|t| t.starts_with("multi_agent_v1__")),
                "{tools:?}"
            );
            assert!(!tools.iter().any(|t| t == "web_search"), "{tools:?}");
            seen.push("plain");
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        ["plain", "shell", "streamed"],
        "the README's codex exec lines: {commands:#?}"
    );
}

/// The README's Claude Code and Codex sections are found (a renamed heading fails here, not
/// as a confusing error in the tests above) and point at the front door's documented port.
#[test]
fn the_readme_sections_the_clients_follow_are_there() {
    for heading in [
        "Claude Code and Anthropic's clients",
        "Codex and the OpenAI Responses API",
    ] {
        let section = readme_section(heading);
        assert!(
            section.contains("http://127.0.0.1:7780"),
            "{heading}: {section}"
        );
        assert!(!blocks(&section, "sh").is_empty(), "{heading}");
    }
}
