"""The docs: the generated reference pages match the code (tests/test_present_tense.py checks their tense)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from bootstrap_scripts.spot_training.agent.lifecycle import STATES, TERMINAL, TRANSITIONS
from docs_gen.pages import PAGES, REFERENCE, stale_pages
from docs_gen.team_file import nested_model
from team_config.model import TeamConfig

REPO = Path(__file__).resolve().parent.parent


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
    assert len(models) == 13  # the sections of TeamConfig and ClusterConfig, capacity the 13th
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


def test_node_lifecycle_reference_draws_every_transition_of_the_agents_table() -> None:
    page = PAGES["node-lifecycle.md"]()
    diagram = page.split("```mermaid\n", 1)[1].split("```", 1)[0].splitlines()
    assert diagram[:2] == ["stateDiagram-v2", "    [*] --> BOOT"]
    arrows = {tuple(row.strip().split(" --> ")) for row in diagram[2:]}
    assert arrows == set(TRANSITIONS) | {(name, "[*]") for name in TERMINAL}
    assert len(TRANSITIONS) == 20
    for (source, target), when in TRANSITIONS.items():
        assert f"| `{source}` | `{target}` | {when} |" in page
    for name in STATES:
        assert f"| `{name}` | " in page
