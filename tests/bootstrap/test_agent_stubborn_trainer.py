"""A trainer that ignores SIGTERM: after the grace the node agent kills its whole process tree (a forked grandchild
too, as torchrun's workers), then goes on as after any interruption: it reports the attempt and hands the instance
back. Against moto; the agent runs in-process with the stubborn trainer in place of torchrun."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster
from .test_agent_notice import NOTICE, Imds, agent_for, store_of

# Ignores SIGTERM, forks a grandchild (which inherits that), then writes "<trainer pid> <grandchild pid>" to <pids>;
# both sleep ``seconds`` (bounded either way).
STUBBORN = """
import os, signal, sys, time
pids, seconds = sys.argv[1], float(sys.argv[2])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    time.sleep(seconds)
    os._exit(0)
with open(pids + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}")
os.replace(pids + ".tmp", pids)
time.sleep(seconds)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for a parent that does not reap it has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_trainer_that_ignores_sigterm_is_killed_with_its_tree_after_the_grace(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: Cluster = make_cluster(nodes=1, interruption_grace_s=1)
    cluster.submit("job-k", {"train.py": ""}, "python train.py")
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.rendezvous.world_file = str(tmp_path / "world.json")
    pids = tmp_path / "pids"
    agent.node.imds = Imds(NOTICE, ready=pids)  # the notice comes once the trainer ignores SIGTERM and has forked
    trainer = [sys.executable, "-c", STUBBORN, str(pids), "20"]
    env = {**os.environ, "SPOT_TRAINING_STORE_BIND_ADDRESS": "127.0.0.1"}
    monkeypatch.setattr(agent.rendezvous, "torchrun_command", lambda job, peers: (trainer, env))

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 0

    trainer_pid, grandchild_pid = map(int, pids.read_text().split())
    assert not alive(trainer_pid) and not alive(grandchild_pid), lines
    notice = f"spot interruption notice {NOTICE}"
    expected = [
        f"{notice}: sending SIGTERM to the trainer, grace 1 s",
        "trainer still running after 1 s grace: killing it",
        "interrupted: exiting cleanly; the group replaces this instance",
        f"left {cluster.group}: the group launches a replacement",
    ]
    assert [line for line in lines if line in expected] == expected, lines
    assert agent.syncs.syncer is not None and agent.syncs.syncer.trainer_cut_off
    # what the peers read: this node leaves on a notice, its trainer was killed (SIGKILL), nothing is pending
    leaving = cluster.marker(job.job_id, f"nodes/{agent.node.instance_id}/leaving")
    assert leaving is not None and (leaving["notice"], leaving["trainer"]) == (notice, True)
    synced = cluster.marker(job.job_id, f"nodes/{agent.node.instance_id}/synced")
    assert synced is not None
    assert (synced["rc"], synced["interrupted"], synced["pending"]) == (-signal.SIGKILL, True, None)
    assert cluster.marker(job.job_id, "FAILED") is None  # an interruption, not a failed job
    assert agent.node.instance_id not in [i for i, _ in cluster.instances()]  # handed back: the group replaces it
