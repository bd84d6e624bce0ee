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

from emulator.cfn_compat.base import NamedWithoutAttributes, report_unsupported


class Budget(NamedWithoutAttributes, CloudFormationModel):
    """``AWS::Budgets::Budget`` through moto's Budgets backend; ``Ref`` = the budget's name."""

    def __init__(self, account_id: str, partition: str, name: str) -> None:
        self.account_id, self.partition, self.name = account_id, partition, name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Budgets::Budget"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Budget:
        from moto.budgets.models import budgets_backends

        props = cloudformation_json.get("Properties", {})
        # ResourceTags (the stack's team tag) are accepted and dropped: moto's Budgets has no tag API to keep them.
        handled = {"Budget", "NotificationsWithSubscribers", "ResourceTags"}
        report_unsupported(cls.cloudformation_type(), props, handled)
        budget = dict(props["Budget"])
        budget.setdefault("BudgetName", resource_name)
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
    def update_from_cloudformation_json(
        cls,
        original_resource: Budget,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Budget:
        original_resource.delete(account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        name = cloudformation_json.get("Properties", {}).get("Budget", {}).get("BudgetName", resource_name)
        cls(account_id, get_partition(region_name), name).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.budgets.models import budgets_backends

        budgets_backends[self.account_id][self.partition].delete_budget(self.account_id, self.name)
