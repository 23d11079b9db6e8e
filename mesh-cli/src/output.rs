//! What a person reads: times as ages, tables, a node's refusal in words, and every text that
//! came from elsewhere with its control characters escaped ([`shown`]), so that it cannot move
//! the cursor or rewrite what the operator reads. `--json` output does not pass here: JSON
//! escapes control characters itself.

use std::{borrow::Cow, time::Duration};

use anyhow::anyhow;
use mesh_domain::text::{LineBreaks, escape_controls};

/// Writes one line to stdout. When its reader has gone (a closed pipe: `mesh-cli status |
/// head -n 1`), mesh-cli has nothing more to say to anyone: it exits 0 at once, as ripgrep does,
/// instead of panicking on the next line. Any other failure (a full disk behind a redirect) is
/// said and ends it with 1.
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    match writeln!(std::io::stdout().lock(), "{line}") {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// A call the node refused, in words: the node's own sentence, without tonic's description of
/// the status code in front of it.
pub(crate) fn refused(call: &str, node: &str, status: &tonic::Status) -> anyhow::Error {
    anyhow!("{call} on {node}: {}", status_words(status))
}

/// A status in words: its message, or the code's description when it has none.
pub(crate) fn status_words(status: &tonic::Status) -> String {
    if status.message().is_empty() {
        status.code().to_string()
    } else {
        status.message().to_owned()
    }
}

pub(crate) fn ago(now_ms: u64, then_ms: u64) -> String {
    if then_ms == 0 {
        return "never".into();
    }
    let age = Duration::from_millis(now_ms.saturating_sub(then_ms));
    match age.as_secs() {
        0 => "now".into(),
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s => format!("{}h ago", s / 3600),
    }
}

pub(crate) use mesh_domain::time::now_ms as unix_ms;

/// `text` as a terminal may show it: line breaks and tabs kept, every other control character
/// escaped (ESC and with it CSI and OSC sequences, CR, backspace, C1 controls; see
/// [`escape_controls`]).
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    escape_controls(text, LineBreaks::Keep)
}

/// Prints a table; each cell stays on its line (line breaks in it are escaped too).
pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let rows: Vec<[Cow<'_, str>; N]> = rows
        .iter()
        .map(|row| {
            row.each_ref()
                .map(|cell| escape_controls(cell, LineBreaks::Escape))
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(AsRef::as_ref).collect());
    }
}
