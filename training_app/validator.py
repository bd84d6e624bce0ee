"""aws-cdk-lib's CloudFormation validation engine, started in a process of its own (stdlib only: ``app.py`` calls
it before anything loads aws-cdk-lib; cfn_validate/__init__.py and docs/benchmarks.md ("Synth speed") say why)."""

from __future__ import annotations

import os
import subprocess
from typing import Optional

import cfn_validate


def start_cfn_validate() -> Optional[subprocess.Popen[str]]:
    """aws-cdk-lib's CloudFormation validation engine, starting now in a process of its own (cfn_validate/
    __init__.py); None where validation is off (``CDK_VALIDATION=false``, which ``cdk synth --no-validation`` sets)
    or the engine was not copied into the venv (aws-cdk-lib's own validator runs then)."""
    if os.environ.get("CDK_VALIDATION") == "false":
        return None
    return cfn_validate.start_engine(node=os.environ.get("JSII_NODE") or "node")
