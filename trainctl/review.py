"""``trainctl review``: a Markdown summary of what the synthesized app deploys, for a pull request to carry.

Per team and cluster: instance types, max nodes, on-demand base, worst-case hourly cost (max nodes at the dearest
type's on-demand price) and the same at spot when spot prices are given (the spot nodes at the dearest given spot
price of the cluster's types, which need not be the type dearest on demand), changed values as base -> head
against a base; warm pools (volumes, their size and performance, USD per month: billed while no node runs); team
budgets; the IAM statements with what each policy is attached to (added and removed ones when
a base assembly is given); the cdk-nag acknowledgements with their reasons; and, against a base, the resources
CloudFormation would replace or delete and the data retention changes (DeletionPolicy, UpdateReplacePolicy, a
bucket's versioning and lifecycle rules). Replacement is decided with cfn-lint's copy of the CloudFormation
resource schemas (``createOnlyProperties``: changing one replaces the resource), then carried to the resources
whose create-only references point at a replaced one (:data:`REFERENCE_CREATE_ONLY`).
Reads a cloud assembly (``cdk.out``): the one it synthesizes, or one given with ``--assembly``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from team_config.naming import CLUSTER_TAG, POOL_TAG, TEAM_TAG
from trainctl.prices import (
    BEFORE_CUT_NOTE,
    GP3_INCLUDED_IOPS,
    GP3_INCLUDED_MBPS,
    GP3_SOURCE,
    PriceTable,
    gp3_monthly,
)

ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


class ReviewError(Exception):
    """A one-line reason (no assembly, synth failed); bad team files: one line per problem."""


@dataclass
class Stack:
    name: str
    template: dict[str, Any]
    acknowledged: list[tuple[str, str, str]]  # (construct path, finding, reason)

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.template.get("Resources", {}))


def synthesize(outdir: Path, teams_dir: Optional[Path] = None) -> Path:
    """Synthesize every team (cdk-nag and the SpotTraining checks run, as in ``cdk synth``) into ``outdir``."""
    from aws_cdk import App

    from team_config import ConfigError, load_teams
    from training_app import wiring as cdk_app

    try:
        teams = load_teams(teams_dir or cdk_app.TEAMS_DIR)
    except ConfigError as exc:  # every problem of every team file, one line each (as `cdk synth` prints them)
        raise ReviewError(str(exc)) from None
    application = App(outdir=str(outdir), context=cdk_app.cdk_json_context())
    cdk_app.add_teams(application, teams)
    try:
        application.synth()
    except RuntimeError as exc:
        too_many = cdk_app.too_many_resources(exc, teams)
        if too_many is not None:
            raise ReviewError(too_many) from None
        if "ValidationFailed" not in str(exc):
            raise
        raise ReviewError(  # not the report file: without --assembly, the folder is removed before this is read
            "synth found cdk-nag or SpotTraining violations, listed above (`npx cdk synth` lists them too)"
        ) from None
    return outdir


def _read_json(path: Path) -> Any:
    """A JSON file of the assembly; a missing or unreadable one is a one-line :class:`ReviewError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReviewError(f"{path}: missing from the assembly; synthesize it again (`npx cdk synth`)") from None
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        why = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise ReviewError(f"{path}: cannot read it as JSON ({why}); synthesize the assembly again") from None


def load_assembly(directory: Path) -> dict[str, Stack]:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise ReviewError(f"{directory} is not a cloud assembly (no manifest.json); run `npx cdk synth` first")
    manifest = _read_json(manifest_path)
    stacks = {}
    try:
        for name, artifact in sorted(manifest.get("artifacts", {}).items()):
            if artifact.get("type") != "aws:cloudformation:stack":
                continue
            template = _read_json(directory / artifact["properties"]["templateFile"])
            metadata = dict(artifact.get("metadata", {}))
            extra = artifact.get("additionalMetadataFile")
            if extra and (directory / extra).is_file():
                metadata.update(_read_json(directory / extra))
            acknowledged = [
                (path, finding, reason)
                for path, entries in sorted(metadata.items())
                for entry in entries
                if entry.get("type") == "aws:cdk:acknowledged-rules"
                for finding, reason in sorted(entry["data"].items())
            ]
            stacks[name] = Stack(name, template, acknowledged)
    except (AttributeError, KeyError, TypeError) as exc:  # valid JSON, but not the cloud assembly schema
        raise ReviewError(
            f"{manifest_path}: not a cloud assembly manifest ({type(exc).__name__}: {exc}); synthesize it again"
        ) from None
    if not stacks:
        raise ReviewError(f"{directory}: the assembly holds no CloudFormation stack")
    return stacks


def _render(value: Any) -> str:
    """A policy value as text: references as <LogicalId> / <LogicalId.Attr>, joins joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_render(v) for v in value)
    if isinstance(value, Mapping) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            return f"<{arg}>"
        if key == "Fn::GetAtt":
            return f"<{'.'.join(arg) if isinstance(arg, list) else arg}>"
        if key == "Fn::Join":
            return str(arg[0]).join(_render(v) for v in arg[1])
        if key == "Fn::Sub":
            return _render(arg if isinstance(arg, str) else arg[0])
    return json.dumps(value, sort_keys=True)


def iam_statements(stack: Stack) -> set[str]:
    """Who may do what: identity policies (with the roles, users and groups they are attached to), trust policies,
    managed policies, resource policies (bucket policies, Lambda permissions) and security group rules, one line
    each. ``NotPrincipal``/``NotAction``/``NotResource`` are labelled: turning ``Action`` into ``NotAction`` is a
    removed and an added line."""
    found: set[str] = set()
    for logical_id, resource in stack.resources.items():
        kind, props = resource["Type"], resource.get("Properties", {})
        documents = []
        if kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::S3::BucketPolicy"):
            documents.append(props.get("PolicyDocument", {}))
        if kind in ("AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"):
            documents += [p.get("PolicyDocument", {}) for p in props.get("Policies", [])]
            found |= {f"{logical_id}: managed policy {_render(arn)}" for arn in props.get("ManagedPolicyArns", [])}
        if kind == "AWS::IAM::Role":
            for s in props.get("AssumeRolePolicyDocument", {}).get("Statement", []):
                found.add(f"{logical_id}: trust policy {_statement(s)}")
        if kind == "AWS::Lambda::Permission":
            source = f" from {_render(props['SourceArn'])}" if "SourceArn" in props else ""
            found.add(
                f"{logical_id}: {_render(props.get('Principal'))} may {_render(props.get('Action'))} "
                f"{_render(props.get('FunctionName'))}{source}"
            )
        if kind == "AWS::EC2::SecurityGroup":
            for direction in ("Ingress", "Egress"):
                found |= {f"{logical_id}: {_rule(direction, r)}" for r in props.get(f"SecurityGroup{direction}", [])}
        if kind in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
            found.add(f"{_render(props.get('GroupId'))}: {_rule(kind.rsplit('Group', 1)[1], props)}")
        # whom the document applies to: a policy's roles, users and groups, a bucket policy's bucket
        attached = [
            f"{key.lower()} {', '.join(sorted(_render(v) for v in props[key]))}"
            for key in ("Roles", "Users", "Groups")
            if kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") and props.get(key)
        ]
        if kind == "AWS::S3::BucketPolicy":
            attached.append(f"bucket {_render(props.get('Bucket'))}")
        where = f" ({'; '.join(attached)})" if attached else ""
        for document in documents:
            for s in document.get("Statement", []):
                found.add(f"{logical_id}{where}: {_statement(s)}")
    # an asset's hash changes with its content, not with what the statement grants
    return {ASSET_HASH.sub("<asset hash>", f) for f in found}


def _statement(s: Mapping[str, Any]) -> str:
    """A policy statement as text: effect, principal, actions, resources, condition; the Not* forms labelled."""
    parts = [str(s.get("Effect", "?"))]
    for key in ("Principal", "NotPrincipal", "Action", "NotAction"):
        if key in s:
            parts.append(f"{'' if key in ('Principal', 'Action') else key + ' '}{_render(s[key])}")
    if "NotResource" in s:
        parts.append(f"on NotResource {_render(s['NotResource'])}")
    elif "Resource" in s:
        parts.append(f"on {_render(s['Resource'])}")
    if "Condition" in s:
        parts.append(f"if {json.dumps(s['Condition'], sort_keys=True)}")
    return " ".join(parts)


def _rule(direction: str, rule: Mapping[str, Any]) -> str:
    """A security group rule: direction, protocol and ports, and the peer (CIDR, group or prefix list)."""
    protocol = str(rule.get("IpProtocol", "-1"))
    ports = "" if protocol == "-1" else f" ports {rule.get('FromPort')}-{rule.get('ToPort')}"
    peer_keys = ("CidrIp", "CidrIpv6", "SourceSecurityGroupId", "DestinationSecurityGroupId", "SourcePrefixListId",
                 "DestinationPrefixListId")  # fmt: skip
    peers = [_render(rule[k]) for k in peer_keys if k in rule]
    side = "from" if direction == "Ingress" else "to"
    return f"{direction.lower()} {'all traffic' if protocol == '-1' else protocol}{ports} {side} {', '.join(peers)}"


def clusters(stack: Stack) -> Iterator[dict[str, Any]]:
    for resource in stack.resources.values():
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
        }


# Create-only properties that hold a reference to another resource of our stacks, per resource type: a resource
# whose such property refers (Ref, Fn::GetAtt, Fn::Sub) to a replaced resource gets a new value, so it is replaced
# too. Source: the `createOnlyProperties` of the CloudFormation resource schemas (cfn-lint's copy; a test checks
# each entry against it), kept to the types the app's templates hold; extend it when a new type refers to another.
REFERENCE_CREATE_ONLY: dict[str, tuple[str, ...]] = {
    "AWS::EC2::Subnet": ("VpcId",),
    "AWS::EC2::RouteTable": ("VpcId",),
    "AWS::EC2::SecurityGroup": ("VpcId",),
    "AWS::EC2::VPCEndpoint": ("VpcId",),
    "AWS::EC2::VPCGatewayAttachment": ("VpcId",),
    "AWS::EC2::Route": ("RouteTableId",),
    "AWS::EC2::SubnetRouteTableAssociation": ("SubnetId", "RouteTableId"),
    "AWS::EC2::NatGateway": ("SubnetId", "AllocationId"),
    "AWS::EC2::FlowLog": ("ResourceId", "LogGroupName", "DeliverLogsPermissionArn"),
    "AWS::EC2::SecurityGroupIngress": ("GroupId", "SourceSecurityGroupId"),
    "AWS::EC2::SecurityGroupEgress": ("GroupId", "DestinationSecurityGroupId"),
    "AWS::S3::BucketPolicy": ("Bucket",),
    "AWS::Lambda::Permission": ("FunctionName", "SourceArn"),
}
_SUB_REF = re.compile(r"\$\{(?!!)([^}.]+)")


def replaced(base: Stack, head: Stack) -> list[tuple[str, str, str]]:
    """(logical id, type, why) of every resource of ``base`` that deploying ``head`` replaces or deletes: a changed
    create-only property (or type), and then, to a fixed point, a :data:`REFERENCE_CREATE_ONLY` property that refers
    to a replaced resource (a new VPC range replaces the VPC, so its subnets, security groups, route tables ...)."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    found: dict[str, tuple[str, str]] = {}
    for logical_id, old in sorted(base.resources.items()):
        if old["Type"] == "AWS::CDK::Metadata":  # the CLI's usage analytics (absent from in-process synths)
            continue
        new = head.resources.get(logical_id)
        if new is None:
            policy = str(old.get("DeletionPolicy", "Delete"))
            why = "deleted (not in the new template)"
            if policy.startswith("Retain"):  # Retain, RetainExceptOnCreate: CloudFormation leaves the resource
                why = f"removed from the stack, resource kept (DeletionPolicy {policy})"
            found[logical_id] = (old["Type"], why)
            continue
        if new["Type"] != old["Type"]:
            found[logical_id] = (old["Type"], f"replaced: type changes to {new['Type']}")
            continue
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region="us-east-1", resource_type=old["Type"]).schema
        for path in schema.get("createOnlyProperties", []):
            keys = path.split("/")[2:]
            if _at(old.get("Properties", {}), keys) != _at(new.get("Properties", {}), keys):
                found[logical_id] = (old["Type"], f"replaced: {'.'.join(keys)} changes")
                break
    gone = {k for k, (_, why) in found.items() if why.startswith("replaced")}
    while True:  # to a fixed point: a route refers to a route table that refers to the replaced VPC
        more = {}
        for logical_id, new in sorted(head.resources.items()):
            old = base.resources.get(logical_id)
            if logical_id in found or old is None or old["Type"] != new["Type"]:
                continue
            for prop in REFERENCE_CREATE_ONLY.get(new["Type"], ()):
                if targets := sorted(_refs(new.get("Properties", {}).get(prop)) & gone):
                    more[logical_id] = (new["Type"], f"replaced: {prop} refers to {', '.join(targets)} (replaced)")
                    break
        if not more:
            break
        found.update(more)
        gone |= set(more)
    return [(logical_id, kind, why) for logical_id, (kind, why) in sorted(found.items())]


def _refs(value: Any) -> set[str]:
    """The logical ids ``value`` refers to with Ref, Fn::GetAtt or Fn::Sub (not pseudo parameters)."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                found.add(arg)
            elif key == "Fn::GetAtt":
                found.add(arg[0] if isinstance(arg, list) else str(arg).split(".", 1)[0])
            elif key == "Fn::Sub":
                text = arg if isinstance(arg, str) else arg[0]
                found |= {m.split(".", 1)[0] for m in _SUB_REF.findall(str(text))}
                found |= _refs(arg[1:] if isinstance(arg, list) else None)
            else:
                found |= _refs(arg)
    elif isinstance(value, list):
        for item in value:
            found |= _refs(item)
    return {f for f in found if not f.startswith("AWS::")}


def retention_changes(base: Stack, head: Stack) -> list[tuple[str, str, str, str, str]]:
    """(logical id, type, what, base value, head value) of every change to how long data outlives its resource or
    its objects: DeletionPolicy and UpdateReplacePolicy of any resource (an EC2 volume's or the checkpoint bucket's
    going from Retain to Delete), and of an S3 bucket its versioning and each lifecycle rule (by ``Id``)."""
    out = []
    for logical_id, new in sorted(head.resources.items()):
        old = base.resources.get(logical_id)
        if old is None or old["Type"] != new["Type"]:
            continue
        kind = new["Type"]
        # CloudFormation's default for both is Delete (a few database types snapshot; none is in these stacks)
        changes = [(key, _text(old.get(key, "Delete")), _text(new.get(key, "Delete")))
                   for key in ("DeletionPolicy", "UpdateReplacePolicy")]  # fmt: skip
        if kind == "AWS::S3::Bucket":
            before, after = old.get("Properties", {}), new.get("Properties", {})
            status = [_at(p, ["VersioningConfiguration", "Status"]) or "none (unversioned)" for p in (before, after)]
            changes.append(("versioning", _text(status[0]), _text(status[1])))
            changes += _lifecycle_changes(before.get("LifecycleConfiguration"), after.get("LifecycleConfiguration"))
        out += [(logical_id, kind, what, was, now) for what, was, now in changes if was != now]
    return out


def _lifecycle_changes(before: Any, after: Any) -> list[tuple[str, str, str]]:
    """A bucket's lifecycle configuration, base -> head: a row per added, removed or changed rule (by ``Id``, else
    by position), and one for the rest of the configuration."""

    def rules(config: Any) -> dict[str, Any]:
        found = config.get("Rules", []) if isinstance(config, Mapping) else []
        return {str(r.get("Id", f"#{i + 1}")) if isinstance(r, Mapping) else f"#{i + 1}": r
                for i, r in enumerate(found)}  # fmt: skip

    def rest(config: Any) -> Any:
        return {k: v for k, v in config.items() if k != "Rules"} if isinstance(config, Mapping) else None

    old, new = rules(before), rules(after)
    out = [
        (f"lifecycle rule {name}", _text(old.get(name, "none")), _text(new.get(name, "none")))
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]
    if (rest(before) or None) != (rest(after) or None):
        out.append(("LifecycleConfiguration", _text(rest(before) or "none"), _text(rest(after) or "none")))
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _at(props: Any, keys: list[str]) -> Any:
    for key in keys:
        props = props.get(key) if isinstance(props, Mapping) else None
    return props


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
        cells = [", ".join(c["types"]), str(c["max_nodes"]), f"{c['on_demand_base']} + {c['on_demand_pct']}% above",
                 f"{on_demand:.2f}", spot_cost]  # fmt: skip
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
        (stack.name, _render(r["Properties"]["Budget"]["BudgetName"])): str(
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
    out += ["", "### Clusters", ""]
    head_rows = {key: row for stack in head.values() for key, row in _cluster_rows(stack, prices, spot)}
    base_rows = {key: row for stack in (base or {}).values() for key, row in _cluster_rows(stack, prices, spot)}
    rows = _against_base(head_rows, base_rows, head, base is not None)
    out += _table(["team", "cluster", "instance types", "max nodes", "on-demand", "worst case USD/h on demand",
                   "worst case USD/h at spot"], rows)  # fmt: skip
    used = {t for stack in [*head.values(), *(base or {}).values()] for c in clusters(stack) for t in c["types"]}
    before_cut = sorted(t for t in used if prices.before_cut(t))
    out += [
        "",
        f"Worst case: every node of the group running as its dearest listed type. On-demand prices: {prices.source}. "
        + (
            "Spot prices: as given; spot nodes at the dearest spot price given for the cluster's types."
            if spot is not None
            else "Spot: no spot prices given (--spot-prices FILE)."
        )
        + (f" {', '.join(before_cut)}: {BEFORE_CUT_NOTE}." if before_cut else "")
        + (" A changed value reads base -> head." if base is not None else ""),
    ]
    head_pools = {key: row for stack in head.values() for key, row in _pool_rows(stack)}
    base_pools = {key: row for stack in (base or {}).values() for key, row in _pool_rows(stack)}
    pool_rows = _against_base(head_pools, base_pools, head, base is not None)
    if pool_rows:
        out += ["", "### Warm pools (billed while idle)", ""]
        out += _table(["team", "cluster", "volumes", "GiB each", "IOPS each", "MB/s each", "USD per month"], pool_rows)
        out += [
            "",
            "A pool's volumes are billed from the deploy to their deletion, nodes or not. Prices: "
            f"{GP3_SOURCE}, whatever --prices gives the instances."
            + (" (new) and (removed): the cluster's pool." if base is not None else ""),
        ]
    head_budgets, base_budgets = _budgets(head), _budgets(base or {})
    budgets = []
    for (stack_name, name), amount in head_budgets.items():
        limit = next((a for (s, _), a in base_budgets.items() if s == stack_name), None)  # one budget per stack
        if base is not None and limit is None:
            amount = f"{amount} (new)"
        elif limit is not None and limit != amount:  # its name changes with its emails or threshold: by stack
            amount = f"{limit} -> {amount}"
        budgets.append([stack_name, name, amount])
    out += ["", "### Team budgets", ""]
    out += _table(["stack", "budget", "USD per month"], budgets) if budgets else ["No team sets a budget."]
    out += ["", "### IAM, resource policies and security group rules", ""]
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
    out += ["### cdk-nag acknowledgements", ""]
    acks = [[name, path, finding, reason] for name, s in head.items() for path, finding, reason in s.acknowledged]
    out += _table(["stack", "construct", "finding", "reason"], acks) if acks else ["None."]
    if base is not None:
        out += ["", "### Replaced or deleted resources", ""]
        rows = [[name, *r] for name, stack in head.items() if name in base for r in replaced(base[name], stack)]
        rows += [[name, "(whole stack)", "", "deleted"] for name in base if name not in head]
        out += _table(["stack", "resource", "type", "why"], rows) if rows else ["None."]
        if any(r[2] == "AWS::EC2::Volume" for r in rows):
            out += ["", POOL_REPLACED_NOTE]
        out += ["", "### Data retention changes", ""]
        rows = [
            [name, *r] for name, stack in head.items() if name in base for r in retention_changes(base[name], stack)
        ]
        out += _table(["stack", "resource", "type", "what", "base", "head"], rows) if rows else ["None."]
    return "\n".join(out) + "\n"
