"""Names shared by the stack, the node agent's job spec and the tools: tags and SSM parameter paths.

Kept free of aws-cdk imports so that command-line tools can use them without starting jsii.
"""

from __future__ import annotations

TEAM_TAG = "spot-training:team"
CLUSTER_TAG = "spot-training:cluster"


def parameter_path(team: str, cluster: str) -> str:
    """SSM path of a cluster's parameters: ``job-spec`` (stack defaults), ``current-job`` (written on submit).

    Team-scoped, so two teams' stacks never collide.
    """
    return f"/spot-training/{team}/{cluster}"


def budget_name(team: str) -> str:
    """The team's AWS Budgets budget (``budget:`` in the team file)."""
    return f"spot-training-{team}"
