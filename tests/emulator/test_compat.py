"""The compatibility layer (emulator/cfn_compat/), item by item, against a running emulator (no CDK involved)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from emulator import EmulatedCloud
from emulator.deploy import unsupported


@pytest.fixture(scope="module")
def cloud() -> Iterator[EmulatedCloud]:
    with EmulatedCloud() as c:
        yield c


def _create_stack(cloud: EmulatedCloud, resources: dict[str, Any], outputs: dict[str, Any] | None = None) -> str:
    name = f"compat-{uuid.uuid4().hex[:8]}"
    template: dict[str, Any] = {"Resources": resources}
    if outputs:
        template["Outputs"] = outputs
    cloud.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))
    return name


def _physical_ids(cloud: EmulatedCloud, stack: str) -> dict[str, str]:
    resources = cloud.client("cloudformation").list_stack_resources(StackName=stack)["StackResourceSummaries"]
    return {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in resources}


def test_placement_group_api(cloud: EmulatedCloud) -> None:
    ec2 = cloud.client("ec2")
    ec2.create_placement_group(GroupName="pg-api-test", Strategy="spread")
    with pytest.raises(ClientError, match=r"InvalidPlacementGroup\.Duplicate"):
        ec2.create_placement_group(GroupName="pg-api-test", Strategy="spread")
    found = ec2.describe_placement_groups(Filters=[{"Name": "strategy", "Values": ["spread"]}])["PlacementGroups"]
    assert [g["GroupName"] for g in found] == ["pg-api-test"]
    ec2.delete_placement_group(GroupName="pg-api-test")
    with pytest.raises(ClientError, match=r"InvalidPlacementGroup\.Unknown"):
        ec2.describe_placement_groups(GroupNames=["pg-api-test"])


def test_placement_group_from_cloudformation_is_referenced(cloud: EmulatedCloud) -> None:
    stack = _create_stack(
        cloud,
        {
            "Pg": {"Type": "AWS::EC2::PlacementGroup", "Properties": {"Strategy": "cluster"}},
            "Lt": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {"LaunchTemplateData": {"Placement": {"GroupName": {"Ref": "Pg"}}}},
            },
        },
        outputs={"PgName": {"Value": {"Fn::GetAtt": ["Pg", "GroupName"]}}},
    )
    cfn = cloud.client("cloudformation")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in cfn.describe_stacks(StackName=stack)["Stacks"][0]["Outputs"]}
    name = _physical_ids(cloud, stack)["Pg"]
    assert outputs["PgName"] == name
    (group,) = cloud.client("ec2").describe_placement_groups(GroupNames=[name])["PlacementGroups"]
    assert group["Strategy"] == "cluster"
    cfn.delete_stack(StackName=stack)
    assert not cloud.client("ec2").describe_placement_groups(Filters=[{"Name": "group-name", "Values": [name]}])[
        "PlacementGroups"
    ]


def test_volume_keeps_snapshot_type_and_tags(cloud: EmulatedCloud) -> None:
    ec2 = cloud.client("ec2")
    source = ec2.create_volume(Size=20, AvailabilityZone="us-east-1a")
    snapshot = ec2.create_snapshot(VolumeId=source["VolumeId"])["SnapshotId"]
    stack = _create_stack(
        cloud,
        {
            "V": {
                "Type": "AWS::EC2::Volume",
                "Properties": {
                    "AvailabilityZone": "us-east-1a",
                    "SnapshotId": snapshot,
                    "Size": 50,
                    "VolumeType": "gp3",
                    "Iops": 4000,
                    "Throughput": 250,
                    "Encrypted": True,
                    "Tags": [{"Key": "pool", "Value": "p1"}],
                },
            }
        },
    )
    (volume,) = ec2.describe_volumes(VolumeIds=[_physical_ids(cloud, stack)["V"]])["Volumes"]
    assert (volume["SnapshotId"], volume["VolumeType"], volume["Iops"], volume["Throughput"]) == (
        snapshot,
        "gp3",
        4000,
        250,
    )
    assert volume["Encrypted"] is True
    assert {"Key": "pool", "Value": "p1"} in volume["Tags"]


def test_ssm_parameter_with_map_tags(cloud: EmulatedCloud) -> None:
    _create_stack(
        cloud,
        {
            "P": {
                "Type": "AWS::SSM::Parameter",
                "Properties": {"Name": "/compat/p", "Type": "String", "Value": "v", "Tags": {"team": "t1"}},
            }
        },
    )
    ssm = cloud.client("ssm")
    assert ssm.get_parameter(Name="/compat/p")["Parameter"]["Value"] == "v"
    tags = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId="/compat/p")["TagList"]
    assert tags == [{"Key": "team", "Value": "t1"}]


def test_bucket_policy_and_conditions(cloud: EmulatedCloud) -> None:
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": "s3:*",
                "Resource": [{"Fn::GetAtt": ["B", "Arn"]}, {"Fn::Join": ["", [{"Fn::GetAtt": ["B", "Arn"]}, "/*"]]}],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
            {  # an Allow whose condition the request does not meet must not deny (moto would)
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:GetObject",
                "Resource": {"Fn::Join": ["", [{"Fn::GetAtt": ["B", "Arn"]}, "/*"]]},
                "Condition": {"StringEquals": {"aws:SourceVpce": "vpce-0123"}},
            },
        ],
    }
    stack = _create_stack(
        cloud,
        {
            "B": {"Type": "AWS::S3::Bucket", "Properties": {"VersioningConfiguration": {"Status": "Enabled"}}},
            "Bp": {"Type": "AWS::S3::BucketPolicy", "Properties": {"Bucket": {"Ref": "B"}, "PolicyDocument": policy}},
        },
    )
    bucket = _physical_ids(cloud, stack)["B"]
    s3 = cloud.client("s3")
    stored = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    assert stored["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert stored["Statement"][0]["Resource"] == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    s3.put_object(Bucket=bucket, Key="k", Body=b"tls")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"tls"
    insecure = cloud.client("s3", insecure=True)
    with pytest.raises(ClientError) as denied:
        insecure.get_object(Bucket=bucket, Key="k")
    # Forbidden, not NoSuchBucket/NoSuchKey (404) nor a signature error (403 with its own code). S3 answers
    # AccessDenied; moto's bucket-policy check answers a bare 403 without a body (botocore's code: "403").
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403")
    s3.delete_bucket_policy(Bucket=bucket)  # and it was the policy's Deny: without it the same request succeeds
    assert insecure.get_object(Bucket=bucket, Key="k")["Body"].read() == b"tls"
    cloud.client("cloudformation").delete_stack(StackName=stack)


def test_failed_change_set_rolls_back_instead_of_succeeding(cloud: EmulatedCloud) -> None:
    cfn = cloud.client("cloudformation")
    template = {"Resources": {"Bad": {"Type": "AWS::EC2::Volume", "Properties": {"AvailabilityZone": "us-east-1a"}}}}
    cfn.create_change_set(
        StackName="compat-bad", ChangeSetName="cs1", ChangeSetType="CREATE", TemplateBody=json.dumps(template)
    )
    cfn.execute_change_set(StackName="compat-bad", ChangeSetName="cs1")
    stack = cfn.describe_stacks(StackName="compat-bad")["Stacks"][0]
    assert stack["StackStatus"] == "ROLLBACK_COMPLETE"
    events = cfn.describe_stack_events(StackName="compat-bad")["StackEvents"]
    assert any(e["ResourceStatus"] == "CREATE_FAILED" and "Size" in e.get("ResourceStatusReason", "") for e in events)


def test_change_set_outputs_are_published(cloud: EmulatedCloud) -> None:
    cfn = cloud.client("cloudformation")
    template = {
        "Resources": {"P": {"Type": "AWS::SSM::Parameter", "Properties": {"Type": "String", "Value": "x"}}},
        "Outputs": {"Name": {"Value": {"Ref": "P"}}},
    }
    cfn.create_change_set(
        StackName="compat-cs", ChangeSetName="cs1", ChangeSetType="CREATE", TemplateBody=json.dumps(template)
    )
    cfn.execute_change_set(StackName="compat-cs", ChangeSetName="cs1")
    stack = cfn.describe_stacks(StackName="compat-cs")["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    (output,) = stack["Outputs"]
    assert cloud.client("ssm").get_parameter(Name=output["OutputValue"])["Parameter"]["Value"] == "x"


def test_unemulated_property_is_reported(cloud: EmulatedCloud) -> None:
    offset = cloud.server_log.stat().st_size
    _create_stack(
        cloud,
        {"B": {"Type": "AWS::S3::Bucket", "Properties": {"CorsConfiguration": {"CorsRules": []}}}},
    )
    assert unsupported(cloud.server_log, offset) == {"AWS::S3::Bucket.CorsConfiguration"}


def test_attach_volume_answers_like_ec2(cloud: EmulatedCloud) -> None:
    """emulator.ebs_strict runs in the server too: a volume in use cannot be attached again."""
    ec2 = cloud.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instances = ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, Placement={"AvailabilityZone": "us-east-1a"})
    first, second = (i["InstanceId"] for i in instances["Instances"])
    volume = ec2.create_volume(Size=1, AvailabilityZone="us-east-1a")["VolumeId"]
    ec2.attach_volume(VolumeId=volume, InstanceId=first, Device="/dev/sdf")
    with pytest.raises(ClientError, match="VolumeInUse"):
        ec2.attach_volume(VolumeId=volume, InstanceId=second, Device="/dev/sdf")


def test_an_instance_from_a_launch_template_with_efa_interfaces_gets_the_primarys_groups(cloud: EmulatedCloud) -> None:
    """Item 15: the groups live on the template's interfaces (EC2 takes them in one place only); the node keeps one
    interface, in them, and no EFA interface is created (nothing ever sends traffic to one here)."""
    ec2 = cloud.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"efa-{uuid.uuid4().hex[:6]}", Description="efa", VpcId=vpc)["GroupId"]
    offset = cloud.server_log.stat().st_size
    interfaces = [
        {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card, "InterfaceType": "efa", "Groups": [sg]}
        for card in range(4)
    ]
    stack = _create_stack(
        cloud,
        {
            "Lt": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {"LaunchTemplateData": {"InstanceType": "p4d.24xlarge", "NetworkInterfaces": interfaces}},
            }
        },
    )
    assert not unsupported(cloud.server_log, offset)
    template = _physical_ids(cloud, stack)["Lt"]
    [version] = ec2.describe_launch_template_versions(LaunchTemplateId=template)["LaunchTemplateVersions"]
    assert [i["NetworkCardIndex"] for i in version["LaunchTemplateData"]["NetworkInterfaces"]] == [0, 1, 2, 3]
    [instance] = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=subnet, LaunchTemplate={"LaunchTemplateId": template}
    )["Instances"]
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [sg]
    assert len(instance["NetworkInterfaces"]) == 1


def test_fis_template_and_its_stop_alarm_reach_the_apis_and_leave_with_the_stack(cloud: EmulatedCloud) -> None:
    """Items 13 and 14: the drill's template as FIS's API shows it, its stop condition the alarm's ARN."""
    alarm = {
        "Type": "AWS::CloudWatch::Alarm",
        "Properties": {
            "ComparisonOperator": "LessThanThreshold", "EvaluationPeriods": 5, "MetricName": "GroupInServiceInstances",
            "Namespace": "AWS/AutoScaling", "Period": 60, "Statistic": "Minimum", "Threshold": 1,
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "g"}], "TreatMissingData": "notBreaching",
        },
    }  # fmt: skip
    target = {
        "ResourceType": "aws:ec2:spot-instance", "SelectionMode": "PERCENT(50)",
        "ResourceTags": {"spot-training:cluster": "main"}, "Filters": [{"Path": "State.Name", "Values": ["running"]}],
    }  # fmt: skip
    template = {
        "Type": "AWS::FIS::ExperimentTemplate",
        "Properties": {
            "Description": "drill",
            "RoleArn": "arn:aws:iam::123456789012:role/fis",
            "StopConditions": [{"Source": "aws:cloudwatch:alarm", "Value": {"Fn::GetAtt": ["StopAlarm", "Arn"]}}],
            "Targets": {"Spot": target},
            "Actions": {
                "Notices": {
                    "ActionId": "aws:ec2:send-spot-instance-interruptions",
                    "Parameters": {"durationBeforeInterruption": "PT3M"},
                    "Targets": {"SpotInstances": "Spot"},
                }
            },
            "Tags": {"spot-training:team": "t"},
        },
    }
    stack = _create_stack(
        cloud, {"StopAlarm": alarm, "Drill": template}, {"Drill": {"Value": {"Fn::GetAtt": ["Drill", "Id"]}}}
    )
    ids = _physical_ids(cloud, stack)
    [output] = cloud.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]["Outputs"]
    assert output["OutputValue"] == ids["Drill"]
    fis = cloud.client("fis")
    found = fis.get_experiment_template(id=ids["Drill"])["experimentTemplate"]
    [described] = cloud.client("cloudwatch").describe_alarms(AlarmNames=[ids["StopAlarm"]])["MetricAlarms"]
    assert found["stopConditions"] == [{"source": "aws:cloudwatch:alarm", "value": described["AlarmArn"]}]
    assert found["targets"]["Spot"]["resourceTags"] == {"spot-training:cluster": "main"}
    assert found["targets"]["Spot"]["filters"] == [{"path": "State.Name", "values": ["running"]}]
    assert found["actions"]["Notices"]["parameters"] == {"durationBeforeInterruption": "PT3M"}
    assert found["tags"] == {"spot-training:team": "t"}
    assert described["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": "g"}]
    cloud.client("cloudformation").delete_stack(StackName=stack)
    with pytest.raises(ClientError, match="ResourceNotFound"):
        fis.get_experiment_template(id=ids["Drill"])
    assert cloud.client("cloudwatch").describe_alarms(AlarmNames=[ids["StopAlarm"]])["MetricAlarms"] == []
