"""Who may do what in a template, one line per statement or rule, for ``trainctl review`` to compare."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainctl.assembly import Stack

ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def render(value: Any) -> str:
    """A policy value as text: references as <LogicalId> / <LogicalId.Attr>, joins joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(render(v) for v in value)
    if isinstance(value, Mapping) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            return f"<{arg}>"
        if key == "Fn::GetAtt":
            return f"<{'.'.join(arg) if isinstance(arg, list) else arg}>"
        if key == "Fn::Join":
            return str(arg[0]).join(render(v) for v in arg[1])
        if key == "Fn::Sub":
            return render(arg if isinstance(arg, str) else arg[0])
    return json.dumps(value, sort_keys=True)


def iam_statements(stack: Stack) -> set[str]:
    """Who may do what: identity policies (with the roles, users and groups they are attached to), trust policies,
    managed policies, resource policies (bucket policies, Lambda permissions) and security group rules, one line
    each. ``NotPrincipal``/``NotAction``/``NotResource`` are labelled: turning ``Action`` into ``NotAction`` is a
    removed and an added line."""
    found: set[str] = set()
    for logical_id, resource in stack.resources.items():
        lines = STATEMENT_LINES.get(resource["Type"])
        if lines is not None:
            found |= lines(logical_id, resource["Type"], resource.get("Properties", {}))
    # an asset's hash changes with its content, not with what the statement grants
    return {ASSET_HASH.sub("<asset hash>", f) for f in found}


def _documents(logical_id: str, where: str, documents: Iterable[Mapping[str, Any]]) -> set[str]:
    """A line per statement of the policy documents, with whom they apply to (``where``)."""
    return {f"{logical_id}{where}: {_statement(s)}" for document in documents for s in document.get("Statement", [])}


def _policy(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    """An identity policy or a managed policy: its statements, with the roles, users and groups it is attached to."""
    attached = [
        f"{key.lower()} {', '.join(sorted(render(v) for v in props[key]))}"
        for key in ("Roles", "Users", "Groups")
        if props.get(key)
    ]
    where = f" ({'; '.join(attached)})" if attached else ""
    return _documents(logical_id, where, [props.get("PolicyDocument", {})])


def _bucket_policy(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    return _documents(logical_id, f" (bucket {render(props.get('Bucket'))})", [props.get("PolicyDocument", {})])


def _identity(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    """A role, user or group: its inline policies' statements, its managed policies and (a role) its trust policy."""
    found = _documents(logical_id, "", [p.get("PolicyDocument", {}) for p in props.get("Policies", [])])
    found |= {f"{logical_id}: managed policy {render(arn)}" for arn in props.get("ManagedPolicyArns", [])}
    trust = props.get("AssumeRolePolicyDocument", {}).get("Statement", []) if kind == "AWS::IAM::Role" else []
    return found | {f"{logical_id}: trust policy {_statement(s)}" for s in trust}


def _lambda_permission(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    source = f" from {render(props['SourceArn'])}" if "SourceArn" in props else ""
    return {
        f"{logical_id}: {render(props.get('Principal'))} may {render(props.get('Action'))} "
        f"{render(props.get('FunctionName'))}{source}"
    }


def _security_group(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    return {
        f"{logical_id}: {_rule(direction, r)}"
        for direction in ("Ingress", "Egress")
        for r in props.get(f"SecurityGroup{direction}", [])
    }


def _security_group_rule(logical_id: str, kind: str, props: Mapping[str, Any]) -> set[str]:
    return {f"{render(props.get('GroupId'))}: {_rule(kind.rsplit('Group', 1)[1], props)}"}


# What each resource type grants, as lines: (logical id, type, properties) -> lines.
STATEMENT_LINES: dict[str, Callable[[str, str, Mapping[str, Any]], set[str]]] = {
    "AWS::IAM::Policy": _policy,
    "AWS::IAM::ManagedPolicy": _policy,
    "AWS::S3::BucketPolicy": _bucket_policy,
    "AWS::IAM::Role": _identity,
    "AWS::IAM::User": _identity,
    "AWS::IAM::Group": _identity,
    "AWS::Lambda::Permission": _lambda_permission,
    "AWS::EC2::SecurityGroup": _security_group,
    "AWS::EC2::SecurityGroupIngress": _security_group_rule,
    "AWS::EC2::SecurityGroupEgress": _security_group_rule,
}


def _statement(s: Mapping[str, Any]) -> str:
    """A policy statement as text: effect, principal, actions, resources, condition; the Not* forms labelled."""
    parts = [str(s.get("Effect", "?"))]
    for key in ("Principal", "NotPrincipal", "Action", "NotAction"):
        if key in s:
            parts.append(f"{'' if key in ('Principal', 'Action') else key + ' '}{render(s[key])}")
    if "NotResource" in s:
        parts.append(f"on NotResource {render(s['NotResource'])}")
    elif "Resource" in s:
        parts.append(f"on {render(s['Resource'])}")
    if "Condition" in s:
        parts.append(f"if {json.dumps(s['Condition'], sort_keys=True)}")
    return " ".join(parts)


def _rule(direction: str, rule: Mapping[str, Any]) -> str:
    """A security group rule: direction, protocol and ports, and the peer (CIDR, group or prefix list)."""
    protocol = str(rule.get("IpProtocol", "-1"))
    ports = "" if protocol == "-1" else f" ports {rule.get('FromPort')}-{rule.get('ToPort')}"
    peer_keys = ("CidrIp", "CidrIpv6", "SourceSecurityGroupId", "DestinationSecurityGroupId", "SourcePrefixListId",
                 "DestinationPrefixListId")  # fmt: skip
    peers = [render(rule[k]) for k in peer_keys if k in rule]
    side = "from" if direction == "Ingress" else "to"
    return f"{direction.lower()} {'all traffic' if protocol == '-1' else protocol}{ports} {side} {', '.join(peers)}"
