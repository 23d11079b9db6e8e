//! Text for people: cutting text to a byte budget without splitting a UTF-8 character, showing
//! text from elsewhere (a model, a tool, a caller) with its control characters escaped, so that
//! it cannot act on the terminal or the log it is shown in, and an error with its causes said
//! once each.

use std::{borrow::Cow, fmt::Write as _};

/// The longest prefix of `text` that is at most `max` bytes and ends on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// What [`escape_controls`] does with line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineBreaks {
    /// Kept (`\n` and `\t`): text shown as a block, such as a model's answer.
    Keep,
    /// Escaped too: text that must stay on its line, such as a log field or a table cell.
    Escape,
}

/// `text` with every character that would act on a terminal instead of showing written as an
/// escape (`\u{1b}`, `\r`, `\u{8}`): ESC, and with it every CSI and OSC sequence (cursor
/// moves, clearing the screen, setting the title or the clipboard), CR and backspace (which
/// overwrite what was shown), DEL and every other C0 and C1 control, the Unicode line and
/// paragraph separators, and the bidirectional formatting characters (which reorder what is
/// shown). `\n` and `\t` are kept or escaped as `breaks` says. Borrowed when nothing needed
/// escaping.
pub fn escape_controls(text: &str, breaks: LineBreaks) -> Cow<'_, str> {
    let escaped = |c: char| match c {
        '\n' | '\t' => breaks == LineBreaks::Escape,
        '\u{2028}' | '\u{2029}' => true,
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => true,
        c => c.is_control(),
    };
    if !text.contains(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !escaped(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// An error and its causes (outermost first) as one line, `error: cause: cause`, leaving out a
/// cause whose text the line already holds: an error that puts its source in its own message
/// *and* reports it as its source would otherwise say it twice.
pub fn causes_once(chain: impl IntoIterator<Item = String>) -> String {
    let mut line = String::new();
    for cause in chain {
        if cause.is_empty() || line.contains(&cause) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28: `Address already in use (os error 98)` was printed twice, once in the error's
    /// message and once as its source.
    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let said = |chain: &[&str]| causes_once(chain.iter().map(|c| (*c).to_owned()));
        assert_eq!(
            said(&[
                "cannot listen on 127.0.0.1:7700: Address already in use; stop it",
                "Address already in use",
            ]),
            "cannot listen on 127.0.0.1:7700: Address already in use; stop it"
        );
        assert_eq!(
            said(&["load the CA", "no such file"]),
            "load the CA: no such file"
        );
        assert_eq!(said(&["a", "", "b"]), "a: b");
    }

    #[test]
    fn control_characters_are_escaped_and_line_breaks_kept_or_not() {
        use LineBreaks::{Escape, Keep};
        let cases = [
            ("plain text, ünïcödé", Keep, "plain text, ünïcödé"),
            ("two\nlines\tand a tab", Keep, "two\nlines\tand a tab"),
            ("two\nlines\tand a tab", Escape, r"two\nlines\tand a tab"),
            ("\u{1b}[2J\u{1b}[Hclear", Keep, r"\u{1b}[2J\u{1b}[Hclear"),
            (
                "\u{1b}]52;c;Zm9v\u{7}osc",
                Keep,
                r"\u{1b}]52;c;Zm9v\u{7}osc",
            ),
            ("ok\rEVIL", Keep, r"ok\rEVIL"),
            ("abc\u{8}\u{8}\u{8}xyz", Keep, r"abc\u{8}\u{8}\u{8}xyz"),
            ("c1\u{9b}31m del\u{7f}", Keep, r"c1\u{9b}31m del\u{7f}"),
            ("rtl\u{202e}fdp.exe", Keep, r"rtl\u{202e}fdp.exe"),
            ("sep\u{2028}x", Keep, r"sep\u{2028}x"),
        ];
        for (text, breaks, expected) in cases {
            assert_eq!(
                escape_controls(text, breaks),
                expected,
                "{text:?} {breaks:?}"
            );
        }
        assert!(matches!(
            escape_controls("nothing to do\n", LineBreaks::Keep),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("", 0), "");
    }
}
