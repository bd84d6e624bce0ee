"""The team file's ``budget`` section: the monthly AWS Budgets budget and the guard that stops jobs at 100 %."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from team_config.model.base import EMAIL_PATTERN, Strict

MAX_BUDGET_SUBSCRIBERS = 10  # AWS Budgets: at most 10 email subscribers per notification


class BudgetConfig(Strict):
    usd_per_month: float = Field(
        # The template carries the number as written by JSON.stringify, and Budgets takes ([0-9]*\.)?[0-9]+: from a
        # cent to a billion it never turns into 1e-7 or 1e+21.
        ge=0.01,
        le=1_000_000_000,
        allow_inf_nan=False,
        description="Monthly spend limit of the team's tagged resources, in USD.",
    )
    warn_at_percent: int = Field(80, ge=1, le=99, description="Email the notify list when actual spend passes this.")
    notify: list[Annotated[str, StringConstraints(pattern=EMAIL_PATTERN)]] = Field(
        default_factory=list, description="Email addresses AWS Budgets alerts (at warn_at_percent and 100 %)."
    )
    check_every_minutes: int = Field(
        60,
        ge=5,
        le=1440,
        description="How often the guard reads the budget (every force_stop_after_minutes when that is shorter).",
    )
    force_stop_after_minutes: int = Field(
        15, ge=5, le=120, description="Set a group to 0 if its job has not stopped this long after the request."
    )

    @field_validator("notify")
    @classmethod
    def _notify(cls, addresses: list[str]) -> list[str]:
        seen: set[str] = set()
        for address in addresses:
            if address.lower() in seen:
                raise ValueError(f"{address} is listed twice; list each address once")
            seen.add(address.lower())
        if len(addresses) > MAX_BUDGET_SUBSCRIBERS:
            raise ValueError(
                f"{len(addresses)} addresses, but AWS Budgets emails at most {MAX_BUDGET_SUBSCRIBERS} per alert; "
                "list at most 10 (a mailing list address reaches more people)"
            )
        return addresses
