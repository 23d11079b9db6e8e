//! Text for people: cutting text to a byte budget without splitting a UTF-8 character, and an
//! error with its causes said once each.

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
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("", 0), "");
    }
}
