"""Terminating lifecycle hooks (emulator/lifecycle.py, cfn_compat item 12) against a running emulator.

The server runs with ``EMULATOR_LIFECYCLE_HEARTBEAT_SCALE=0.1``: a hook's HeartbeatTimeout of 60 s expires after
6 s; the other tests use 3600 s (6 min here), far beyond their own run. The last test runs the node agent's drain
hold (``bootstrap_scripts/spot_training/agent/drain.py``) against such a hook.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from emulator import EmulatedCloud
from emulator.deploy import unsupported
from emulator.lifecycle import SCALE_ENV

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bootstrap_scripts"))  # as on the node
from spot_training.agent.drain import DrainHold

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
HOOK = "spot-training-drain"
WAIT_S = 30.0  # bound of every wait below (the 6 s timeout included); the loops poll and end early
POLL_S = 0.2


@pytest.fixture(scope="module")
def cloud() -> Iterator[EmulatedCloud]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SCALE_ENV, "0.1")  # read by the server process at start
        with EmulatedCloud() as c:
            yield c


@pytest.fixture(scope="module")
def launch_configuration(cloud: EmulatedCloud) -> str:
    image = cloud.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    cloud.client("autoscaling").create_launch_configuration(
        LaunchConfigurationName="lifecycle-lc", ImageId=image, InstanceType="t3.micro"
    )
    return "lifecycle-lc"


def _group(cloud: EmulatedCloud, launch_configuration: str, desired: int, *, hook_timeout: int | None = 3600) -> str:
    """A group of ``desired`` InService instances, with the terminating hook (unless ``hook_timeout`` is None)."""
    name = f"lifecycle-{uuid.uuid4().hex[:8]}"
    asg = cloud.client("autoscaling")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchConfigurationName=launch_configuration,
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=desired,
        AvailabilityZones=["us-east-1a"],
    )
    if hook_timeout is not None:
        asg.put_lifecycle_hook(
            AutoScalingGroupName=name,
            LifecycleHookName=HOOK,
            LifecycleTransition=TERMINATING,
            HeartbeatTimeout=hook_timeout,
            DefaultResult="CONTINUE",
        )
    states = _states(cloud, name)
    assert list(states.values()) == ["InService"] * desired
    return name


def _describe(cloud: EmulatedCloud, group: str) -> dict[str, Any]:
    (found,) = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
        "AutoScalingGroups"
    ]
    return dict(found)


def _states(cloud: EmulatedCloud, group: str) -> dict[str, str]:
    """Instance id -> LifecycleState of the group's instances, as DescribeAutoScalingGroups lists them."""
    return {i["InstanceId"]: i["LifecycleState"] for i in _describe(cloud, group)["Instances"]}


def _ec2_state(cloud: EmulatedCloud, instance_id: str) -> str:
    reservations = cloud.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    for _ in range(int(WAIT_S / POLL_S) + 1):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    pytest.fail(f"not within {WAIT_S:.0f} s: {what}")


