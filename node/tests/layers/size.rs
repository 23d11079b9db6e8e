//! Rule 5, the size of a file: no product file of any crate of the workspace has more than
//! [`MAX_LINES_OF_CODE`] lines of code. A file that long holds several concerns; split it along
//! them (the way `server/` and `peers/swim/` are split), moving each unit test with the code it
//! tests.
//!
//! Product files are those of every library, binary and build script of every crate, but the
//! test crate `mesh-tests` (all of it is tests, harness and benchmarks). A file only tests build
//! (reached through `#[cfg(test)] mod x;`, or starting with `#![cfg(test)]`) is not one.
//!
//! A line of code is a line with something on it besides comments and whitespace, outside the
//! items (or fields, statements, arms) under `#[cfg(test)]`. The file is read by a small lexer
//! that knows comments (nested block comments too), strings (raw, byte and C strings too) and
//! character literals, so braces and `#[cfg(test)]` inside them do not count; each attribute is
//! parsed with `syn` to tell whether it is `cfg(test)`.

use syn::parse::Parser;

use crate::{
    tree::is_test_only,
    workspace::{Member, Workspace},
};

/// Most lines of code in one product file.
pub const MAX_LINES_OF_CODE: usize = 800;
/// The crate whose every file is tests: not held to the rule.
const TEST_CRATE: &str = "mesh-tests";
/// The kinds of target whose files are products (see `workspace::Target::kind`).
const PRODUCT_TARGETS: [&str; 3] = ["lib", "bin", "build script"];

/// One problem per product file of `workspace` over [`MAX_LINES_OF_CODE`], longest first.
pub fn check_sizes(workspace: &Workspace) -> Vec<String> {
    let mut long: Vec<(usize, &str)> = Vec::new();
    for member in &workspace.members {
        for (path, text) in product_files(member) {
            let lines = lines_of_code(text);
            if lines > MAX_LINES_OF_CODE && !long.iter().any(|(_, known)| *known == path) {
                long.push((lines, path));
            }
        }
    }
    long.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    long.into_iter()
        .map(|(lines, path)| {
            format!(
                "{path}: {lines} lines of code, more than {MAX_LINES_OF_CODE}.\nA file that long \
                 holds several concerns: make it a folder with one file per concern, each unit \
                 test moved with the code it tests (`#[cfg(test)]` items do not count)"
            )
        })
        .collect()
}

/// The product files of `member` (path relative to the workspace root, text).
fn product_files(member: &Member) -> impl Iterator<Item = (&str, &str)> {
    member
        .targets
        .iter()
        .filter(move |target| member.name != TEST_CRATE && PRODUCT_TARGETS.contains(&target.kind))
        .flat_map(|target| &target.files)
        .filter(|file| !file.test_only)
        .map(|file| (file.path.as_str(), file.text.as_str()))
}

/// The lines of code in `text`: lines with a token on them, but those of items under
/// `#[cfg(test)]` (and none at all in a file that starts with `#![cfg(test)]`).
pub fn lines_of_code(text: &str) -> usize {
    let tokens = lex(text);
    let mut code = vec![false; text.lines().count() + 1];
    for token in &tokens {
        for line in &mut code[token.first_line..=token.last_line] {
            *line = true;
        }
    }
    let mut at = 0;
    // `#![cfg(test)]` among the file's first attributes: the whole file is tests.
    while let Some((true, after)) = attribute_at(&tokens, at) {
        if test_only_attribute(text, &tokens, at, after, true) {
            return 0;
        }
        at = after;
    }
    while at < tokens.len() {
        let Some((false, after)) = attribute_at(&tokens, at) else {
            at += 1;
            continue;
        };
        if !test_only_attribute(text, &tokens, at, after, false) {
            at = after;
            continue;
        }
        let end = item_end(&tokens, after);
        let last_line = end.map_or(tokens[after - 1].last_line, |end| tokens[end].last_line);
        for line in &mut code[tokens[at].first_line..=last_line] {
            *line = false;
        }
        at = end.map_or(after, |end| end + 1);
    }
    code.iter().filter(|line| **line).count()
}

/// A token of Rust source: a punctuation character, a word (identifier, keyword, number) or a
/// literal (string or character), with the lines it spans (0-based) and its byte range.
#[derive(Debug)]
struct Token {
    kind: Kind,
    first_line: usize,
    last_line: usize,
    start: usize,
    end: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Punct(char),
    Word,
    Literal,
}

