"""``python -m emulator``'s errors, the emulated cloud's settings (run directory, moto config) and the CDK CLI's
environment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import ssl
import subprocess
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.parsers import ResponseParserError

import emulator.__main__ as cli
from emulator import EmulatedCloud
from emulator.cloud import EmulatorError
from emulator.demo import JobEvent, summarize
from emulator.deploy import cdk_env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    """Started from another working directory with a relative run directory."""
    base = tmp_path_factory.mktemp("cli")
    with contextlib.chdir(base):
        c = EmulatedCloud(run_dir=Path("relative-run")).start()
    try:
        yield c
    finally:
        c.stop()


def test_a_relative_run_dir_is_made_absolute(cloud: EmulatedCloud) -> None:
    """Before, the server (working directory: the repository) could not find its TLS files."""
    assert cloud.run_dir is not None and cloud.run_dir.is_absolute() and cloud.run_dir.name == "relative-run"
    assert cloud.ca_bundle.is_file()
    assert cloud.client("sts").get_caller_identity()["Account"] == cloud.account_id


def test_moto_runs_lambda_and_batch_without_docker(cloud: EmulatedCloud) -> None:
    """An invoke answers from moto's Docker-less Lambda backend (moto's default would run the function in Docker)."""
    context = ssl.create_default_context(cafile=str(cloud.ca_bundle))
    with urllib.request.urlopen(f"{cloud.endpoint_url}/moto-api/config", context=context, timeout=30) as response:
        config = json.loads(response.read().decode())
    assert config["lambda"]["use_docker"] is False and config["batch"]["use_docker"] is False
    role = cloud.client("iam").create_role(
        RoleName="cli-test-lambda",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("index.py", "def handler(event, context):\n    return event\n")
    awslambda = cloud.client("lambda")
    awslambda.create_function(
        FunctionName="cli-test",
        Runtime="python3.11",
        Role=role,
        Handler="index.handler",
        Code={"ZipFile": code.getvalue()},
    )
    answer = awslambda.invoke(FunctionName="cli-test", Payload=b'{"ping": 1}')
    assert answer["StatusCode"] == 200 and "FunctionError" not in answer
    assert json.loads(answer["Payload"].read()) == {"ping": 1}


@pytest.mark.parametrize(
    "error",
    [
        ClientError({"Error": {"Code": "ValidationError", "Message": "no such\nstack"}}, "DescribeStacks"),
        EndpointConnectionError(endpoint_url="https://localhost:1"),
        ResponseParserError("Unable to parse response, invalid XML received:\nb'<!doctype html>\\n'"),
    ],
    ids=["client-error", "botocore-error", "500-page"],
)
def test_an_aws_error_is_one_line_and_exit_code_1(
    error: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def up(*args: Any, **kwargs: Any) -> int:
        raise error

    monkeypatch.setattr(cli, "up", up)
    assert cli.main(["up", "--no-wait", "--run-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_a_summary_without_a_replacement_is_an_emulator_error() -> None:
    """Before, ``next()`` raised StopIteration (a traceback from ``python -m emulator demo``)."""
    run = SimpleNamespace(
        client=None,
        ref=None,
        job_id="job",
        events=[JobEvent("power-off", "i-0123", 100.0)],
        launcher=SimpleNamespace(nodes={}, all_nodes=list),
        log_events=lambda: [],
    )
    with pytest.raises(EmulatorError, match="no node booted after the power-off to i-0123"):
        summarize(cast(Any, run))


def test_npm_never_checks_for_updates_in_the_cdk_cli_environment() -> None:
    env = cdk_env(cast(EmulatedCloud, SimpleNamespace(client_env=lambda: dict(os.environ))))
    assert env["NPM_CONFIG_UPDATE_NOTIFIER"] == "false"
    found = subprocess.run(
        ["npm", "config", "get", "update-notifier"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0 and found.stdout.strip() == "false", found.stderr
