"""Each construct's duties, asserted on the synthesized template (never on hashed logical ids)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Annotations, Match, Template

from bootstrap_scripts.spot_training import protocol
from bootstrap_scripts.spot_training.job_spec import (
    MTBI_MAX_S,
    PARAMETER_MAX_BYTES,
    SPEC_KEYS,
    WarmPoolSpec,
)
from team_config.model import DATA_BUCKETS_JSON_BYTES, DEFAULT_PYTHON, JOB_SPEC_TEXT_BYTES, json_bytes
from team_config.naming import budget_name
from tests.synth import CLUSTER, CONTEXT, joined, resources, synth, team_config
from training_constructs import WarmVolumePool, node_bootstrap
from training_constructs.guard_code import PACKAGE_FILES
from training_constructs.node_bootstrap import BOOTSTRAP_DIR
from training_constructs.spot_fleet import SESSION_MANAGER_ACTIONS

EXISTING_VPC = {
    "vpc_id": "vpc-0123456789abcdef0",
    "subnets": [
        {"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "eu-west-1b", "route_table_id": "rtb-0123456789"}
    ],
}
WARM_POOL = {
    "size": 3,
    "snapshot_id": "snap-0123456789abcdef0",
    "volume_size_gib": 300,
    "iops": 6000,
    "throughput_mibps": 500,
    "initialization_rate_mibps": 300,
    "removal_policy": "destroy",
    "min_free_percent": 35,
}
# a cluster whose pool copies a snapshot given by hand: the nodes boot the AMI it comes from
POOLED = {**CLUSTER, "ami": {"image_id": "ami-0123456789abcdef0"}}


@pytest.fixture(scope="module")
def default() -> Template:
    return synth(team_config(log_retention_days=14))[1]


@pytest.fixture(scope="module")
def variant() -> Template:
    """Imported VPC, two clusters, on-demand base, no placement group on one, a warm pool on the other."""
    config = team_config(
        network={"existing_vpc": EXISTING_VPC},
        clusters=[
            {
                **CLUSTER,
                "name": "big",
                "max_nodes": 3,
                "on_demand_base_capacity": 1,
                "on_demand_percentage_above_base": 25,
                "spot_allocation_strategy": "capacity-optimized",
                "warm_pool": WARM_POOL,
                "ami": {"image_id": "ami-0123456789abcdef0", "root_device_name": "/dev/sda1"},
            },
            {**CLUSTER, "name": "small", "placement_group": False, "instance_types": ["m7g.large", "c7g.large"]},
        ],
        checkpoint_bucket={"removal_policy": "destroy", "noncurrent_version_expiration_days": 7},
    )
    return synth(config)[1]


# ---- ClusterNetwork -------------------------------------------------------------------------------------------


def test_new_vpc_single_az_with_s3_gateway_endpoint_and_flow_logs(default: Template) -> None:
    default.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.0.0.0/16"})
    default.resource_count_is("AWS::EC2::NatGateway", 1)
    training_subnets = [s for s in resources(default, "AWS::EC2::Subnet") if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert len(training_subnets) == 1, "one AZ by default: one training subnet"
    [endpoint] = resources(default, "AWS::EC2::VPCEndpoint")
    assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
    assert joined(endpoint["Properties"]["ServiceName"]).endswith('".s3"]]}')
    assert len(endpoint["Properties"]["RouteTableIds"]) == 1, "the training subnet's route table"
    default.has_resource_properties("AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL"})


def test_new_vpc_in_the_zone_the_team_names_with_the_warm_pool_there() -> None:
    """The team names the zone of a new VPC, the one with spot capacity for its types, rather than the region's first
    zone."""
    config = team_config(
        network={"new_vpc": {"availability_zones": ["eu-west-1c"]}}, clusters=[{**POOLED, "warm_pool": WARM_POOL}]
    )
    template = synth(config)[1]
    assert {s["Properties"]["AvailabilityZone"] for s in resources(template, "AWS::EC2::Subnet")} == {"eu-west-1c"}
    assert {v["Properties"]["AvailabilityZone"] for v in resources(template, "AWS::EC2::Volume")} == {"eu-west-1c"}


def test_imported_vpc_uses_given_subnet_and_route_table(variant: Template) -> None:
    variant.resource_count_is("AWS::EC2::VPC", 0)
    variant.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcId": "vpc-0123456789abcdef0", "RouteTableIds": ["rtb-0123456789"], "VpcEndpointType": "Gateway"},
    )
    for group in resources(variant, "AWS::AutoScaling::AutoScalingGroup"):
        assert group["Properties"]["VPCZoneIdentifier"] == ["subnet-0123456789abcdef0"]


def test_security_group_is_self_referencing_with_no_open_ingress(default: Template, variant: Template) -> None:
    for template in (default, variant):
        groups = template.find_resources("AWS::EC2::SecurityGroup")
        assert groups
        for sg in groups.values():
            for rule in sg["Properties"].get("SecurityGroupIngress", []):
                assert rule.get("CidrIp") != "0.0.0.0/0" and rule.get("CidrIpv6") != "::/0", rule
        ingress = resources(template, "AWS::EC2::SecurityGroupIngress")
        assert ingress, "node-to-node rule missing"
        for rule in ingress:
            props = rule["Properties"]
            assert "CidrIp" not in props and "CidrIpv6" not in props, props
            assert props["IpProtocol"] == "-1"
            assert props["SourceSecurityGroupId"] == props["GroupId"], "must reference its own group"
            assert props["GroupId"]["Fn::GetAtt"][0] in groups


# ---- SpotFleet ------------------------------------------------------------------------------------------------


def test_placement_group_cluster_strategy_per_cluster(default: Template, variant: Template) -> None:
    default.resource_count_is("AWS::EC2::PlacementGroup", 1)
    default.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    variant.resource_count_is("AWS::EC2::PlacementGroup", 1)  # "small" opted out
    placed = [
        lt
        for lt in resources(variant, "AWS::EC2::LaunchTemplate")
        if "Placement" in lt["Properties"]["LaunchTemplateData"]
    ]
    assert len(placed) == 1


def test_launch_template_imdsv2_tags_encrypted_gp3_root(default: Template) -> None:
    default.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "MetadataOptions": {
                        "HttpTokens": "required",
                        "InstanceMetadataTags": "enabled",
                        "HttpPutResponseHopLimit": 2,
                    },
                    "BlockDeviceMappings": [
                        {
                            "DeviceName": "/dev/xvda",
                            "Ebs": {
                                "Encrypted": True,
                                "VolumeType": "gp3",
                                "VolumeSize": 200,
                                "DeleteOnTermination": True,
                            },
                        }
                    ],
                    "IamInstanceProfile": Match.any_value(),
                    "Placement": {"GroupName": Match.any_value()},
                }
            )
        },
    )


def test_user_data_downloads_bootstrap_asset_and_runs_it_with_cluster_identity(default: Template) -> None:
    [lt] = resources(default, "AWS::EC2::LaunchTemplate")
    text = joined(lt["Properties"]["LaunchTemplateData"]["UserData"])
    assert "set -euo pipefail" in text
    assert "aws s3 cp 's3://" in text and "cdk-hnb659fds-assets-" in text and ".zip" in text
    assert "python3 -m zipfile -e /opt/spot-training/bootstrap.zip /opt/spot-training/bootstrap" in text
    assert "bootstrap/user_data.sh --region " in text
    assert "--team team-a --cluster main --job-spec-parameter /spot-training/team-a/main/job-spec" in text


def test_bootstrap_asset_ships_exactly_the_tracked_scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool caches and bytecode next to the scripts (mypy, pytest, an editor) stay out of the asset nodes download.

    On a copy of the scripts (with whatever caches the real tree has) plus junk: the source tree is never written."""
    tracked = subprocess.run(
        ["git", "ls-files", "."], cwd=BOOTSTRAP_DIR, check=True, capture_output=True, text=True
    ).stdout.split()
    assert "node_agent.py" in tracked and "spot_training/checkpoint.py" in tracked
    scripts = tmp_path / "bootstrap_scripts"
    shutil.copytree(BOOTSTRAP_DIR, scripts, symlinks=True)
    junk = [scripts / ".tool_cache" / "cache.json", scripts / "spot_training" / "__pycache__" / "x.pyc"]
    for path in junk:
        path.parent.mkdir(exist_ok=True)
        path.write_text("junk")
    monkeypatch.setattr(node_bootstrap, "BOOTSTRAP_DIR", scripts)
    out = tmp_path / "cdk.out"
    synth(team_config(), outdir=str(out))
    [asset] = [p for p in out.glob("asset.*") if p.is_dir()]
    staged = sorted(str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file())
    assert staged == sorted(tracked)


