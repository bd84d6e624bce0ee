"""Docs and code comments in the present tense: no page of the docs, no comment or docstring of the code or of its
tests narrates history (what the code did once belongs in commit messages and CHANGELOG.md)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# History narration: what the code did once. Each pattern comes with text it must catch and text it must let
# through (present-tense uses of the same words), checked below.
NARRATION = {
    "a clause that starts with 'before' and a comma or colon": r"(?:^|[(;:.!?]\s*|\s[-–]\s)[Bb]efore[,:]",
    "'previously' / 'formerly'": r"\b(?:[Pp]reviously|[Ff]ormerly)\b",
    "'was fixed' / 'fixed in <commit>'": r"\b(?:was|were) fixed\b|\b[Ff]ixed in [0-9a-f]{7,40}\b",
    "'is now' / 'are now' / 'now does'": r"\b(?:is|are|does|do) now\b|\bnow (?:is|are)\b",
    "'<subject> used to <verb>'": r"\b(?:it|they|we|this|that|[a-z]+er|agent|helper|app)\s+used to\s+[a-z]+\b",
    "'no longer' after a change": r"\bno longer (?:does|do|is|are|runs|reads|writes|counts|stops|fails)\b",
    "'as before' closing a clause": r"\bas before(?:[.,;:)]|$)",
    "'was changed' / 'has been replaced'": r"\b(?:was|were|has been|have been) (?:changed|replaced|rewritten)\b",
    "'now ... instead of'": r"\b[Nn]ow \w[^.;:]{0,60}? instead of\b",
}
NARRATED = [
    "a node of 8 GPUs trained on one (before, 1: it billed all 8)",
    "Before, the group kept wanting the rest.",
    "restores read the file once; before, they read it twice",
    "nor is it handed to the trainer as one (before: '1')",
    "The helper previously all-reduced at every step.",
    "This was fixed in 278c822.",
    "the access-log bucket is now versioned",
    "The helper used to all-reduce its decision.",
    "a failed download no longer stops a running job",
    "acknowledgements apply as before, and the flag turns it off",
    "late peers join as before.",
    "the check was changed to read the marker",
    "the agent now reads the marker instead of listing the prefix",
]
PRESENT = [
    "Stop every job before you deploy.",
    "the agent reads the marker again just before, and leaves the group alone",
    "the step it saved just before: 7",
    "Before you deploy, stop every job.",
    "the starts of the nodes before it imports aws-cdk-lib",
    "the key used to sign the request",
    "an instance EC2 no longer describes is named in a warning",
    "The job is running now.",
    "delete it, as before the first submit",
    "wait for a place as before (below)",
    "Hand the instance back now instead of idling until the reclaim",
    "the file is replaced by the newer one",
]

# Passages that match a pattern without narrating history: file:line -> why (none today).
ALLOWED: dict[str, str] = {}


def narration(text: str, first_line: int = 1) -> list[str]:
    """'line N: <pattern name>: <text>' for each narrating passage of ``text`` (lines counted from ``first_line``)."""
    found = []
    for number, raw in enumerate(text.splitlines(), first_line):
        line = raw.lstrip(" \t#\"'*->")  # a comment's '#', a docstring's quotes, a list item's marker
        for name, pattern in NARRATION.items():
            match = re.search(pattern, line)
            if match:
                found.append(f"line {number}: {name}: ...{line[max(0, match.start() - 40) : match.end() + 40]}...")
    return found


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment and docstring of a Python module."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append((first.lineno, "\n".join(lines[first.lineno - 1 : first.end_lineno])))
    return found


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def code_files() -> list[Path]:
    """The Python files git tracks, tests included (a test's docstring says what it checks, not what the code did)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / name for name in listed.stdout.split()]


@pytest.mark.parametrize("text", NARRATED)
def test_narration_is_caught(text: str) -> None:
    assert narration(text), f"no pattern in NARRATION catches {text!r}"


@pytest.mark.parametrize("text", PRESENT)
def test_present_tense_passes(text: str) -> None:
    assert narration(text) == []


def test_comments_and_docstrings_are_found_with_their_lines() -> None:
    source = (
        '"""Before, the module...\n\nX = 1  # before, two\n\n\ndef f() -> None:\n    """One,\n    formerly two."""\n'
    )
    source = source.replace("module...", 'module."""')
    found = sorted(comments_and_docstrings(source))
    assert found == [(1, '"""Before, the module."""'), (3, "# before, two"), (7, '    """One,\n    formerly two."""')]
    hits = [hit for first_line, text in found for hit in narration(text, first_line)]
    assert [hit.split(":", 2)[:2] for hit in hits] == [
        ["line 1", " a clause that starts with 'before' and a comma or colon"],
        ["line 3", " a clause that starts with 'before' and a comma or colon"],
        ["line 8", " 'previously' / 'formerly'"],
    ]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_docs_do_not_narrate_history(path: Path) -> None:
    found = narration(path.read_text())
    assert found == [], f"{path.relative_to(REPO)} narrates history (it belongs in CHANGELOG.md):\n" + "\n".join(found)


def test_comments_and_docstrings_of_code_and_tests_do_not_narrate_history() -> None:
    found, allowed_seen = [], set()
    for path in code_files():
        name = str(path.relative_to(REPO))
        for first_line, text in comments_and_docstrings(path.read_text()):
            for hit in narration(text, first_line):
                where = f"{name}:{hit.split(':', 1)[0].removeprefix('line ')}"
                if where in ALLOWED:
                    allowed_seen.add(where)
                else:
                    found.append(f"{where}: {hit.split(': ', 1)[1]}")
    assert found == [], "comments or docstrings narrate history (it belongs in CHANGELOG.md):\n" + "\n".join(found)
    assert allowed_seen == set(ALLOWED), f"fixed, remove from ALLOWED: {sorted(set(ALLOWED) - allowed_seen)}"
