"""A cluster's ``capacity`` section: what the cluster does when spot capacity does not come."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from team_config.model.base import AzName, Strict


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
    zones: Optional[list[AzName]] = Field(
        None,
        min_length=2,
        max_length=3,
        description="Zones the cluster may run in, each one of the network's, the first the one it starts in. With "
        "a placement group the cluster runs in one zone at a time (a placement group and warm volumes per zone): "
        "when a zone has had no spot capacity for on_demand_after_minutes and no node runs, the watcher moves the "
        "group to the next listed zone, and falls back to on-demand once every zone failed. Without a placement "
        "group the group spreads over them. Unset: the network's zones, as without capacity.",
    )

    @model_validator(mode="after")
    def _zones_once(self) -> CapacityConfig:
        if self.zones is not None and len(set(self.zones)) != len(self.zones):
            raise ValueError(f"zones {self.zones} names a zone twice; list each zone once")
        return self
