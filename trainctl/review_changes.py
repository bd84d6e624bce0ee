"""What deploying a template over another replaces, deletes or changes in how long data is kept."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Optional

from trainctl.assembly import Stack, toolchain_missing

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
    found = {logical_id: change for logical_id, old in sorted(base.resources.items())
             if (change := _changed(old, head.resources.get(logical_id))) is not None}  # fmt: skip
    gone = {k for k, (_, why) in found.items() if why.startswith("replaced")}
    while more := _replaced_by_reference(base, head, found, gone):  # a route's table refers to the replaced VPC
        found.update(more)
        gone |= set(more)
    return [(logical_id, kind, why) for logical_id, (kind, why) in sorted(found.items())]


def _changed(old: Mapping[str, Any], new: Optional[Mapping[str, Any]]) -> Optional[tuple[str, str]]:
    """(type, why) if deploying ``new`` over ``old`` deletes it or replaces it (a changed type or create-only
    property), else None."""
    try:
        from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
    except ModuleNotFoundError as exc:
        raise toolchain_missing(exc, "--base needs cfn-lint's resource schemas") from None

    if old["Type"] == "AWS::CDK::Metadata":  # the CLI's usage analytics (absent from in-process synths)
        return None
    if new is None:
        policy = str(old.get("DeletionPolicy", "Delete"))
        if policy.startswith("Retain"):  # Retain, RetainExceptOnCreate: CloudFormation leaves the resource
            return old["Type"], f"removed from the stack, resource kept (DeletionPolicy {policy})"
        return old["Type"], "deleted (not in the new template)"
    if new["Type"] != old["Type"]:
        return old["Type"], f"replaced: type changes to {new['Type']}"
    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region="us-east-1", resource_type=old["Type"]).schema
    for path in schema.get("createOnlyProperties", []):
        keys = path.split("/")[2:]
        if _at(old.get("Properties", {}), keys) != _at(new.get("Properties", {}), keys):
            return old["Type"], f"replaced: {'.'.join(keys)} changes"
    return None


def _replaced_by_reference(
    base: Stack, head: Stack, found: Mapping[str, tuple[str, str]], gone: set[str]
) -> dict[str, tuple[str, str]]:
    """The resources not in ``found`` whose :data:`REFERENCE_CREATE_ONLY` property refers to one in ``gone``."""
    more = {}
    for logical_id, new in sorted(head.resources.items()):
        old = base.resources.get(logical_id)
        if logical_id in found or old is None or old["Type"] != new["Type"]:
            continue
        for prop in REFERENCE_CREATE_ONLY.get(new["Type"], ()):
            if targets := sorted(_refs(new.get("Properties", {}).get(prop)) & gone):
                more[logical_id] = (new["Type"], f"replaced: {prop} refers to {', '.join(targets)} (replaced)")
                break
    return more


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