def _validation_error(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    assert (error["Code"], raised.value.response["ResponseMetadata"]["HTTPStatusCode"]) == ("ValidationError", 400)
    return str(error["Message"])


def _complete(cloud: EmulatedCloud, group: str, instance_id: str, result: str = "CONTINUE") -> Any:
    return cloud.client("autoscaling").complete_lifecycle_action(
        AutoScalingGroupName=group, LifecycleHookName=HOOK, InstanceId=instance_id, LifecycleActionResult=result
    )


def test_cloudformation_hook_is_readable_and_deleted_with_the_stack(
    cloud: EmulatedCloud, launch_configuration: str
) -> None:
    offset = cloud.server_log.stat().st_size
    stack = f"lifecycle-{uuid.uuid4().hex[:8]}"
    hook: dict[str, Any] = {
        "AutoScalingGroupName": {"Ref": "Group"},
        "LifecycleTransition": TERMINATING,
        "HeartbeatTimeout": 300,
        "DefaultResult": "CONTINUE",
    }
    template = {
        "Resources": {
            "Group": {
                "Type": "AWS::AutoScaling::AutoScalingGroup",
                "Properties": {
                    "LaunchConfigurationName": launch_configuration,
                    "MinSize": 0,
                    "MaxSize": 2,
                    "DesiredCapacity": 1,
                    "AvailabilityZones": ["us-east-1a"],
                },
            },
            "Drain": {
                "Type": "AWS::AutoScaling::LifecycleHook",
                "Properties": {**hook, "LifecycleHookName": HOOK, "NotificationMetadata": "drain"},
            },
            "Unnamed": {"Type": "AWS::AutoScaling::LifecycleHook", "Properties": hook},
        },
        "Outputs": {"Hook": {"Value": {"Ref": "Drain"}}, "Group": {"Value": {"Ref": "Group"}}},
    }
    cfn = cloud.client("cloudformation")
    cfn.create_stack(StackName=stack, TemplateBody=json.dumps(template))
    (described,) = cfn.describe_stacks(StackName=stack)["Stacks"]
    assert described["StackStatus"] == "CREATE_COMPLETE"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]}
    assert outputs["Hook"] == HOOK
    hooks = cloud.client("autoscaling").describe_lifecycle_hooks(AutoScalingGroupName=outputs["Group"])[
        "LifecycleHooks"
    ]
    by_name = {h["LifecycleHookName"]: h for h in hooks}
    assert set(by_name) == {HOOK, next(n for n in by_name if n != HOOK)}
    assert next(n for n in by_name if n != HOOK).startswith(f"{stack}-Unnamed-")  # generated, as CloudFormation does
    drain = by_name[HOOK]
    assert {k: drain.get(k) for k in ("LifecycleTransition", "HeartbeatTimeout", "GlobalTimeout", "DefaultResult")} == {
        "LifecycleTransition": TERMINATING,
        "HeartbeatTimeout": 300,
        "GlobalTimeout": 30000,
        "DefaultResult": "CONTINUE",
    }
    assert drain["NotificationMetadata"] == "drain"
    assert "NotificationTargetARN" not in drain and "RoleARN" not in drain  # not moto's example ARNs
    assert unsupported(cloud.server_log, offset) == set()
    cfn.delete_stack(StackName=stack)
    assert (
        cloud.client("autoscaling").describe_lifecycle_hooks(AutoScalingGroupName=outputs["Group"])["LifecycleHooks"]
        == []
    )


def test_notification_target_and_role_are_reported(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 0, hook_timeout=None)
    offset = cloud.server_log.stat().st_size
    hook = {
        "AutoScalingGroupName": group,
        "LifecycleTransition": TERMINATING,
        "NotificationTargetARN": "arn:aws:sqs:us-east-1:123456789012:drain",
        "RoleARN": "arn:aws:iam::123456789012:role/drain",
    }
    template = {"Resources": {"Hook": {"Type": "AWS::AutoScaling::LifecycleHook", "Properties": hook}}}
    cloud.client("cloudformation").create_stack(
        StackName=f"lifecycle-{uuid.uuid4().hex[:8]}", TemplateBody=json.dumps(template)
    )
    assert unsupported(cloud.server_log, offset) == {
        "AWS::AutoScaling::LifecycleHook.NotificationTargetARN",
        "AWS::AutoScaling::LifecycleHook.RoleARN",
    }


