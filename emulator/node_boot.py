"""What an emulated instance boots with (:mod:`emulator.nodes` boots them), and the record of a booted node.

A node is a process tree running that instance's actual user data (read back through the EC2 API), with:
- its own instance-metadata mock (:class:`emulator.imds.ImdsMock`: IMDSv2 tokens, instance id, AZ, launch
  index, instance type, instance tags, spot notices) on its own loopback address 127.X.Y.N (X.Y chosen at random
  per launcher, so launchers of other runs on the same machine never share an address and port);
- its own root directory: absolute paths under ``/opt/`` in the user data are relocated to
  ``<work_dir>/<instance-id>/root/opt/`` (the only change made to the user data), and the node agent gets
  ``SPOT_TRAINING_NODE_ROOT`` for the job's checkpoint directory, so nodes never share files;
- the emulator's AWS endpoint and, by default, its fake root credentials (no instance profile credentials: see
  docs/security.md). With ``NodeLauncher(instance_credentials=True)`` a node gets its instance role's credentials
  instead, the way an instance does: its metadata mock serves them under ``iam/security-credentials/<role>``,
  and the node's environment holds no AWS keys and leaves instance metadata lookups on, so botocore and the AWS
  CLI take them from there. The role is the instance profile's of the group's launch template (moto records no
  profile on the instances a group launches); the launcher assumes it (``sts:AssumeRole``, for one hour, not
  refreshed) once per watched group when it starts, and every node of the group gets those credentials. Start
  the launcher before :meth:`EmulatedCloud.enforce_iam` switches enforcement on: EC2 itself assumes an instance
  role, trusted as the service ``ec2.amazonaws.com``, and moto (5.2.5) answers an ``AssumeRole`` of such a role
  under enforcement with a 500 (its trust-policy check fails on a principal without an ``AWS`` key). With
  enforcement on, every AWS call of the node is then checked against the role's policies; the launcher's own
  calls need credentials moto's IAM knows (:meth:`EmulatedCloud.use_admin_user` before creating the launcher);
- ``SPOT_TRAINING_WARM_VOLUME_MOUNT=0``: a claimed warm-pool volume is attached through the EC2 API, but
  there is no block device to mount;
- ``SPOT_TRAINING_WARM_VOLUME_DIRS=<work_dir>/warm-volumes``: the directory ``<volume id>`` in it stands for a
  warm volume's file system; the node that claims the volume keeps what it writes to the volume there (the job's
  setup cache and inputs), and the next node that claims the same volume finds it;
- ``SPOT_TRAINING_PER_BOOT_DIR=<root>/var/lib/cloud/scripts/per-boot``: the user data's reboot hook is installed
  there, not in the host's cloud-init directory (nodes are never rebooted: the hook does not run by itself);
- ``SPOT_TRAINING_PEER_ADDRESS_MAP``: a file mapping every instance's private 10.x address to its node's
  loopback address. The 10.x addresses are labels: nothing ever connects to them.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from emulator.cloud import EmulatedCloud, EmulatorError
from emulator.imds import ImdsMock
from emulator.node_process import exit_status

WARM_VOLUME_DIRS = "warm-volumes"  # under the launcher's work directory, beside the address map


@dataclass
class Node:
    """One emulated instance and the process tree running its user data."""

    instance_id: str
    group: str
    private_ip: str
    host: str
    root: Path
    console: Path
    imds: ImdsMock
    imds_url: str
    proc: subprocess.Popen[bytes]
    booted_at: float
    notice_at: Optional[float] = None
    notice_deadline: Optional[float] = None  # time.monotonic() when the notice's time is up: EC2 takes the instance
    rebalance_at: Optional[float] = None
    draining_at: Optional[float] = None  # time.time() its group started ending it (Terminating:Wait)
    exited_at: Optional[float] = None
    exit_code: Optional[int] = None
    terminated_at: Optional[float] = None
    shut_down: bool = False  # the launcher ended the process tree (instance gone), as opposed to exiting by itself
    cleaned_up: bool = False  # the launcher ended what was left, reaped the user data's process, stopped the IMDS
    events: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return exit_status(self.proc) is None


@dataclass(frozen=True)
class RoleCredentials:
    """An instance role's name, its credentials (``sts:AssumeRole``) and its instance profile."""

    role_name: str
    credentials: dict[str, Any]
    profile: dict[str, Any]