def test_fixed_ami_and_root_device(variant: Template) -> None:
    variant.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "ImageId": "ami-0123456789abcdef0",
                    "BlockDeviceMappings": [Match.object_like({"DeviceName": "/dev/sda1"})],
                }
            )
        },
    )


def test_default_ami_is_the_deep_learning_ami_parameter_for_the_architecture(
    default: Template, variant: Template
) -> None:
    params = json.dumps(default.to_json()["Parameters"])
    assert (
        "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-amazon-linux-2023/latest/ami-id"
        in params
    )
    assert "/aws/service/deeplearning/ami/arm64/" in json.dumps(variant.to_json()["Parameters"])


def test_group_mixed_instances_all_spot_by_default(default: Template) -> None:
    default.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "MinSize": "0",
            "MaxSize": "2",
            "CapacityRebalance": True,
            "DesiredCapacity": Match.absent(),
            "MixedInstancesPolicy": {
                "InstancesDistribution": {
                    "OnDemandBaseCapacity": 0,
                    "OnDemandPercentageAboveBaseCapacity": 0,
                    "SpotAllocationStrategy": "price-capacity-optimized",
                },
                "LaunchTemplate": Match.object_like(
                    {"Overrides": [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g5.2xlarge"}]}
                ),
            },
            "Tags": Match.array_with(
                [
                    {"Key": "spot-training:cluster", "PropagateAtLaunch": True, "Value": "main"},
                    {"Key": "spot-training:team", "PropagateAtLaunch": True, "Value": "team-a"},
                ]
            ),
        },
    )


def test_group_drains_an_instance_it_ends_itself(default: Template, variant: Template) -> None:
    """Capacity rebalancing and a scale-in end an instance with no spot notice: the group holds it until its agent
    has saved (the agent completes the hook by its name), at most 5 minutes, with no notification role to trust."""
    for template in (default, variant):
        groups = template.find_resources("AWS::AutoScaling::AutoScalingGroup")
        hooks = [h["Properties"] for h in resources(template, "AWS::AutoScaling::LifecycleHook")]
        assert hooks == [
            {
                "AutoScalingGroupName": {"Ref": group_id},
                "LifecycleHookName": "spot-training-drain",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
                "HeartbeatTimeout": 300,
                "DefaultResult": "CONTINUE",
            }
            for group_id in groups
        ]
        roles = json.dumps(resources(template, "AWS::IAM::Role"))
        assert "autoscaling.amazonaws.com" not in roles


def test_group_on_demand_mix_from_config(variant: Template) -> None:
    variant.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "MaxSize": "3",
            "MixedInstancesPolicy": Match.object_like(
                {
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": 1,
                        "OnDemandPercentageAboveBaseCapacity": 25,
                        "SpotAllocationStrategy": "capacity-optimized",
                    }
                }
            ),
        },
    )


# ---- IAM: least privilege -------------------------------------------------------------------------------------


def policies(template: Template) -> list[dict[str, Any]]:
    return [s for p in resources(template, "AWS::IAM::Policy") for s in p["Properties"]["PolicyDocument"]["Statement"]]


def parameter_names(arns: list[Any]) -> set[str]:
    """The SSM parameter names in a statement's resource ARNs."""
    found = [re.search(r":parameter(/[^\"]+)", joined(arn)) for arn in arns]
    return {m.group(1) for m in found if m}