def test_scale_in_waits_for_completion(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 2)
    asg = cloud.client("autoscaling")
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
    states = _states(cloud, group)
    (first,) = [i for i, s in states.items() if s == "Terminating:Wait"]
    (other,) = [i for i, s in states.items() if s == "InService"]
    assert _ec2_state(cloud, first) == "running"
    (instance,) = asg.describe_auto_scaling_instances(InstanceIds=[first])["AutoScalingInstances"]
    assert instance["LifecycleState"] == "Terminating:Wait"
    assert _describe(cloud, group)["DesiredCapacity"] == 1

    # A second scale-in takes the InService instance, never the one already waiting.
    asg.update_auto_scaling_group(AutoScalingGroupName=group, DesiredCapacity=0)
    assert _states(cloud, group) == {first: "Terminating:Wait", other: "Terminating:Wait"}

    heartbeat = asg.record_lifecycle_action_heartbeat(
        AutoScalingGroupName=group, LifecycleHookName=HOOK, InstanceId=first
    )
    assert heartbeat["ResponseMetadata"]["HTTPStatusCode"] == 200 and _ec2_state(cloud, first) == "running"
    _complete(cloud, group, first)
    assert _ec2_state(cloud, first) == "terminated"
    assert _states(cloud, group) == {other: "Terminating:Wait"}
    assert _validation_error(lambda: _complete(cloud, group, first)) == (
        f"No active Lifecycle Action found with instance ID {first}"
    )
    _complete(cloud, group, other, "ABANDON")  # ABANDON ends a terminating wait too
    assert _ec2_state(cloud, other) == "terminated"
    assert _states(cloud, group) == {}


def test_terminate_without_decrement_waits_and_replaces(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 1)
    (old,) = _states(cloud, group)
    asg = cloud.client("autoscaling")
    activity = asg.terminate_instance_in_auto_scaling_group(InstanceId=old, ShouldDecrementDesiredCapacity=False)
    assert activity["Activity"]["Description"] == f"Terminating EC2 instance: {old}"
    states = _states(cloud, group)
    (replacement,) = [i for i in states if i != old]
    assert states == {old: "Terminating:Wait", replacement: "InService"}
    assert _ec2_state(cloud, old) == "running" and _describe(cloud, group)["DesiredCapacity"] == 1
    assert _validation_error(
        lambda: asg.terminate_instance_in_auto_scaling_group(InstanceId=old, ShouldDecrementDesiredCapacity=False)
    ) == (f"The instance {old} is not in InService or Standby.")

    # With decrement: it waits, and nothing replaces it.
    asg.terminate_instance_in_auto_scaling_group(InstanceId=replacement, ShouldDecrementDesiredCapacity=True)
    assert _states(cloud, group) == {old: "Terminating:Wait", replacement: "Terminating:Wait"}
    assert _describe(cloud, group)["DesiredCapacity"] == 0

    _complete(cloud, group, old)
    assert _ec2_state(cloud, old) == "terminated"
    assert _states(cloud, group) == {replacement: "Terminating:Wait"}


def test_heartbeat_timeout_applies_the_default_result(cloud: EmulatedCloud, launch_configuration: str) -> None:
    # 6 s with the scale: room for the state read after the scale-in on a loaded runner (AWS's minimum is 30 s: 3 s)
    group = _group(cloud, launch_configuration, 1, hook_timeout=60)
    (instance,) = _states(cloud, group)
    cloud.client("autoscaling").set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
    assert _states(cloud, group) == {instance: "Terminating:Wait"}
    _wait_until(lambda: _ec2_state(cloud, instance) == "terminated", f"{instance} terminated after the timeout")
    assert _states(cloud, group) == {}
    assert _validation_error(lambda: _complete(cloud, group, instance)) == (
        f"No active Lifecycle Action found with instance ID {instance}"
    )
    assert _validation_error(
        lambda: cloud.client("autoscaling").record_lifecycle_action_heartbeat(
            AutoScalingGroupName=group, LifecycleHookName=HOOK, InstanceId=instance
        )
    ) == (f"No active Lifecycle Action found with instance ID {instance}")


def test_completing_without_a_wait_is_refused(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 1)
    (instance,) = _states(cloud, group)
    assert _validation_error(lambda: _complete(cloud, group, instance)) == (
        f"No active Lifecycle Action found with instance ID {instance}"
    )
    assert _states(cloud, group) == {instance: "InService"} and _ec2_state(cloud, instance) == "running"