def instance_role_credentials(cloud: EmulatedCloud, asg: Any, ec2: Any, group: str) -> RoleCredentials:
    """The role of the instance profile in the group's launch template, assumed as EC2 assumes it (``asg``, ``ec2``:
    the launcher's clients)."""
    ref = _launch_template_profile(asg, ec2, group)
    name = ref.get("Name") or str(ref["Arn"]).rsplit("/", 1)[-1]
    profile = cloud.client("iam").get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    [role] = profile["Roles"]  # EC2 allows exactly one role per instance profile
    answer = cloud.client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="emulated-node")
    return RoleCredentials(str(role["RoleName"]), dict(answer["Credentials"]), dict(profile))


def _launch_template_profile(asg: Any, ec2: Any, group: str) -> dict[str, str]:
    [found] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    spec = found.get("LaunchTemplate") or found["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
    [version] = ec2.describe_launch_template_versions(
        LaunchTemplateId=spec["LaunchTemplateId"], Versions=[spec.get("Version") or "$Default"]
    )["LaunchTemplateVersions"]
    profile = version["LaunchTemplateData"].get("IamInstanceProfile")
    if not profile:
        raise EmulatorError(f"the launch template of {group} has no instance profile: no role credentials")
    return dict(profile)


def read_instance(ec2: Any, instance_id: str, group: str) -> tuple[dict[str, Any], str]:
    """The instance as ``DescribeInstances`` shows it, and its user data script."""
    inst = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    user_data = base64.b64decode(raw.get("UserData", {}).get("Value", "")).decode()
    if not user_data.strip():
        raise EmulatorError(f"instance {instance_id} of {group} has no user data")
    return inst, user_data


def metadata_mock(host: str, region: str, inst: dict[str, Any], instance_type: str) -> ImdsMock:
    """The instance's metadata mock on ``host``, not started."""
    return ImdsMock(
        host=host,
        instance_id=inst["InstanceId"],
        region=region,
        availability_zone=inst["Placement"]["AvailabilityZone"],
        launch_index=int(inst.get("AmiLaunchIndex", 0)),
        local_ipv4=inst["PrivateIpAddress"],
        instance_type=instance_type,
        lifecycle="spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand",
        tags={t["Key"]: t["Value"] for t in inst.get("Tags", [])},
    )


def user_data_environment(
    base: dict[str, str], *, imds_url: str, address_map: Path, root: Path, instance_credentials: bool
) -> dict[str, str]:
    """The user data's environment: ``base`` (the emulator's endpoint and credentials) and the node's own paths."""
    env = dict(base)
    if instance_credentials:
        # As on an instance: no keys in the environment; botocore and the AWS CLI find the role's credentials
        # in the instance metadata (AWS_EC2_METADATA_SERVICE_ENDPOINT below). A loaded machine gets more than
        # botocore's default 1 s and 1 attempt for the metadata mock to answer.
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_EC2_METADATA_DISABLED"):
            env.pop(key, None)
        env.update({"AWS_METADATA_SERVICE_TIMEOUT": "5", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "3"})
    env.update(
        {
            # the node's python3 and aws: this environment's (boto3, torch, the AWS CLI)
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds_url,
            "SPOT_TRAINING_PEER_ADDRESS_MAP": str(address_map),
            "SPOT_TRAINING_NODE_ROOT": str(root),
            # warm-pool volumes are attached through the EC2 API; there is no block device to mount
            "SPOT_TRAINING_WARM_VOLUME_MOUNT": "0",
            # a directory per volume stands for its file system: the node that claims it keeps its job's setup cache
            # and inputs there, the next node claiming it finds them
            "SPOT_TRAINING_WARM_VOLUME_DIRS": str(address_map.parent / WARM_VOLUME_DIRS),
            # the user data's reboot hook goes to the node's own cloud-init directory, never the host's
            "SPOT_TRAINING_PER_BOOT_DIR": str(root / "var" / "lib" / "cloud" / "scripts" / "per-boot"),
        }
    )
    return env
