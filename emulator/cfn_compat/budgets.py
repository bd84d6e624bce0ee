"""Budgets (item 11 of :mod:`emulator.cfn_compat`): ``AWS::Budgets::Budget``.

11. ``AWS::Budgets::Budget``: no CloudFormation type (moto has the Budgets API). -> A model that creates the
    budget and its notifications through moto's Budgets backend (``describe_budget`` returns them; the
    limit's ``Amount`` becomes the API's string) and deletes it with the stack. ``ResourceTags`` are accepted
    and dropped: moto's Budgets has no tag API (they only label the budget; its cost filter is unaffected).
"""

from __future__ import annotations

from typing import Any

from moto.core.common_models import CloudFormationModel
from moto.utilities.utils import get_partition

from emulator.cfn_compat.base import CompatModel


class Budget(CompatModel, CloudFormationModel):
    """``AWS::Budgets::Budget`` through moto's Budgets backend; ``Ref`` = the budget's name."""

    CFN_TYPE = "AWS::Budgets::Budget"
    # ResourceTags (the stack's team tag) are accepted and dropped: moto's Budgets has no tag API to keep them.
    PROPERTIES = frozenset({"Budget", "NotificationsWithSubscribers", "ResourceTags"})

    def __init__(self, account_id: str, partition: str, name: str) -> None:
        self.account_id, self.partition, self.name = account_id, partition, name

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> Budget:
        from moto.budgets.models import budgets_backends

        budget = dict(props["Budget"])
        budget.setdefault("BudgetName", name)
        if "BudgetLimit" in budget:
            budget["BudgetLimit"] = {**budget["BudgetLimit"], "Amount": str(budget["BudgetLimit"]["Amount"])}
        notifications = [
            {
                "Notification": {**n["Notification"], "Threshold": float(n["Notification"]["Threshold"])},
                "Subscribers": n["Subscribers"],
            }
            for n in props.get("NotificationsWithSubscribers", [])
        ]
        partition = get_partition(region_name)
        budgets_backends[account_id][partition].create_budget(account_id, budget, notifications)
        return cls(account_id, partition, budget["BudgetName"])

    @classmethod
    def update(
        cls, original: Budget, new_name: str, props: dict[str, Any], account_id: str, region_name: str
    ) -> Budget:
        original.delete(account_id, region_name)  # by its own name: the new properties may name another budget
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        budget_name = props.get("Budget", {}).get("BudgetName", name)
        cls(account_id, get_partition(region_name), budget_name).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.budgets.models import budgets_backends

        budgets_backends[self.account_id][self.partition].delete_budget(self.account_id, self.name)
