"""The one-line errors a synth stops with (file, what is wrong, what to do) and exit code 2, no traceback."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import NoReturn, Optional

from team_config import Team

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


def stop(message: str) -> NoReturn:
    """Print each line of ``message`` as ``error: <line>`` on stderr and exit 2."""
    for line in message.splitlines():
        print(f"error: {line}", file=sys.stderr)
    sys.exit(2)