def test_instance_role_trusts_ec2_has_only_session_manager_channels_and_a_profile(default: Template) -> None:
    roles = default.find_resources(
        "AWS::IAM::Role",
        {"Properties": {"AssumeRolePolicyDocument": {"Statement": [{"Principal": {"Service": "ec2.amazonaws.com"}}]}}},
    )
    assert len(roles) == 1
    (role,) = roles.values()
    # Not AmazonSSMManagedInstanceCore: it grants ssm:GetParameter(s) on "*" (every team's parameters).
    assert "ManagedPolicyArns" not in role["Properties"]
    statements = [
        st
        for policy in default.find_resources("AWS::IAM::Policy").values()
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if st.get("Sid") == "SessionManagerChannels"
    ]
    assert statements == [
        {
            "Sid": "SessionManagerChannels",
            "Effect": "Allow",
            "Action": [
                "ssm:UpdateInstanceInformation",
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Resource": "*",
        }
    ]
    default.resource_count_is("AWS::IAM::InstanceProfile", 1)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def object_keys(template: Template, statement: dict[str, Any]) -> list[str]:
    """The key patterns of ``statement``'s resources if each is an object ARN of the checkpoint bucket, else []."""
    tagged = Match.array_with([{"Key": "spot-training:role", "Value": "checkpoints"}])
    [bucket] = template.find_resources("AWS::S3::Bucket", {"Properties": {"Tags": tagged}})
    keys = []
    for resource in as_list(statement["Resource"]):
        parts = resource.get("Fn::Join", ["", []])[1] if isinstance(resource, dict) else []
        if len(parts) != 2 or parts[0] != {"Fn::GetAtt": [bucket, "Arn"]} or not parts[1].startswith("/"):
            return []
        keys.append(parts[1][1:])
    return keys


def iam_matches(pattern: str, key: str) -> bool:
    """IAM's resource wildcards: ``*`` any run of characters ('/' included), ``?`` any one character."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), key) is not None


# Keys of cluster main as the node agent writes them (bootstrap_scripts/spot_training/agent/) and trainctl submit's
# archive.
CHECKPOINT_KEYS = ["main/job-1/ckpt/20/model.pt", "main/job-1/ckpt/20/spot-training-manifest.json"]
NODE_MARKER_NAMES = ("boot", "save-request", "leaving", "training", "synced", "ready", "progress", "membership")
MARKER_KEYS = [
    *(f"main/job-1/nodes/i-0123456789abcdef0/{m}" for m in NODE_MARKER_NAMES),
    "main/job-1/nodes/i-0123456789abcdef0/done",
    "main/job-1/DONE",
    "main/job-1/FAILED",
    "main/job-1/STOPPED",
    "main/job-1/NEXT",
]
CODE_KEYS = ["main/code/job-1.tar.gz", "main/code/job-20260101-000000-ab12.tar.gz"]
WRITE_ACTIONS = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:DeleteObjectVersion"}


def test_bucket_access_is_limited_to_the_cluster_prefix(default: Template) -> None:
    s3 = [s for s in policies(default) if any(a.startswith("s3:") for a in as_list(s["Action"]))]
    listing = [s for s in s3 if "s3:ListBucket" in s["Action"]]
    assert len(listing) == 1 and listing[0]["Condition"] == {"StringLike": {"s3:prefix": ["main/", "main/*"]}}
    [read] = [s for s in s3 if s["Effect"] == "Allow" and object_keys(default, s) == ["main/*"]]
    assert read["Action"] == "s3:GetObject"  # the code archives, markers and checkpoints; nothing else on main/*
    assert "Version" not in str([st["Action"] for st in s3])  # nothing on the node reads object versions
    for statement in s3:
        assert "*" not in str(statement["Action"]), "no s3 action wildcards"
        assert statement["Resource"] != "*"


def test_nodes_write_only_checkpoints_and_markers_and_delete_only_checkpoints_and_queue_entries(
    default: Template,
) -> None:
    """The training code runs with the node role: it must not delete or overwrite the code archives other jobs run,
    nor a job's markers. Writes go where the node agent writes, deletes to checkpoints (pruning) and to queue
    entries (a node hands an ended job over to the next queued one)."""
    allows = [s for s in policies(default) if s["Effect"] == "Allow"]
    writes = [s for s in allows if WRITE_ACTIONS & set(as_list(s["Action"]))]
    assert {a for s in writes for a in as_list(s["Action"])} == {
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    }
    [put] = [s for s in writes if "s3:PutObject" in as_list(s["Action"])]
    assert put["Action"] == "s3:PutObject"
    assert sorted(object_keys(default, put)) == sorted(
        ["main/*/ckpt/*", "main/*/nodes/*", "main/*/DONE", "main/*/FAILED", "main/*/STOPPED", "main/*/NEXT"]
    )
    deletes = sorted((s for s in writes if "s3:DeleteObject" in as_list(s["Action"])), key=lambda s: s["Sid"])
    [delete, take] = deletes  # checkpoints pruned; a queued job's entry deleted once a node hands over to it
    assert sorted(delete["Action"]) == ["s3:AbortMultipartUpload", "s3:DeleteObject"]
    assert object_keys(default, delete) == ["main/*/ckpt/*"]
    assert (take["Action"], object_keys(default, take)) == ("s3:DeleteObject", ["main/queue/*"])
    for key in CHECKPOINT_KEYS + MARKER_KEYS:
        assert any(iam_matches(p, key) for p in object_keys(default, put)), key
    for key in CHECKPOINT_KEYS:
        assert any(iam_matches(p, key) for p in object_keys(default, delete)), key
    for key in MARKER_KEYS:
        assert not any(iam_matches(p, key) for s in deletes for p in object_keys(default, s)), key
    assert all(object_keys(default, s) for s in writes), "every write names keys of the checkpoint bucket"
    for key in CODE_KEYS:  # no Allow of a write covers a code archive
        assert not [s for s in writes if any(iam_matches(p, key) for p in object_keys(default, s))], key
    # and whatever an Allow's "*" would match under main/code/ (main/code/x/ckpt/y), an explicit Deny refuses
    [deny] = [s for s in policies(default) if s["Effect"] == "Deny"]
    assert sorted(deny["Action"]) == ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:PutObject"]
    assert object_keys(default, deny) == ["main/code/*"]
    assert "Condition" not in deny


def agent_written_keys(cluster: str) -> list[str]:
    """Every key the node agent writes under cluster ``cluster``, built as the agent builds them: by the protocol's
    key builders, from the marker names the protocol lists (``test_the_agent_writes_only_the_protocols_keys``)."""
    job = protocol.job_prefix(protocol.cluster_prefix(cluster), "job-1")
    checkpoints = protocol.checkpoints_prefix(job)
    return [
        protocol.checkpoint_prefix(checkpoints, 20) + "model.pt",
        protocol.checkpoint_prefix(checkpoints, 20) + "sub/optim.pt",
        protocol.manifest_key(checkpoints, 20),
        *(job + protocol.node_marker("i-0123456789abcdef0", name) for name in protocol.NODE_MARKERS),
        *(job + marker for marker in (*protocol.END_MARKERS, protocol.NEXT)),
    ]


def test_every_key_the_agent_writes_is_one_the_node_role_may_write(default: Template) -> None:
    [put] = [s for s in policies(default) if s["Effect"] == "Allow" and "s3:PutObject" in as_list(s["Action"])]
    [deny] = [s for s in policies(default) if s["Effect"] == "Deny"]
    keys = agent_written_keys("main")
    assert set(keys) >= set(CHECKPOINT_KEYS + MARKER_KEYS)  # the protocol builds the keys written out above
    for key in keys:
        assert any(iam_matches(p, key) for p in object_keys(default, put)), key
        assert not any(iam_matches(p, key) for p in object_keys(default, deny)), key
    archive = protocol.code_key(protocol.cluster_prefix("main"), "job-1")
    assert archive == CODE_KEYS[0]
    assert not any(iam_matches(p, archive) for p in object_keys(default, put))
    assert all(iam_matches(p, archive) for p in object_keys(default, deny))


def test_the_agent_writes_only_the_protocols_keys() -> None:
    """Every S3 write of the node agent names its key by the protocol's names and builders, never a string of its
    own: so ``agent_written_keys`` is every key it writes. Markers go through ``Markers.put_own`` (a node marker:
    one of ``NODE_MARKERS``) and ``put_marker`` (an end marker, or a ``node_marker``)."""
    names = {name: getattr(protocol, name) for name in dir(protocol) if name.isupper()}
    node_markers = {n for n, v in names.items() if v in protocol.NODE_MARKERS}
    end_markers = {n for n, v in names.items() if v in protocol.END_MARKERS}
    writes = 0
    for path in sorted((BOOTSTRAP_DIR / "spot_training" / "agent").glob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            method, where = call.func.attr, f"{path.name}:{call.lineno}"
            keyword = {k.arg: k.value for k in call.keywords}
            key = {"put_own": call.args[1:2], "put_marker": call.args[1:2], "upload_file": call.args[2:3]}.get(
                method, [keyword["Key"]] if method == "put_object" else []
            )
            if not key:
                continue
            writes += 1
            literals = [n for n in ast.walk(key[0]) if isinstance(n, (ast.JoinedStr, ast.Constant))]
            assert not literals, f"{where}: the key is built from a string of its own"
            if path.name == "markers.py" and "name" in {n.id for n in ast.walk(key[0]) if isinstance(n, ast.Name)}:
                continue  # put_own and put_marker themselves: the callers' names are checked
            if method == "put_own":
                assert isinstance(key[0], ast.Name) and key[0].id in node_markers, where
            if method == "put_marker" and isinstance(key[0], ast.Name):
                assert key[0].id in end_markers, where
            if method == "put_marker" and isinstance(key[0], ast.Call):
                marker = key[0].args[1]
                assert ast.unparse(key[0].func) == "node_marker" and isinstance(marker, ast.Name), where
                assert marker.id in node_markers, where
    assert writes >= 10  # the scan finds the agent's writes


def test_logs_scale_and_parameters_are_scoped_to_own_resources(default: Template) -> None:
    statements = policies(default)
    cluster_tag = Match.array_with([{"Key": "spot-training:cluster", "Value": "main"}])
    [training_logs] = default.find_resources("AWS::Logs::LogGroup", {"Properties": {"Tags": cluster_tag}})
    log_writes = [s for s in statements if "logs:PutLogEvents" in s["Action"]]
    assert {"Fn::GetAtt": [training_logs, "Arn"]} in [s["Resource"] for s in log_writes]
    assert all(s["Resource"] != "*" for s in log_writes)
    [scale] = [s for s in statements if s.get("Sid") == "ScaleOwnGroup"]
    [group_id] = default.find_resources("AWS::AutoScaling::AutoScalingGroup").keys()
    assert sorted(scale["Action"]) == [
        "autoscaling:CompleteLifecycleAction",
        "autoscaling:RecordLifecycleActionHeartbeat",
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    assert joined(scale["Resource"]).endswith(
        f':autoScalingGroup:*:autoScalingGroupName/", {{"Ref": "{group_id}"}}]]}}'
    )
    [params] = [s for s in statements if s.get("Sid") == "ReadOwnJobParameters"]
    assert parameter_names(params["Resource"]) == {
        "/spot-training/team-a/main/job-spec",
        "/spot-training/team-a/main/current-job",
    }
    # the hand-over to the next queued job writes the current job's parameter, and no other
    [hand_over] = [s for s in statements if s.get("Sid") == "HandOverToQueuedJob"]
    assert hand_over["Action"] == "ssm:PutParameter"
    assert parameter_names([hand_over["Resource"]]) == {"/spot-training/team-a/main/current-job"}


def test_only_describe_actions_and_session_manager_channels_get_resource_star(
    default: Template, variant: Template
) -> None:
    for template in (default, variant):
        starred = []  # every statement with "*" among its resources ("*" or a list holding it)
        for statement in policies(template):
            resource = statement["Resource"]
            if "*" not in (resource if isinstance(resource, list) else [resource]):
                continue
            starred.append(statement.get("Sid"))
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if statement.get("Sid") == "SessionManagerChannels":
                assert actions == SESSION_MANAGER_ACTIONS
            else:
                assert all(a.split(":")[1].startswith("Describe") for a in actions), statement
        assert "SessionManagerChannels" in starred  # the channels have no resource ARN: the check above ran


# ---- CheckpointStore ------------------------------------------------------------------------------------------


def test_checkpoint_bucket_encrypted_versioned_private_retained(default: Template) -> None:
    default.has_resource(
        "AWS::S3::Bucket",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "VersioningConfiguration": {"Status": "Enabled"},
                    "BucketEncryption": {
                        "ServerSideEncryptionConfiguration": [
                            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                        ]
                    },
                    "PublicAccessBlockConfiguration": {
                        "BlockPublicAcls": True,
                        "BlockPublicPolicy": True,
                        "IgnorePublicAcls": True,
                        "RestrictPublicBuckets": True,
                    },
                    "LoggingConfiguration": Match.object_like({"LogFilePrefix": "checkpoints/"}),
                    "LifecycleConfiguration": {
                        "Rules": Match.array_with(
                            [
                                Match.object_like(
                                    {"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}, "Status": "Enabled"}
                                ),
                                Match.object_like(
                                    {
                                        "NoncurrentVersionExpiration": {"NoncurrentDays": 3},
                                        "ExpiredObjectDeleteMarker": True,
                                        "Status": "Enabled",
                                    }
                                ),
                            ]
                        )
                    },
                }
            ),
        },
    )


def test_every_bucket_denies_plain_http(default: Template) -> None:
    buckets = default.find_resources("AWS::S3::Bucket")
    denied = set()
    for policy in resources(default, "AWS::S3::BucketPolicy"):
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement.get("Condition") == {
                "Bool": {"aws:SecureTransport": "false"}
            }:
                denied.add(policy["Properties"]["Bucket"]["Ref"])
    assert denied == set(buckets)


def test_removal_policy_and_version_expiry_follow_config(variant: Template) -> None:
    variant.has_resource(
        "AWS::S3::Bucket",
        {
            "DeletionPolicy": "Delete",
            "Properties": Match.object_like(
                {
                    "VersioningConfiguration": {"Status": "Enabled"},
                    "LifecycleConfiguration": {
                        "Rules": Match.array_with(
                            [Match.object_like({"NoncurrentVersionExpiration": {"NoncurrentDays": 7}})]
                        )
                    },
                }
            ),
        },
    )


# ---- TrainingLogs, job spec, outputs ---------------------------------------------------------------------------


def test_log_groups_have_explicit_retention(default: Template) -> None:
    groups = resources(default, "AWS::Logs::LogGroup")
    assert len(groups) == 2  # training + flow logs
    assert all(g["Properties"]["RetentionInDays"] == 14 for g in groups)


def test_job_spec_parameter_carries_cluster_defaults(default: Template) -> None:
    [param] = resources(default, "AWS::SSM::Parameter")
    assert param["Properties"]["Name"] == "/spot-training/team-a/main/job-spec"
    value = joined(param["Properties"]["Value"])
    for fragment in (
        '\\"cluster\\":\\"main\\"',
        '\\"prefix\\":\\"main/\\"',
        '\\"nproc_per_node\\":1',
        '\\"min_nodes\\":1',
        '\\"max_nodes\\":2',
        '\\"interruption_grace_s\\":90',
        '\\"checkpoint_dir\\":\\"/opt/ml/checkpoints\\"',
        '\\"checkpoint_wait_for_upload\\":false',
        '\\"stall_timeout_s\\":0',  # the stall watchdog, off by default
        '\\"python\\":\\"/opt/pytorch/bin/python\\"',  # the default AMI's (PyTorch DLAMI) torch environment
    ):
        assert fragment in value, fragment
    # Unset values (no warm pool, Young/Daly interval) are left out of the JSON; the agent reads them as null.
    assert "warm_pool" not in value and "checkpoint_interval_s" not in value


@pytest.mark.parametrize(
    ("types", "job", "nproc"),
    [
        (["g5.12xlarge", "g6.12xlarge"], {}, 4),  # not 1: four GPUs billed and one trained on
        (["g5.12xlarge", "g6.12xlarge"], {"nproc_per_node": 2}, 2),  # a team's own number stays
        (["c7i.xlarge", "c6i.xlarge"], {}, 1),  # no GPU: one process
    ],
)
def test_a_node_runs_one_process_per_gpu_unless_the_team_file_says(types: list[str], job: dict, nproc: int) -> None:
    template = synth(team_config(clusters=[{**CLUSTER, "instance_types": types, "job": job}]))[1]
    [param] = resources(template, "AWS::SSM::Parameter")
    assert re.search(rf'\\"nproc_per_node\\":{nproc}[,}}]', joined(param["Properties"]["Value"]))


def test_a_team_files_stall_timeout_reaches_the_agent_and_null_is_off() -> None:
    """CDK leaves a null out of the JSON: the stack writes 0 for off, which the agent reads as off, as it does a
    missing key (tests/bootstrap/test_job_spec.py)."""
    for stall, written in ((None, "0"), (900, "900")):
        template = synth(team_config(clusters=[{**CLUSTER, "job": {"stall_timeout_s": stall}}]))[1]
        [param] = resources(template, "AWS::SSM::Parameter")
        assert re.search(rf'\\"stall_timeout_s\\":{written}[,}}]', joined(param["Properties"]["Value"]))


def test_outputs_name_bucket_group_log_group_and_job_spec(default: Template) -> None:
    outputs = default.to_json()["Outputs"]
    descriptions = {v["Description"] for v in outputs.values()}
    assert descriptions >= {
        "S3 bucket holding code and checkpoints (one prefix per cluster)",
        "Auto Scaling group of cluster main",
        "Log group of cluster main",
        "SSM parameter with the job-spec defaults of cluster main",
    }


# ---- WarmVolumePool -------------------------------------------------------------------------------------------


def test_warm_pool_volumes_from_snapshot_in_the_cluster_az(variant: Template) -> None:
    volumes = resources(variant, "AWS::EC2::Volume")
    assert len(volumes) == 3
    for volume in volumes:
        assert (volume["DeletionPolicy"], volume["UpdateReplacePolicy"]) == ("Delete", "Delete")
        props = volume["Properties"]
        assert props["SnapshotId"] == "snap-0123456789abcdef0"
        assert props["AvailabilityZone"] == "eu-west-1b"
        assert (props["Encrypted"], props["VolumeType"], props["Size"]) == (True, "gp3", 300)
        assert (props["Iops"], props["Throughput"], props["VolumeInitializationRate"]) == (6000, 500, 300)
        assert {"Key": "spot-training:warm-pool", "Value": "team-a-big"} in props["Tags"]


def test_warm_pool_volumes_are_deleted_by_default_and_kept_on_request() -> None:
    """Copies of a snapshot: a replaced or destroyed pool is deleted unless the team file says retain."""
    app = App(context=CONTEXT)
    stack = Stack(app, "Pool")
    WarmVolumePool(
        stack, "Pool", pool_name="p", size=2, snapshot_id="snap-0123456789abcdef0", availability_zones=["az"]
    )
    for volume in resources(Template.from_stack(stack), "AWS::EC2::Volume"):
        assert (volume["DeletionPolicy"], volume["UpdateReplacePolicy"]) == ("Delete", "Delete")
    for written, policy in ((None, "Delete"), ("retain", "Retain")):  # None: the team file does not say
        pool = {k: v for k, v in WARM_POOL.items() if k != "removal_policy"}
        config = team_config(
            network={"existing_vpc": EXISTING_VPC},
            clusters=[{**POOLED, "warm_pool": {**pool, **({"removal_policy": written} if written else {})}}],
        )
        volumes = resources(synth(config)[1], "AWS::EC2::Volume")
        assert [(v["DeletionPolicy"], v["UpdateReplacePolicy"]) for v in volumes] == [(policy, policy)] * 3


def test_the_group_is_deleted_before_its_pools_volumes(variant: Template) -> None:
    """DependsOn: CloudFormation deletes the group (terminating its nodes) first; a volume still attached to a
    node would fail to delete (VolumeInUse). Only the pool's cluster's group waits for it."""
    volumes = set(variant.find_resources("AWS::EC2::Volume"))
    assert len(volumes) == 3
    groups = {
        next(t["Value"] for t in g["Properties"]["Tags"] if t["Key"] == "spot-training:cluster"): g
        for g in variant.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    }
    assert volumes <= set(groups["big"].get("DependsOn", []))
    assert volumes.isdisjoint(groups["small"].get("DependsOn", []))


def test_warm_pool_claim_is_limited_by_arn_and_tags(variant: Template) -> None:
    statements = {s.get("Sid"): s for s in policies(variant)}
    volumes = statements["ClaimOwnPoolVolumes"]
    assert volumes["Action"] == ["ec2:AttachVolume", "ec2:DetachVolume"]
    assert volumes["Condition"] == {"StringEquals": {"aws:ResourceTag/spot-training:warm-pool": "team-a-big"}}
    volume_ids = set(variant.find_resources("AWS::EC2::Volume"))
    assert {r["Fn::Join"][1][-1]["Ref"] for r in volumes["Resource"]} == volume_ids, "exact volume ARNs, no wildcard"
    instances = statements["AttachToOwnClusterInstances"]
    # Cluster names repeat across teams: the team tag keeps this pool's volumes off other teams' instances.
    assert instances["Condition"] == {
        "StringEquals": {"aws:ResourceTag/spot-training:cluster": "big", "aws:ResourceTag/spot-training:team": "team-a"}
    }


def test_only_a_cluster_with_a_warm_pool_may_list_volumes(default: Template, variant: Template) -> None:
    """ec2:DescribeVolumes is on "*": a node without a pool that had it could list every volume of the account and
    region, other teams' included, so only a pool's claim policy grants it."""

    def listing(template: Template) -> list[Any]:
        return [s.get("Sid") for s in policies(template) if "ec2:DescribeVolumes" in json.dumps(s["Action"])]

    assert listing(default) == []
    assert listing(variant) == ["FindFreePoolVolumes"]  # one cluster of two has a pool


def test_the_job_spec_lists_the_pools_volumes_for_the_claim(variant: Template) -> None:
    """The agent claims only these (a retained volume of an earlier pool keeps the tag, but IAM refuses it), and
    keeps the team file's share of a claimed volume free (min_free_percent)."""
    specs = [p for p in resources(variant, "AWS::SSM::Parameter") if p["Properties"]["Name"].endswith("/big/job-spec")]
    value = joined(specs[0]["Properties"]["Value"])
    assert '\\"volumes\\":[\\"' in value
    assert '\\"min_free_percent\\":35' in value
    assert {ref for ref in set(variant.find_resources("AWS::EC2::Volume")) if f'{{"Ref": "{ref}"}}' in value} == set(
        variant.find_resources("AWS::EC2::Volume")
    )


def test_the_job_spec_holds_the_keys_the_agent_reads(variant: Template) -> None:
    """The stack writes a JobSpec (bootstrap_scripts/spot_training/job_spec.py) and the agent checks it against
    SPEC_KEYS: the written keys are those, and the warm pool's, apart from a value the team file leaves unset (CDK
    leaves a null out of the JSON: here the Young/Daly checkpoint interval)."""
    [spec] = [p for p in resources(variant, "AWS::SSM::Parameter") if p["Properties"]["Name"].endswith("/big/job-spec")]
    written = set(re.findall(r'\\"(\w+)\\":', joined(spec["Properties"]["Value"])))
    assert written == (SPEC_KEYS - {"checkpoint_interval_s"}) | {f.name for f in fields(WarmPoolSpec)}


def test_nodes_boot_the_ami_their_warm_pool_copies() -> None:
    """The pool is a copy of one AMI's root: nodes booting the DLAMI's latest (the default SSM parameter, looked up
    again at every deploy) would bind that copy's environment over a newer AMI's."""
    pool = {**WARM_POOL, "ami_id": "ami-0fedcba9876543210"}
    template = synth(team_config(clusters=[{**CLUSTER, "warm_pool": pool}]))[1]
    [launch_template] = resources(template, "AWS::EC2::LaunchTemplate")
    assert launch_template["Properties"]["LaunchTemplateData"]["ImageId"] == "ami-0fedcba9876543210"
    assert "Parameters" not in template.to_json() or not any(
        "ami" in name.lower() for name in template.to_json()["Parameters"]
    )


def pool_volumes(**warm_pool: Any) -> set[str]:
    """The logical ids of the warm pool's volumes for WARM_POOL with ``warm_pool`` changed."""
    config = team_config(
        network={"existing_vpc": EXISTING_VPC}, clusters=[{**POOLED, "warm_pool": {**WARM_POOL, **warm_pool}}]
    )
    return set(synth(config)[1].find_resources("AWS::EC2::Volume"))


def test_a_new_snapshot_initialization_rate_or_size_makes_new_volumes_iops_and_throughput_do_not() -> None:
    """CloudFormation cannot update a volume's SnapshotId, AZ or VolumeInitializationRate: the stack update fails
    ("Volume properties other than AutoEnableIO, type, size, and IOPS cannot be updated"). EBS cannot shrink a
    volume either (the update failed too), and growing one in place gives a node nothing: the copy's filesystem
    keeps the snapshot's size. New volumes (new logical ids) are created instead; IOPS and throughput stay in-place
    updates of the same volumes, and min_free_percent (the node agent's, not the volumes') keeps them too."""
    before = pool_volumes()
    assert pool_volumes(snapshot_id="snap-0fedcba9876543210").isdisjoint(before)
    assert pool_volumes(initialization_rate_mibps=200).isdisjoint(before)
    assert pool_volumes(volume_size_gib=100).isdisjoint(before)
    assert pool_volumes(iops=8000, throughput_mibps=250, min_free_percent=50) == before


@pytest.fixture(scope="module")
def drill() -> Template:
    cluster = dict(CLUSTER, interruption_drill={"percent": 50, "notice_minutes": 3})
    return synth(team_config(clusters=[cluster]))[1]


def test_no_interruption_drill_unless_asked(default: Template) -> None:
    assert resources(default, "AWS::FIS::ExperimentTemplate") == []


def test_interruption_drill_interrupts_this_clusters_spot_instances(drill: Template) -> None:
    drill.has_resource_properties(
        "AWS::FIS::ExperimentTemplate",
        {
            "Actions": {
                "SendInterruptionNotices": {
                    "ActionId": "aws:ec2:send-spot-instance-interruptions",
                    "Parameters": {"durationBeforeInterruption": "PT3M"},
                    "Targets": {"SpotInstances": "ClusterSpotInstances"},
                }
            },
            "Targets": {
                "ClusterSpotInstances": {
                    "ResourceType": "aws:ec2:spot-instance",
                    "SelectionMode": "PERCENT(50)",
                    "ResourceTags": {"spot-training:team": "team-a", "spot-training:cluster": "main"},
                    "Filters": [{"Path": "State.Name", "Values": ["running"]}],
                }
            },
            "StopConditions": [{"Source": "aws:cloudwatch:alarm", "Value": Match.any_value()}],
        },
    )
    [alarm] = resources(drill, "AWS::CloudWatch::Alarm")
    assert alarm["Properties"]["MetricName"] == "GroupInServiceInstances"
    assert (alarm["Properties"]["Threshold"], alarm["Properties"]["ComparisonOperator"]) == (1, "LessThanThreshold")
    [template] = resources(drill, "AWS::FIS::ExperimentTemplate")
    alarm_id = next(iter(drill.find_resources("AWS::CloudWatch::Alarm")))
    assert template["Properties"]["StopConditions"][0]["Value"] == {"Fn::GetAtt": [alarm_id, "Arn"]}


def test_interruption_drill_role_may_interrupt_only_this_cluster(drill: Template) -> None:
    statements = {s.get("Sid"): s for s in policies(drill)}
    interrupt = statements["InterruptThisClusterOnly"]
    assert interrupt["Action"] == "ec2:SendSpotInstanceInterruptions"
    assert interrupt["Condition"] == {
        "StringEquals": {
            "aws:ResourceTag/spot-training:team": "team-a",
            "aws:ResourceTag/spot-training:cluster": "main",
        }
    }
    roles = [r for r in resources(drill, "AWS::IAM::Role") if "fis.amazonaws.com" in json.dumps(r)]
    assert len(roles) == 1


# ---- TeamBudget -----------------------------------------------------------------------------------------------


BUDGETED_NOTIFY = ["a@example.com", "b@example.com"]
BUDGETED_NAME = budget_name("team-a", BUDGETED_NOTIFY, 75)


@pytest.fixture(scope="module")
def budgeted() -> Template:
    budget = {"usd_per_month": 1234.5, "warn_at_percent": 75, "notify": BUDGETED_NOTIFY}
    clusters = [CLUSTER, {**CLUSTER, "name": "dev", "max_nodes": 1}]
    return synth(team_config(clusters=clusters, budget=budget))[1]


def test_no_budget_unless_asked(default: Template) -> None:
    assert resources(default, "AWS::Budgets::Budget") == resources(default, "AWS::Lambda::Function") == []


def test_budget_counts_the_team_tag_and_emails_at_the_warning_share_and_at_the_limit(budgeted: Template) -> None:
    [budget] = resources(budgeted, "AWS::Budgets::Budget")
    data = budget["Properties"]["Budget"]
    assert data["BudgetName"] == BUDGETED_NAME
    assert (data["BudgetType"], data["TimeUnit"], data["BudgetLimit"]) == (
        "COST",
        "MONTHLY",
        {"Amount": 1234.5, "Unit": "USD"},
    )
    assert data["CostFilters"] == {"TagKeyValue": ["user:spot-training:team$team-a"]}
    notes = budget["Properties"]["NotificationsWithSubscribers"]
    assert sorted(n["Notification"]["Threshold"] for n in notes) == [75, 100]
    for note in notes:
        assert note["Notification"]["NotificationType"] == "ACTUAL"
        assert note["Subscribers"] == [
            {"SubscriptionType": "EMAIL", "Address": "a@example.com"},
            {"SubscriptionType": "EMAIL", "Address": "b@example.com"},
        ]


def test_a_change_to_the_budgets_emails_or_threshold_gives_it_a_new_name() -> None:
    """CloudFormation can set a budget's notifications only when it creates it: it replaces the budget to change
    them, and cannot under the same name ("the budget already exists", cloudformation-coverage-roadmap#365): the
    stack update would fail on a new email address. The name changes with them, and stays the same otherwise."""

    def name(**budget: Any) -> str:
        template = synth(team_config(clusters=[CLUSTER], budget={"usd_per_month": 100, **budget}))[1]
        [found] = resources(template, "AWS::Budgets::Budget")
        return str(found["Properties"]["Budget"]["BudgetName"])

    one = name(notify=["a@example.com"])
    assert one.startswith("spot-training-team-a.")
    assert name(notify=["a@example.com"], usd_per_month=200) == one  # the limit is updated in place
    others = {name(notify=["a@example.com", "b@example.com"]), name(notify=["a@example.com"], warn_at_percent=90)}
    assert one not in others and len(others) == 2


def test_budget_guard_runs_on_a_schedule_with_every_clusters_job_spec(budgeted: Template) -> None:
    [function] = resources(budgeted, "AWS::Lambda::Function")
    env = function["Properties"]["Environment"]["Variables"]
    assert env["JOB_SPEC_PARAMETERS"] == "/spot-training/team-a/main/job-spec,/spot-training/team-a/dev/job-spec"
    assert (env["BUDGET_NAME"], env["TEAM"], env["FORCE_AFTER_S"]) == (BUDGETED_NAME, "team-a", "900")
    assert "ReservedConcurrentExecutions" not in function["Properties"]  # fails deploys on low-quota accounts
    [rule] = resources(budgeted, "AWS::Events::Rule")
    # the defaults read the budget every 60 minutes and force a stop after 15: the guard runs every 15, or an
    # overdue stop would wait for the next hourly run
    assert rule["Properties"]["ScheduleExpression"] == "rate(15 minutes)"
    [function_id] = budgeted.find_resources("AWS::Lambda::Function").keys()
    assert rule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}


