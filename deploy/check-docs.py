#!/usr/bin/env python3
"""Checks the links of the documentation: README.md and every page of the book (docs/src).

Every relative link must name a file or directory that exists, and every `#anchor` (on the
same page or on another Markdown file) must match a heading of that file, slugged as mdBook
and GitHub slug them, or an explicit `<a id="…">`. Every page under docs/src must be listed in
docs/src/SUMMARY.md, or the book never shows it. External links (http, https, mailto) are not
fetched. Code blocks and inline code are not read.

Usage: deploy/check-docs.py [ROOT]   (ROOT: the repository, by default the one holding this
script; deploy/check-docs-test.py runs it on fixtures). Exit 0 when every link resolves, 1
with one line per problem (file:line: the link and what is missing) otherwise. Python's
standard library only.
"""

import os
import re
import sys
from pathlib import Path

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# Link text may hold one level of brackets (`[`[security]`](#security)`), two at most.
TEXT = r"(?:[^\[\]]|\[(?:[^\[\]]|\[[^\[\]]*\])*\])*"
INLINE_LINK = re.compile(r"!?\[" + TEXT + r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HTML_HREF = re.compile(r"<a\s[^>]*href=\"([^\"]*)\"", re.IGNORECASE)
HTML_ID = re.compile(r"<[a-z][^>]*\s(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def masked(text, spans=True):
    """`text` with fenced code blocks and (with `spans`) code spans blanked, newlines kept so
    line numbers still count."""
    lines = text.split("\n")
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None:
            # A backtick fence's info string holds no backtick (else it is a code span).
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence = m.group(1)
                lines[i] = ""
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                fence = None
            lines[i] = ""
    text = "\n".join(lines)
    if not spans:
        return text
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def slug(heading):
    """The id mdBook and GitHub give a heading: its text without markup, lower case, letters,
    digits, `_` and `-` kept, each space a `-`, everything else dropped."""
    text = re.sub(r"!?\[(" + TEXT + r")\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.strip():
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    """Every anchor a Markdown file offers: its headings' ids (a repeated one gets -1, -2, …)
    and explicit `<a id>`/`name` ids."""
    if path not in cache:
        text = masked(path.read_text(encoding="utf-8"), spans=False)
        found, seen = set(), {}
        lines = text.split("\n")
        for i, line in enumerate(lines):
            m = HEADING.match(line)
            title = m.group(2) if m else None
            if title is None and i > 0 and lines[i - 1].strip() and SETEXT.match(line):
                previous = lines[i - 1]
                if not HEADING.match(previous) and not previous.lstrip().startswith(("|", ">", "-", "*")):
                    title = previous
            if title is None:
                continue
            s = slug(title.replace("`", "").replace("*", ""))
            if s in seen:
                seen[s] += 1
                s = f"{s}-{seen[s]}"
            else:
                seen[s] = 0
            found.add(s)
        found.update(HTML_ID.findall(text))
        cache[path] = found
    return cache[path]


def links(path):
    """(line number, target) of every link in a Markdown file, outside code."""
    text = masked(path.read_text(encoding="utf-8"))
    out = []
    for pattern in (INLINE_LINK, HTML_HREF):
        for m in pattern.finditer(text):
            out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    for number, line in enumerate(text.split("\n"), 1):
        m = REFERENCE_DEF.match(line)
        if m:
            out.append((number, m.group(1)))
    return sorted(out)


def check_file(path, root):
    problems = []
    for number, target in links(path):
        where = f"{path.relative_to(root)}:{number}"
        if not target or EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part:
            dest = (path.parent / file_part).resolve()
            if not dest.exists():
                problems.append(f"{where}: link `{target}`: no file {os.path.relpath(dest, root)}")
                continue
        else:
            dest = path
        if anchor and dest.suffix == ".md":
            if anchor not in anchors(dest):
                problems.append(
                    f"{where}: link `{target}`: {os.path.relpath(dest, root)} has no heading "
                    f"or <a id> whose anchor is `#{anchor}`"
                )
    return problems


def check(root):
    root = Path(root).resolve()
    files = []
    if (root / "README.md").exists():
        files.append(root / "README.md")
    src = root / "docs" / "src"
    pages = sorted(src.rglob("*.md")) if src.is_dir() else []
    files += pages
    problems = []
    for path in files:
        problems += check_file(path, root)
    summary = src / "SUMMARY.md"
    if pages and not summary.exists():
        problems.append(f"{summary.relative_to(root)}: missing (mdBook's table of contents)")
    elif pages:
        listed = set()
        for _, target in links(summary):
            if target and not EXTERNAL.match(target):
                listed.add((summary.parent / target.partition("#")[0]).resolve())
        for page in pages:
            if page != summary and page.resolve() not in listed:
                problems.append(
                    f"{page.relative_to(root)}: not listed in {summary.relative_to(root)}, "
                    "so the book never shows it"
                )
    return files, problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    files, problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check-docs: {len(problems)} problem(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    print(f"check-docs: every link of {len(files)} file(s) resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
