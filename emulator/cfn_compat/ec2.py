"""EC2 (items 1, 3 and 15 of :mod:`emulator.cfn_compat`): placement groups, volumes with everything the template
says, and instances from a launch template with EFA interfaces.

1. ``AWS::EC2::PlacementGroup``: moto has no placement groups at all, neither a CloudFormation type
   nor the EC2 API. -> A ``PlacementGroup`` model kept per EC2 backend (Strategy, PartitionCount,
   SpreadLevel, Tags; ``Ref`` = group name, ``GetAtt GroupName``) plus the EC2 actions
   ``CreatePlacementGroup``, ``DescribePlacementGroups`` (names, ids, filters ``group-name``,
   ``strategy``, ``state``, ``tag:*``) and ``DeletePlacementGroup`` added to moto's EC2 response class.
3. ``AWS::EC2::Volume``: moto's model keeps only Size and AvailabilityZone and drops ``SnapshotId``,
   ``VolumeType``, ``Iops``, ``Throughput``, ``Encrypted``, ``KmsKeyId``, ``MultiAttachEnabled`` and
   the resource's own ``Tags``. -> A model that passes all of them to moto's ``create_volume`` (which
   checks the snapshot exists) and tags the volume. ``VolumeInitializationRate`` has no equivalent in
   moto and is accepted and ignored (it only changes how fast EBS hydrates the volume).
15. EFA interfaces in a launch template (``LaunchTemplateData.NetworkInterfaces`` of ``InterfaceType`` ``efa``, the
   security groups on each interface, none on the template): moto stores them but launches an instance from a
   launch template with the template's own ``SecurityGroupIds`` only, so the node would get no security group. ->
   ``run_instances`` gives the instance the groups of the template's primary interface (device index 0). The
   instance keeps moto's one interface: the emulated nodes run on this machine and never send traffic to an EFA
   interface.
"""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

from moto.core.common_models import CloudFormationModel
from moto.core.responses import ActionResult
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.responses import EC2Response
from moto.utilities.utils import get_partition

from emulator.cfn_compat.base import CompatModel, as_bool
from emulator.moto_patch import original, patch

PLACEMENT_STRATEGIES = ("cluster", "spread", "partition")

# --- 1. Placement groups -------------------------------------------------------------------------


class PlacementGroup(CompatModel, CloudFormationModel):
    """An EC2 placement group, as ``DescribePlacementGroups`` returns it. CloudFormation generates its name."""

    CFN_TYPE = "AWS::EC2::PlacementGroup"
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {"GroupName": "name"}

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

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> PlacementGroup:
        partition_count = props.get("PartitionCount")
        return placement_groups(account_id, region_name).create(
            name=name,
            strategy=props.get("Strategy", "cluster"),
            partition_count=int(partition_count) if partition_count is not None else None,
            spread_level=props.get("SpreadLevel"),
            tags={t["Key"]: t["Value"] for t in props.get("Tags", [])},
        )

    # update: every property of AWS::EC2::PlacementGroup requires replacement (CompatModel.update's default).

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        placement_groups(account_id, region_name).delete(name)


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


# --- 3. EBS volumes with everything the template says ----------------------------------------------


_VOLUME_PROPS = frozenset({
    "AvailabilityZone", "Size", "SnapshotId", "VolumeType", "Iops", "Throughput", "Encrypted", "KmsKeyId",
    "MultiAttachEnabled", "Tags", "VolumeInitializationRate",
})  # fmt: skip


class Volume(CompatModel, CloudFormationModel):
    """``AWS::EC2::Volume`` with SnapshotId, type, IOPS, throughput, encryption and tags (returns moto's Volume)."""

    CFN_TYPE = "AWS::EC2::Volume"
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {"VolumeId": "id"}
    PROPERTIES = _VOLUME_PROPS

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
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
            encrypted=as_bool(props.get("Encrypted", False)),
            kms_key_id=props.get("KmsKeyId"),
            volume_type=props.get("VolumeType"),
            iops=opt_int("Iops"),
            throughput=opt_int("Throughput"),
            multi_attach_enabled=as_bool(props.get("MultiAttachEnabled", False)),
        )
        _tag_volume(backend, volume.id, props)
        return volume

    @classmethod
    def update(cls, original: Any, new_name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        _tag_volume(ec2_backends[account_id][region_name], original.id, props)
        return original

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        ec2_backends[account_id][region_name].delete_volume(name)


def _tag_volume(backend: Any, volume_id: str, props: dict[str, Any]) -> None:
    tags = {t["Key"]: t["Value"] for t in props.get("Tags", [])}
    if tags:
        backend.create_tags([volume_id], tags)


# --- 15. EFA interfaces in a launch template ------------------------------------------------------


def _run_instances(
    self: Any, image_id: str, count: int, user_data: Any, security_group_names: Any, **kwargs: Any
) -> Any:
    """moto's ``run_instances``; from a launch template whose groups are on its interfaces, with the primary's."""
    if kwargs.get("launch_template") and not kwargs.get("security_group_ids"):
        data = self._get_template_from_args(kwargs["launch_template"]).data
        primary = [n for n in data.get("NetworkInterfaces", []) if str(n.get("DeviceIndex")) == "0"]
        if not data.get("SecurityGroupIds") and primary and primary[0].get("Groups"):
            kwargs["security_group_ids"] = list(primary[0]["Groups"])
    return original(InstanceBackend, "run_instances")(self, image_id, count, user_data, security_group_names, **kwargs)


def patch_moto() -> None:
    """The placement group actions on moto's EC2 Query API (where moto has none of its own), and instances launched
    with the groups of a launch template's primary interface (item 15)."""
    for action, function in _EC2_ACTIONS.items():
        if not hasattr(EC2Response, action):
            patch(EC2Response, action, function)
    patch(InstanceBackend, "run_instances", _run_instances)
