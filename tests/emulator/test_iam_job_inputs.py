"""A job's secrets and data inputs under moto's IAM enforcement: with its node role's credentials, a node reads its
team's secrets (an SSM SecureString parameter under ``/spot-training-secrets/<team>/``, a Secrets Manager secret
named ``spot-training-secrets/<team>/...``) and the data buckets its team file lists, and is denied another team's
secrets, secrets outside any team's prefix and an unlisted bucket.

The real CDK CLI deploys team ``alpha`` (``data_buckets: [alpha-listed-data]``); the node role is found the way a
node gets it (group -> launch template -> instance profile -> role) and assumed through STS before enforcement goes
on. moto checks S3 requests on the bucket/object ARN itself; SSM ``GetParameter`` and Secrets Manager
``GetSecretValue`` on the parameter's and secret's ARN through emulator/iam_resources.py. Not evaluated by moto:
condition keys and KMS (a SecureString decrypts without a key policy check); see tests/emulator/test_isolation.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import boto3
import pytest
import yaml

from bootstrap_scripts.spot_training.job_parts import secret_prefix
from emulator import EmulatedCloud
from emulator.deploy import bootstrap, deploy
from tests.emulator.test_iam_job import instance_role
from tests.emulator.test_isolation import assert_denied
from trainctl import jobs

pytestmark = pytest.mark.slow

TEAM, CLUSTER = "alpha", "main"
LISTED, UNLISTED = "alpha-listed-data", "alpha-unlisted-data"
OWN = f"{secret_prefix(TEAM)}hf-token"  # spot-training-secrets/alpha/hf-token
# Not the team's: another team's, a team whose name starts with the team's, outside every team's prefix.
FOREIGN = [f"{secret_prefix('beta')}hf-token", f"{secret_prefix('alphabet')}hf-token", "alpha/hf-token"]


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("iam-job-inputs"), iam_enforcement=True) as c:
        yield c


def plant(cloud: EmulatedCloud) -> None:
    """The buckets and their objects, and each secret as a SecureString parameter and as a secret, valued by name."""
    s3, ssm, secrets = cloud.client("s3"), cloud.client("ssm"), cloud.client("secretsmanager")
    for bucket in (LISTED, UNLISTED):
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="train/part-0", Body=bucket.encode())
    for name in (OWN, *FOREIGN):
        ssm.put_parameter(Name=f"/{name}", Value=name, Type="SecureString")
        secrets.create_secret(Name=name, SecretString=name)


@pytest.fixture(scope="module")
def node(cloud: EmulatedCloud, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A boto3 session with the node role's credentials, enforcement on."""
    teams_dir = tmp_path_factory.mktemp("teams")
    cluster = {"name": CLUSTER, "instance_types": ["g5.xlarge", "g5.2xlarge"], "max_nodes": 1}
    (teams_dir / f"{TEAM}.yaml").write_text(yaml.safe_dump({"data_buckets": [LISTED], "clusters": [cluster]}))
    bootstrap(cloud)
    deploy(cloud, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams_dir)})
    plant(cloud)
    role = cloud.client("iam").get_role(RoleName=instance_role(cloud, jobs.find_cluster(cloud.client, TEAM, CLUSTER)))
    creds = cloud.client("sts").assume_role(RoleArn=role["Role"]["Arn"], RoleSessionName="node")["Credentials"]
    session = boto3.session.Session(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        region_name=cloud.region,
    )
    cloud.enforce_iam(True)
    try:
        yield lambda service: session.client(service, endpoint_url=cloud.endpoint_url, verify=str(cloud.ca_bundle))
    finally:
        cloud.enforce_iam(False)


def test_enforcement_is_on(node: Any) -> None:
    assert_denied(lambda: node("s3").list_buckets())


def test_the_teams_own_secret_parameter_is_read_and_decrypted_others_are_denied(node: Any) -> None:
    ssm = node("ssm")
    assert ssm.get_parameter(Name=f"/{OWN}", WithDecryption=True)["Parameter"]["Value"] == OWN
    for name in FOREIGN:
        assert_denied(partial(ssm.get_parameter, Name=f"/{name}", WithDecryption=True))


def test_the_teams_own_secret_is_read_others_are_denied(node: Any) -> None:
    secrets = node("secretsmanager")
    assert secrets.get_secret_value(SecretId=OWN)["SecretString"] == OWN
    for name in FOREIGN:
        assert_denied(partial(secrets.get_secret_value, SecretId=name))


def test_a_listed_data_bucket_is_read_and_listed_an_unlisted_one_is_denied(node: Any) -> None:
    s3 = node("s3")
    assert s3.get_object(Bucket=LISTED, Key="train/part-0")["Body"].read() == LISTED.encode()
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=LISTED, Prefix="train/")["Contents"]] == ["train/part-0"]
    assert_denied(lambda: s3.get_object(Bucket=UNLISTED, Key="train/part-0"))
    assert_denied(lambda: s3.list_objects_v2(Bucket=UNLISTED, Prefix="train/"))
    assert_denied(lambda: s3.put_object(Bucket=LISTED, Key="train/planted", Body=b"x"))  # read-only
