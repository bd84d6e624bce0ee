"""A cluster's ``capacity`` section: what the cluster does when spot capacity does not come."""

from __future__ import annotations

from pydantic import Field

from team_config.model.base import Strict


class CapacityConfig(Strict):
    on_demand_after_minutes: float = Field(
        ge=0.05,
        le=1440,
        allow_inf_nan=False,
        description="Take on-demand instances when spot has not filled a job's nodes for this long (the capacity "
        "watcher checks every check_every_minutes); the group goes back to spot once it stands at 0 (job ended or "
        "stopped). Refused with on_demand_percentage_above_base: 100 (no spot to fall back from).",
    )
    check_every_minutes: int = Field(
        1, ge=1, le=60, description="How often the capacity watcher reads the group's scaling activities."
    )
