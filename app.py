#!/usr/bin/env python3
"""CDK app: one TrainingStack per team file in teams/ (default.yaml -> "TrainingStack").

Synthesize one team with ``npx cdk synth -c team=<name>``; read team files from another folder
with ``-c teams_dir=<path>``. A bad team file stops synth with one
line per problem (file, field, what is wrong, what to do) and exit code 2.

The wiring is :mod:`training_app.wiring`; this file starts aws-cdk-lib's CloudFormation validation engine in a
process of its own first, before the wiring's import loads aws-cdk-lib (about 1 s), so that the engine is ready
when the templates are (docs/benchmarks.md, "Synth speed"). A module that imports this file starts nothing.
"""

from __future__ import annotations

from training_app.validator import start_cfn_validate


def run() -> None:
    """The engine, then the wiring: what ``npx cdk synth`` (cdk.json's ``python3 -O app.py``) runs."""
    engine = start_cfn_validate()
    from training_app.wiring import main  # loads aws-cdk-lib: after the engine's start

    main(engine=engine)


if __name__ == "__main__":
    run()
