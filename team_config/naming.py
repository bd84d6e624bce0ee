"""Names shared by the stack, the node agent's job spec and the tools: tags and SSM parameter paths.

Kept free of aws-cdk imports so that command-line tools can use them without starting jsii.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

TEAM_TAG = "spot-training:team"
CLUSTER_TAG = "spot-training:cluster"
POOL_TAG = "spot-training:warm-pool"  # a warm pool's volumes (value: the pool's name)


def parameter_path(team: str, cluster: str) -> str:
    """SSM path of a cluster's parameters: ``job-spec`` (stack defaults), ``current-job`` (written on submit).

    Team-scoped, so two teams' stacks never collide.
    """
    return f"/spot-training/{team}/{cluster}"


def budget_name(team: str, notify: Sequence[str], warn_at_percent: float) -> str:
    """The team's AWS Budgets budget (``budget:`` in the team file): ``spot-training-<team>.<8 hex>``.

    The budget's notifications can only be set when it is created: CloudFormation replaces it to change them, and
    cannot replace a resource under the same name ("the budget already exists"). So the name carries a hash of
    them: a new email or threshold makes a new name, and the replacement goes through. Team names have no dot:
    one team's budget never matches another's (``is_budget_of``)."""
    settings = json.dumps({"notify": list(notify), "warn_at_percent": warn_at_percent if notify else None})
    return f"spot-training-{team}.{hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def is_budget_of(team: str, name: str) -> bool:
    """Whether ``name`` is a name ``budget_name`` gives ``team``'s budget."""
    return re.fullmatch(rf"spot-training-{re.escape(team)}\.[0-9a-f]{{8}}", name) is not None
