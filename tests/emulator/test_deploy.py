"""The real CDK CLI bootstraps and deploys the real TrainingStack into the emulator; the AWS APIs show what it made.

One deploy per module (~30-60 s here). Every assertion reads the emulated cloud through boto3, never the
template: a compat layer that dropped a property would fail here.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from emulator import EmulatedCloud
from emulator.deploy import bootstrap, deploy
from team_config import load_team

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STACK = "TrainingStack"


@dataclass
class Deployed:
    cloud: EmulatedCloud
    outputs: dict[str, str]
    bootstrap_s: float
    deploy_s: float

    def client(self, service: str) -> Any:
        return self.cloud.client(service)


@pytest.fixture(scope="module")
def config() -> Any:
    return load_team(REPO / "teams" / "default.yaml").config


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    run_dir = tmp_path_factory.mktemp("emulator-run")
    with EmulatedCloud(run_dir=run_dir) as cloud:
        bootstrap_s = bootstrap(cloud)
        started = time.monotonic()
        outputs = deploy(cloud, STACK)
        deploy_s = time.monotonic() - started
        (run_dir / "durations.json").write_text(json.dumps({"bootstrap_s": bootstrap_s, "deploy_s": deploy_s}))
        print(f"\nemulator run dir {run_dir}: cdk bootstrap {bootstrap_s:.1f} s, cdk deploy {deploy_s:.1f} s")
        yield Deployed(cloud, outputs, bootstrap_s, deploy_s)


@pytest.fixture(scope="module")
def group(deployed: Deployed, config: Any) -> dict[str, Any]:
    name = deployed.outputs[f"GroupName{config.clusters[0].name}"]
    groups = deployed.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    assert len(groups["AutoScalingGroups"]) == 1
    return dict(groups["AutoScalingGroups"][0])


@pytest.fixture(scope="module")
def launch_template_data(deployed: Deployed, group: dict[str, Any]) -> dict[str, Any]:
    spec = group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
    versions = deployed.client("ec2").describe_launch_template_versions(
        LaunchTemplateId=spec["LaunchTemplateId"], Versions=[spec["Version"]]
    )["LaunchTemplateVersions"]
    assert len(versions) == 1
    return dict(versions[0]["LaunchTemplateData"])


def test_stack_outputs_present(deployed: Deployed, config: Any) -> None:
    expected = {"CheckpointBucketName"}
    for cluster in config.clusters:
        expected |= {f"GroupName{cluster.name}", f"LogGroupName{cluster.name}", f"JobSpecParameter{cluster.name}"}
    assert expected <= set(deployed.outputs)
    assert all(deployed.outputs[k] for k in expected)
    stack = deployed.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE"


def test_placement_group_is_cluster_and_used_by_launch_template(
    deployed: Deployed, launch_template_data: dict[str, Any]
) -> None:
    name = launch_template_data["Placement"]["GroupName"]
    groups = deployed.client("ec2").describe_placement_groups(GroupNames=[name])["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"], g["State"]) for g in groups] == [(name, "cluster", "available")]


def test_launch_template_metadata_and_root_volume(deployed: Deployed, launch_template_data: dict[str, Any]) -> None:
    md = launch_template_data["MetadataOptions"]
    assert md["HttpTokens"] == "required"
    assert md["InstanceMetadataTags"] == "enabled"
    roots = [b for b in launch_template_data["BlockDeviceMappings"] if b["DeviceName"] == "/dev/xvda"]
    assert len(roots) == 1
    ebs = roots[0]["Ebs"]
    assert ebs["Encrypted"] is True
    assert ebs["VolumeType"] == "gp3"
    assert launch_template_data["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::123456789012:instance-profile/")
    assert launch_template_data["SecurityGroupIds"]


def test_launch_template_image_is_the_seeded_public_parameter(
    deployed: Deployed, launch_template_data: dict[str, Any]
) -> None:
    parameter = (
        "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-amazon-linux-2023/latest/ami-id"
    )
    ami = deployed.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    assert launch_template_data["ImageId"] == ami
    assert deployed.client("ec2").describe_images(ImageIds=[ami])["Images"][0]["ImageId"] == ami


def test_user_data_downloads_the_uploaded_bootstrap_asset(
    deployed: Deployed, launch_template_data: dict[str, Any]
) -> None:
    user_data = base64.b64decode(launch_template_data["UserData"]).decode()
    assert user_data.startswith("#!/bin/bash")
    match = re.search(r"aws s3 cp '?s3://([^/\s']+)/([^\s']+\.zip)'?", user_data)
    assert match, user_data
    bucket, key = match.groups()
    assert bucket == "cdk-hnb659fds-assets-123456789012-us-east-1"
    # The CLI really published the asset: the object the node will download exists.
    head = deployed.client("s3").head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] > 0
    assert "--job-spec-parameter /spot-training/default/main/job-spec" in user_data


def test_checkpoint_bucket_settings(deployed: Deployed) -> None:
    s3 = deployed.client("s3")
    bucket = deployed.outputs["CheckpointBucketName"]
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    pab = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert pab == {
        k: True for k in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
    }
    lifecycle = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert any(
        r["Status"] == "Enabled" and r.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation") == 1
        for r in lifecycle
    )
    assert any("NoncurrentVersionExpiration" in r for r in lifecycle)
    logging = s3.get_bucket_logging(Bucket=bucket)["LoggingEnabled"]
    assert logging["TargetPrefix"] == "checkpoints/"
    s3.head_bucket(Bucket=logging["TargetBucket"])
    ownership = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert ownership == [{"ObjectOwnership": "BucketOwnerEnforced"}]


def test_checkpoint_bucket_policy_denies_non_tls(deployed: Deployed) -> None:
    bucket = deployed.outputs["CheckpointBucketName"]
    policy = json.loads(deployed.client("s3").get_bucket_policy(Bucket=bucket)["Policy"])
    denies = [
        s
        for s in policy["Statement"]
        if s["Effect"] == "Deny"
        and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        and s["Action"] in ("s3:*", ["s3:*"])
    ]
    assert len(denies) == 1
    assert f"arn:aws:s3:::{bucket}/*" in denies[0]["Resource"]


def test_tls_only_policy_is_enforced(deployed: Deployed) -> None:
    bucket = deployed.outputs["CheckpointBucketName"]
    deployed.client("s3").put_object(Bucket=bucket, Key="main/probe.txt", Body=b"over TLS")
    insecure = deployed.cloud.client("s3", insecure=True)
    # Forbidden by the policy, not NoSuchBucket/NoSuchKey (404) nor a signature error (403 with its own code). S3
    # answers AccessDenied; moto's bucket-policy check answers a bare 403 without a body (botocore's code: "403").
    with pytest.raises(ClientError) as denied:
        insecure.put_object(Bucket=bucket, Key="main/probe-plain.txt", Body=b"over plain HTTP")
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403")
    with pytest.raises(ClientError) as denied:
        insecure.get_object(Bucket=bucket, Key="main/probe.txt")
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403")
    assert deployed.client("s3").get_object(Bucket=bucket, Key="main/probe.txt")["Body"].read() == b"over TLS"


def test_group_is_spot_mixed_instances_with_capacity_rebalance(group: dict[str, Any], config: Any) -> None:
    cluster = config.clusters[0]
    assert group["MinSize"] == 0
    assert group["MaxSize"] == cluster.max_nodes
    assert group["CapacityRebalance"] is True
    policy = group["MixedInstancesPolicy"]
    assert [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]] == list(cluster.instance_types)
    distribution = policy["InstancesDistribution"]
    assert distribution["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert distribution["OnDemandBaseCapacity"] == 0
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert {m["Metric"] for m in group["EnabledMetrics"]} >= {"GroupDesiredCapacity", "GroupInServiceInstances"}
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags["spot-training:cluster"] == cluster.name


def test_group_subnet_is_in_the_stack_vpc(deployed: Deployed, group: dict[str, Any]) -> None:
    ec2 = deployed.client("ec2")
    subnets = ec2.describe_subnets(SubnetIds=group["VPCZoneIdentifier"].split(","))["Subnets"]
    vpc_ids = {s["VpcId"] for s in subnets}
    assert len(vpc_ids) == 1
    endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": list(vpc_ids)}])["VpcEndpoints"]
    assert any(e["ServiceName"].endswith(".s3") for e in endpoints)


def test_security_group_allows_only_node_to_node(deployed: Deployed, launch_template_data: dict[str, Any]) -> None:
    (sg_id,) = launch_template_data["SecurityGroupIds"]
    rules = deployed.client("ec2").describe_security_group_rules(Filters=[{"Name": "group-id", "Values": [sg_id]}])
    ingress = [r for r in rules["SecurityGroupRules"] if not r["IsEgress"]]
    assert ingress
    assert all(r.get("ReferencedGroupInfo", {}).get("GroupId") == sg_id for r in ingress)
    assert not any(r.get("CidrIpv4") for r in ingress)


def test_job_spec_parameter_is_valid_json(deployed: Deployed, config: Any) -> None:
    cluster = config.clusters[0]
    name = deployed.outputs[f"JobSpecParameter{cluster.name}"]
    spec = json.loads(deployed.client("ssm").get_parameter(Name=name)["Parameter"]["Value"])
    assert spec["cluster"] == cluster.name
    assert spec["team"] == "default"
    assert spec["region"] == "us-east-1"
    assert spec["bucket"] == deployed.outputs["CheckpointBucketName"]
    assert spec["log_group"] == deployed.outputs[f"LogGroupName{cluster.name}"]
    assert spec["max_nodes"] == cluster.max_nodes
    tags = deployed.client("ssm").list_tags_for_resource(ResourceType="Parameter", ResourceId=name)["TagList"]
    assert {"Key": "spot-training:team", "Value": "default"} in tags


def test_log_group_has_retention(deployed: Deployed, config: Any) -> None:
    name = deployed.outputs[f"LogGroupName{config.clusters[0].name}"]
    groups = deployed.client("logs").describe_log_groups(logGroupNamePrefix=name)["logGroups"]
    assert [g.get("retentionInDays") for g in groups if g["logGroupName"] == name] == [config.log_retention_days]


def test_cdk_bootstrap_stack_is_complete(deployed: Deployed) -> None:
    cfn = deployed.client("cloudformation")
    stack = cfn.describe_stacks(StackName="CDKToolkit")["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    assert outputs["BucketName"] == "cdk-hnb659fds-assets-123456789012-us-east-1"
    policy = json.loads(deployed.client("s3").get_bucket_policy(Bucket=outputs["BucketName"])["Policy"])
    assert any(s["Effect"] == "Deny" for s in policy["Statement"])
    version = deployed.client("ssm").get_parameter(Name="/cdk-bootstrap/hnb659fds/version")["Parameter"]["Value"]
    assert int(version) >= 6
