"""Compatibility layer: what moto's CloudFormation (and EC2) lack for our templates, added without editing moto.

moto builds its map of CloudFormation resource types once, on first use, from the *direct* subclasses
of ``moto.core.common_models.CloudFormationModel`` (``moto.cloudformation.parsing.get_model_map``, an
``lru_cache``). :func:`install` defines the classes below (importing this module does that), clears
those caches and checks that every type we handle now resolves to our class. It must run in the
server process before the server handles its first request (``emulator.server`` does that).

A resource type moto does not know is *skipped with a warning* and every ``Ref`` to it becomes
``None``, which silently drops the property that referred to it (e.g. the launch template's
``Placement.GroupName``). So every item here creates the real thing, readable through the AWS API,
never a stand-in that makes the deploy "succeed" while weakening what the template says.

Items (what moto 5.2.5 lacks -> what we do):

1. ``AWS::EC2::PlacementGroup``: moto has no placement groups at all, neither a CloudFormation type
   nor the EC2 API. -> A ``PlacementGroup`` model kept per EC2 backend (Strategy, PartitionCount,
   SpreadLevel, Tags; ``Ref`` = group name, ``GetAtt GroupName``) plus the EC2 actions
   ``CreatePlacementGroup``, ``DescribePlacementGroups`` (names, ids, filters ``group-name``,
   ``strategy``, ``state``, ``tag:*``) and ``DeletePlacementGroup`` added to moto's EC2 response class.
2. ``AWS::S3::BucketPolicy``: no CloudFormation type. -> A model that stores ``PolicyDocument`` as
   the bucket's policy through moto's S3 backend (``get_bucket_policy`` returns it) and deletes it
   with the stack. Used by the TLS-only/deny policies of our buckets and by the CDK bootstrap stack.
3. ``AWS::EC2::Volume``: moto's model keeps only Size and AvailabilityZone and drops ``SnapshotId``,
   ``VolumeType``, ``Iops``, ``Throughput``, ``Encrypted``, ``KmsKeyId``, ``MultiAttachEnabled`` and
   the resource's own ``Tags``. -> A model that passes all of them to moto's ``create_volume`` (which
   checks the snapshot exists) and tags the volume. ``VolumeInitializationRate`` has no equivalent in
   moto and is accepted and ignored (it only changes how fast EBS hydrates the volume).
4. ``AWS::CDK::Metadata``: the CDK's analytics resource, no AWS API behind it. -> A no-op model, so
   moto does not warn about it.
5. Public SSM parameters: the launch template's ``ImageId`` comes from an SSM-typed CloudFormation
   parameter whose default is a public ``/aws/service/deeplearning/...`` path; moto only knows its
   own ``ami-amazon-linux-latest`` tree and refuses ``PutParameter`` on ``/aws/`` names (as AWS
   does). -> :func:`seed_public_ami_parameters` writes such parameters into the SSM backend of the
   server process, each set to an AMI id moto's EC2 knows (``describe_images``) for the path's
   architecture.
6. Bucket policies on requests: moto checks a bucket's policy on object requests but evaluates only
   ``StringEquals`` conditions, counts every other condition as met, and answers DENIED for *any*
   statement whose condition fails (even an Allow). Our buckets (and the CDK's) carry "Deny if
   ``aws:SecureTransport`` is false", which moto therefore applies to every request, including TLS
   ones. -> ``FakeBucket.get_permission`` is replaced by an evaluator with AWS's semantics for the
   statements moto considers (principal ``*``): Deny wins, then Allow, else neutral; a condition on
   a key the request does not carry does not match; operators ``Bool``, ``String(Not)Equals``,
   ``String(Not)Like``, ``ArnLike``/``ArnEquals``, ``Null`` (and ``...IfExists``). The request context
   carries ``aws:SecureTransport`` from the listener the request really arrived on (the server's
   HTTPS listener: true, its plain-HTTP listener: false), so plain HTTP is denied as on AWS.
7. ``AWS::SSM::Parameter``: moto passes ``Tags`` on unchanged, but CloudFormation gives them as a
   map (``{"key": "value"}``) and moto's ``put_parameter`` wants a list, so the create fails (and
   moto needs ``Name``, which CloudFormation makes optional). -> A model that converts the map,
   gives an unnamed parameter a generated name, as CloudFormation does, and then uses moto's own ``put_parameter``.
8. ``AWS::AutoScaling::AutoScalingGroup``: moto's model drops ``CapacityRebalance``,
   ``MetricsCollection`` and ``PlacementGroup`` (its API keeps them). -> A model that passes them
   to moto's ``create_auto_scaling_group`` /
   ``enable_metrics_collection`` (no ``Metrics`` list = all group metrics, as on AWS) and returns
   moto's group, so scaling, instances and the Auto Scaling API are moto's own.
9. ``AWS::S3::Bucket``: moto's model applies only ``BucketEncryption`` and ``Tags``; it drops
   ``VersioningConfiguration``, ``LifecycleConfiguration``, ``PublicAccessBlockConfiguration``,
   ``OwnershipControls`` and ``LoggingConfiguration``. -> A model that applies each through moto's S3
   backend (what ``PutBucketVersioning`` etc. would store), readable with ``get_bucket_*``. Logging:
   moto refuses a target bucket whose log-delivery policy does not exist yet; CloudFormation creates
   the target's ``BucketPolicy`` in parallel with the source bucket (no dependency between them),
   so the configuration is stored after checking only that the target bucket exists in the region.
   ``AccessControl`` (the CDK bootstrap bucket's ``Private``) becomes the bucket's canned ACL.
10. ``ExecuteChangeSet`` (how the CDK CLI deploys): moto applies the change set but never rebuilds
    the stack's outputs from the new template (``describe_stacks`` shows none), and when a resource
    fails it answers HTTP 500, which the CLI retries into an empty "successful" deploy. -> After
    moto's ``execute_change_set`` the stack's template and outputs are rebuilt; if it raises, the
    stack ends ``ROLLBACK_COMPLETE`` (``UPDATE_ROLLBACK_COMPLETE`` for an update) with a
    ``CREATE_FAILED``/``UPDATE_FAILED`` event carrying the error, as CloudFormation reports it, and
    the traceback goes to the server log. A change set named without its ARN is looked up within
    the given stack (moto takes the first of that name in any stack).
11. ``AWS::Budgets::Budget``: no CloudFormation type (moto has the Budgets API). -> A model that creates the
    budget and its notifications through moto's Budgets backend (``describe_budget`` returns them; the
    limit's ``Amount`` becomes the API's string) and deletes it with the stack. ``ResourceTags`` are accepted
    and dropped: moto's Budgets has no tag API (they only label the budget; its cost filter is unaffected).
12. ``AWS::AutoScaling::LifecycleHook``: no CloudFormation type (moto's Auto Scaling API stores hooks; what they do
    to the group is :mod:`emulator.lifecycle`). -> A model that creates the hook through moto's
    ``create_lifecycle_hook`` (``AutoScalingGroupName``, ``LifecycleTransition``, ``HeartbeatTimeout``,
    ``DefaultResult``, ``LifecycleHookName``, generated when absent as for SSM parameters, ``NotificationMetadata``),
    checks the group exists and the values are in AWS's ranges, and deletes it with the stack; ``Ref`` = the hook's
    name. moto gives every hook an example role and SQS queue ARN (ours have neither: ``DescribeLifecycleHooks`` shows
    none) and a 48 h ``GlobalTimeout`` (ours: AWS's 100 x ``HeartbeatTimeout``, at most 48 h).
    ``NotificationTargetARN`` and ``RoleARN`` are not emulated (nothing is ever notified): reported.

Properties a compat model does not emulate are reported as ``EMULATOR-UNSUPPORTED-PROPERTY`` in the
server log, and :func:`emulator.deploy.deploy` fails on them (as on moto's own "No Moto
CloudFormation support" warnings): a deploy never succeeds with part of a template silently dropped.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import json
import logging
import random
import re
import string
from collections.abc import Iterator
from typing import Any, Optional

from moto.autoscaling.models import FakeAutoScalingGroup, autoscaling_backends
from moto.core.common_models import CloudFormationModel
from moto.core.responses import ActionResult
from moto.ec2.models import ec2_backends
from moto.ec2.responses import EC2Response
from moto.s3.models import FakeBucket, s3_backends
from moto.ssm.models import Parameter, ssm_backends
from moto.utilities.utils import get_partition

# moto's own models (imported above) must exist before ours: see install().

logger = logging.getLogger(__name__)
UNSUPPORTED_PROPERTY = "EMULATOR-UNSUPPORTED-PROPERTY"


def _report_unsupported(resource_type: str, props: dict[str, Any], handled: set[str]) -> None:
    for key in sorted(set(props) - handled):
        logger.warning("%s %s.%s is not emulated", UNSUPPORTED_PROPERTY, resource_type, key)


PLACEMENT_STRATEGIES = ("cluster", "spread", "partition")


# --- 1. Placement groups -------------------------------------------------------------------------


class PlacementGroup(CloudFormationModel):
    """An EC2 placement group, as ``DescribePlacementGroups`` returns it."""

    def __init__(
        self,
        *,
        account_id: str,
        region_name: str,
        name: str,
        strategy: str,
        partition_count: Optional[int] = None,
        spread_level: Optional[str] = None,
        tags: Optional[dict[str, str]] = None,
    ) -> None:
        if strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"invalid placement group strategy {strategy!r}")
        self.account_id = account_id
        self.region_name = region_name
        self.name = name
        self.strategy = strategy
        self.partition_count = partition_count if strategy == "partition" else None
        self.spread_level = spread_level if strategy == "spread" else None
        self.group_id = "pg-" + "".join(random.choices(string.hexdigits.lower()[:16], k=17))  # noqa: S311
        self.tags = dict(tags or {})
        self.state = "available"

    @property
    def arn(self) -> str:
        partition = get_partition(self.region_name)
        return f"arn:{partition}:ec2:{self.region_name}:{self.account_id}:placement-group/{self.name}"

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "GroupName": self.name,
            "State": self.state,
            "Strategy": self.strategy,
            "GroupId": self.group_id,
            "GroupArn": self.arn,
            "Tags": [{"Key": k, "Value": v} for k, v in self.tags.items()],
        }
        if self.partition_count is not None:
            out["PartitionCount"] = self.partition_count
        if self.spread_level is not None:
            out["SpreadLevel"] = self.spread_level
        return out

    # CloudFormation
    @staticmethod
    def cloudformation_name_type() -> str:
        return ""  # no name property: CloudFormation generates the group name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::EC2::PlacementGroup"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "GroupName"

    def get_cfn_attribute(self, attribute_name: str) -> Any:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name == "GroupName":
            return self.name
        raise UnformattedGetAttTemplateException()

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> PlacementGroup:
        props = cloudformation_json.get("Properties", {})
        partition_count = props.get("PartitionCount")
        return placement_groups(account_id, region_name).create(
            name=resource_name,
            strategy=props.get("Strategy", "cluster"),
            partition_count=int(partition_count) if partition_count is not None else None,
            spread_level=props.get("SpreadLevel"),
            tags={t["Key"]: t["Value"] for t in props.get("Tags", [])},
        )

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: PlacementGroup,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> PlacementGroup:
        # Every property of AWS::EC2::PlacementGroup requires replacement.
        placement_groups(account_id, region_name).delete(original_resource.name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        placement_groups(account_id, region_name).delete(resource_name)

    def is_created(self) -> bool:
        return True


class PlacementGroupStore:
    """The placement groups of one account and region (kept on moto's EC2 backend, so a reset clears them)."""

    def __init__(self, account_id: str, region_name: str) -> None:
        self.account_id = account_id
        self.region_name = region_name
        self.groups: dict[str, PlacementGroup] = {}

    def create(
        self,
        *,
        name: str,
        strategy: str,
        partition_count: Optional[int] = None,
        spread_level: Optional[str] = None,
        tags: Optional[dict[str, str]] = None,
    ) -> PlacementGroup:
        from moto.ec2.exceptions import EC2ClientError

        if name in self.groups:
            raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        if strategy not in PLACEMENT_STRATEGIES:
            raise EC2ClientError("InvalidParameterValue", f"Value ({strategy}) for parameter strategy is invalid.")
        group = PlacementGroup(
            account_id=self.account_id,
            region_name=self.region_name,
            name=name,
            strategy=strategy,
            partition_count=partition_count,
            spread_level=spread_level,
            tags=tags,
        )
        self.groups[name] = group
        return group

    def delete(self, name: str) -> None:
        from moto.ec2.exceptions import EC2ClientError

        if self.groups.pop(name, None) is None:
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")

    def describe(self, names: list[str], group_ids: list[str], filters: dict[str, list[str]]) -> list[PlacementGroup]:
        from moto.ec2.exceptions import EC2ClientError

        for name in names:
            if name not in self.groups:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        out = []
        for group in self.groups.values():
            if names and group.name not in names:
                continue
            if group_ids and group.group_id not in group_ids:
                continue
            if not _matches_filters(group, filters):
                continue
            out.append(group)
        return out


def _matches_filters(group: PlacementGroup, filters: dict[str, list[str]]) -> bool:
    for key, values in filters.items():
        if key == "group-name":
            actual: Optional[str] = group.name
        elif key == "group-arn":
            actual = group.arn
        elif key == "strategy":
            actual = group.strategy
        elif key == "state":
            actual = group.state
        elif key == "spread-level":
            actual = group.spread_level
        elif key.startswith("tag:"):
            actual = group.tags.get(key[4:])
        elif key == "tag-key":
            if not any(v in group.tags for v in values):
                return False
            continue
        else:
            continue  # unknown filters are ignored, as moto does elsewhere
        if actual not in values:
            return False
    return True


def placement_groups(account_id: str, region_name: str) -> PlacementGroupStore:
    backend: Any = ec2_backends[account_id][region_name]
    store = getattr(backend, "compat_placement_groups", None)
    if store is None:
        store = PlacementGroupStore(account_id, region_name)
        backend.compat_placement_groups = store
    return store


# EC2 Query API actions for placement groups; set on moto's ``EC2Response`` by :func:`install`.


def _create_placement_group(self: Any) -> ActionResult:
    tags = self._parse_tag_specification("placement-group").get("placement-group", {})
    self.error_on_dryrun()
    group = placement_groups(self.current_account, self.region).create(
        name=self._get_param("GroupName"),
        strategy=self._get_param("Strategy"),
        partition_count=self._get_int_param("PartitionCount"),
        spread_level=self._get_param("SpreadLevel"),
        tags=tags,
    )
    return ActionResult({"PlacementGroup": group.to_api()})


def _describe_placement_groups(self: Any) -> ActionResult:
    groups = placement_groups(self.current_account, self.region).describe(
        names=self._get_param("GroupNames", []) or [],
        group_ids=self._get_param("GroupIds", []) or [],
        filters=self._filters_from_querystring(),
    )
    return ActionResult({"PlacementGroups": [g.to_api() for g in groups]})


def _delete_placement_group(self: Any) -> ActionResult:
    self.error_on_dryrun()
    placement_groups(self.current_account, self.region).delete(self._get_param("GroupName"))
    return ActionResult({})


_EC2_ACTIONS = {
    "create_placement_group": _create_placement_group,
    "describe_placement_groups": _describe_placement_groups,
    "delete_placement_group": _delete_placement_group,
}


# --- 2. Bucket policies --------------------------------------------------------------------------


class BucketPolicy(CloudFormationModel):
    """``AWS::S3::BucketPolicy``: the document becomes the bucket's policy in moto's S3 backend."""

    def __init__(self, account_id: str, region_name: str, bucket_name: str, document: dict[str, Any]) -> None:
        self.account_id = account_id
        self.region_name = region_name
        self.bucket_name = bucket_name
        self.document = document

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::S3::BucketPolicy"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @property
    def physical_resource_id(self) -> str:
        return self.bucket_name

    @staticmethod
    def _backend(account_id: str, region_name: str) -> Any:
        return s3_backends[account_id][get_partition(region_name)]

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> BucketPolicy:
        props = cloudformation_json["Properties"]
        bucket_name = props["Bucket"]
        document = props["PolicyDocument"]
        if isinstance(document, str):
            document = json.loads(document)
        cls._backend(account_id, region_name).put_bucket_policy(bucket_name, json.dumps(document).encode())
        return cls(account_id, region_name, bucket_name, document)

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: BucketPolicy,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> BucketPolicy:
        new_bucket = cloudformation_json["Properties"]["Bucket"]
        if new_bucket != original_resource.bucket_name:
            original_resource.delete(account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        bucket = cloudformation_json.get("Properties", {}).get("Bucket", resource_name)
        cls._backend(account_id, region_name).delete_bucket_policy(bucket)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.s3.exceptions import MissingBucket

        try:
            self._backend(account_id, region_name).delete_bucket_policy(self.bucket_name)
        except MissingBucket:
            pass  # the bucket went first: its policy went with it

    def is_created(self) -> bool:
        return True


# --- 3. EBS volumes with everything the template says ----------------------------------------------


_VOLUME_PROPS = {
    "AvailabilityZone", "Size", "SnapshotId", "VolumeType", "Iops", "Throughput", "Encrypted", "KmsKeyId",
    "MultiAttachEnabled", "Tags", "VolumeInitializationRate",
}  # fmt: skip


class Volume(CloudFormationModel):
    """``AWS::EC2::Volume`` with SnapshotId, type, IOPS, throughput, encryption and tags (returns moto's Volume)."""

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::EC2::Volume"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "VolumeId"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        props = cloudformation_json["Properties"]
        _report_unsupported(cls.cloudformation_type(), props, _VOLUME_PROPS)
        backend = ec2_backends[account_id][region_name]

        def opt_int(key: str) -> Optional[int]:
            return int(props[key]) if props.get(key) is not None else None

        snapshot_id = props.get("SnapshotId")
        size = opt_int("Size")
        if size is None and snapshot_id:
            size = backend.get_snapshot(snapshot_id).volume.size
        if size is None:
            raise ValueError("AWS::EC2::Volume needs Size or SnapshotId")
        volume = backend.create_volume(
            size=size,
            zone_name=props["AvailabilityZone"],
            snapshot_id=snapshot_id,
            encrypted=_as_bool(props.get("Encrypted", False)),
            kms_key_id=props.get("KmsKeyId"),
            volume_type=props.get("VolumeType"),
            iops=opt_int("Iops"),
            throughput=opt_int("Throughput"),
            multi_attach_enabled=_as_bool(props.get("MultiAttachEnabled", False)),
        )
        tags = {t["Key"]: t["Value"] for t in props.get("Tags", [])}
        if tags:
            backend.create_tags([volume.id], tags)
        return volume

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        backend = ec2_backends[account_id][region_name]
        props = cloudformation_json["Properties"]
        tags = {t["Key"]: t["Value"] for t in props.get("Tags", [])}
        if tags:
            backend.create_tags([original_resource.id], tags)
        return original_resource

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        ec2_backends[account_id][region_name].delete_volume(resource_name)

    def is_created(self) -> bool:
        return True


def _as_bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


# --- 4. CDK metadata -------------------------------------------------------------------------------


class _NamedWithoutAttributes:
    """What a model whose physical id is ``self.name`` and that has no ``Fn::GetAtt`` attributes answers."""

    name: str

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @property
    def physical_resource_id(self) -> str:
        return self.name

    def is_created(self) -> bool:
        return True


class CdkMetadata(_NamedWithoutAttributes, CloudFormationModel):
    """``AWS::CDK::Metadata``: the CDK's usage-analytics record; there is nothing to create."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CDK::Metadata"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> CdkMetadata:
        return cls(resource_name)

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: CdkMetadata,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> CdkMetadata:
        return original_resource

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        return None

    def delete(self, account_id: str, region_name: str) -> None:
        return None


class Budget(_NamedWithoutAttributes, CloudFormationModel):
    """``AWS::Budgets::Budget`` through moto's Budgets backend; ``Ref`` = the budget's name."""

    def __init__(self, account_id: str, partition: str, name: str) -> None:
        self.account_id, self.partition, self.name = account_id, partition, name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Budgets::Budget"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Budget:
        from moto.budgets.models import budgets_backends

        props = cloudformation_json.get("Properties", {})
        # ResourceTags (the stack's team tag) are accepted and dropped: moto's Budgets has no tag API to keep them.
        handled = {"Budget", "NotificationsWithSubscribers", "ResourceTags"}
        _report_unsupported(cls.cloudformation_type(), props, handled)
        budget = dict(props["Budget"])
        budget.setdefault("BudgetName", resource_name)
        if "BudgetLimit" in budget:
            budget["BudgetLimit"] = {**budget["BudgetLimit"], "Amount": str(budget["BudgetLimit"]["Amount"])}
        notifications = [
            {
                "Notification": {**n["Notification"], "Threshold": float(n["Notification"]["Threshold"])},
                "Subscribers": n["Subscribers"],
            }
            for n in props.get("NotificationsWithSubscribers", [])
        ]
        partition = get_partition(region_name)
        budgets_backends[account_id][partition].create_budget(account_id, budget, notifications)
        return cls(account_id, partition, budget["BudgetName"])

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Budget,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Budget:
        original_resource.delete(account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        name = cloudformation_json.get("Properties", {}).get("Budget", {}).get("BudgetName", resource_name)
        cls(account_id, get_partition(region_name), name).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.budgets.models import budgets_backends

        budgets_backends[self.account_id][self.partition].delete_budget(self.account_id, self.name)


# --- 5. Public SSM parameters ----------------------------------------------------------------------


def emulated_ami(account_id: str, region_name: str, architecture: str) -> str:
    """An AMI id moto's EC2 knows for ``architecture``: a Deep Learning AMI on Amazon Linux if there is one."""
    images = [
        i
        for i in ec2_backends[account_id][region_name].describe_images()
        if i.architecture == architecture and i.platform != "windows"
    ]
    if not images:
        raise RuntimeError(f"moto knows no {architecture} AMI in {region_name}")

    def rank(image: Any) -> tuple[int, int, str]:
        name = (image.name or "").lower()
        return (
            0 if "deep learning" in name and "amazon linux" in name else 1,
            0 if image.root_device_name == "/dev/xvda" else 1,
            image.id,
        )

    return min(images, key=rank).id


def seed_public_ami_parameters(account_id: str, region_name: str, names: list[str]) -> dict[str, str]:
    """Give each public ``/aws/service/.../ami-id`` parameter an AMI moto knows; returns name -> AMI id."""
    from moto.core.utils import utcnow

    params = ssm_backends[account_id][region_name]._parameters
    seeded = {}
    for name in names:
        architecture = "arm64" if "/arm64/" in name else "x86_64"
        ami = emulated_ami(account_id, region_name, architecture)
        params[name].append(
            Parameter(  # type: ignore[abstract]
                account_id=account_id,
                name=name,
                value=ami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=utcnow(),
                version=len(params[name]) + 1,
                data_type="aws:ec2:image",
            )
        )
        seeded[name] = ami
    return seeded


# --- 7. SSM parameters with tags -------------------------------------------------------------------


class SsmParameter(CloudFormationModel):
    """``AWS::SSM::Parameter`` with CloudFormation's map-shaped ``Tags`` (returns moto's Parameter)."""

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::SSM::Parameter"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("Type", "Value")

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        props = cloudformation_json["Properties"]
        raw_tags = props.get("Tags") or {}
        tags: list[dict[str, str]] = (
            [{"Key": k, "Value": v} for k, v in raw_tags.items()] if isinstance(raw_tags, dict) else list(raw_tags)
        )
        return ssm_backends[account_id][region_name].put_parameter(
            name=props.get("Name") or resource_name,
            description=props.get("Description"),
            value=props.get("Value"),
            parameter_type=props.get("Type"),
            allowed_pattern=props.get("AllowedPattern"),
            keyid=props.get("KeyId"),
            overwrite=False,
            tags=tags,
            data_type=props.get("DataType", "text"),
            tier=props.get("Tier"),
            policies=props.get("Policies"),
        )

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        cls.delete_from_cloudformation_json(original_resource.name, cloudformation_json, account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        name = resource_name or cloudformation_json.get("Properties", {}).get("Name")
        ssm_backends[account_id][region_name].delete_parameter(name)

    def is_created(self) -> bool:
        return True


# --- 8. Auto Scaling groups with everything the template says ---------------------------------------

ALL_GROUP_METRICS = (
    "GroupMinSize", "GroupMaxSize", "GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances",
    "GroupStandbyInstances", "GroupTerminatingInstances", "GroupTotalInstances", "GroupInServiceCapacity",
    "GroupPendingCapacity", "GroupStandbyCapacity", "GroupTerminatingCapacity", "GroupTotalCapacity",
    "WarmPoolDesiredCapacity", "WarmPoolWarmedCapacity", "WarmPoolPendingCapacity", "WarmPoolTerminatingCapacity",
    "WarmPoolTotalCapacity", "GroupAndWarmPoolDesiredCapacity", "GroupAndWarmPoolTotalCapacity",
)  # fmt: skip
_ASG_PROPS = {
    "AutoScalingGroupName", "AvailabilityZones", "CapacityRebalance", "Cooldown", "DesiredCapacity",
    "HealthCheckGracePeriod", "HealthCheckType", "LaunchConfigurationName", "LaunchTemplate", "LoadBalancerNames",
    "MaxSize", "MetricsCollection", "MinSize", "MixedInstancesPolicy", "NewInstancesProtectedFromScaleIn",
    "PlacementGroup", "Tags", "TargetGroupARNs", "TerminationPolicies", "VPCZoneIdentifier",
}  # fmt: skip


class AutoScalingGroup(CloudFormationModel):
    """``AWS::AutoScaling::AutoScalingGroup`` keeping capacity rebalance, metrics, placement (returns moto's group)."""

    @staticmethod
    def cloudformation_name_type() -> str:
        return "AutoScalingGroupName"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::AutoScaling::AutoScalingGroup"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return bool(FakeAutoScalingGroup.has_cfn_attr(attr))

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        props = cloudformation_json["Properties"]
        _report_unsupported(cls.cloudformation_type(), props, _ASG_PROPS)
        backend = autoscaling_backends[account_id][region_name]
        group = backend.create_auto_scaling_group(
            name=resource_name,
            availability_zones=props.get("AvailabilityZones", []),
            desired_capacity=props.get("DesiredCapacity"),
            max_size=props.get("MaxSize"),
            min_size=props.get("MinSize"),
            launch_config_name=props.get("LaunchConfigurationName"),
            launch_template=props.get("LaunchTemplate", {}),
            vpc_zone_identifier=",".join(props.get("VPCZoneIdentifier", [])) or None,
            default_cooldown=props.get("Cooldown"),
            health_check_period=props.get("HealthCheckGracePeriod"),
            health_check_type=props.get("HealthCheckType"),
            load_balancers=props.get("LoadBalancerNames", []),
            target_group_arns=props.get("TargetGroupARNs", []),
            placement_group=props.get("PlacementGroup"),
            termination_policies=props.get("TerminationPolicies", []),
            tags=props.get("Tags", []),
            capacity_rebalance=_as_bool(props.get("CapacityRebalance", False)),
            new_instances_protected_from_scale_in=_as_bool(props.get("NewInstancesProtectedFromScaleIn", False)),
            mixed_instances_policy=props.get("MixedInstancesPolicy", {}),
        )
        metrics: list[str] = []
        for collection in props.get("MetricsCollection", []):
            metrics += collection.get("Metrics") or list(ALL_GROUP_METRICS)
        if metrics:
            backend.enable_metrics_collection(group.name, list(dict.fromkeys(metrics)))
        return group

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        cls.delete_from_cloudformation_json(original_resource.name, cloudformation_json, account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        FakeAutoScalingGroup.delete_from_cloudformation_json(
            resource_name, cloudformation_json, account_id, region_name
        )

    def is_created(self) -> bool:
        return True


# --- 12. Lifecycle hooks ----------------------------------------------------------------------------

_LIFECYCLE_HOOK_PROPS = {
    "AutoScalingGroupName", "LifecycleTransition", "HeartbeatTimeout", "DefaultResult", "LifecycleHookName",
    "NotificationMetadata",
}  # fmt: skip
LIFECYCLE_TRANSITIONS = ("autoscaling:EC2_INSTANCE_LAUNCHING", "autoscaling:EC2_INSTANCE_TERMINATING")


class LifecycleHook(_NamedWithoutAttributes, CloudFormationModel):
    """``AWS::AutoScaling::LifecycleHook`` through moto's Auto Scaling backend; ``Ref`` = the hook's name."""

    def __init__(self, account_id: str, region_name: str, group_name: str, name: str) -> None:
        self.account_id, self.region_name, self.group_name, self.name = account_id, region_name, group_name, name

    @staticmethod
    def cloudformation_name_type() -> str:
        return "LifecycleHookName"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::AutoScaling::LifecycleHook"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LifecycleHook:
        props = cloudformation_json["Properties"]
        _report_unsupported(cls.cloudformation_type(), props, _LIFECYCLE_HOOK_PROPS)
        backend = autoscaling_backends[account_id][region_name]
        group_name = props["AutoScalingGroupName"]
        if group_name not in backend.autoscaling_groups:
            raise ValueError(f"AutoScalingGroup name not found - {group_name}")
        transition, result = props["LifecycleTransition"], props.get("DefaultResult", "ABANDON")
        timeout = int(props.get("HeartbeatTimeout", 3600))
        valid = transition in LIFECYCLE_TRANSITIONS and result in ("CONTINUE", "ABANDON") and 30 <= timeout <= 7200
        if not valid:
            raise ValueError(
                f"AWS::AutoScaling::LifecycleHook: LifecycleTransition {transition!r}, DefaultResult {result!r}, "
                f"HeartbeatTimeout {timeout} (30 to 7200)"
            )
        name = props.get("LifecycleHookName") or resource_name
        hook = backend.create_lifecycle_hook(name, group_name, transition, timeout, result)
        hook.role_arn = hook.notification_target_arn = None  # type: ignore[assignment]
        hook.global_timeout = min(100 * timeout, 172800)  # AWS's; moto says 48 h for every hook
        hook.notification_metadata = props.get("NotificationMetadata")  # type: ignore[attr-defined]
        return cls(account_id, region_name, group_name, name)

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: LifecycleHook,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> LifecycleHook:
        props = cloudformation_json["Properties"]
        new_name = props.get("LifecycleHookName") or new_resource_name
        if (props["AutoScalingGroupName"], new_name) != (original_resource.group_name, original_resource.name):
            original_resource.delete(account_id, region_name)  # a new name or group: a new hook
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        group_name = cloudformation_json.get("Properties", {}).get("AutoScalingGroupName")
        if not isinstance(group_name, str):  # an unresolved Ref: moto deletes through delete() below
            raise ValueError(f"lifecycle hook {resource_name}: AutoScalingGroupName {group_name!r} is not a name")
        autoscaling_backends[account_id][region_name].delete_lifecycle_hook(group_name, resource_name)

    def delete(self, account_id: str, region_name: str) -> None:
        properties = {"Properties": {"AutoScalingGroupName": self.group_name}}
        self.delete_from_cloudformation_json(self.name, properties, self.account_id, self.region_name)


# --- 9. S3 buckets with everything the template says -----------------------------------------------

_BUCKET_PROPS = {
    "BucketName", "BucketEncryption", "Tags", "VersioningConfiguration", "LifecycleConfiguration",
    "PublicAccessBlockConfiguration", "OwnershipControls", "LoggingConfiguration", "AccessControl",
}  # fmt: skip


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """A CloudFormation lifecycle rule in the shape moto's ``PutBucketLifecycleConfiguration`` parser makes."""
    out: dict[str, Any] = {"ID": rule.get("Id"), "Status": rule.get("Status", "Enabled")}
    out["Filter"] = {"Prefix": rule.get("Prefix", "")}
    expiration: dict[str, Any] = {}
    if rule.get("ExpirationInDays") is not None:
        expiration["Days"] = int(rule["ExpirationInDays"])
    if rule.get("ExpirationDate") is not None:
        expiration["Date"] = rule["ExpirationDate"]
    if rule.get("ExpiredObjectDeleteMarker") is not None:
        expiration["ExpiredObjectDeleteMarker"] = str(rule["ExpiredObjectDeleteMarker"]).lower()
    if expiration:
        out["Expiration"] = expiration
    if rule.get("AbortIncompleteMultipartUpload"):
        out["AbortIncompleteMultipartUpload"] = {
            "DaysAfterInitiation": int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        }
    nve = rule.get("NoncurrentVersionExpiration")
    if nve or rule.get("NoncurrentVersionExpirationInDays") is not None:
        days = (nve or {}).get("NoncurrentDays", rule.get("NoncurrentVersionExpirationInDays"))
        out["NoncurrentVersionExpiration"] = {"NoncurrentDays": int(str(days))}
        if nve and nve.get("NewerNoncurrentVersions") is not None:
            out["NoncurrentVersionExpiration"]["NewerNoncurrentVersions"] = int(nve["NewerNoncurrentVersions"])
    transitions = list(rule.get("Transitions", [])) + ([rule["Transition"]] if rule.get("Transition") else [])
    if transitions:
        out["Transition"] = [
            {"Days": t.get("TransitionInDays"), "Date": t.get("TransitionDate"), "StorageClass": t["StorageClass"]}
            for t in transitions
        ]
    nvts = list(rule.get("NoncurrentVersionTransitions", []))
    if rule.get("NoncurrentVersionTransition"):
        nvts.append(rule["NoncurrentVersionTransition"])
    if nvts:
        out["NoncurrentVersionTransition"] = [
            {"NoncurrentDays": t.get("TransitionInDays"), "StorageClass": t["StorageClass"]} for t in nvts
        ]
    unknown = set(rule) - {
        "Id", "Status", "Prefix", "ExpirationInDays", "ExpirationDate", "ExpiredObjectDeleteMarker",
        "AbortIncompleteMultipartUpload", "NoncurrentVersionExpiration", "NoncurrentVersionExpirationInDays",
        "Transitions", "Transition", "NoncurrentVersionTransitions", "NoncurrentVersionTransition",
    }  # fmt: skip
    for key in sorted(unknown):
        logger.warning("%s AWS::S3::Bucket.LifecycleConfiguration.Rules.%s is not emulated", UNSUPPORTED_PROPERTY, key)
    return out


def _apply_bucket_properties(backend: Any, bucket: Any, props: dict[str, Any]) -> None:
    from moto.s3.models import get_canned_acl

    name = bucket.name
    if props.get("AccessControl"):
        # CloudFormation spells canned ACLs in PascalCase: LogDeliveryWrite -> log-delivery-write.
        backend.put_bucket_acl(name, get_canned_acl(re.sub(r"(?<!^)(?=[A-Z])", "-", props["AccessControl"]).lower()))
    versioning = props.get("VersioningConfiguration")
    if versioning:
        backend.put_bucket_versioning(name, versioning["Status"])
    lifecycle = props.get("LifecycleConfiguration")
    if lifecycle:
        backend.put_bucket_lifecycle(name, [_lifecycle_rule(r) for r in lifecycle.get("Rules", [])])
    pab = props.get("PublicAccessBlockConfiguration")
    if pab:
        backend.put_public_access_block(
            name,
            {
                k: str(_as_bool(pab.get(k, False))).lower()
                for k in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
            },
        )
    ownership = props.get("OwnershipControls")
    if ownership:
        backend.put_bucket_ownership_controls(name, ownership["Rules"][0]["ObjectOwnership"])
    logging_cfg = props.get("LoggingConfiguration")
    if logging_cfg:
        config = {"TargetBucket": logging_cfg.get("DestinationBucketName", name)}
        config["TargetPrefix"] = logging_cfg.get("LogFilePrefix", "")
        target = backend.get_bucket(config["TargetBucket"])  # raises NoSuchBucket, as AWS would
        if target.region_name != bucket.region_name:
            from moto.s3.exceptions import CrossLocationLoggingProhibited

            raise CrossLocationLoggingProhibited()
        bucket.logging = config


class Bucket(CloudFormationModel):
    """``AWS::S3::Bucket`` with versioning, lifecycle, public access block, ownership, logging (moto's bucket)."""

    @staticmethod
    def cloudformation_name_type() -> str:
        return "BucketName"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::S3::Bucket"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return bool(FakeBucket.has_cfn_attr(attr))

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        props = cloudformation_json.get("Properties", {})
        _report_unsupported(cls.cloudformation_type(), props, _BUCKET_PROPS)
        bucket = FakeBucket.create_from_cloudformation_json(resource_name, cloudformation_json, account_id, region_name)
        _apply_bucket_properties(s3_backends[account_id][get_partition(region_name)], bucket, props)
        return bucket

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        props = cloudformation_json.get("Properties", {})
        _report_unsupported(cls.cloudformation_type(), props, _BUCKET_PROPS)
        bucket = FakeBucket.update_from_cloudformation_json(
            original_resource, new_resource_name, cloudformation_json, account_id, region_name
        )
        _apply_bucket_properties(s3_backends[account_id][get_partition(region_name)], bucket, props)
        return bucket

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        FakeBucket.delete_from_cloudformation_json(resource_name, cloudformation_json, account_id, region_name)

    def is_created(self) -> bool:
        return True


# --- 6. Bucket policies evaluated with the request's transport -------------------------------------

_REQUEST_CONTEXT: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar(
    "emulator_request_context", default=None
)


@contextlib.contextmanager
def request_transport(*, secure: bool) -> Iterator[None]:
    """Set the policy context keys of the request being handled (the server wraps every request)."""
    token = _REQUEST_CONTEXT.set({"aws:securetransport": "true" if secure else "false"})
    try:
        yield
    finally:
        _REQUEST_CONTEXT.reset(token)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _wildcard(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _condition_matches(operator: str, key: str, expected: Any, context: dict[str, str]) -> bool:
    actual = context.get(key.lower())
    if operator == "Null":
        return (actual is None) == (str(_as_list(expected)[0]).lower() == "true")
    if_exists = operator.endswith("IfExists")
    op = operator[: -len("IfExists")] if if_exists else operator
    if actual is None:
        return if_exists  # AWS: a key the request does not carry makes the condition false
    values = [str(v) for v in _as_list(expected)]
    if op == "Bool":
        return actual.lower() in [v.lower() for v in values]
    if op == "StringEquals" or op == "ArnEquals":
        return actual in values
    if op == "StringNotEquals" or op == "ArnNotEquals":
        return actual not in values
    if op == "StringEqualsIgnoreCase":
        return actual.lower() in [v.lower() for v in values]
    if op in ("StringLike", "ArnLike"):
        return any(_wildcard(v, actual) for v in values)
    if op in ("StringNotLike", "ArnNotLike"):
        return not any(_wildcard(v, actual) for v in values)
    logger.warning("bucket policy condition operator %s is not emulated: treated as not matching", operator)
    return False


def _statement_applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    principal = statement.get("Principal")
    if not (principal == "*" or (isinstance(principal, dict) and principal.get("AWS") == "*")):
        return False  # as moto: only statements for everyone are checked (callers are not identified)
    if "Action" in statement:
        if not any(_wildcard(a.lower(), action.lower()) for a in _as_list(statement["Action"])):
            return False
    elif any(_wildcard(a.lower(), action.lower()) for a in _as_list(statement.get("NotAction", []))):
        return False
    if "Resource" in statement:
        if not any(_wildcard(r, resource) for r in _as_list(statement["Resource"])):
            return False
    elif any(_wildcard(r, resource) for r in _as_list(statement.get("NotResource", []))):
        return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, expected in keys.items():
            if not _condition_matches(operator, key, expected, context):
                return False
    return True


def evaluate_bucket_policy(policy: str, action: str, resource: str, context: dict[str, str]) -> Any:
    """AWS's order for one resource policy: an applicable Deny wins, then an Allow, else no opinion."""
    from moto.iam.access_control import PermissionResult

    statements = _as_list(json.loads(policy).get("Statement", []))
    applicable = [s for s in statements if _statement_applies(s, action, resource, context)]
    if any(s.get("Effect") == "Deny" for s in applicable):
        return PermissionResult.DENIED
    if any(s.get("Effect") == "Allow" for s in applicable):
        return PermissionResult.PERMITTED
    return PermissionResult.NEUTRAL


def _bucket_get_permission(self: Any, action: str, resource: str) -> Any:
    from moto.iam.access_control import PermissionResult

    if self.policy is None:
        return PermissionResult.NEUTRAL
    policy = self.policy.decode() if isinstance(self.policy, bytes) else self.policy
    return evaluate_bucket_policy(policy, action, resource, _REQUEST_CONTEXT.get() or {})


# --- 10. ExecuteChangeSet: outputs and failures ---------------------------------------------------------


def _execute_change_set(self: Any, change_set_name: str, stack_name: Optional[str] = None) -> None:
    # moto looks a change set up by name across all stacks; CloudFormation by name within the stack.
    change_set = self.change_sets.get(change_set_name) or next(
        (
            cs
            for cs in self.change_sets.values()
            if cs.change_set_name == change_set_name and stack_name in (None, cs.stack_name, cs.stack_id)
        ),
        None,
    )
    try:
        _ORIGINAL_EXECUTE_CHANGE_SET(self, change_set.change_set_id if change_set else change_set_name, stack_name)
    except Exception as error:
        if change_set is None:
            raise
        logger.exception("ExecuteChangeSet %s failed", change_set_name)
        stack = self.stacks[change_set.stack_id]
        verb = "CREATE" if change_set.change_set_type == "CREATE" else "UPDATE"
        stack._add_stack_event(f"{verb}_FAILED", resource_status_reason=f"{type(error).__name__}: {error}")
        stack.status = "ROLLBACK_COMPLETE" if verb == "CREATE" else "UPDATE_ROLLBACK_COMPLETE"
        stack._add_stack_event(stack.status)
        change_set.execution_status = "EXECUTE_FAILED"
        return
    if change_set is not None:
        stack = self.stacks[change_set.stack_id]
        stack._parse_template()
        stack.output_map = stack._create_output_map()


_ORIGINAL_EXECUTE_CHANGE_SET: Any = None


# --- installation ----------------------------------------------------------------------------------

COMPAT_MODELS: tuple[type[CloudFormationModel], ...] = (
    PlacementGroup,
    BucketPolicy,
    Volume,
    CdkMetadata,
    SsmParameter,
    AutoScalingGroup,
    Bucket,
    Budget,
    LifecycleHook,
)


def install() -> None:
    """Make moto use the models and EC2 actions above. Idempotent; call before the first request."""
    from moto.cloudformation import parsing

    global _ORIGINAL_EXECUTE_CHANGE_SET
    from moto.cloudformation.models import CloudFormationBackend

    FakeBucket.get_permission = _bucket_get_permission  # type: ignore[method-assign]
    if _ORIGINAL_EXECUTE_CHANGE_SET is None:
        _ORIGINAL_EXECUTE_CHANGE_SET = CloudFormationBackend.execute_change_set
        CloudFormationBackend.execute_change_set = _execute_change_set  # type: ignore[method-assign]
    for action, function in _EC2_ACTIONS.items():
        if not hasattr(EC2Response, action):
            setattr(EC2Response, action, function)
    for cache in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cache.cache_clear()
    # Several direct subclasses may claim one type (moto's Volume and ours): the map keeps the last
    # one defined, which is ours because this module imports moto's models first. Check it.
    model_map = parsing.get_model_map()
    wrong = {m.cloudformation_type(): model_map.get(m.cloudformation_type()) for m in COMPAT_MODELS}
    wrong = {t: m for t, m in wrong.items() if m not in COMPAT_MODELS}
    if wrong:
        raise RuntimeError(f"moto's CloudFormation does not use the compat models for: {sorted(wrong)}")
    logger.debug("cfn_compat installed: %s", ", ".join(m.cloudformation_type() for m in COMPAT_MODELS))
