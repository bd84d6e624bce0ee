"""SpotTrainingChecks: a cdk-nag rule pack for the mistakes that hurt spot training clusters.

    Validations.of(app).add_plugins(AwsSolutionsChecks(app), SpotTrainingChecks(app))

Each rule reads the resource as it stands in the **synthesized template** (the pack runs after synthesis, so
raw property overrides and escape hatches are seen too) and may look at other resources of the same template
(the subnet of a group, the bucket policy of a bucket, the policies of a role). A finding is reported as
``SpotTraining-<ID>`` with a one-line message that says how to fix it; acknowledge one like any cdk-nag
finding (``training_constructs.nag.acknowledge``) with a reason.

The rules are plain functions of (logical id, resource, template), so they are tested on small templates
without a synth: ``tests/test_spot_checks.py``.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import jsii
from aws_cdk import (
    CfnResource,
    IPolicyValidationContext,
    IPolicyValidationPlugin,
    PolicyValidationPluginReport,
    PolicyViolatingResource,
    PolicyViolation,
    Stack,
    Validations,
)
from constructs import IConstruct

from team_config.naming import CLUSTER_TAG, POOL_TAG
from training_constructs.nag import failed_report

PACK = "SpotTraining"
CHECKPOINT_ROLE_TAG = ("spot-training:role", "checkpoints")  # marks the checkpoint bucket
CAPACITY_AWARE = {"price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized"}
MAX_FINITE_NODES = 1000

Resource = dict[str, Any]
Template = dict[str, Any]
# None: not applicable; []: compliant; otherwise the problems found (for the log, the message says the fix)
Check = Callable[[str, Resource, Template], Optional[list[str]]]


@dataclass(frozen=True)
class Rule:
    id: str
    types: tuple[str, ...]
    message: str  # one line: what is wrong and how to fix it
    why: str
    check: Check


# ------------------------------------------------------------------------------------------ template helpers
def props(resource: Resource) -> dict[str, Any]:
    return dict(resource.get("Properties") or {})


def tags(resource: Resource) -> dict[str, Any]:
    raw = props(resource).get("Tags") or []
    if isinstance(raw, dict):
        return dict(raw)
    return {str(t.get("Key")): t.get("Value") for t in raw if isinstance(t, dict)}


def ref_target(value: Any) -> Optional[str]:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` points at, else None."""
    if isinstance(value, dict):
        if "Ref" in value:
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            return str(target[0] if isinstance(target, list) else str(target).split(".")[0])
    return None


def mentions(value: Any, logical_id: str) -> bool:
    """Whether ``value`` refers to ``logical_id`` anywhere (Ref, GetAtt, Sub)."""
    return f'"{logical_id}"' in json.dumps(value) or "${" + logical_id in json.dumps(value)


def resources_of(template: Template, type_: str) -> dict[str, Resource]:
    return {k: v for k, v in template.get("Resources", {}).items() if v.get("Type") == type_}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def truthy(value: Any) -> bool:
    return value is True or value == "true"


# ------------------------------------------------------------------------------------------ rules
def check_launch_template_metadata(_: str, resource: Resource, __: Template) -> list[str]:
    options = props(resource).get("LaunchTemplateData", {}).get("MetadataOptions", {})
    problems = []
    if options.get("HttpTokens") != "required":
        problems.append(f"HttpTokens is {options.get('HttpTokens')!r}")
    if options.get("InstanceMetadataTags") != "enabled":
        problems.append(f"InstanceMetadataTags is {options.get('InstanceMetadataTags')!r}")
    if options.get("HttpEndpoint", "enabled") != "enabled":  # off: no identity and no spot notice at all
        problems.append(f"HttpEndpoint is {options.get('HttpEndpoint')!r}")
    return problems


def _launch_template_data(group: Resource, template: Template) -> dict[str, Any]:
    """LaunchTemplateData of the launch template the group launches from (plain or mixed-instances)."""
    p = props(group)
    spec = p.get("LaunchTemplate") or p.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification"
    )
    lt = template.get("Resources", {}).get(ref_target((spec or {}).get("LaunchTemplateId")) or "", {})
    return dict(props(lt).get("LaunchTemplateData") or {})