/// The tokens of `text`, comments and whitespace left out.
fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let byte = |i: usize| chars.get(i).map_or(text.len(), |(at, _)| *at);
    let char_at = |i: usize| chars.get(i).map(|(_, c)| *c);
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 0);
    while let Some(c) = char_at(i) {
        let (start, first_line) = (i, line);
        let kind = if c == '\n' {
            line += 1;
            i += 1;
            continue;
        } else if c.is_whitespace() {
            i += 1;
            continue;
        } else if c == '/' && char_at(i + 1) == Some('/') {
            while char_at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
            continue;
        } else if c == '/' && char_at(i + 1) == Some('*') {
            let mut depth = 0;
            while let Some(c) = char_at(i) {
                if c == '/' && char_at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c == '*' && char_at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c == '\n');
                    i += 1;
                }
            }
            continue;
        } else if c == '"' {
            i = quoted(&chars, i + 1, '"', &mut line);
            Kind::Literal
        } else if c == '\'' {
            // A character literal ('a', '\n', '\''), else a lifetime or a label ('a, 'static).
            if char_at(i + 1) == Some('\\') {
                i = quoted(&chars, i + 1, '\'', &mut line);
                Kind::Literal
            } else if char_at(i + 2) == Some('\'') {
                i += 3;
                Kind::Literal
            } else {
                i += 1;
                Kind::Punct('\'')
            }
        } else if c.is_alphanumeric() || c == '_' {
            while char_at(i).is_some_and(|c| c.is_alphanumeric() || c == '_') {
                i += 1;
            }
            let word = &text[byte(start)..byte(i)];
            match (word, char_at(i)) {
                ("r" | "br" | "cr", Some('"' | '#')) => match raw(&chars, i) {
                    Some(end) => {
                        line += chars[i..end].iter().filter(|(_, c)| *c == '\n').count();
                        i = end;
                        Kind::Literal
                    }
                    None => Kind::Word, // `r#ident`, a raw identifier
                },
                ("b" | "c", Some('"')) => {
                    i = quoted(&chars, i + 1, '"', &mut line);
                    Kind::Literal
                }
                ("b", Some('\'')) => {
                    i = quoted(&chars, i + 1, '\'', &mut line);
                    Kind::Literal
                }
                _ => Kind::Word,
            }
        } else {
            i += 1;
            Kind::Punct(c)
        };
        tokens.push(Token {
            kind,
            first_line,
            last_line: line,
            start: byte(start),
            end: byte(i),
        });
    }
    tokens
}

/// Past the closing `close` of a literal whose body starts at `i` (escapes skipped), counting
/// the lines it spans into `line`.
fn quoted(chars: &[(usize, char)], mut i: usize, close: char, line: &mut usize) -> usize {
    while let Some((_, c)) = chars.get(i) {
        match c {
            '\\' => i += 2,
            '\n' => {
                *line += 1;
                i += 1;
            }
            c if *c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Past the end of a raw string whose hashes (or quote) start at `i`; `None` when it is no raw
/// string (a raw identifier, `r#match`).
fn raw(chars: &[(usize, char)], mut i: usize) -> Option<usize> {
    let hashes = chars[i..].iter().take_while(|(_, c)| *c == '#').count();
    i += hashes;
    if chars.get(i).map(|(_, c)| *c) != Some('"') {
        return None;
    }
    i += 1;
    while i < chars.len() {
        if chars[i].1 == '"'
            && chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|(_, c)| *c == '#')
                .count()
                == hashes
        {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

/// An attribute starting at token `at` (`#[…]` or `#![…]`): whether it is inner, and the index
/// of the token after its closing `]`.
fn attribute_at(tokens: &[Token], at: usize) -> Option<(bool, usize)> {
    if tokens.get(at)?.kind != Kind::Punct('#') {
        return None;
    }
    let inner = tokens.get(at + 1)?.kind == Kind::Punct('!');
    let open = at + 1 + usize::from(inner);
    if tokens.get(open)?.kind != Kind::Punct('[') {
        return None;
    }
    let close = matching(tokens, open)?;
    Some((inner, close + 1))
}

/// The index of the bracket closing the one at `open`.
fn matching(tokens: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (index, token) in tokens.iter().enumerate().skip(open) {
        match token.kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(index);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the attribute from token `at` to before `after` is `cfg(test)` (as `syn` reads it).
fn test_only_attribute(text: &str, tokens: &[Token], at: usize, after: usize, inner: bool) -> bool {
    let source = &text[tokens[at].start..tokens[after - 1].end];
    let parsed = if inner {
        syn::Attribute::parse_inner.parse_str(source)
    } else {
        syn::Attribute::parse_outer.parse_str(source)
    };
    parsed.is_ok_and(|attrs| is_test_only(&attrs))
}

/// The last token of the item (field, statement, arm) starting at `start`, after its
/// attributes: its `;` or `,`, or the `}` that closes its body; `None` when it is cut short by
/// the end of what holds it.
fn item_end(tokens: &[Token], mut start: usize) -> Option<usize> {
    while let Some((_, after)) = attribute_at(tokens, start) {
        start = after;
    }
    let mut depth = 0usize;
    let mut index = start;
    while let Some(token) = tokens.get(index) {
        match token.kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']' | '}') if depth == 0 => return index.checked_sub(1),
            Kind::Punct(close @ (')' | ']' | '}')) => {
                depth -= 1;
                if depth == 0 && close == '}' {
                    let next = tokens.get(index + 1).map(|token| token.kind);
                    return Some(match next {
                        Some(Kind::Punct(';' | ',')) => index + 1,
                        _ => index,
                    });
                }
            }
            Kind::Punct(';' | ',') if depth == 0 => return Some(index),
            _ => {}
        }
        index += 1;
    }
    tokens.len().checked_sub(1)
}
