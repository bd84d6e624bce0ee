"""The job's secrets on a node: read from SSM (decrypted) and Secrets Manager; a read that fails names the variable
and the secret, never a value."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from spot_training.agent.errors import AgentError
from spot_training.agent.job_secrets import read_secrets

from .conftest import REGION, TEAM, Clients


def _secretsmanager(aws: Clients) -> Any:
    return boto3.session.Session(region_name=REGION).client("secretsmanager", endpoint_url=aws.endpoint)


def _names() -> tuple[str, str]:
    unique = uuid.uuid4().hex[:8]
    return f"/spot-training-secrets/{TEAM}/{unique}/token", f"spot-training-secrets/{TEAM}/{unique}/db"


def test_values_come_from_ssm_securestrings_and_secrets_manager(aws: Clients) -> None:
    parameter, secret = _names()
    aws.ssm.put_parameter(Name=parameter, Value="tok-123", Type="SecureString")
    secretsmanager = _secretsmanager(aws)
    secretsmanager.create_secret(Name=secret, SecretString="pw-456")
    values = read_secrets(aws.ssm, secretsmanager, {"HF_TOKEN": f"ssm:{parameter}", "DB": f"secretsmanager:{secret}"})
    assert values == {"HF_TOKEN": "tok-123", "DB": "pw-456"}


@pytest.mark.parametrize("kind", ["ssm", "secretsmanager"])
def test_a_missing_secret_fails_in_one_line_naming_it(aws: Clients, kind: str) -> None:
    parameter, secret = _names()
    source = f"ssm:{parameter}" if kind == "ssm" else f"secretsmanager:{secret}"
    secretsmanager = _secretsmanager(aws)
    with pytest.raises(AgentError) as raised:
        read_secrets(aws.ssm, secretsmanager, {"TOKEN": source})
    code = "ParameterNotFound" if kind == "ssm" else "ResourceNotFoundException"
    assert str(raised.value) == f"secret TOKEN ({source}) cannot be read: {code}"


def test_a_binary_secret_is_refused_without_its_value(aws: Clients) -> None:
    _, secret = _names()
    secretsmanager = _secretsmanager(aws)
    secretsmanager.create_secret(Name=secret, SecretBinary=b"raw-bytes-789")
    with pytest.raises(AgentError) as raised:
        read_secrets(aws.ssm, secretsmanager, {"KEY": f"secretsmanager:{secret}"})
    assert "raw-bytes-789" not in str(raised.value)
    assert str(raised.value).endswith("a binary secret; only string secrets can go in an environment variable")


def test_an_access_denied_names_the_code_not_the_message() -> None:
    class Denied:
        def get_parameter(self, **_: Any) -> Any:
            raise ClientError(
                {"Error": {"Code": "AccessDeniedException", "Message": "value s3cr3t not allowed"}}, "GetParameter"
            )

    with pytest.raises(AgentError) as raised:
        read_secrets(Denied(), None, {"TOKEN": "ssm:/spot-training-secrets/team-a/x"})
    assert (
        str(raised.value) == "secret TOKEN (ssm:/spot-training-secrets/team-a/x) cannot be read: AccessDeniedException"
    )