def check_mixed_instances(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    policy = p.get("MixedInstancesPolicy")
    if policy is None:
        market = _launch_template_data(resource, template).get("InstanceMarketOptions", {})
        return ["spot launch template without a MixedInstancesPolicy"] if market.get("MarketType") == "spot" else None
    distribution = policy.get("InstancesDistribution", {})
    if str(distribution.get("OnDemandPercentageAboveBaseCapacity", 100)) == "100":
        return None  # all on-demand: no spot capacity to diversify
    problems = []
    overrides = policy.get("LaunchTemplate", {}).get("Overrides", [])
    types = {o.get("InstanceType") for o in overrides} - {None}
    # attribute-based selection (InstanceRequirements): EC2 picks every type that matches, not one
    if len(types) < 2 and not any("InstanceRequirements" in o for o in overrides):
        problems.append(f"{len(types)} instance type(s)")
    strategy = distribution.get("SpotAllocationStrategy", "lowest-price")
    if strategy not in CAPACITY_AWARE:
        problems.append(f"SpotAllocationStrategy {strategy!r}")
    return problems


def _group_azs(resource: Resource, template: Template) -> list[Any]:
    """The AZ (as written in the template) of each subnet or AZ the group spans; None where not in the template."""
    p = props(resource)
    if p.get("VPCZoneIdentifier"):
        out = []
        for subnet in as_list(p["VPCZoneIdentifier"]):
            res = template.get("Resources", {}).get(ref_target(subnet) or "")
            out.append(props(res).get("AvailabilityZone") if res else None)  # imported subnet: AZ unknown here
        return out
    return as_list(p.get("AvailabilityZones", []))


def check_placement_group_single_az(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    placement = _launch_template_data(resource, template).get("Placement", {})
    named = p.get("PlacementGroup") or placement.get("GroupName") or placement.get("GroupId")
    if not named:
        return None
    placement_group = template.get("Resources", {}).get(ref_target(named) or "")
    if placement_group is not None and props(placement_group).get("Strategy", "cluster") != "cluster":
        return None  # spread and partition groups may span AZs; one made elsewhere counts as a cluster one
    spans = p.get("VPCZoneIdentifier") or p.get("AvailabilityZones") or []
    count = len(as_list(spans)) if not isinstance(spans, dict) else 2  # an unresolved list: not provably one
    return [] if count == 1 else [f"spans {count} subnets/AZs"]


def check_rebalance_or_hook(logical_id: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    if str(p.get("MaxSize")) in ("0", "1"):
        return None  # single-node groups: nothing to rendezvous with
    if truthy(p.get("CapacityRebalance")):
        return []
    hooks = [
        h for h in p.get("LifecycleHookSpecificationList", []) if "TERMINATING" in str(h.get("LifecycleTransition"))
    ]
    hooks += [
        h
        for h in resources_of(template, "AWS::AutoScaling::LifecycleHook").values()
        if mentions(props(h).get("AutoScalingGroupName"), logical_id)
        and "TERMINATING" in str(props(h).get("LifecycleTransition"))
    ]
    return [] if hooks else ["no capacity rebalance and no termination lifecycle hook"]


def check_scale_to_zero(_: str, resource: Resource, __: Template) -> list[str]:
    p = props(resource)
    problems = []
    if str(p.get("MinSize")) != "0":
        problems.append(f"MinSize {p.get('MinSize')!r}")
    desired = p.get("DesiredCapacity", 0)  # nodes launched at create, and again by a deploy that changes it
    try:
        launches = isinstance(desired, dict) or int(desired) > 0  # an intrinsic: whatever the deploy gives it
    except (TypeError, ValueError):
        launches = True
    if launches:
        problems.append(f"DesiredCapacity {desired!r}")
    try:
        finite = 0 < int(p.get("MaxSize")) <= MAX_FINITE_NODES  # type: ignore[arg-type]
    except (TypeError, ValueError):
        finite = False
    if not finite:
        problems.append(f"MaxSize {p.get('MaxSize')!r}")
    return problems


def _is_checkpoint_bucket(resource: Resource) -> bool:
    key, value = CHECKPOINT_ROLE_TAG
    return tags(resource).get(key) == value


def check_checkpoint_bucket(logical_id: str, resource: Resource, template: Template) -> Optional[list[str]]:
    if not _is_checkpoint_bucket(resource):
        return None
    p = props(resource)
    problems = []
    if p.get("VersioningConfiguration", {}).get("Status") != "Enabled":
        problems.append("not versioned")
    if not p.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration"):
        problems.append("not encrypted")
    block = p.get("PublicAccessBlockConfiguration", {})
    flags = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
    if not all(truthy(block.get(k)) for k in flags):
        problems.append("public access not fully blocked")
    rules = p.get("LifecycleConfiguration", {}).get("Rules", [])
    if not any(r.get("AbortIncompleteMultipartUpload") and r.get("Status", "Enabled") == "Enabled"
               and not r.get("Prefix") and not r.get("TagFilters") for r in rules):  # fmt: skip
        problems.append("no lifecycle rule aborting incomplete multipart uploads in the whole bucket")
    statements = [
        st
        for policy in resources_of(template, "AWS::S3::BucketPolicy").values()
        if mentions(props(policy).get("Bucket"), logical_id)
        for st in as_list(props(policy).get("PolicyDocument", {}).get("Statement", []))
    ]
    if not any(_denies_plain_http(st) for st in statements):
        problems.append("no bucket policy denying aws:SecureTransport=false to everyone, for every action on the "
                        "bucket and its objects")  # fmt: skip
    return problems


def _denies_plain_http(statement: dict[str, Any]) -> bool:
    """A Deny of every S3 action (``s3:*``) to every principal on the bucket and its objects (``<bucket>/*``) when
    ``aws:SecureTransport`` is false: one limited to an action, a principal or the bucket alone does not make it
    TLS-only."""
    condition = json.dumps(statement.get("Condition", {}))
    principal = statement.get("Principal")
    resources = [render(r) for r in as_list(statement.get("Resource", []))]
    return (
        statement.get("Effect") == "Deny"
        and "aws:SecureTransport" in condition
        and "false" in condition
        and principal in ("*", {"AWS": "*"})
        and any(a in ("s3:*", "*") for a in as_list(statement.get("Action", [])))
        and any(r.endswith("/*") for r in resources)
        and any(not r.endswith("/*") for r in resources)
    )


def check_log_retention(_: str, resource: Resource, __: Template) -> list[str]:
    return [] if props(resource).get("RetentionInDays") else ["no RetentionInDays"]


def check_warm_volume(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    volume_tags = tags(resource)
    if POOL_TAG not in volume_tags:
        return None
    p = props(resource)
    problems = [] if truthy(p.get("Encrypted")) else ["not encrypted"]
    cluster = volume_tags.get(CLUSTER_TAG)
    for group in resources_of(template, "AWS::AutoScaling::AutoScalingGroup").values():
        group_tags = {t.get("Key"): t.get("Value") for t in props(group).get("Tags", [])}
        if cluster is not None and group_tags.get(CLUSTER_TAG) == cluster:
            azs = _group_azs(group, template)
            if None not in azs and p.get("AvailabilityZone") not in azs:
                problems.append("not in the AZ of its cluster's group")
    return problems


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


# An ARN that names every resource of its kind: arn:aws:ssm:us-east-1:123456789012:* , arn:aws:s3:::*/* ...
WILDCARD_ARN = re.compile(r"arn:[^:]*:[^:]*:[^:]*:[^:]*:\*(/\*)?|arn:[^:]*:s3:::\*(/\*)?")
# An ARN that names every resource of one type in the account (parameter/*, volume/vol-*, secret:*, every Auto
# Scaling group: IAM's * also matches : and /). Fine under a resource tag condition (the warm pool's claim and the
# drill: instance/* of the cluster's own tags). S3 ARNs have no type.
TYPE_WILDCARD_ARN = re.compile(
    r"arn:[^:]*:(?!s3:)[^:]*:[^:]*:[^:]*:(autoScalingGroup:\*(:autoScalingGroupName/\*)?|[A-Za-z-]+[/:]?[\w.-]*\*)"
)
SUB_VARIABLE = re.compile(r"\$\{(!?)([^}]*)\}")


def render(value: Any) -> str:
    """An ARN as text, every intrinsic (Ref, GetAtt, a ``Fn::Sub`` variable, ...) as ``<ref>``; only a literal
    ``*`` stays a wildcard."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return str(separator).join(render(p) for p in parts)
    if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
        text, variables = value["Fn::Sub"] if isinstance(value["Fn::Sub"], list) else (value["Fn::Sub"], {})
        # ${!Literal} is the text ${Literal}; a variable of the map is its value; any other ${...} is known at deploy
        return SUB_VARIABLE.sub(
            lambda m: "${" + m[2] + "}" if m[1] else render(variables[m[2]]) if m[2] in variables else "<ref>",
            str(text),
        )
    return "<ref>"


def scoped_by_tag(statement: dict[str, Any]) -> bool:
    """Whether the statement's Condition limits it to resources carrying a tag (``aws:ResourceTag/...``,
    ``ec2:ResourceTag/...``): an account-wide ARN pattern then reaches only the tagged ones."""
    condition = statement.get("Condition")
    keys = [key for block in condition.values() if isinstance(block, dict) for key in block] if condition else []
    return any("resourcetag/" in str(key).lower() for key in keys)


def is_wildcard_resource(resource: Any, tag_scoped: bool = False) -> bool:
    """``*``, or an ARN (written out, joined or substituted) that names every resource of a service's kind, or
    (unless ``tag_scoped``: a resource tag condition) every resource of one type."""
    text = render(resource)
    if not tag_scoped and TYPE_WILDCARD_ARN.fullmatch(text):
        return True
    return text == "*" or WILDCARD_ARN.fullmatch(text) is not None


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


OPEN_CIDR = {"CidrIp": "0.0.0.0/0", "CidrIpv6": "::/0"}


def _can_be(parameter: dict[str, Any], value: str) -> bool:
    """Whether a deployer can give the template parameter ``value`` (its AllowedValues, else its AllowedPattern)."""
    if "AllowedValues" in parameter:
        return value in parameter["AllowedValues"]
    try:
        return re.fullmatch(str(parameter.get("AllowedPattern", ".*")), value) is not None
    except re.error:  # a Java pattern Python cannot read: assume it lets the value through
        return True


def _open_ingress(rule: dict[str, Any], template: Template) -> Optional[str]:
    """What opens the rule to the internet: an open CIDR, or template parameters it uses that can be one at
    deploy (through Ref, Fn::Select, Fn::Sub ...)."""
    for key, open_cidr in OPEN_CIDR.items():
        cidr = rule.get(key)
        if cidr == open_cidr:
            return open_cidr
        if isinstance(cidr, dict):
            parameters = template.get("Parameters", {})
            found = sorted(name for name, parameter in parameters.items()
                           if mentions(cidr, name) and _can_be(parameter, open_cidr))  # fmt: skip
            if found:
                return f"parameter {', '.join(found)} (can be {open_cidr} at deploy)"
    return None


def check_security_group_ingress(_: str, resource: Resource, template: Template) -> list[str]:
    p = props(resource)
    rules = p.get("SecurityGroupIngress", []) if resource.get("Type") == "AWS::EC2::SecurityGroup" else [p]
    return [f"ingress from {found}" for found in (_open_ingress(r, template) for r in rules) if found]


RULES: tuple[Rule, ...] = (
    Rule("ST1", ("AWS::EC2::LaunchTemplate",),
         "Launch template must require IMDSv2 and allow instance metadata tags: set MetadataOptions "
         "HttpTokens=required and InstanceMetadataTags=enabled (HttpEndpoint enabled or unset).",
         "The boot script reads its identity and spot notices from IMDSv2 and its team/cluster from instance tags.",
         check_launch_template_metadata),
    Rule("ST2", ("AWS::AutoScaling::AutoScalingGroup",),
         "Spot Auto Scaling group must use a MixedInstancesPolicy with at least 2 instance types and "
         "SpotAllocationStrategy price-capacity-optimized, capacity-optimized or capacity-optimized-prioritized.",
         "One instance type in one pool is the likeliest to be reclaimed all at once and to find no capacity.",
         check_mixed_instances),
    Rule("ST3", ("AWS::AutoScaling::AutoScalingGroup",),
         "Group in a cluster placement group must span exactly one subnet/AZ: give it one subnet.",
         "A cluster placement group lives in one AZ; more subnets make launches fail.",
         check_placement_group_single_az),
    Rule("ST4", ("AWS::AutoScaling::AutoScalingGroup",),
         "Multi-node group needs CapacityRebalance: true or a termination lifecycle hook.",
         "Without either, an interrupted node is replaced only after it is gone, stalling every other node.",
         check_rebalance_or_hook),
    Rule("ST5", ("AWS::AutoScaling::AutoScalingGroup",),
         "Group must be able to scale to zero and have a finite size: set MinSize 0, no DesiredCapacity (or 0) and "
         f"MaxSize 1-{MAX_FINITE_NODES}.",
         "Jobs start by setting the group's size and end by setting it to 0; a MinSize or DesiredCapacity above 0 "
         "or an unbounded MaxSize burns money when idle.",
         check_scale_to_zero),
    Rule("ST6", ("AWS::S3::Bucket",),
         "Checkpoint bucket must be versioned, encrypted, TLS-only (bucket policy), block public access and "
         "abort incomplete multipart uploads (lifecycle rule).",
         "Checkpoints are the job's only state; interrupted multipart uploads otherwise cost storage forever.",
         check_checkpoint_bucket),
    Rule("ST7", ("AWS::Logs::LogGroup",),
         "Log group needs a retention period: set RetentionInDays.",
         "Training logs grow with every job and restart; unbounded retention is an unbounded bill.",
         check_log_retention),
    Rule("ST8", ("AWS::EC2::Volume",),
         "Warm-pool volume must be encrypted and in the AZ of its cluster's group.",
         "A volume in another AZ can never be attached to the cluster's nodes; it only costs.",
         check_warm_volume),
    Rule("ST9", ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role"),
         "Instance role must not allow S3 or SSM parameter actions (reads included), or EC2 volume or Auto Scaling "
         "write actions, on Resource '*': scope them to the cluster's bucket prefix, parameters, pool volumes and "
         "group.",
         "A wildcard lets one team's node touch every team's checkpoints, volumes and groups.",
         check_instance_role_policy),
    Rule("ST10", ("AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress"),
         "Security group must not allow ingress from 0.0.0.0/0 or ::/0 (nor from a parameter that can be one): "
         "allow the cluster's own group only.",
         "Training nodes talk only to each other; access is through SSM Session Manager.",
         check_security_group_ingress),
)  # fmt: skip


# ------------------------------------------------------------------------------------------ cdk-nag adapter
def _acknowledged(construct: IConstruct, rule_id: str) -> bool:
    """Whether ``rule_id`` is acknowledged on the construct or a scope above it (cdk-nag's rule, same metadata)."""
    key = Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    current: Optional[IConstruct] = construct
    while current is not None:
        for entry in current.node.metadata:
            if entry.type == key and isinstance(entry.data, dict):
                if rule_id in (re.sub(r"^annotation::", "", k, flags=re.IGNORECASE) for k in entry.data):
                    return True
        current = current.node.scope
    return False


def _find_resource(app: IConstruct, stack_path: str, logical_id: str, resource: Resource) -> Optional[IConstruct]:
    """The construct of a template resource: by its ``aws:cdk:path`` metadata, else by walking the stack."""
    cdk_path = (resource.get("Metadata") or {}).get("aws:cdk:path")
    if isinstance(cdk_path, str):
        found: Optional[IConstruct] = app
        for part in cdk_path.split("/"):
            found = found.node.try_find_child(part) if found is not None else None
        if found is not None:
            return found
    stack: Optional[IConstruct] = app
    for part in stack_path.split("/"):
        stack = stack.node.try_find_child(part) if stack is not None else None
    if stack is None:
        return None
    for child in stack.node.find_all():
        if isinstance(child, CfnResource) and Stack.of(child).resolve(child.logical_id) == logical_id:
            return child
    return None


@jsii.implements(IPolicyValidationPlugin)
class SpotTrainingChecks:
    """The rules above as a validation plugin that reports like a cdk-nag pack: findings are ``SpotTraining-ST<n>``,
    acknowledged like any cdk-nag finding.

    It reads each synthesized template once, in Python, and crosses into jsii only for the construct of a finding
    (to honour an acknowledgement and name its path): a cdk-nag ``NagPack`` calls back into Python for every
    ``CfnResource`` of every stack, about 20 jsii round trips each, which made it most of a 10-team synth.
    """

    def __init__(self, scope: Optional[IConstruct] = None, *, verbose: Optional[bool] = None) -> None:
        del scope  # the same signature as a NagPack; the app comes with the validation context
        self._verbose = bool(verbose)

    @builtins.property
    def name(self) -> str:
        return PACK

    @builtins.property
    def version(self) -> Optional[str]:
        return None  # as a cdk-nag pack: no version, no rule list

    @builtins.property
    def rule_ids(self) -> Optional[list[str]]:
        return None

    def findings(self, template: Template) -> list[tuple[str, Rule, str]]:
        """(logical id, rule, description) of every non-compliant resource of one template."""
        out = []
        for logical_id, resource in (template.get("Resources") or {}).items():
            for rule in RULES:
                if resource.get("Type") not in rule.types:
                    continue
                try:
                    result = rule.check(logical_id, resource, template)
                except Exception as exc:  # reported as cdk-nag reports a rule that throws
                    reason = (
                        str(exc)
                        if self._verbose
                        else "This is generally caused by a parameter referencing an intrinsic function."
                    )
                    out.append((logical_id, rule, f"Rule threw an error during validation. {reason}"))
                    continue
                if result:
                    why = f" {rule.why} Found: {'; '.join(result)}." if self._verbose else ""
                    out.append((logical_id, rule, rule.message + why))
        return out

    def validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        try:
            return self._validate(context)
        except Exception as exc:  # a template it cannot read, a bug: fail the synth, never pass it unchecked
            return failed_report(
                context,
                f"{PACK}-Error",
                f"SpotTrainingChecks could not check the templates: {type(exc).__name__}: {exc}",
                "a bug in training_constructs/spot_checks.py unless the error names a file the synth did not write",
            )

    def _validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        described: dict[str, str] = {}  # rule id -> description of its first finding (cdk-nag groups by rule)
        violating: dict[str, list[PolicyViolatingResource]] = {}
        app: Optional[IConstruct] = None
        for stack in context.stack_templates:
            template = json.loads(Path(stack.template_path).read_text())
            for logical_id, rule, description in self.findings(template):
                rule_id = f"{PACK}-{rule.id}"
                app = app or context.app_construct
                resource = template["Resources"][logical_id]
                construct = _find_resource(app, stack.stack_construct_path, logical_id, resource)
                if construct is not None and _acknowledged(construct, rule_id):
                    continue
                if construct is not None:
                    where = PolicyViolatingResource(locations=["Properties"], construct_path=construct.node.path)
                else:
                    where = PolicyViolatingResource(
                        locations=["Properties"], resource_logical_id=logical_id, template_path=stack.template_path
                    )
                described.setdefault(rule_id, description)
                violating.setdefault(rule_id, []).append(where)
        violations = [
            PolicyViolation(rule_name=k, description=d, severity="error", violating_resources=violating[k])
            for k, d in described.items()
        ]
        return PolicyValidationPluginReport(success=not violations, violations=violations)