def test_budget_guard_waits_for_its_two_policies_and_not_again_for_its_role(budgeted: Template) -> None:
    """The role's GetAtt already creates it first; a DependsOn on it as well is cfn-lint W3005. Nothing references
    the role's policies: only DependsOn creates them before the function, which would run without them."""
    [function] = resources(budgeted, "AWS::Lambda::Function")
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    role_policies = [
        policy_id
        for policy_id, policy in budgeted.find_resources("AWS::IAM::Policy").items()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
    ]
    assert len(role_policies) == 2  # its own statements, and the log group's grant
    assert sorted(function["DependsOn"]) == sorted(role_policies)


def test_the_budget_guard_package_holds_the_protocol_it_imports(tmp_path: Path) -> None:
    """The guard's Lambda package is its handler and the S3 contract (``protocol.py``) at the path the handler
    imports it by; the handler imports there with nothing else of the repository at hand, as in Lambda."""
    out = tmp_path / "cdk.out"
    synth(team_config(budget={"usd_per_month": 10}), outdir=str(out))
    template = json.loads((out / "TrainingStack-team-a.template.json").read_text())
    [function] = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert function["Properties"]["Handler"] == "handler.handler"
    package = out / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert files == ["bootstrap_scripts/spot_training/protocol.py", "handler.py"]
    for name, source in PACKAGE_FILES.items():
        assert (package / name).read_bytes() == source.read_bytes()
    # As in Lambda: the package's folder and the runtime's libraries (boto3), nothing else of the repository. -S: no
    # site, so not the dev venv's .pth files either (the editable trainctl puts the checkout on the venv's path).
    libraries = sysconfig.get_paths()["purelib"]
    code = f"""import sys; sys.path.append({libraries!r}); import handler
print(handler.END_MARKERS, sys.modules[handler.listed.__module__].__file__)"""
    lambda_like = [sys.executable, "-E", "-s", "-S", "-c", code]
    imported = subprocess.run(lambda_like, cwd=package, capture_output=True, text=True, timeout=60)
    protocol = package / "bootstrap_scripts" / "spot_training" / "protocol.py"
    assert imported.stdout == f"('DONE', 'FAILED', 'STOPPED') {protocol}\n", imported.stderr


