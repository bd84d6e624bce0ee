"""``trainctl submit JOB_FILE``: the job file's keys reach the submitted job, the options override them, and a bad
file is refused in one line naming the file, the key and the fix, before anything is uploaded or scaled. AWS is moto
in-process, as in tests/test_trainctl_submit.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from tests.test_trainctl_submit import CLUSTER, CURRENT, GROUP, LOG_GROUP, TEAM, aws, state, trainctl
from trainctl.cli import main as trainctl_main
from trainctl.job_file import JobFile, load_job_file

__all__ = ["aws"]  # the fixture, used by name

REPO = Path(__file__).resolve().parent.parent
SPEC = f"/spot-training/{TEAM}/{CLUSTER}/job-spec"
GOOD: dict[str, Any] = {
    "cluster": CLUSTER,
    "nodes": 2,
    "command": "python train.py --epochs 3",
    "setup": "setup.sh",
    "env": {"LOG_LEVEL": "debug"},
    "secrets": {"HF_TOKEN": f"ssm:/spot-training-secrets/{TEAM}/hf-token"},
    "inputs": [{"s3": "s3://team-data/digits/", "path": "/opt/ml/input/digits"}],
    "checkpoint_interval_s": 300.0,
    "job_id": "run-1",
}
UNCHANGED = {"desired": 0, "objects": 0, "current job written": False}


@pytest.fixture
def listed(aws: None) -> None:
    """The cluster's job spec lists data bucket team-data (the team file's data_buckets)."""
    ssm = boto3.client("ssm")
    spec = json.loads(ssm.get_parameter(Name=SPEC)["Parameter"]["Value"])
    ssm.put_parameter(Name=SPEC, Value=json.dumps({**spec, "data_buckets": ["team-data"]}), Overwrite=True)


def job_file(directory: Path, doc: object) -> Path:
    """``directory/job.yaml`` holding ``doc`` (YAML text, or a mapping), next to train.py and setup.sh."""
    (directory / "train.py").write_text("print('training')\n")
    (directory / "setup.sh").write_text("echo setup\n")
    path = directory / "job.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def submitted() -> dict[str, Any]:
    return dict(json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"]))


def test_a_job_files_keys_reach_the_submitted_job(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert trainctl_main(["submit", str(job_file(tmp_path, GOOD))]) == 0
    assert capsys.readouterr() == ("run-1\n", "")
    job = submitted()
    assert {key: job[key] for key in GOOD if key != "cluster"} == {
        key: v for key, v in GOOD.items() if key != "cluster"
    }
    assert state() == {"desired": 2, "objects": 1, "current job written": True}
    [archive] = boto3.client("s3").list_objects_v2(Bucket="checkpoints")["Contents"]
    assert archive["Key"] == job["code_key"] == f"{CLUSTER}/code/run-1.tar.gz"


def test_options_override_the_files_keys_and_add_to_its_env(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = job_file(tmp_path, GOOD)
    argv = ["submit", str(path), "--nodes", "1", "--env", "LOG_LEVEL=info", "--env", "SEED=3", "--job-id", "run-2"]
    assert trainctl_main(argv) == 0
    job = submitted()
    assert (job["nodes"], job["job_id"], job["env"]) == (1, "run-2", {"LOG_LEVEL": "info", "SEED": "3"})
    assert job["secrets"] == GOOD["secrets"]


def test_the_code_directory_is_relative_to_the_job_file(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    job_file(tmp_path / "src", {})
    path = job_file(tmp_path, {**GOOD, "code": "src"})
    (tmp_path / "train.py").unlink()  # only src/ is packed: its train.py is the one found
    assert trainctl_main(["submit", str(path)]) == 0


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        pytest.param(
            {**GOOD, "nodez": 2},
            "nodez: unknown key 'nodez': did you mean 'nodes'? allowed keys here: checkpoint_interval_s, "
            "checkpoint_wait_for_upload, cluster, code, command, env, inputs, interruption_grace_s, job_id, "
            "max_nodes, max_restarts, mean_time_between_interruptions_s, min_nodes, nodes, nproc_per_node, python, "
            "resume_from, secrets, setup, stall_timeout_s, team",
            id="unknown-key",
        ),
        pytest.param(
            {**GOOD, "setup": "install.sh"},
            "setup: install.sh is not in the code archive of {dir} (not there, left out by .gitignore or always "
            "skipped, or a symbolic link: links are left out); add it or fix the path",
            id="setup-missing",
        ),
        pytest.param(
            {**GOOD, "secrets": {"HF_TOKEN": "ssm:/spot-training-secrets/research/hf-token"}},
            "secrets: HF_TOKEN names '/spot-training-secrets/research/hf-token', outside the team's secrets "
            "(ssm:/spot-training-secrets/default/...); the nodes may read only those",
            id="secret-of-another-team",
        ),
        pytest.param(
            {**GOOD, "secrets": {"HF_TOKEN": "secretsmanager:hf-token"}},
            "secrets: HF_TOKEN names 'hf-token', outside the team's secrets "
            "(secretsmanager:spot-training-secrets/default/...); the nodes may read only those",
            id="secret-outside-every-prefix",
        ),
        pytest.param(
            {**GOOD, "inputs": [{"s3": "s3://other-data/x/", "path": "/data"}]},
            "inputs[1].s3: bucket other-data is not in the team file's data_buckets (team-data); ask the team's ops "
            "to add it",
            id="input-bucket-not-listed",
        ),
        pytest.param(
            {**GOOD, "inputs": [{"s3": "s3://team-data/x/", "dir": "/data"}]},
            "inputs[0].dir: unknown key 'dir': allowed keys here: path, s3",
            id="input-unknown-key",
        ),
        pytest.param(
            {**GOOD, "nodes": "2"},
            "nodes: Input should be a valid integer, got '2', a number in quotes; remove the quotes: 2",
            id="quoted-number",
        ),
        pytest.param(
            {**GOOD, "env": {"RANK": "0"}},
            "env: RANK is set by the node agent or torchrun; choose another name",
            id="reserved-env",
        ),
        pytest.param(
            {**GOOD, "max_restarts": 1000},
            "max_restarts must be an integer from 0 to 100, got 1000",
            id="setting-out-of-range",
        ),
        pytest.param(
            "cluster: [main\n",
            "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'; fix the syntax",
            id="not-yaml",
        ),
    ],
)
def test_a_bad_job_file_is_one_line_naming_it_and_nothing_starts(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: object, problem: str
) -> None:
    path = job_file(tmp_path, doc)
    assert trainctl_main(["submit", str(path)]) == 2
    assert capsys.readouterr() == ("", f"trainctl: error: {path}: {problem.format(dir=tmp_path)}\n")
    assert state() == UNCHANGED


def test_without_a_cluster_anywhere_the_submit_says_where_to_give_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = job_file(tmp_path, {"command": "python train.py"})
    assert trainctl_main(["submit", str(path)]) == 2
    assert capsys.readouterr().err == "trainctl: error: no cluster: give --cluster or cluster: in the job file\n"


def test_a_bad_option_is_not_blamed_on_the_job_file(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = job_file(tmp_path, GOOD)
    assert trainctl_main(["submit", str(path), "--setup", "missing.sh"]) == 2
    assert capsys.readouterr().err == (
        f"trainctl: error: setup: missing.sh is not in the code archive of {tmp_path} (not there, left out by "
        ".gitignore or always skipped, or a symbolic link: links are left out); add it or fix the path\n"
    )
    assert trainctl_main(["submit", str(path), "--secret", "HF_TOKEN=ssm:/elsewhere/x"]) == 2
    assert capsys.readouterr().err == (
        "trainctl: error: the node agent would refuse this job: secrets: HF_TOKEN names '/elsewhere/x', outside the "
        "team's secrets (ssm:/spot-training-secrets/default/...); the nodes may read only those\n"
    )
    assert trainctl_main(["submit", str(path), "--env", "NOVALUE"]) == 2
    assert capsys.readouterr().err == "trainctl: error: --env 'NOVALUE': write NAME=VALUE\n"
    assert state() == UNCHANGED


def test_the_example_job_file_loads_with_every_part() -> None:
    path = REPO / "examples" / "digits" / "job.yaml"
    job = load_job_file(path)
    assert job.setup is not None and (path.parent / job.setup).is_file()
    assert job.env and job.secrets and job.inputs and job.command
    assert set(JobFile.model_fields) >= set(yaml.safe_load(path.read_text()))


def test_status_shows_the_env_and_only_the_names_of_the_secrets(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Of an earlier job too: its job is read back from the current-job parameter's history."""
    path = job_file(tmp_path, {**GOOD, "secrets": {"HF_TOKEN": GOOD["secrets"]["HF_TOKEN"], "A_KEY": "ssm:/x"}})
    assert trainctl_main(["submit", str(path), "--secret", f"A_KEY=ssm:/spot-training-secrets/{TEAM}/a"]) == 0
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    (tmp_path / "second").mkdir()
    second = job_file(tmp_path / "second", {"cluster": CLUSTER})
    assert trainctl_main(["submit", str(second), "--job-id", "run-2", "--nodes", "1"]) == 0
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    capsys.readouterr()
    rc, out, err = trainctl(capsys, "status", "run-1")
    assert (rc, err) == (0, "")
    assert "\nenv: LOG_LEVEL=debug\nsecrets: A_KEY, HF_TOKEN\n" in out
    assert "spot-training-secrets" not in out  # the names of the variables, not where their values are
    assert trainctl_main(["--json", "status", "--team", TEAM, "--cluster", CLUSTER, "run-1"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["env"], info["secrets"]) == ({"LOG_LEVEL": "debug"}, ["A_KEY", "HF_TOKEN"])
    rc, out, _ = trainctl(capsys, "status", "run-2")
    assert rc == 0 and "\nenv: -\nsecrets: -\n" in out


def test_the_how_to_page_shows_the_example_job_file_as_it_is() -> None:
    page = (REPO / "docs" / "how-to" / "job-files.md").read_text()
    example = (REPO / "examples" / "digits" / "job.yaml").read_text()
    assert f"```yaml\n{example}```\n" in page


def test_a_job_too_large_for_its_parameter_names_its_parts_too(
    listed: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = job_file(tmp_path, {**GOOD, "env": {f"VAR_{i}": "x" * 100 for i in range(40)}})
    assert trainctl_main(["submit", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainctl: error: the job takes ") and err.endswith(
        " bytes as JSON, above the 4,096 of its SSM parameter: shorten --command (long arguments go in a file of "
        "your code) or its env, secrets, inputs\n"
    )
    assert state() == UNCHANGED
