"""The app's wiring: load the team files, build one TrainingStack per team, add the gates (cdk-nag's AwsSolutions,
SpotTraining, and the CloudFormation validator's worker) and synthesize."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from cfn_validate.plugin import CloudFormationValidateWorker
from compliance.spot_training import SpotTrainingChecks
from stacks import TrainingStack
from team_config import ConfigError, Team, load_teams
from training_app.errors import stop, too_many_resources

ROOT = Path(__file__).resolve().parent.parent
TEAMS_DIR = ROOT / "teams"
CDK_JSON = ROOT / "cdk.json"

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
        stop(str(exc))
    add_teams(app, teams, validator)
    try:
        app.synth()
    except RuntimeError as exc:  # jsii's error for what aws-cdk-lib threw
        too_many = too_many_resources(exc, teams)
        if too_many is None:
            raise
        stop(too_many)
    return app