def test_budget_guard_may_touch_only_this_teams_budget_markers_and_groups(budgeted: Template) -> None:
    statements = {s.get("Sid"): s for s in policies(budgeted)}
    assert joined(statements["ReadOwnBudget"]["Resource"]).endswith(f':budget/{BUDGETED_NAME}"]]}}')
    # the guard learns whether a job ended by listing its end markers: it may read no object (checkpoints, code)
    [function] = resources(budgeted, "AWS::Lambda::Function")
    role = {"Ref": function["Properties"]["Role"]["Fn::GetAtt"][0]}
    guard = [s for p in resources(budgeted, "AWS::IAM::Policy") if role in p["Properties"]["Roles"]
             for s in p["Properties"]["PolicyDocument"]["Statement"]]  # fmt: skip
    actions = [a for s in guard for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert "s3:PutObject" in actions and not [a for a in actions if a.startswith("s3:Get")], actions
    written = {joined(r).rsplit('"', 2)[-2] for r in statements["WriteStopRequests"]["Resource"]}
    assert written == {"/main/*/STOP", "/dev/*/STOP"}  # not checkpoints or code: STOP requests only
    assert statements["WriteStopRequests"]["Action"] == "s3:PutObject"
    # listing, to tell a missing marker from a denied one (S3 answers 403 for a missing key without ListBucket)
    listing = statements["ListJobMarkers"]
    assert listing["Action"] == "s3:ListBucket"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["main/*", "dev/*"]}}
    groups = budgeted.find_resources("AWS::AutoScaling::AutoScalingGroup").keys()
    scaled = joined(statements["ScaleClusterGroups"]["Resource"])
    assert all(f'{{"Ref": "{g}"}}' in scaled for g in groups) and len(groups) == 2
    assert statements["ScaleClusterGroups"]["Action"] == "autoscaling:SetDesiredCapacity"
    assert parameter_names(statements["ReadClusterJobParameters"]["Resource"]) == {
        f"/spot-training/team-a/{c}/{p}" for c in ("main", "dev") for p in ("job-spec", "current-job")
    }


