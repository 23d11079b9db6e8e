//! Tests of rule 5 (the size of a product file), on made-up workspaces and files.

use crate::{
    crate_fixtures::write,
    size::{MAX_LINES_OF_CODE, check_sizes, lines_of_code},
    workspace::read_workspace,
};

/// `n` lines of code, each a function.
fn code(n: usize, prefix: &str) -> String {
    (0..n)
        .map(|i| format!("pub fn {prefix}{i}() {{}}\n"))
        .collect()
}

/// A file of exactly [`MAX_LINES_OF_CODE`] lines of code, with all that does not count
/// around them: blank lines, comments, doc comments, a block comment, and items under
/// `#[cfg(test)]` (a test module, a field, a function).
fn at_the_limit() -> String {
    let mut text = String::from("//! The module.\n\n/* a block\n   comment /* nested */\n */\n");
    text += "pub struct S {\n    pub kept: u8,\n    #[cfg(test)]\n    pub probe: u8,\n}\n";
    text += "#[cfg(test)]\n#[allow(dead_code)]\nfn helper() {\n    let _ = 1;\n}\n\n";
    text += &code(MAX_LINES_OF_CODE - 3, "f");
    text += "/// Why.\n\n// a comment\n";
    text += "#[cfg(test)]\nmod tests {\n";
    text += &code(2 * MAX_LINES_OF_CODE, "t");
    text += "}\n";
    text
}

#[test]
fn a_product_file_over_the_limit_fails_and_one_at_it_passes() {
    let root = tempfile::tempdir().expect("tempdir");
    let long = code(MAX_LINES_OF_CODE + 1, "f");
    let at_limit = at_the_limit();
    assert_eq!(lines_of_code(&at_limit), MAX_LINES_OF_CODE);
    let tests_only = format!("#![cfg(test)]\n{long}");
    write(
        root.path(),
        &[
            (
                "Cargo.toml",
                "[workspace]\nmembers = [\"one\", \"tests\"]\n",
            ),
            ("one/Cargo.toml", "[package]\nname = \"mesh-one\"\n"),
            (
                "one/src/lib.rs",
                "mod long;\nmod short;\nmod inner_test;\n#[cfg(test)]\nmod tests;\n",
            ),
            ("one/src/long.rs", &long),
            ("one/src/short.rs", &at_limit),
            ("one/src/inner_test.rs", &tests_only),
            // A test module's file, an integration test, the test crate: tests, all of them.
            ("one/src/tests.rs", &long),
            ("one/tests/t.rs", &long),
            ("tests/Cargo.toml", "[package]\nname = \"mesh-tests\"\n"),
            ("tests/src/lib.rs", &long),
        ],
    );
    let workspace = read_workspace(root.path());
    assert_eq!(workspace.problems, Vec::<String>::new());
    let problems = check_sizes(&workspace);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].starts_with("one/src/long.rs: 801 lines of code, more than 800."),
        "{}",
        problems[0]
    );
}

#[test]
fn a_long_binary_or_build_script_fails_too() {
    let root = tempfile::tempdir().expect("tempdir");
    let long = format!("fn main() {{}}\n{}", code(MAX_LINES_OF_CODE, "f"));
    write(
        root.path(),
        &[
            ("Cargo.toml", "[workspace]\nmembers = [\"one\"]\n"),
            ("one/Cargo.toml", "[package]\nname = \"mesh-one\"\n"),
            ("one/src/main.rs", &long),
            ("one/build.rs", &long),
        ],
    );
    let problems = check_sizes(&read_workspace(root.path()));
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("one/build.rs: 801 lines"));
    assert!(problems[1].starts_with("one/src/main.rs: 801 lines"));
}

/// Table of texts and their lines of code: braces, `#[cfg(test)]` and comment marks inside
/// literals are not code structure.
#[test]
fn lines_of_code_count_what_the_compiler_reads() {
    let cases: &[(&str, usize)] = &[
        ("", 0),
        ("\n\n   \n", 0),
        ("// a\n/// b\n//! c\n", 0),
        ("/* a\n/* b */\n*/ fn f() {}\n", 1),
        ("fn f() {}\n", 1),
        ("let s = \"{ // not a comment\n#[cfg(test)] }\";\n", 2),
        ("let s = r#\"a \" { \"#;\nfn f() {}\n", 2),
        ("let c = '{';\nlet d = '\\'';\nlet e = b'}';\n", 3),
        ("fn f<'a>(x: &'a str) -> &'a str {\n    x\n}\n", 3),
        ("#[cfg(test)]\nmod tests;\nfn f() {}\n", 1),
        (
            "#[cfg(all(test, unix))]\nfn t() {\n    let s = \"}\";\n}\nfn f() {}\n",
            1,
        ),
        ("#[cfg(not(test))]\nfn f() {}\n", 2),
        ("#[cfg(test)]\nconst X: [u8; 2] = [1, 2];\nfn f() {}\n", 1),
        (
            "match x {\n    #[cfg(test)]\n    1 => {}\n    _ => {}\n}\n",
            3,
        ),
        ("#![cfg(test)]\nfn f() {}\n", 0),
        ("fn r#match() {}\n", 1),
    ];
    for (text, expected) in cases {
        assert_eq!(lines_of_code(text), *expected, "in {text:?}");
    }
}
