"""The node role's grants for a job's secrets and data inputs (JobInputsPolicy), and the data buckets the job spec
lists: asserted on the synthesized template, against the names a job may and may not read."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk.assertions import Template

from compliance.spot_training.arns import render
from team_config import TeamConfig
from tests.synth import CLUSTER, resources, synth, team_config

DATA_BUCKETS = ["team-a-datasets", "corpus.example.com"]
OWN_PARAMETER = "/spot-training-secrets/team-a/hf-token"
OWN_SECRET = "spot-training-secrets/team-a/wandb-AbCdEf"  # Secrets Manager appends a random suffix to the ARN
# Names a job of team-a must not read: another team's secrets, a look-alike team name, a cluster's own parameters.
FOREIGN_PARAMETERS = [
    "/spot-training-secrets/team-b/hf-token",
    "/spot-training-secrets/team-ab/hf-token",
    "/spot-training/team-a/main/job-spec",
    "/team-a/hf-token",
]
FOREIGN_SECRETS = ["spot-training-secrets/team-b/wandb-AbCdEf", "spot-training-secrets/team-ab/x-AbCdEf", "wandb-Ab"]
PARTITION_ARN = "arn:<ref>:{service}:<ref>:<ref>:{resource}"


@pytest.fixture(scope="module")
def with_data() -> Template:
    return synth(team_config(data_buckets=DATA_BUCKETS, clusters=[CLUSTER, {**CLUSTER, "name": "other"}]))[1]


@pytest.fixture(scope="module")
def without_data() -> Template:
    return synth(team_config())[1]


def node_statements(template: Template) -> list[dict[str, Any]]:
    """The Allow statements of every policy attached to a node role (the role that EC2 assumes)."""
    roles = template.find_resources(
        "AWS::IAM::Role",
        {"Properties": {"AssumeRolePolicyDocument": {"Statement": [{"Principal": {"Service": "ec2.amazonaws.com"}}]}}},
    )
    return [
        statement
        for policy in resources(template, "AWS::IAM::Policy")
        if {r.get("Ref") for r in policy["Properties"].get("Roles", [])} & set(roles)
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Effect"] == "Allow"
    ]


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def iam_matches(pattern: str, arn: str) -> bool:
    """IAM's resource wildcards: ``*`` any run of characters, ``?`` any one character."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), arn) is not None


def reaches(statements: list[dict[str, Any]], action: str, arn: str) -> bool:
    """Whether any statement allows ``action`` (exactly, or by an action wildcard) on ``arn``."""
    return any(
        any(iam_matches(a, action) for a in listed(s["Action"]))
        and any(iam_matches(render(r), arn) for r in listed(s["Resource"]))
        for s in statements
    )


def parameter_arn(name: str) -> str:
    return PARTITION_ARN.format(service="ssm", resource=f"parameter{name}")


def secret_arn(name: str) -> str:
    return PARTITION_ARN.format(service="secretsmanager", resource=f"secret:{name}")


def test_nodes_read_their_own_teams_secrets_and_no_one_elses(with_data: Template) -> None:
    statements = node_statements(with_data)
    for action in ("ssm:GetParameter", "ssm:GetParameters"):
        assert reaches(statements, action, parameter_arn(OWN_PARAMETER))
        for name in FOREIGN_PARAMETERS:
            if name.startswith("/spot-training/team-a/main/"):
                continue  # the cluster's own job parameters: ReadOwnJobParameters (tests/test_constructs.py)
            assert not reaches(statements, action, parameter_arn(name)), name
    assert reaches(statements, "secretsmanager:GetSecretValue", secret_arn(OWN_SECRET))
    for name in FOREIGN_SECRETS:
        assert not reaches(statements, "secretsmanager:GetSecretValue", secret_arn(name)), name
    secret_reads = [s for s in statements if "secretsmanager" in json.dumps(s["Action"])]
    assert [s["Action"] for s in secret_reads] == ["secretsmanager:GetSecretValue"] * 2  # one per cluster


def test_the_secret_grant_is_the_same_without_data_buckets(without_data: Template) -> None:
    statements = node_statements(without_data)
    assert reaches(statements, "ssm:GetParameter", parameter_arn(OWN_PARAMETER))
    assert reaches(statements, "secretsmanager:GetSecretValue", secret_arn(OWN_SECRET))
    assert not reaches(statements, "ssm:GetParameter", parameter_arn("/spot-training-secrets/team-b/hf-token"))


def test_no_kms_grant_the_aws_managed_keys_need_none(with_data: Template) -> None:
    """aws/ssm's and aws/secretsmanager's key policies let the account's principals decrypt through the service: a
    kms:Decrypt grant could only name every key of the account (key ids are unknown at synth)."""
    assert not [s for s in node_statements(with_data) if "kms:" in json.dumps(s["Action"])]


def test_nodes_get_and_list_exactly_the_listed_data_buckets(with_data: Template) -> None:
    statements = node_statements(with_data)
    for bucket in DATA_BUCKETS:
        assert reaches(statements, "s3:ListBucket", f"arn:<ref>:s3:::{bucket}")
        assert reaches(statements, "s3:GetObject", f"arn:<ref>:s3:::{bucket}/train/part-0.tar")
        assert not reaches(statements, "s3:PutObject", f"arn:<ref>:s3:::{bucket}/train/part-0.tar")
        assert not reaches(statements, "s3:DeleteObject", f"arn:<ref>:s3:::{bucket}/train/part-0.tar")
    for unlisted in ("team-b-datasets", "team-a-datasets-2", "corpus-example-com"):
        assert not reaches(statements, "s3:ListBucket", f"arn:<ref>:s3:::{unlisted}"), unlisted
        assert not reaches(statements, "s3:GetObject", f"arn:<ref>:s3:::{unlisted}/x"), unlisted
    # every S3 resource written out by name is a listed bucket (the checkpoint bucket's and CDK's asset bucket's
    # names hold references)
    named = {
        m.group(1)
        for s in statements
        for r in listed(s["Resource"])
        if (m := re.match(r"arn:<ref>:s3:::([^/<]+)(/|$)", render(r)))
    }
    assert named == set(DATA_BUCKETS)


def test_no_data_bucket_grant_without_data_buckets(without_data: Template) -> None:
    statements = node_statements(without_data)
    assert not [s for s in statements if re.search(r"s3:::[a-z0-9]", json.dumps(s["Resource"]))]


def job_spec(template: Template) -> dict[str, Any]:
    [param] = [r for r in resources(template, "AWS::SSM::Parameter") if "job-spec" in r["Properties"]["Name"]][:1]
    value = param["Properties"]["Value"]
    text = "".join(p if isinstance(p, str) else "<ref>" for p in value["Fn::Join"][1])
    return dict(json.loads(text))


def test_the_job_spec_lists_the_data_buckets(with_data: Template, without_data: Template) -> None:
    assert job_spec(with_data)["data_buckets"] == DATA_BUCKETS
    assert job_spec(without_data)["data_buckets"] == []


def test_a_team_file_without_data_buckets_reads_none() -> None:
    assert TeamConfig.model_validate({"clusters": [CLUSTER]}).data_buckets == []
