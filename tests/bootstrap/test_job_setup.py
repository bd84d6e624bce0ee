"""The job's setup on a node: run once with the job's env and a cache directory, its output in the log, skipped when
the cache (on the claimed warm volume, keyed by the script's content) is complete, redone when it is not, and a
failure that names the setup's last lines."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from spot_training.agent import job_setup
from spot_training.agent.errors import AgentError, LeavingBeforeTraining
from spot_training.agent.job_setup import COMPLETE, JobSetup

from .test_agent_notice import agent_for, tune

SETUP = """set -eu
echo "greeting=$GREETING cache=$SPOT_TRAINING_SETUP_CACHE_DIR"
echo ran >> "$SPOT_TRAINING_SETUP_CACHE_DIR/runs"
"""


def _setup(make_cluster: Any, tmp_path: Path, script: str = SETUP) -> tuple[Any, Any, list[str], JobSetup, Path]:
    cluster = make_cluster()
    cluster.submit("setup-run", {"train.py": "pass\n"}, "python train.py", setup="setup.sh", env={"GREETING": "hi"})
    agent, job, lines = agent_for(cluster)
    tune(agent, work_dir=str(tmp_path / "work"))
    code = tmp_path / "code"
    code.mkdir(parents=True)
    (code / "setup.sh").write_text(script)
    return agent, job, lines, JobSetup(agent.node, agent.notices), code


def test_setup_runs_with_the_jobs_env_and_a_cache_on_the_warm_volume(make_cluster: Any, tmp_path: Path) -> None:
    agent, job, lines, setup, code = _setup(make_cluster, tmp_path)
    volume = tmp_path / "vol-1"
    setup.run(job, str(code), str(volume))
    key = hashlib.sha256(SETUP.encode()).hexdigest()
    cache = volume / "setup-cache" / key
    assert f"[setup {agent.node.instance_id}] greeting=hi cache={cache}" in lines
    assert (cache / COMPLETE).is_file() and (cache / "runs").read_text() == "ran\n"
    assert f"setup: done; cached (key {key[:12]})" in lines

    # the next node claiming the volume (another agent, same volume): skipped
    _again, job2, lines2, setup2, code2 = _setup(make_cluster, tmp_path / "next")
    setup2.run(job2, str(code2), str(volume))
    assert f"setup: cached on the warm volume (key {key[:12]}, {cache}); skipped" in lines2
    assert (cache / "runs").read_text() == "ran\n"
    assert not any(line.startswith("[setup ") for line in lines2)


def test_without_a_warm_volume_the_cache_is_this_boots(make_cluster: Any, tmp_path: Path) -> None:
    _agent, job, lines, setup, code = _setup(make_cluster, tmp_path)
    setup.run(job, str(code), None)
    key = hashlib.sha256(SETUP.encode()).hexdigest()
    cache = tmp_path / "work" / "setup-cache" / job_setup.boot_id() / key
    assert (cache / "runs").read_text() == "ran\n"
    setup.run(job, str(code), None)  # an agent restarted within the boot: done already
    assert (cache / "runs").read_text() == "ran\n"
    assert f"setup: cached for this boot (key {key[:12]}, {cache}); skipped" in lines


def test_a_half_done_cache_is_emptied_and_the_setup_runs_again(make_cluster: Any, tmp_path: Path) -> None:
    _agent, job, _lines, setup, code = _setup(make_cluster, tmp_path)
    key = hashlib.sha256(SETUP.encode()).hexdigest()
    cache = tmp_path / "vol" / "setup-cache" / key
    cache.mkdir(parents=True)
    (cache / "runs").write_text("cut off\n")  # no COMPLETE marker: that setup never finished
    setup.run(job, str(code), str(tmp_path / "vol"))
    assert (cache / "runs").read_text() == "ran\n"
    assert (cache / COMPLETE).is_file()


def test_a_failing_setup_names_its_last_lines_and_marks_nothing_complete(make_cluster: Any, tmp_path: Path) -> None:
    script = "for i in 1 2 3 4 5 6 7; do echo line $i; done\necho 'pip: no such wheel' >&2\nexit 3\n"
    _agent, job, _lines, setup, code = _setup(make_cluster, tmp_path, script)
    with pytest.raises(AgentError) as raised:
        setup.run(job, str(code), str(tmp_path / "vol"))
    assert str(raised.value) == (
        "setup setup.sh exited with code 3; its last lines: line 4 | line 5 | line 6 | line 7 | pip: no such wheel"
    )
    key = hashlib.sha256(script.encode()).hexdigest()
    assert not (tmp_path / "vol" / "setup-cache" / key / COMPLETE).exists()


def test_a_setup_missing_from_the_code_archive_is_refused(make_cluster: Any, tmp_path: Path) -> None:
    _agent, job, _lines, setup, code = _setup(make_cluster, tmp_path)
    (code / "setup.sh").unlink()
    with pytest.raises(AgentError, match=r"^setup script 'setup.sh' is not in the code archive s3://"):
        setup.run(job, str(code), None)


def test_a_notice_during_the_setup_ends_it(make_cluster: Any, tmp_path: Path) -> None:
    agent, job, lines, setup, code = _setup(make_cluster, tmp_path, "echo started\nsleep 60\necho never\n")
    tune(agent, poll_s=0.1)
    calls: list[int] = []

    def notice() -> str | None:
        calls.append(1)
        return "spot interruption notice" if len(calls) > 2 else None

    agent.notices.notice = notice
    with pytest.raises(LeavingBeforeTraining, match="during setup"):
        setup.run(job, str(code), None)
    assert "never" not in " ".join(lines)


def test_a_job_without_setup_runs_nothing(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster()
    cluster.submit("no-setup", {"train.py": "pass\n"}, "python train.py")
    agent, job, lines = agent_for(cluster)
    JobSetup(agent.node, agent.notices).run(job, str(tmp_path), str(tmp_path))
    assert lines == [] and os.listdir(tmp_path) == []
