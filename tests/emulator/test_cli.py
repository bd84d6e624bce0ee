"""``python -m emulator``'s errors, the emulated cloud's settings (run directory, moto config) and the CDK CLI's
environment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import ssl
import subprocess
import threading
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
from emulator.cloud import SERVER_PID_FILE, EmulatorError
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
    """A relative run directory is made absolute: the server's working directory is the repository, from where a
    relative one would not lead to its TLS files."""
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
    """A bare ``next()`` would raise StopIteration here (a traceback from ``python -m emulator demo``)."""
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "1"], "argument --epochs: 1 is below 3"),  # the demo interrupts after step 40; 21 per epoch
        (["--epochs", "two"], "argument --epochs: 'two' is not a whole number"),
        (["--checkpoint-interval-s", "0.5"], "argument --checkpoint-interval-s: 0.5 is below 1"),  # the agent's bound
        (["--step-sleep-s", "-1"], "argument --step-sleep-s: -1 is below 0"),
    ],
)
def test_a_demo_knob_out_of_range_is_refused_before_anything_starts(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the check, ``--checkpoint-interval-s 0.5`` would deploy for 20 s, then end in a JobError traceback,
    and ``--epochs 1`` would wait out the demo's 8 minutes."""
    import emulator.demo

    monkeypatch.setattr(emulator.demo, "run", lambda *_, **__: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as refused:
        cli.main(["demo", *argv])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


def test_a_job_error_and_a_run_dir_that_cannot_be_made_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each is one line, not a traceback from ``python -m emulator``."""
    import emulator.demo

    def refused(*_: Any, **__: Any) -> None:
        raise cli.JobError("the node agent would refuse this job: max_restarts must be at least 0")

    monkeypatch.setattr(emulator.demo, "run", refused)
    assert cli.main(["demo", "--run-dir", str(tmp_path / "demo")]) == 1
    assert capsys.readouterr().err == "error: the node agent would refuse this job: max_restarts must be at least 0\n"
    (tmp_path / "file").write_text("")
    assert cli.main(["up", "--no-wait", "--run-dir", str(tmp_path / "file" / "run")]) == 1
    assert capsys.readouterr().err == f"error: Not a directory: {tmp_path / 'file' / 'run'}\n"


def test_a_run_dir_in_use_is_refused_and_the_running_emulator_keeps_its_tls_files(cloud: EmulatedCloud) -> None:
    """Two emulators on one run directory (two demos started in the same second share one): the second would
    replace the first one's CA, and the first one's clients would fail certificate checks."""
    assert cloud.run_dir is not None
    ca = cloud.ca_bundle.read_bytes()
    with pytest.raises(EmulatorError) as refused:
        EmulatedCloud(run_dir=cloud.run_dir).start()
    assert str(refused.value).startswith(f"{cloud.run_dir} is the run directory of an emulator that is still running")
    assert cloud.ca_bundle.read_bytes() == ca
    assert cloud.client("sts").get_caller_identity()["Account"] == cloud.account_id


def test_up_ends_with_one_line_when_its_aws_endpoint_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it, ``emulator up`` would report failed poll rounds forever, its export lines pointing at nothing."""

    def bootstrap_then_die(cloud: EmulatedCloud) -> float:
        assert cloud.run_dir is not None
        os.kill(int((cloud.run_dir / SERVER_PID_FILE).read_text()), signal.SIGKILL)
        return 0.0

    monkeypatch.setattr(cli, "bootstrap", bootstrap_then_die)
    monkeypatch.setattr(cli, "deploy", lambda *_: {})
    ended: list[BaseException] = []

    def up() -> None:
        try:
            cli.up(["TrainingStack"], tmp_path / "run")
        except BaseException as exc:
            ended.append(exc)

    waiter = threading.Thread(target=up, daemon=True)  # bounded: joined below, daemon if it never ends
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "emulator up still waits on a dead endpoint"
    [exc] = ended
    assert isinstance(exc, EmulatorError)
    assert str(exc) == f"the emulated AWS endpoint exited; see {tmp_path / 'run' / 'moto-server.log'}"


def test_a_run_dir_whose_server_is_gone_is_free_again_even_if_its_pid_was_reused(tmp_path: Path) -> None:
    """The server's pid file goes with the stop, and a pid file whose process is no emulator frees the run
    directory: otherwise, once the machine gave that pid to another process, the run directory would be refused as
    in use for good."""
    run_dir = tmp_path / "run"
    with EmulatedCloud(run_dir=run_dir):
        assert (run_dir / SERVER_PID_FILE).is_file()
    assert not (run_dir / SERVER_PID_FILE).exists()
    (run_dir / SERVER_PID_FILE).write_text(f"{os.getpid()}\n")  # a live process that is no emulator
    with EmulatedCloud(run_dir=run_dir) as again:
        assert again.client("sts").get_caller_identity()["Account"] == again.account_id


def test_an_ignored_sighup_stays_ignored(tmp_path: Path) -> None:
    """``nohup python -m emulator up &`` must outlive the terminal; SIGTERM still stops the emulator."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with EmulatedCloud(run_dir=tmp_path / "run"):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with EmulatedCloud(run_dir=tmp_path / "run"):  # from a terminal: a closed one stops it
            assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("argv", [["interrupt"], ["end", "i-0123", "--any", "group"]])
def test_a_fault_names_an_instance_or_a_group_not_both(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main([*argv, "--run-dir", str(tmp_path)])
    assert refused.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f"error: {argv[0]}: give an instance id or --any GROUP (one of them)")
    )