def test_instance_taken_by_ec2_is_not_held(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 2)
    first, second = _states(cloud, group)
    ec2 = cloud.client("ec2")
    ec2.terminate_instances(InstanceIds=[first])  # a spot reclaim: EC2 takes it, no hook holds that
    states = _states(cloud, group)
    assert first not in states and set(states.values()) == {"InService"} and len(states) == 2
    # An instance that leaves its group while waiting ends its wait.
    cloud.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=second, ShouldDecrementDesiredCapacity=True
    )
    assert _states(cloud, group)[second] == "Terminating:Wait"
    ec2.terminate_instances(InstanceIds=[second])
    assert second not in _states(cloud, group)
    assert _validation_error(lambda: _complete(cloud, group, second)) == (
        f"No active Lifecycle Action found with instance ID {second}"
    )


def test_deleting_the_hook_completes_its_waits(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 1)
    (instance,) = _states(cloud, group)
    asg = cloud.client("autoscaling")
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
    assert _states(cloud, group) == {instance: "Terminating:Wait"}
    asg.delete_lifecycle_hook(AutoScalingGroupName=group, LifecycleHookName=HOOK)
    assert _ec2_state(cloud, instance) == "terminated" and _states(cloud, group) == {}


def test_group_without_terminating_hook_is_unchanged(cloud: EmulatedCloud, launch_configuration: str) -> None:
    group = _group(cloud, launch_configuration, 2, hook_timeout=None)
    asg = cloud.client("autoscaling")
    asg.put_lifecycle_hook(  # a launching hook holds no termination
        AutoScalingGroupName=group, LifecycleHookName="boot", LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING"
    )
    before = _states(cloud, group)
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
    after = _states(cloud, group)
    (removed,) = set(before) - set(after)
    assert set(after.values()) == {"InService"} and _ec2_state(cloud, removed) == "terminated"
    (kept,) = after
    asg.terminate_instance_in_auto_scaling_group(InstanceId=kept, ShouldDecrementDesiredCapacity=False)
    states = _states(cloud, group)
    assert kept not in states and set(states.values()) == {"InService"} and len(states) == 1
    assert _ec2_state(cloud, kept) == "terminated"


def test_the_agents_drain_hold_keeps_an_uploading_instance_past_the_heartbeat(
    cloud: EmulatedCloud, launch_configuration: str
) -> None:
    """The node agent's drain hold against the hook: while checkpoint bytes go to S3 it records the hook's heartbeat,
    and the instance stays in Terminating:Wait past the heartbeat timeout; once no bytes go out, the timeout applies.
    Without the hold, an agent still uploading after the hook's heartbeat (300 s on AWS) would have its instance
    ended mid-upload."""
    group = _group(cloud, launch_configuration, 1, hook_timeout=60)  # 6 s with the scale
    (instance,) = _states(cloud, group)
    asg = cloud.client("autoscaling")
    lines: list[str] = []
    sent = [0]  # the checkpoint bytes uploaded so far, as CheckpointStore.sent_bytes counts them
    hold = DrainHold(asg, instance, lines.append, lambda: sent[0], lambda: True, look_s=0.5, beat_s=1.0)
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
    hold.start()
    try:
        uploading_until = time.monotonic() + 15.0  # two and a half heartbeat timeouts
        for _ in range(200):  # bounded: about 0.25 s each
            if time.monotonic() >= uploading_until:
                break
            sent[0] += 2**20
            assert _states(cloud, group) == {instance: "Terminating:Wait"}, lines
            time.sleep(0.25)
        beats = [line for line in lines if f"recorded {HOOK}'s heartbeat, {group} holds this instance" in line]
        assert len(beats) >= 5, lines  # one a second while bytes went out; the timeout alone would be 6 s
        _wait_until(lambda: _ec2_state(cloud, instance) == "terminated", f"{instance} ended once no bytes went out")
        assert _states(cloud, group) == {}
    finally:
        hold.stop()
    assert not [line for line in lines if "could not record" in line], lines
