#!/usr/bin/env python3
"""CDK app: one TrainingStack per team file in teams/ (default.yaml -> "TrainingStack").

Synthesize one team with ``npx cdk synth -c team=<name>``; read team files from another folder
with ``-c teams_dir=<path>``. A bad team file stops synth with one
line per problem (file, field, what is wrong, what to do) and exit code 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import cfn_validate


def start_cfn_validate() -> Optional[subprocess.Popen[str]]:
    """aws-cdk-lib's CloudFormation validation engine, starting now in a process of its own (cfn_validate/
    __init__.py); None where validation is off (``CDK_VALIDATION=false``, which ``cdk synth --no-validation`` sets)
    or the engine was not copied into the venv (aws-cdk-lib's own validator runs then)."""
    if os.environ.get("CDK_VALIDATION") == "false":
        return None
    return cfn_validate.start_engine(node=os.environ.get("JSII_NODE") or "node")


# Started before the imports below load aws-cdk-lib (about 1 s), so that the engine is ready when the templates
# are: only when this file runs as the app (`npx cdk synth`); a module that imports it starts nothing.
CFN_VALIDATE_ENGINE = start_cfn_validate() if __name__ == "__main__" else None

from aws_cdk import App, Validations  # noqa: E402 - after the engine's start, above
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from cfn_validate.plugin import CloudFormationValidateWorker  # noqa: E402
from stacks import TrainingStack  # noqa: E402
from team_config import ConfigError, Team, load_teams  # noqa: E402
from training_constructs.spot_checks import SpotTrainingChecks  # noqa: E402

TEAMS_DIR = Path(__file__).resolve().parent / "teams"
CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


# In a Python app a construct's creation stack trace holds only jsii runtime frames, and capturing one per construct
# costs synth time; `cdk synth --debug` (CDK_DEBUG) still records them. Set here, not in cdk.json: the CLI warns
# about every "aws:" key there.
DISABLE_CREATION_STACK_TRACES = "aws:cdk:disable-creation-stack-traces"


def add_teams(
    app: App, teams: Sequence[Team], validator: Optional[CloudFormationValidateWorker] = None
) -> list[TrainingStack]:
    """One stack per team, and the cdk-nag gates (AwsSolutions, SpotTraining) over the whole app; with
    ``validator``, aws-cdk-lib's CloudFormation validation in its worker (the App must have its own turned off)."""
    app.node.set_context(DISABLE_CREATION_STACK_TRACES, True)
    stacks = [TrainingStack(app, team.stack_name, team=team.name, config=team.config) for team in teams]
    # The validator's sender first: the worker checks the templates while cdk-nag's packs run.
    first, last = ([validator.sender], [validator]) if validator else ([], [])
    Validations.of(app).add_plugins(*first, AwsSolutionsChecks(app), SpotTrainingChecks(app), *last)
    return stacks


# aws-cdk-lib's check at synth of CloudFormation's per-stack quota (the jsii error's text)
TOO_MANY_RESOURCES = re.compile(
    r"Number of resources in stack '([^']+)': (\d+) is greater than allowed maximum of (\d+)"
)


def too_many_resources(error: Exception, teams: Sequence[Team]) -> Optional[str]:
    """The one line to print when ``error`` is a team's stack over CloudFormation's resource quota, else None."""
    found = TOO_MANY_RESOURCES.search(str(error))
    paths = {team.stack_name: team.path for team in teams}
    if found is None or found.group(1) not in paths:
        return None
    stack, count, limit = found.groups()
    volumes = re.search(r"AWS::EC2::Volume \((\d+)\)", str(error))
    of_them = f" ({volumes.group(1)} of them warm pool volumes)" if volumes else ""
    return (
        f"{paths[stack]}: stack {stack} would hold {count} CloudFormation resources{of_them}, more than the {limit} "
        "one stack may hold; split the clusters across team files (a stack each) or make warm_pool.size smaller"
    )


def cdk_json_context() -> dict[str, object]:
    """cdk.json's feature flags. The CDK CLI passes them to the app; ``python3 app.py`` run by hand gets them here,
    so that it builds what ``npx cdk synth`` builds. An App's own context has the lowest precedence: the CLI's (and
    ``-c``) values win."""
    return dict(json.loads(CDK_JSON.read_text())["context"])


def main(app: Optional[App] = None, teams_dir: Path = TEAMS_DIR, engine: Optional[subprocess.Popen[str]] = None) -> App:
    """Synthesize every team file (or ``-c team=``'s) into ``app``. With ``engine`` (start_cfn_validate's worker)
    and no ``app``, the App made here has aws-cdk-lib's own CloudFormation validator off and the worker checks the
    templates instead; an ``app`` given keeps its own validator."""
    worker = CloudFormationValidateWorker(engine) if engine is not None else None
    try:
        if app is None:
            app = App(context=cdk_json_context(), builtin_cloud_formation_validation=worker is None)
            return synth(app, teams_dir, worker)
        return synth(app, teams_dir, None)
    finally:
        if worker is not None:
            worker.close()


def synth(app: App, teams_dir: Path, validator: Optional[CloudFormationValidateWorker]) -> App:
    only = app.node.try_get_context("team")
    teams_dir = Path(app.node.try_get_context("teams_dir") or teams_dir)
    try:
        teams = load_teams(teams_dir, only=only)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    add_teams(app, teams, validator)
    try:
        app.synth()
    except RuntimeError as exc:  # jsii's error for what aws-cdk-lib threw
        too_many = too_many_resources(exc, teams)
        if too_many is None:
            raise
        print(f"error: {too_many}", file=sys.stderr)
        sys.exit(2)
    return app


if __name__ == "__main__":
    main(engine=CFN_VALIDATE_ENGINE)
