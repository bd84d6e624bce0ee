"""A deployed cluster, found by team and cluster name, and its Auto Scaling group.

The cluster's job-spec parameter ``/spot-training/<team>/<cluster>/job-spec`` (written by the stack) names the
bucket, prefix and current-job parameter; its Auto Scaling group carries the tags ``spot-training:team`` and
``spot-training:cluster``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from bootstrap_scripts.spot_training import protocol
from team_config.naming import CLUSTER_TAG, TEAM_TAG, parameter_path

ClientFactory = Callable[[str], Any]


class JobError(Exception):
    """A one-line reason (unknown team/cluster/job, bad code directory)."""


@dataclass(frozen=True)
class ClusterRef:
    team: str
    cluster: str
    spec: dict[str, Any]
    group: str

    @property
    def bucket(self) -> str:
        return str(self.spec["bucket"])

    @property
    def prefix(self) -> str:
        return str(self.spec["prefix"])

    def job_prefix(self, job_id: str) -> str:
        return protocol.job_prefix(self.prefix, job_id)

    @property
    def code_prefix(self) -> str:
        """Where the jobs' code archives are: ``<prefix>code/<job>.tar.gz`` (so no job may be called ``code``)."""
        return protocol.code_prefix(self.prefix)


def find_cluster(client: ClientFactory, team: str, cluster: str) -> ClusterRef:
    name = f"{parameter_path(team, cluster)}/job-spec"
    ssm = client("ssm")
    try:
        spec = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    except ssm.exceptions.ParameterNotFound:
        raise JobError(
            f"no cluster {team}/{cluster}: SSM parameter {name} does not exist (is the stack deployed?)"
        ) from None
    wanted = {TEAM_TAG: team, CLUSTER_TAG: cluster}
    for page in client("autoscaling").get_paginator("describe_auto_scaling_groups").paginate():
        for group in page["AutoScalingGroups"]:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            if all(tags.get(k) == v for k, v in wanted.items()):
                return ClusterRef(team, cluster, spec, group["AutoScalingGroupName"])
    raise JobError(f"no Auto Scaling group tagged {TEAM_TAG}={team}, {CLUSTER_TAG}={cluster}")


def group(client: ClientFactory, ref: ClusterRef) -> dict[str, Any]:
    """The cluster's Auto Scaling group as DescribeAutoScalingGroups returns it (instances, desired capacity)."""
    groups = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])
    return dict(groups["AutoScalingGroups"][0])


def described(client: ClientFactory, instances: list[str]) -> dict[str, dict[str, Any]]:
    """EC2's view of ``instances``, by id. EC2 is eventually consistent: one just launched may not be known yet, and
    one unknown id fails the whole call: then one by one, leaving out the unknown."""
    if not instances:
        return {}
    try:
        found = client("ec2").describe_instances(InstanceIds=instances)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
            raise
        return {k: v for i in instances if len(instances) > 1 for k, v in described(client, [i]).items()}
    return {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}


def desired_capacity(client: ClientFactory, ref: ClusterRef) -> int:
    return int(group(client, ref)["DesiredCapacity"])
