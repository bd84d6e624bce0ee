"""The job queue on the emulated cloud: jobs submitted back to back run one after another on the nodes already
running, and a cancelled one never starts. Everything is read back from S3, CloudWatch Logs and the Auto Scaling
API; the nodes run their real user data and node agent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR, NODE_ENV
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from tests.emulator.user_environment import use_emulator_exports
from trainctl import jobs
from trainctl.cli import main as trainctl_main

pytestmark = pytest.mark.slow

JOBS = (("q-first", "2"), ("q-second", "2"), ("q-cancelled", "1"), ("q-third", "1"))  # (job id, --nodes)
RUN_TIMEOUT_S = 420  # the three jobs, one epoch each, on a shared 2-core machine


@pytest.fixture(scope="module")
def queue_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmulatedCloud, jobs.ClusterRef, Any]]:
    """Four submits back to back, the third cancelled while it waits; the nodes run until the group is back at 0."""
    run_dir = tmp_path_factory.mktemp("queue")
    with EmulatedCloud(run_dir=run_dir) as cloud:
        bootstrap(cloud)
        deploy(cloud, "TrainingStack")
        with pytest.MonkeyPatch.context() as patch:
            use_emulator_exports(cloud, patch)
            ref = jobs.find_cluster(cloud.client, "default", "main")
            with NodeLauncher(cloud, run_dir / "nodes", groups=[ref.group], node_env=NODE_ENV) as launcher:
                lines = [submit(job_id, nodes) for job_id, nodes in JOBS]
                lines.append(trainctl("queue"))
                lines.append(trainctl("cancel", "q-cancelled"))
                launcher.wait_for(
                    lambda: jobs.marker(cloud.client, ref, "q-third", "DONE") is not None and not launcher.running(),
                    RUN_TIMEOUT_S,
                    "the third job to be DONE and every node gone",
                )
                booted = [n.instance_id for n in launcher.all_nodes()]
            yield cloud, ref, {"lines": lines, "booted": booted}


def trainctl(*argv: str) -> str:
    rc = trainctl_main([argv[0], "--cluster", "main", *argv[1:]])
    assert rc == 0, argv
    return " ".join(argv)


def submit(job_id: str, nodes: str) -> str:
    return trainctl(
        "submit", "--code", str(EXAMPLE_DIR), "--nodes", nodes, "--job-id", job_id, "--python", sys.executable,
        "--command", "python train.py --epochs 1 --seed 0", "--checkpoint-interval-s", "2",
    )  # fmt: skip


def boots(cloud: EmulatedCloud, ref: jobs.ClusterRef, job_id: str) -> set[str]:
    """The instances whose agents joined the job (their ``boot`` marker under the job)."""
    return {instance for instance, names in jobs.node_markers(cloud.client, ref, job_id).items() if "boot" in names}


def test_three_queued_jobs_run_one_after_another_to_done(queue_run: Any) -> None:
    cloud, ref, _ = queue_run
    for job_id in ("q-first", "q-second", "q-third"):
        assert jobs.marker(cloud.client, ref, job_id, "DONE") is not None, job_id
    assert jobs.desired_capacity(cloud.client, ref) == 0


def test_the_second_job_runs_on_the_first_jobs_nodes_without_a_new_boot(queue_run: Any) -> None:
    cloud, ref, run = queue_run
    first, second, third = (boots(cloud, ref, j) for j in ("q-first", "q-second", "q-third"))
    assert len(first) == 2 and second == first and third < first
    assert sorted(run["booted"]) == sorted(first)  # no instance launched after the first job's two
    activities = cloud.client("autoscaling").describe_scaling_activities(AutoScalingGroupName=ref.group)["Activities"]
    launched = {a["Description"].split(": ")[-1] for a in activities if a["Description"].startswith("Launching")}
    assert launched == first, activities  # the group's own record: it launched the first job's nodes, no others
    logged = [message for _, _, message in jobs.log_events(cloud.client, ref, "q-first")]
    handed = [m for m in logged if "next job q-second from the queue on this node (no new boot)" in m]
    assert len(handed) == 2, logged[-20:]
    assert any("job q-first done; next job q-second" in m for m in handed)
    # the third job needs one node: the other left the group, one fewer
    logged = [message for _, _, message in jobs.log_events(cloud.client, ref, "q-second")]
    assert sum("next job q-third from the queue on this node (no new boot)" in m for m in logged) == 1
    assert sum("next job q-third runs on 1 node(s): leaving" in m for m in logged) == 1


def test_a_cancelled_queued_job_never_starts(queue_run: Any) -> None:
    cloud, ref, _ = queue_run
    s3 = cloud.client("s3")
    objects = s3.list_objects_v2(Bucket=ref.bucket, Prefix=ref.job_prefix("q-cancelled")).get("Contents", [])
    assert objects == []
    assert jobs.log_events(cloud.client, ref, "q-cancelled") == []
    assert s3.list_objects_v2(Bucket=ref.bucket, Prefix=f"{ref.code_prefix}q-cancelled.")["KeyCount"] == 1
    assert jobs.job_state(cloud.client, ref, "q-cancelled") == "UNFINISHED"


def test_the_queue_is_empty_at_the_end(queue_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert trainctl_main(["queue", "--cluster", "main"]) == 0  # the fixture's environment reaches the emulator
    assert capsys.readouterr().out == "no job queued on main\n"
