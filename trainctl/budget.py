"""The team's AWS Budgets budget, as a submit checks it and ``trainctl status`` shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from botocore.exceptions import ClientError

from team_config.naming import is_budget_of
from trainctl.cluster import ClientFactory

BUDGET_UNKNOWN = "unknown (no budgets:ViewBudget)"
ACCESS_DENIED = ("AccessDeniedException", "AccessDenied")


@dataclass(frozen=True)
class Budget:
    name: str
    limit_usd: float
    spent_usd: float

    @property
    def exceeded(self) -> bool:
        return self.spent_usd >= self.limit_usd


def team_budget(client: ClientFactory, team: str) -> Union[Budget, str, None]:
    """The team's AWS Budgets budget (``budget:`` in its team file), None if it has none, or
    :data:`BUDGET_UNKNOWN` when the caller may not read it (no ``budgets:ViewBudget``)."""
    account = client("sts").get_caller_identity()["Account"]
    budgets = client("budgets")
    try:  # its name carries a hash of its notifications (team_config.naming.budget_name): found by listing
        pages = budgets.get_paginator("describe_budgets").paginate(AccountId=account)
        found = next(
            (b for page in pages for b in page.get("Budgets", []) if is_budget_of(team, b["BudgetName"])), None
        )
    except budgets.exceptions.NotFoundException:  # an account without any budget
        return None
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ACCESS_DENIED:
            return BUDGET_UNKNOWN
        raise
    if found is None:
        return None
    spent = found.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", 0)
    return Budget(found["BudgetName"], float(found["BudgetLimit"]["Amount"]), float(spent))
