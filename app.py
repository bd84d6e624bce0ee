#!/usr/bin/env python3
"""CDK app: one TrainingStack per team file in teams/ (default.yaml -> "TrainingStack").

Synthesize one team with ``npx cdk synth -c team=<name>``; read team files from another folder
with ``-c teams_dir=<path>``. A bad team file stops synth with one
line per problem (file, field, what is wrong, what to do) and exit code 2.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from stacks import TrainingStack
from team_config import ConfigError, Team, load_teams
from training_constructs.spot_checks import SpotTrainingChecks

TEAMS_DIR = Path(__file__).resolve().parent / "teams"
CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


# In a Python app a construct's creation stack trace holds only jsii runtime frames, and capturing one per construct
# costs synth time; `cdk synth --debug` (CDK_DEBUG) still records them. Set here, not in cdk.json: the CLI warns
# about every "aws:" key there.
DISABLE_CREATION_STACK_TRACES = "aws:cdk:disable-creation-stack-traces"


def add_teams(app: App, teams: Sequence[Team]) -> list[TrainingStack]:
    """One stack per team, and the cdk-nag gates (AwsSolutions, SpotTraining) over the whole app."""
    app.node.set_context(DISABLE_CREATION_STACK_TRACES, True)
    stacks = [TrainingStack(app, team.stack_name, team=team.name, config=team.config) for team in teams]
    Validations.of(app).add_plugins(AwsSolutionsChecks(app), SpotTrainingChecks(app))
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


def main(app: Optional[App] = None, teams_dir: Path = TEAMS_DIR) -> App:
    app = app or App(context=cdk_json_context())
    only = app.node.try_get_context("team")
    teams_dir = Path(app.node.try_get_context("teams_dir") or teams_dir)
    try:
        teams = load_teams(teams_dir, only=only)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    add_teams(app, teams)
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
    main()
