"""A job's on-demand node-hours (an on-demand base, or the capacity watcher's fallback, docs/concepts/capacity.md)
against what the same hours would have cost at spot prices: the ``on_demand_nodes`` of ``trainctl cost``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # trainctl.cost imports this module
    from trainctl.cost import NodeCost


def on_demand_nodes(nodes: Sequence[NodeCost]) -> dict[str, Any]:
    """Hours and cost of the on-demand nodes, and the same hours at each node's spot price (``at_spot_usd``: None when
    a node's type and AZ have no spot price history)."""
    on_demand = [n for n in nodes if n.market == "on-demand"]
    spot_prices = [n.spot_usd_per_hour for n in on_demand]
    at_spot = None if None in spot_prices else sum(n.hours * (n.spot_usd_per_hour or 0.0) for n in on_demand)
    return {
        "hours": sum(n.hours for n in on_demand),
        "cost_usd": sum(n.cost_usd for n in on_demand),
        "at_spot_usd": at_spot,
    }
