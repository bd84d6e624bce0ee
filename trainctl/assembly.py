"""A cloud assembly (``cdk.out``) as ``trainctl review`` reads it: synthesized here, or given with ``--assembly``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


class ReviewError(Exception):
    """A one-line reason (no assembly, synth failed); bad team files: one line per problem."""


def toolchain_missing(exc: ModuleNotFoundError, needs: str) -> ReviewError:
    """The one line for a ``trainctl`` installed on its own (pip), without the ops repository's toolchain."""
    return ReviewError(
        f"review {needs}: run it from a clone of the ops repository after `make deps` "
        f"(aws-cdk-lib, cfn-lint and Node.js); no module named {exc.name!r} here"
    )


def load_cdk_app() -> tuple[Any, Any]:
    """aws_cdk's ``App`` and the CDK app's wiring, imported on first use: the cluster commands run without them."""
    # jsii prints a banner about the Node.js version when aws_cdk starts it; the CDK CLI pin is what matters
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    try:
        from aws_cdk import App

        from training_app import wiring
    except ModuleNotFoundError as exc:
        raise toolchain_missing(exc, "needs the CDK app (or --assembly DIR, a synthesized one)") from None
    return App, wiring


@dataclass
class Stack:
    name: str
    template: dict[str, Any]
    acknowledged: list[tuple[str, str, str]]  # (construct path, finding, reason)

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.template.get("Resources", {}))


def synthesize(outdir: Path, teams_dir: Optional[Path] = None) -> Path:
    """Synthesize every team (cdk-nag and the SpotTraining checks run, as in ``cdk synth``) into ``outdir``."""
    from team_config import ConfigError, load_teams

    App, cdk_app = load_cdk_app()
    try:
        teams = load_teams(teams_dir or cdk_app.TEAMS_DIR)
    except ConfigError as exc:  # every problem of every team file, one line each (as `cdk synth` prints them)
        raise ReviewError(str(exc)) from None
    application = App(outdir=str(outdir), context=cdk_app.cdk_json_context())
    cdk_app.add_teams(application, teams)
    try:
        application.synth()
    except RuntimeError as exc:
        too_many = cdk_app.too_many_resources(exc, teams)
        if too_many is not None:
            raise ReviewError(too_many) from None
        if "ValidationFailed" not in str(exc):
            raise
        raise ReviewError(  # not the report file: without --assembly, the folder is removed before this is read
            "synth found cdk-nag or SpotTraining violations, listed above (`npx cdk synth` lists them too)"
        ) from None
    return outdir


def _read_json(path: Path) -> Any:
    """A JSON file of the assembly; a missing or unreadable one is a one-line :class:`ReviewError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReviewError(f"{path}: missing from the assembly; synthesize it again (`npx cdk synth`)") from None
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        why = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise ReviewError(f"{path}: cannot read it as JSON ({why}); synthesize the assembly again") from None


def load_assembly(directory: Path) -> dict[str, Stack]:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise ReviewError(f"{directory} is not a cloud assembly (no manifest.json); run `npx cdk synth` first")
    manifest = _read_json(manifest_path)
    stacks = {}
    try:
        for name, artifact in sorted(manifest.get("artifacts", {}).items()):
            if artifact.get("type") != "aws:cloudformation:stack":
                continue
            template = _read_json(directory / artifact["properties"]["templateFile"])
            metadata = dict(artifact.get("metadata", {}))
            extra = artifact.get("additionalMetadataFile")
            if extra and (directory / extra).is_file():
                metadata.update(_read_json(directory / extra))
            acknowledged = [
                (path, finding, reason)
                for path, entries in sorted(metadata.items())
                for entry in entries
                if entry.get("type") == "aws:cdk:acknowledged-rules"
                for finding, reason in sorted(entry["data"].items())
            ]
            stacks[name] = Stack(name, template, acknowledged)
    except (AttributeError, KeyError, TypeError) as exc:  # valid JSON, but not the cloud assembly schema
        raise ReviewError(
            f"{manifest_path}: not a cloud assembly manifest ({type(exc).__name__}: {exc}); synthesize it again"
        ) from None
    if not stacks:
        raise ReviewError(f"{directory}: the assembly holds no CloudFormation stack")
    return stacks
