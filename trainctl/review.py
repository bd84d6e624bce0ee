"""``trainctl review``: a Markdown summary of what the synthesized app deploys, for a pull request to carry.

Per team and cluster: instance types, max nodes, on-demand base, EFA interfaces per node, worst-case hourly cost
(max nodes at the dearest type's on-demand price) and the same at spot when spot prices are given (the spot nodes at
the dearest given spot price of the cluster's types, which need not be the type dearest on demand), changed values
as base -> head against a base; warm pools (volumes, their size and performance, USD per month: billed while no node
runs); team budgets; the IAM statements with what each policy is attached to (added and removed ones when a base
assembly is given); the cdk-nag acknowledgements with their reasons; and, against a base, the resources
CloudFormation would replace or delete and the data retention changes (DeletionPolicy, UpdateReplacePolicy, a
bucket's versioning and lifecycle rules). Replacement is decided with cfn-lint's copy of the CloudFormation resource
schemas (``createOnlyProperties``: changing one replaces the resource), then carried to the resources whose
create-only references point at a replaced one (:data:`trainctl.review_changes.REFERENCE_CREATE_ONLY`). Reads a cloud
assembly (``cdk.out``): the one it synthesizes, or one given with ``--assembly``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional

from team_config.naming import CLUSTER_TAG, POOL_TAG, TEAM_TAG
from trainctl.assembly import Stack
from trainctl.prices import (
    BEFORE_CUT_NOTE,
    GP3_INCLUDED_IOPS,
    GP3_INCLUDED_MBPS,
    GP3_SOURCE,
    PriceTable,
    gp3_monthly,
)
from trainctl.review_changes import replaced, retention_changes
from trainctl.review_iam import iam_statements, render


def efa_interfaces(stack: Stack, policy: Mapping[str, Any]) -> dict[str, int]:
    """EFA interfaces per node of each instance type of a MixedInstancesPolicy (its override's launch template, else
    the policy's); a type without any is left out."""
    spec = policy.get("LaunchTemplate", {})
    out = {}
    for override in spec.get("Overrides", []):
        named = override.get("LaunchTemplateSpecification") or spec.get("LaunchTemplateSpecification", {})
        template = stack.resources.get(named.get("LaunchTemplateId", {}).get("Ref", ""), {})
        interfaces = template.get("Properties", {}).get("LaunchTemplateData", {}).get("NetworkInterfaces", [])
        count = sum(1 for i in interfaces if i.get("InterfaceType") == "efa")
        if count and "InstanceType" in override:
            out[override["InstanceType"]] = count
    return out


def _efa_cell(efa: Mapping[str, int]) -> str:
    """``off``, ``4 per node``, or per type where the types differ: ``p4d.24xlarge 4, p5.48xlarge 32``."""
    if not efa:
        return "off"
    if len(set(efa.values())) == 1:
        return f"{next(iter(efa.values()))} per node"
    return ", ".join(f"{t} {n}" for t, n in efa.items())


def fallback_minutes(stack: Stack, group_id: str) -> Optional[float]:
    """Minutes without spot capacity after which the group's capacity watcher (training_constructs/capacity_watcher.py)
    moves it to on-demand, or None: the group has no watcher."""
    for resource in stack.resources.values():
        variables = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
        if resource["Type"] == "AWS::Lambda::Function" and variables.get("GROUP_NAME") == {"Ref": group_id}:
            return float(variables["ON_DEMAND_AFTER_S"]) / 60
    return None


def clusters(stack: Stack) -> Iterator[dict[str, Any]]:
    for group_id, resource in stack.resources.items():
        if resource["Type"] != "AWS::AutoScaling::AutoScalingGroup":
            continue
        props = resource["Properties"]
        tags = {t["Key"]: t["Value"] for t in props.get("Tags", [])}
        policy = props.get("MixedInstancesPolicy", {})
        types = [
            o["InstanceType"] for o in policy.get("LaunchTemplate", {}).get("Overrides", []) if "InstanceType" in o
        ]
        distribution = policy.get("InstancesDistribution", {})
        yield {
            "team": tags.get(TEAM_TAG, "?"),
            "cluster": tags.get(CLUSTER_TAG, "?"),
            "types": types,
            "max_nodes": int(props["MaxSize"]),
            "on_demand_base": int(distribution.get("OnDemandBaseCapacity", 0)),
            # CloudFormation's default is 100: a group that does not say is all on demand above the base
            "on_demand_pct": int(distribution.get("OnDemandPercentageAboveBaseCapacity", 100)),
            "efa": efa_interfaces(stack, policy),
            "fallback_after_min": fallback_minutes(stack, group_id),
        }


def _cluster_rows(
    stack: Stack, prices: PriceTable, spot: Optional[Mapping[str, float]]
) -> Iterator[tuple[tuple[str, str, str], list[str]]]:
    """Per cluster of the stack, (stack, team, cluster) and its cells: types, max nodes, on-demand share, worst-case
    USD/h on demand and at spot (``-`` unless ``spot`` prices every type)."""
    for c in clusters(stack):
        dearest = max(c["types"], key=prices.on_demand_price)
        on_demand = c["max_nodes"] * prices.on_demand_price(dearest)
        spot_cost = "-"
        # spot prices do not follow the on-demand order: the dearest at spot is the dearest spot price, and a
        # worst case needs every type's (a type the file leaves out may be the dearest)
        if spot is not None and all(t in spot for t in c["types"]):
            above = max(c["max_nodes"] - c["on_demand_base"], 0)
            on_demand_nodes = c["max_nodes"] - above + math.ceil(above * c["on_demand_pct"] / 100)  # worst: up
            spot_nodes = c["max_nodes"] - on_demand_nodes
            dearest_spot = max(spot[t] for t in c["types"])
            spot_cost = f"{spot_nodes * dearest_spot + on_demand_nodes * prices.on_demand_price(dearest):.2f}"
        share = f"{c['on_demand_base']} + {c['on_demand_pct']}% above"
        if c["fallback_after_min"] is not None:  # the worst case is then all on demand, whatever the spot prices
            share += f"; all after {c['fallback_after_min']:g} min without spot"
            spot_cost += f" ({on_demand:.2f} after the fallback)"
        cells = [", ".join(c["types"]), str(c["max_nodes"]), share, _efa_cell(c["efa"]), f"{on_demand:.2f}", spot_cost]
        yield (stack.name, c["team"], c["cluster"]), cells


def _pool_rows(stack: Stack) -> Iterator[tuple[tuple[str, str, str], list[str]]]:
    """Per warm pool of the stack, (stack, team, cluster) and its cells: volumes, GiB, IOPS and MB/s of each (the
    values the pool's volumes have, joined when they differ), and USD per month of all of them (``-`` unless gp3)."""
    pools: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for resource in stack.resources.values():
        if resource["Type"] != "AWS::EC2::Volume":
            continue
        props = resource.get("Properties", {})
        tags = {t["Key"]: t["Value"] for t in props.get("Tags", [])}
        if POOL_TAG in tags:
            pools.setdefault((tags.get(TEAM_TAG, "?"), tags.get(CLUSTER_TAG, "?")), []).append(props)
    for (team, cluster), volumes in pools.items():

        def values(key: str, default: Any, volumes: list[dict[str, Any]] = volumes) -> str:
            return ", ".join(sorted({str(v.get(key, default)) for v in volumes}))

        gp3 = all(v.get("VolumeType") == "gp3" for v in volumes)
        iops, mbps = values("Iops", GP3_INCLUDED_IOPS), values("Throughput", GP3_INCLUDED_MBPS)
        monthly = (
            sum(
                gp3_monthly(
                    int(v["Size"]), int(v.get("Iops", GP3_INCLUDED_IOPS)), int(v.get("Throughput", GP3_INCLUDED_MBPS))
                )
                for v in volumes
            )
            if gp3
            else None
        )
        cells = [str(len(volumes)), values("Size", "?"), iops, mbps,
                 "-" if monthly is None else f"{monthly:.2f}"]  # fmt: skip
        yield (stack.name, team, cluster), cells


def _against_base(
    head: dict[tuple[str, str, str], list[str]],
    base: dict[tuple[str, str, str], list[str]],
    head_stacks: Iterable[str],
    compared: bool,
) -> list[list[str]]:
    """Rows of team, cluster and cells, head against a base: a changed value as base -> head (max nodes 2 -> 40 is
    what a reviewer must see), a new cluster (a new team's too) marked ``(new)``, a removed one ``(removed)``."""
    rows = []
    for key, now in head.items():  # the head's clusters, then the base's removed ones
        was = base.get(key)
        if was is None:
            rows.append([key[1], f"{key[2]} (new)" if compared else key[2], *now])
        else:
            rows.append([key[1], key[2], *(v if v == b else f"{b} -> {v}" for b, v in zip(was, now, strict=True))])
    rows += [[key[1], f"{key[2]} (removed)", *(f"{b} -> -" for b in was)]
             for key, was in base.items() if key not in head and key[0] in head_stacks]  # fmt: skip
    return rows


POOL_REPLACED_NOTE = (
    "Warm pool volumes are replaced or removed: deploy with the cluster's group at 0 (a volume still attached to a "
    "node fails its delete and stays, billed, outside the stack)."
)


def _budgets(stacks: dict[str, Stack]) -> dict[tuple[str, str], str]:
    """{(stack, budget name): USD per month} of the stacks' team budgets."""
    return {
        (stack.name, render(r["Properties"]["Budget"]["BudgetName"])): str(
            r["Properties"]["Budget"]["BudgetLimit"]["Amount"]
        )
        for stack in stacks.values()
        for r in stack.resources.values()
        if r["Type"] == "AWS::Budgets::Budget"
    }


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[c.replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    return [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}", *(f"| {' | '.join(r)} |" for r in cells)]


def summary(
    head: dict[str, Stack],
    prices: PriceTable,
    spot: Optional[Mapping[str, float]] = None,
    base: Optional[dict[str, Stack]] = None,
) -> str:
    out = ["## Spot training: what this change deploys", ""]
    out.append(
        f"Stacks: {', '.join(head)}" + (f"; compared with a base assembly of {', '.join(base)}." if base else ".")
    )
    out += _clusters_section(head, prices, spot, base)
    out += _pools_section(head, base)
    out += _budgets_section(head, base)
    out += _iam_section(head, base)
    out += ["### cdk-nag acknowledgements", ""]
    acks = [[name, path, finding, reason] for name, s in head.items() for path, finding, reason in s.acknowledged]
    out += _table(["stack", "construct", "finding", "reason"], acks) if acks else ["None."]
    if base is not None:
        out += _changes_section(head, base)
    return "\n".join(out) + "\n"


def _clusters_section(
    head: dict[str, Stack], prices: PriceTable, spot: Optional[Mapping[str, float]], base: Optional[dict[str, Stack]]
) -> list[str]:
    """The clusters' table, then how its worst cases are priced."""
    head_rows = {key: row for stack in head.values() for key, row in _cluster_rows(stack, prices, spot)}
    base_rows = {key: row for stack in (base or {}).values() for key, row in _cluster_rows(stack, prices, spot)}
    rows = _against_base(head_rows, base_rows, head, base is not None)
    out = ["", "### Clusters", ""]
    out += _table(["team", "cluster", "instance types", "max nodes", "on-demand", "EFA interfaces",
                   "worst case USD/h on demand", "worst case USD/h at spot"], rows)  # fmt: skip
    used = {t for stack in [*head.values(), *(base or {}).values()] for c in clusters(stack) for t in c["types"]}
    before_cut = sorted(t for t in used if prices.before_cut(t))
    spot_text = (
        "Spot prices: as given; spot nodes at the dearest spot price given for the cluster's types."
        if spot is not None
        else "Spot: no spot prices given (--spot-prices FILE)."
    )
    out += [
        "",
        "Worst case: every node of the group running as its dearest listed type; a cluster with a capacity fallback "
        "(all on demand after so many minutes without spot capacity) may run its whole worst case on demand. "
        f"On-demand prices: {prices.source}. "
        + spot_text
        + (f" {', '.join(before_cut)}: {BEFORE_CUT_NOTE}." if before_cut else "")
        + (" A changed value reads base -> head." if base is not None else ""),
    ]
    return out


def _pools_section(head: dict[str, Stack], base: Optional[dict[str, Stack]]) -> list[str]:
    """The warm pools' table and how they are billed; nothing when no stack has one."""
    head_pools = {key: row for stack in head.values() for key, row in _pool_rows(stack)}
    base_pools = {key: row for stack in (base or {}).values() for key, row in _pool_rows(stack)}
    pool_rows = _against_base(head_pools, base_pools, head, base is not None)
    if not pool_rows:
        return []
    out = ["", "### Warm pools (billed while idle)", ""]
    out += _table(["team", "cluster", "volumes", "GiB each", "IOPS each", "MB/s each", "USD per month"], pool_rows)
    out += [
        "",
        "A pool's volumes are billed from the deploy to their deletion, nodes or not. Prices: "
        f"{GP3_SOURCE}, whatever --prices gives the instances."
        + (" (new) and (removed): the cluster's pool." if base is not None else ""),
    ]
    return out


def _budgets_section(head: dict[str, Stack], base: Optional[dict[str, Stack]]) -> list[str]:
    """The team budgets, a changed limit as base -> head."""
    head_budgets, base_budgets = _budgets(head), _budgets(base or {})
    budgets = []
    for (stack_name, name), amount in head_budgets.items():
        limit = next((a for (s, _), a in base_budgets.items() if s == stack_name), None)  # one budget per stack
        if base is not None and limit is None:
            amount = f"{amount} (new)"
        elif limit is not None and limit != amount:  # its name changes with its emails or threshold: by stack
            amount = f"{limit} -> {amount}"
        budgets.append([stack_name, name, amount])
    out = ["", "### Team budgets", ""]
    out += _table(["stack", "budget", "USD per month"], budgets) if budgets else ["No team sets a budget."]
    return out


def _iam_section(head: dict[str, Stack], base: Optional[dict[str, Stack]]) -> list[str]:
    """Per stack, its statements (folded), or against the base the added and removed ones."""
    out = ["", "### IAM, resource policies and security group rules", ""]
    for name, stack in head.items():
        statements = iam_statements(stack)
        if base is None or name not in base:
            out.append(f"<details><summary>{name}: {len(statements)} statements</summary>\n")
            out += [f"- `{s}`" for s in sorted(statements)]
            out += ["", "</details>", ""]
            continue
        before = iam_statements(base[name])
        added, removed = sorted(statements - before), sorted(before - statements)
        out.append(f"{name}: {len(added)} added, {len(removed)} removed")
        out += [f"- added `{s}`" for s in added] + [f"- removed `{s}`" for s in removed] + [""]
    return out


def _changes_section(head: dict[str, Stack], base: dict[str, Stack]) -> list[str]:
    """Against the base: the resources replaced or deleted, and the data retention changes."""
    out = ["", "### Replaced or deleted resources", ""]
    rows = [[name, *r] for name, stack in head.items() if name in base for r in replaced(base[name], stack)]
    rows += [[name, "(whole stack)", "", "deleted"] for name in base if name not in head]
    out += _table(["stack", "resource", "type", "why"], rows) if rows else ["None."]
    if any(r[2] == "AWS::EC2::Volume" for r in rows):
        out += ["", POOL_REPLACED_NOTE]
    out += ["", "### Data retention changes", ""]
    rows = [[name, *r] for name, stack in head.items() if name in base for r in retention_changes(base[name], stack)]
    out += _table(["stack", "resource", "type", "what", "base", "head"], rows) if rows else ["None."]
    return out
