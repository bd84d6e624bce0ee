"""The docs: generated reference pages match the code, and no page narrates history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from docs_gen.pages import PAGES, REFERENCE, stale_pages
from docs_gen.team_file import nested_model
from team_config.model import TeamConfig

REPO = Path(__file__).resolve().parent.parent

# History narration: what the code did once. Each pattern comes with text it must catch and text it must let
# through (present-tense uses of the same words), checked below.
NARRATION = {
    "a clause that starts with 'before,'": r"(?:^|[(;:.!?]\s*|\s[-–]\s)[Bb]efore,",
    "'previously' / 'formerly'": r"\b(?:[Pp]reviously|[Ff]ormerly)\b",
    "'was fixed' / 'fixed in <commit>'": r"\b(?:was|were) fixed\b|\b[Ff]ixed in [0-9a-f]{7,40}\b",
    "'is now' / 'are now' / 'now does'": r"\b(?:is|are|does|do) now\b|\bnow (?:is|are)\b",
    "'<subject> used to <verb>'": r"\b(?:it|they|we|this|that|[a-z]+er|agent|helper|app)\s+used to\s+[a-z]+\b",
    "'no longer' after a change": r"\bno longer (?:does|do|is|are|runs|reads|writes|counts|stops|fails)\b",
}
NARRATED = [
    "a node of 8 GPUs trained on one (before, 1: it billed all 8)",
    "Before, the group kept wanting the rest.",
    "restores read the file once; before, they read it twice",
    "The helper previously all-reduced at every step.",
    "This was fixed in 278c822.",
    "the access-log bucket is now versioned",
    "The helper used to all-reduce its decision.",
    "a failed download no longer stops a running job",
]
PRESENT = [
    "Stop every job before you deploy.",
    "the agent reads the marker again just before, and leaves the group alone",
    "Before you deploy, stop every job.",
    "the starts of the nodes before it imports aws-cdk-lib",
    "the key used to sign the request",
    "an instance EC2 no longer describes is named in a warning",
    "The job is running now.",
]


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def narration(text: str) -> list[str]:
    """'line N: <pattern name>: <text>' for each narrating passage of ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in NARRATION.items():
            match = re.search(pattern, line)
            if match:
                found.append(f"line {number}: {name}: ...{line[max(0, match.start() - 40) : match.end() + 40]}...")
    return found


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page_is_current(name: str) -> None:
    page = REFERENCE / name
    assert page.is_file(), f"docs/reference/{name} is missing: run .venv/bin/python -m docs_gen"
    assert page.read_text() == PAGES[name](), f"docs/reference/{name} is stale: run .venv/bin/python -m docs_gen"


def test_stale_page_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("docs_gen.pages.REFERENCE", tmp_path)
    for name, render in PAGES.items():
        (tmp_path / name).write_text(render())
    (tmp_path / "trainctl.md").write_text(PAGES["trainctl.md"]().replace("--cluster", "--clusterr"))
    assert stale_pages() == ["trainctl.md"]


def team_file_models() -> list[type[BaseModel]]:
    """TeamConfig and every model under it."""
    found: list[type[BaseModel]] = [TeamConfig]
    for model in found:
        for field in model.model_fields.values():
            sub = nested_model(field.annotation)
            if sub is not None and sub not in found:
                found.append(sub)
    return found


def test_team_file_reference_has_every_field_with_its_description() -> None:
    page = PAGES["team-file.md"]()
    models = team_file_models()
    assert len(models) == 12
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, (
                f"{model.__module__.replace('.', '/')}.py: {model.__name__}.{name} has no Field(description=...)"
            )
            assert f"| `{name}` |" in page
    assert "| `max_nodes` | int | required | 1 to 1000 | Upper bound of the Auto Scaling group. |" in page
    assert "| `interruption_grace_s` | int | `90` | > 0, < 120 |" in page
    assert "| `instance_types` | list of str | required | 1 to 40 items, an instance type such as g5.xlarge" in page


def test_trainctl_reference_lists_every_command() -> None:
    page = PAGES["trainctl.md"]()
    for command in ("submit", "status", "logs", "stop", "list", "cost", "review"):
        assert f"## `trainctl {command}`" in page
    assert "| `--resume-from` |" in page


@pytest.mark.parametrize("text", NARRATED)
def test_narration_is_caught(text: str) -> None:
    assert narration(text), f"no pattern in NARRATION catches {text!r}"


@pytest.mark.parametrize("text", PRESENT)
def test_present_tense_passes(text: str) -> None:
    assert narration(text) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_docs_do_not_narrate_history(path: Path) -> None:
    found = narration(path.read_text())
    assert found == [], f"{path.relative_to(REPO)} narrates history (it belongs in CHANGELOG.md):\n" + "\n".join(found)
