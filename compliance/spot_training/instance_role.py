"""ST9: what an instance role allows on every resource of a kind."""

from __future__ import annotations

import json
from typing import Any, Optional

from compliance.spot_training.arns import is_wildcard_resource, render, scoped_by_tag
from compliance.spot_training.template import Resource, Template, as_list, props, ref_target, resources_of

DATA_PREFIXES = ("s3:", "autoscaling:")
# prefixes: ssm:GetParameter covers GetParameters and GetParametersByPath; ec2:ModifyVolume, ModifyVolumeAttribute
SCOPED_ACTIONS = (
    "ec2:attachvolume", "ec2:detachvolume", "ec2:createvolume", "ec2:deletevolume", "ec2:modifyvolume",
    "ssm:getparameter", "ssm:putparameter", "ssm:deleteparameter", "ssm:labelparameterversion",
)  # fmt: skip


def _risky_action(action: str) -> bool:
    """Whether ``action`` on Resource "*" would reach other teams' data: S3 and Auto Scaling actions (reads
    included: another team's checkpoints), SSM parameter reads and writes, EC2 volume writes. Describe calls are
    exempt: EC2's, Auto Scaling's and SSM's take Resource "*" only."""
    a = action.lower()
    service, _, name = a.partition(":")
    if a == "*" or (name == "*" and service in ("s3", "autoscaling", "ec2", "ssm")):
        return True
    if name.startswith("describe") and "*" not in name:
        return False
    return a.startswith(DATA_PREFIXES) or any(
        a.startswith(v) or (a.endswith("*") and v.startswith(a[:-1])) for v in SCOPED_ACTIONS
    )


def _instance_roles(template: Template) -> set[str]:
    roles = set()
    for logical_id, role in resources_of(template, "AWS::IAM::Role").items():
        if "ec2.amazonaws.com" in json.dumps(props(role).get("AssumeRolePolicyDocument", {})):
            roles.add(logical_id)
    return roles


def _wildcard_statements(document: Any) -> list[str]:
    problems = []
    for st in as_list((document or {}).get("Statement", [])):
        if st.get("Effect") != "Allow":
            continue
        problems += [f"Allow with {key} (everything not listed)" for key in ("NotAction", "NotResource") if key in st]
        resources = as_list(st.get("Resource", []))
        wildcards = sorted({render(r) for r in resources if is_wildcard_resource(r, scoped_by_tag(st))})
        risky = sorted(a for a in as_list(st.get("Action", [])) if isinstance(a, str) and _risky_action(a))
        if wildcards and risky:
            problems.append(f"Resource {', '.join(repr(w) for w in wildcards)} for {', '.join(risky)}")
    return problems


def check_instance_role_policy(logical_id: str, resource: Resource, template: Template) -> Optional[list[str]]:
    roles = _instance_roles(template)
    p = props(resource)
    if resource.get("Type") == "AWS::IAM::Role":
        if logical_id not in roles:
            return None
        managed = [render(arn) for arn in p.get("ManagedPolicyArns", [])]
        return [
            *(x for pol in p.get("Policies", []) for x in _wildcard_statements(pol.get("PolicyDocument"))),
            *(f"AWS managed policy {a.rsplit('/', 1)[-1]} (its statements are not in the template)"
              for a in managed if ":iam::aws:policy/" in a),
        ]  # fmt: skip
    attached = {ref_target(r) for r in p.get("Roles", [])}
    if resource.get("Type") == "AWS::IAM::ManagedPolicy":  # also attached from the role (add_managed_policy)
        everything = template.get("Resources", {})
        attached |= {
            r for r in roles if logical_id in map(ref_target, props(everything[r]).get("ManagedPolicyArns", []))
        }
    if not attached & roles:
        return None
    return _wildcard_statements(p.get("PolicyDocument"))
