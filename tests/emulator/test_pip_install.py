"""``pip install`` of the repository into an empty virtual environment gives a ``trainctl`` that submits a job to the
emulated cloud without the ops toolchain: no aws-cdk-lib, no CDK app, no Node.js (pyproject.toml)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulator import EmulatedCloud
from emulator.deploy import bootstrap, deploy
from trainctl.cli import parser

REPO = Path(__file__).resolve().parents[2]
TEAM, CLUSTER = "solo", "main"
PIP_TIMEOUT_S = 600.0


def _working_tree_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them, with uncommitted edits (pip builds in the source folder)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(source.read_bytes())
    return dest


def _start_install(tmp: Path) -> tuple[Path, subprocess.Popen[str]]:
    """An empty venv, and ``pip install`` of the copy into it, started: it runs while the cloud deploys. The versions
    requirements.txt pins constrain the resolution (the wheels the dev venv has), not what the package requires."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    source = _working_tree_copy(tmp / "source")
    pip_install = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    install = subprocess.Popen(
        [*pip_install, "--no-compile", "--constraint", str(REPO / "requirements.txt"), str(source)],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return venv, install


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EmulatedCloud]]:
    """(the venv with trainctl installed from the repository, the emulated cloud with team solo deployed)."""
    tmp = tmp_path_factory.mktemp("pip")
    venv, install = _start_install(tmp)
    try:
        teams = tmp / "teams"
        teams.mkdir()
        cluster = {"name": CLUSTER, "instance_types": ["g5.xlarge", "g6.xlarge"], "max_nodes": 1}
        (teams / f"{TEAM}.yaml").write_text(yaml.safe_dump({"clusters": [cluster]}))
        with EmulatedCloud(run_dir=tmp / "cloud") as cloud:
            bootstrap(cloud)
            deploy(cloud, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams), "team": TEAM})
            output, _ = install.communicate(timeout=PIP_TIMEOUT_S)
            assert install.returncode == 0, output
            yield venv, cloud
    finally:
        if install.poll() is None:
            install.kill()
            install.wait()


def _run(venv: Path, cloud: EmulatedCloud, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A program of the venv with only what a user of the emulator sets (`python -m emulator up`'s exports)."""
    env = cloud.client_env({"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"})
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_package_holds_trainctl_and_what_it_imports_only(
    installed: tuple[Path, EmulatedCloud], tmp_path: Path
) -> None:
    venv, cloud = installed
    ran = _run(venv, cloud, "python", "-c", "import aws_cdk", cwd=tmp_path)
    assert ran.returncode == 1 and "No module named 'aws_cdk'" in ran.stderr
    files = "import importlib.metadata as m, json; print(json.dumps(list(map(str, m.files('spot-training-trainctl')))))"
    ran = _run(venv, cloud, "python", "-c", files, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    packaged = json.loads(ran.stdout)
    assert "../../../bin/trainctl" in packaged  # the console script
    top_level = {name.split("/")[0] for name in packaged if not name.startswith("..") and ".dist-info/" not in name}
    # not the CDK app, emulator or tests; capacity_watcher's decision tells trainctl status a job waits for capacity
    assert top_level == {"trainctl", "team_config", "bootstrap_scripts", "capacity_watcher"}
    assert "team_config/ec2_instance_types.txt" in packaged  # the instance types trainctl checks a price table by
    assert not [name for name in packaged if name.startswith("bootstrap_scripts/") and "/spot_training/" not in name]


def test_trainctl_help_and_review_without_the_cdk_toolchain(
    installed: tuple[Path, EmulatedCloud], tmp_path: Path
) -> None:
    venv, cloud = installed
    ran = _run(venv, cloud, "trainctl", "--help", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert f"{{{','.join(commands)}}}" in ran.stdout.replace(" ", "").replace("\n", "")  # every command of the repo's
    ran = _run(venv, cloud, "trainctl", "review", cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr == (
        "trainctl: error: review needs the CDK app (or --assembly DIR, a synthesized one): run it from a clone of "
        "the ops repository after `make deps` (aws-cdk-lib, cfn-lint and Node.js); no module named 'aws_cdk' here\n"
    )


def test_the_installed_trainctl_submits_a_job_that_status_shows(
    installed: tuple[Path, EmulatedCloud], tmp_path: Path
) -> None:
    venv, cloud = installed
    code = tmp_path / "job"
    code.mkdir()
    (code / "train.py").write_text("print('training')\n")
    cluster = ("--team", TEAM, "--cluster", CLUSTER)
    ran = _run(venv, cloud, "trainctl", "--json", "submit", *cluster, "--code", str(code), "--job-id", "pip-1",
               "--command", "python train.py", cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"job_id": "pip-1"}
    ran = _run(venv, cloud, "trainctl", "--json", "status", *cluster, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    info: dict[str, Any] = json.loads(ran.stdout)
    assert (info["job_id"], info["group_job"]) == ("pip-1", "pip-1")
    ran = _run(venv, cloud, "trainctl", "list", *cluster, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert [line.split()[0] for line in ran.stdout.splitlines()] == ["JOB_ID", "pip-1"]
