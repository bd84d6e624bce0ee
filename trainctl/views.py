"""The text output of trainctl's commands (``--json`` prints their data as it is)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from trainctl.capacity import capacity_lines
from trainctl.cost import redone_text


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(c).upper() for c in columns]] + [
        ["" if r.get(c) is None else str(r[c]) for c in columns] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def format_status(info: dict[str, Any]) -> str:
    shown = dict(info)
    if isinstance(info["budget"], dict):
        b = info["budget"]
        shown["budget"] = f"spent {b['spent_usd']:.2f} of {b['limit_usd']:.2f} USD this month ({b['name']})"
    if info["last_flat_checkpoint"] is None:
        del shown["last_flat_checkpoint"]
    if info["eta_s"] is None and info["state"] == "RUNNING" and info["planned_steps"]:
        shown["eta_s"] = (
            "unknown (flat checkpoints: the agent cannot tell their step)"
            if info["last_flat_checkpoint"] is not None
            else "unknown (fewer than 2 checkpoints since the last node boot, restart or interruption)"
        )
    if info["reason"] is None:
        del shown["reason"]  # only a FAILED job has one
    shown["env"] = ", ".join(f"{name}={value}" for name, value in info["env"].items()) or None
    shown["secrets"] = ", ".join(info["secrets"]) or None
    hidden = ("nodes", "group_job", "capacity")
    head = "\n".join(
        [f"{k}: {'-' if v is None else v}" for k, v in shown.items() if k not in hidden]
        + capacity_lines(info.get("capacity"), time.time())
    )
    nodes = table([_node_row(n) for n in info["nodes"]], NODE_COLUMNS) if info["nodes"] else "no nodes"
    if info["group_job"] not in (None, info["job_id"]):
        nodes = f"no nodes: the group belongs to the current job {info['group_job']}"
    return f"{head}\n\n{nodes}"


def _on_demand_line(on_demand: dict[str, Any]) -> list[str]:
    """The job's on-demand node-hours and what they cost against spot; nothing for a job that ran on spot only."""
    if not on_demand["hours"]:
        return []
    at_spot = on_demand["at_spot_usd"]
    against = "no spot price history to compare" if at_spot is None else f"at spot prices {at_spot:.4f} USD"
    return [f"on-demand: {on_demand['hours']:.3f} node-hours, {on_demand['cost_usd']:.4f} USD ({against})"]


NODE_COLUMNS = ["instance", "state", "agent_state", "market", "az", "type", "agent_reason"]


def _node_row(node: dict[str, Any]) -> dict[str, Any]:
    """A node as ``trainctl status`` shows it: the agent's state with how long it has been in it."""
    if node.get("agent_state") is None:
        return dict(node, agent_state="-")  # its agent has not written a state yet (booting, or no agent)
    return dict(node, agent_state=f"{node['agent_state']} ({node['agent_state_age_s']:.0f} s)")


def format_cost(info: dict[str, Any]) -> str:
    def money(v: float) -> str:
        return f"{v:.4f}"

    types = [
        dict(r, hours=f"{r['hours']:.3f}", usd_per_hour=money(r["usd_per_hour"]), cost_usd=money(r["cost_usd"]),
             on_demand_usd=money(r["on_demand_usd"]))
        for r in info["by_type"]
    ]  # fmt: skip
    nodes = [dict(n, hours=f"{n['hours']:.3f}", cost_usd=money(n["cost_usd"])) for n in info["nodes"]]
    return "\n".join(
        [
            f"job {info['job_id']}: {len(info['nodes'])} instance(s)",
            "",
            table(types, ["type", "market", "nodes", "hours", "usd_per_hour", "cost_usd", "on_demand_usd"]),
            "",
            table(nodes, ["instance", "type", "market", "az", "hours", "cost_usd", "timed_by"]),
            "",
            f"total: {money(info['total_usd'])} USD; the same hours on demand: {money(info['on_demand_usd'])} USD; "
            f"savings {info['savings_pct']:.1f} %",
            *_on_demand_line(info["on_demand_nodes"]),
            f"interruptions: {info['interruptions']}; {redone_text(info['redone'])}",
            f"on-demand prices: {info['on_demand_prices']}",
            f"spot prices: {info['spot_prices']}",
            *(f"warning: {w}" for w in info["warnings"]),
        ]
    )
