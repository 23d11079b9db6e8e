//! A program run as a person runs it: in a pseudo-terminal (`script(1)`), with keys typed into
//! it (Ctrl-C included, which the terminal turns into SIGINT) and everything it prints read as
//! it comes; and a program whose output is read while it runs (`status --watch`).

use std::{
    io::{Read, Write},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::wait_for;

/// What a running program printed so far, read on a thread of its own.
#[derive(Debug, Clone, Default)]
pub struct Printed {
    text: Arc<Mutex<String>>,
    /// Set when the output ended (the program closed it, or exited).
    ended: Arc<AtomicBool>,
}

impl Printed {
    /// Reads `from` until it ends, on a thread.
    pub fn collect(mut from: impl Read + Send + 'static) -> Self {
        let printed = Self::default();
        let (into, ended) = (printed.text.clone(), printed.ended.clone());
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = from.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                if let Ok(mut text) = into.lock() {
                    text.push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            }
            ended.store(true, Ordering::SeqCst);
        });
        printed
    }

    /// Everything so far.
    pub fn text(&self) -> String {
        self.text.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Whether the output ended.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Waits until the text so far satisfies `check`, failing with what was printed.
    pub fn wait_until(&self, what: &str, timeout: Duration, check: impl Fn(&str) -> bool) {
        wait_for(what, timeout, || check(&self.text()).then_some(()))
            .unwrap_or_else(|e| panic!("{e}; printed so far:\n{}", self.text()));
    }
}

/// A command running in a pseudo-terminal: what it prints (stdout and stderr together, as a
/// terminal shows them) and a keyboard.
#[derive(Debug)]
pub struct Terminal {
    child: Child,
    keys: ChildStdin,
    /// What it printed so far.
    pub printed: Printed,
}

impl Terminal {
    /// Runs `command` (its program, arguments and environment) in a pseudo-terminal.
    pub fn run(command: &Command) -> Self {
        let quote =
            |text: &std::ffi::OsStr| format!("'{}'", text.to_string_lossy().replace('\'', r"'\''"));
        let mut line: Vec<String> = command
            .get_envs()
            .filter_map(|(key, value)| Some(format!("{}={}", key.to_string_lossy(), quote(value?))))
            .collect();
        if !line.is_empty() {
            line.insert(0, "env".into());
        }
        // The shell `script` starts must not stay between the terminal and the command: it
        // would take the Ctrl-C for itself too (and exit 130).
        line.insert(0, "exec".into());
        line.extend(
            std::iter::once(command.get_program())
                .chain(command.get_args())
                .map(quote),
        );
        let mut child = Command::new("script")
            .args(["-q", "-e", "-c", &line.join(" "), "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env_remove("MESH_NODE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1) runs the command in a pseudo-terminal");
        let keys = child.stdin.take().expect("stdin");
        let printed = Printed::collect(child.stdout.take().expect("stdout"));
        Self {
            child,
            keys,
            printed,
        }
    }

    /// Types `keys` (`"\x03"` is Ctrl-C).
    pub fn type_keys(&mut self, keys: &str) {
        self.keys.write_all(keys.as_bytes()).expect("type");
        self.keys.flush().expect("flush");
    }

    /// Waits (at most `timeout`) for the command to end; its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let status = wait_for("the command in the terminal to end", timeout, || {
            self.child.try_wait().ok().flatten()
        })
        .unwrap_or_else(|e| panic!("{e}; printed so far:\n{}", self.printed.text()));
        // Everything it printed is read once the terminal's output ends.
        wait_for("the terminal's output to end", timeout, || {
            self.printed.ended().then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}; printed so far:\n{}", self.printed.text()));
        status.code()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