def test_an_imported_vpc_without_route_tables_synthesizes_without_a_warning() -> None:
    """No S3 endpoint, so no route table ids (the team file's rule); nothing reads them. CDK's noSubnetRouteTableId
    warning for each subnet would be noise on every synth, which reviewers learn to skip."""
    subnet = {"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "eu-west-1b"}
    vpc = {**EXISTING_VPC, "subnets": [subnet], "create_s3_endpoint": False}
    stack, template = synth(team_config(network={"existing_vpc": vpc}))
    assert template.find_resources("AWS::EC2::VPCEndpoint") == {}
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("routeTableId")) == []
    with_tables = synth(team_config(network={"existing_vpc": {**EXISTING_VPC, "create_s3_endpoint": False}}))[0]
    assert Annotations.from_stack(with_tables).find_warning("*", Match.any_value()) == []


# The longest each deploy-time value of the job spec can be: the checkpoint bucket's name (S3's limit), the region's,
# a CloudFormation-made log group name (stack name of at most 46 characters, the logical id, a 13-character suffix),
# an EBS volume id.
LONGEST_REF = {"AWS::Region": 14, "CheckpointsBucket": 63, "LogsLogGroup": 200, "Volume": 21}


def test_the_longest_job_spec_fits_its_ssm_parameter() -> None:
    """The job spec is a Standard SSM parameter (4,096 bytes at most: a longer one fails the deploy). The team file
    bounds the text it controls (JOB_SPEC_TEXT_BYTES, DATA_BUCKETS_JSON_BYTES); with that text at its bound and
    everything else at its longest (64 warm volumes, 32-character names, the largest numbers), the resolved job spec
    still fits."""
    fixed = len(DEFAULT_PYTHON) + len("/opt/ml/checkpoints")
    command = "python train.py --" + "x" * (JOB_SPEC_TEXT_BYTES - fixed - len("python train.py --"))
    job = {
        "command": command,
        "nproc_per_node": 8,  # the most GPUs of an instance type (p5.48xlarge)
        "checkpoint_interval_s": 43199.125,
        "mean_time_between_interruptions_s": MTBI_MAX_S,
        "max_restarts": 100,
        "interruption_grace_s": 119,
        "rendezvous_port": 65535,
        "stall_timeout_s": 86400,
    }
    pool = {**WARM_POOL, "size": 64}
    types = {"instance_types": ["p5.48xlarge", "p4d.24xlarge"]}
    cluster = {**POOLED, **types, "name": "c" * 32, "max_nodes": 64, "desired_nodes": 64, "warm_pool": pool, "job": job}
    # data buckets of 63 characters (S3's longest), as many as fit in DATA_BUCKETS_JSON_BYTES, and the rest in one
    buckets = [f"{i:02}" + "d" * 61 for i in range(DATA_BUCKETS_JSON_BYTES // 68)]
    rest = DATA_BUCKETS_JSON_BYTES - len(json.dumps(buckets)) - len(', ""')
    buckets.append("e" * rest)
    assert len(json.dumps(buckets)) == DATA_BUCKETS_JSON_BYTES
    config = team_config(network={"existing_vpc": EXISTING_VPC}, clusters=[cluster], data_buckets=buckets)
    [spec] = [
        r["Properties"]["Value"]
        for r in synth(config, team="t" * 32)[1].find_resources("AWS::SSM::Parameter").values()
        if "job-spec" in json.dumps(r["Properties"]["Name"])
    ]
    size = 0
    for part in spec["Fn::Join"][1]:
        if isinstance(part, str):
            size += len(part.encode())
        else:
            [kind] = [k for k in LONGEST_REF if k in part["Ref"]]
            size += LONGEST_REF[kind]
    assert json_bytes(command) + fixed == JOB_SPEC_TEXT_BYTES
    assert size <= PARAMETER_MAX_BYTES, f"{size} bytes"
