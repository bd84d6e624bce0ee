"""The node agent under its supervisor (run_agent.sh): a killed agent comes back, ends the trainer it left running
and carries the job to DONE; an agent that keeps dying hands the instance back after the bound; on a real instance
the supervisor is a systemd service."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from spot_training.agent.leftovers import TRAINER_RUN_FILE, tagged_processes
from spot_training.proctree import process_tree

from .conftest import BOOTSTRAP, Cluster, Node, address_map
from .test_node_agent import EPOCHS, TRAIN, Run, reference, weights_equal

__all__ = ["reference"]  # the module's uninterrupted run, shared with test_node_agent's tests
WAIT_S = 120.0


def agent_pids(node: Node) -> set[int]:
    """The node's running node_agent.py processes."""
    assert node.proc is not None
    found = set()
    for pid in process_tree(node.proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"node_agent.py" in cmdline:
            found.add(pid)
    return found


def next_agent(node: Node, killed: set[int]) -> int:
    """The pid of the node's agent that is not one of ``killed`` (bounded wait)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        fresh = agent_pids(node) - killed
        if fresh:
            return fresh.pop()
        time.sleep(0.1)
    raise AssertionError(f"no new agent on {node.instance_id} within {WAIT_S} s:\n{node.text}")


def trainer_token(node: Node) -> str:
    return (node.dir / "root" / "opt" / "spot-training" / "work" / TRAINER_RUN_FILE).read_text().strip()


def test_a_killed_agent_comes_back_ends_its_old_trainer_and_the_job_ends_bitwise_identical(
    make_cluster: Any, make_nodes: Any, tmp_path: Path, reference: Run
) -> None:
    cluster: Cluster = make_cluster(nodes=1, checkpoint_interval_s=1, interruption_grace_s=30)
    out = tmp_path / "resumed.pt"
    cluster.submit("kill-run", TRAIN, f"python train.py --epochs {EPOCHS} --seed 7 --output {out} --step-sleep-s 0.05")
    (node,) = make_nodes(cluster)
    node.start(address_map([node]), SPOT_TRAINING_AGENT_RESTART_PAUSE_S="0.2")
    for line in node.lines():  # bounded by the run itself
        if "durable in s3://" in line:
            break
    old_trainer = tagged_processes(trainer_token(node))
    assert old_trainer, node.text
    (agent,) = agent_pids(node)
    # The killed agent was the only reader of the trainer's output pipe: the trainer's next print would fail and end
    # it before the new agent looks. A reader held here keeps it running, as a trainer that prints nothing runs on.
    reader = os.open(f"/proc/{min(old_trainer)}/fd/1", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.kill(agent, signal.SIGKILL)
        for line in node.lines():
            if "running:" in line:  # the new agent starts its trainer: the old one must be gone by now
                assert not [pid for pid in old_trainer if Path(f"/proc/{pid}/environ").exists() and tagged(pid)], line
                break
    finally:
        os.close(reader)
    assert node.wait() == 0, node.text
    assert "node agent ended with signal KILL: starting it again (restart 1 of 3)" in node.text
    assert "a trainer of an earlier agent is still running" in node.text
    assert cluster.marker("kill-run", "DONE") is not None
    assert cluster.desired_capacity() == 0
    assert weights_equal(out, reference.weights)


def tagged(pid: int) -> bool:
    """Whether ``pid`` still runs with a trainer tag (not a zombie, not a reused pid of another process)."""
    try:
        return b"SPOT_TRAINING_TRAINER_RUN=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_an_agent_that_keeps_dying_hands_the_instance_back_after_the_bound(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("crash-run", TRAIN, f"python train.py --epochs {EPOCHS} --seed 7 --step-sleep-s 0.05")
    (node,) = make_nodes(cluster)
    node.start(address_map([node]), SPOT_TRAINING_AGENT_RESTARTS="1", SPOT_TRAINING_AGENT_RESTART_PAUSE_S="0.2")
    killed: set[int] = set()
    for _ in range(2):  # the first start and its one restart
        agent = next_agent(node, killed)
        os.kill(agent, signal.SIGKILL)
        killed.add(agent)
    assert node.wait(timeout=WAIT_S) == 3, node.text  # the user data ends: it never hangs
    assert "restart 1 of 1" in node.text
    assert "(2 crashes, 1 restarts used): handing the instance back" in node.text
    assert f"instance {node.instance_id} its node agent crashed 2 times; handing it back to group" in node.text
    assert node.instance_id not in [i for i, _ in cluster.instances()]
    assert cluster.desired_capacity() == 1  # not decremented: the group launches a replacement, the job goes on
    assert cluster.marker("crash-run", "FAILED") is None


def test_on_a_real_instance_the_agent_is_a_systemd_service_that_hands_the_instance_back(tmp_path: Path) -> None:
    """run_agent.sh with systemd (forced here; a fake systemctl records its calls): the units it installs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    (fake / "systemctl").chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "SPOT_TRAINING_SUPERVISOR": "systemd",
        "SPOT_TRAINING_SYSTEMD_DIR": str(units),
        "SPOT_TRAINING_POLL_INTERVAL_S": "5",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    argv = ["bash", str(BOOTSTRAP / "run_agent.sh"), "/opt/spot-training/work/hand-back.sh", "/usr/bin/python3"]
    done = subprocess.run([*argv, "--", "--region", "us-east-1", "--team", "t w"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["daemon-reload", "start spot-training-agent.service"]
    service = (units / "spot-training-agent.service").read_text()
    for line in (
        f"ExecStart= /usr/bin/python3 {BOOTSTRAP}/node_agent.py --region us-east-1 --team t\\ w",
        "Restart=on-failure",
        "SuccessExitStatus=1 2",
        "TimeoutStopSec=100",  # under the 2-minute notice
        "KillMode=mixed",
        "StartLimitBurst=4",  # one start and 3 restarts
        "OnFailure=spot-training-agent-hand-back.service",
        f"EnvironmentFile={units}/spot-training-agent.env",
    ):
        assert line in service.splitlines(), (line, service)
    hand_back = (units / "spot-training-agent-hand-back.service").read_text()
    assert 'ExecStart=/opt/spot-training/work/hand-back.sh "its node agent crashed 4 times"' in hand_back
    environment = (units / "spot-training-agent.env").read_text().splitlines()
    assert sorted(environment) == ["AWS_DEFAULT_REGION=us-east-1", "SPOT_TRAINING_POLL_INTERVAL_S=5"]
    assert (units / "spot-training-agent.env").stat().st_mode & 0o077 == 0


def test_a_bad_supervisor_setting_is_one_line(tmp_path: Path) -> None:
    argv = ["bash", str(BOOTSTRAP / "run_agent.sh"), "/x/hand-back.sh", "/usr/bin/python3", "--"]
    done = subprocess.run(argv, env={**os.environ, "SPOT_TRAINING_SUPERVISOR": "cron"}, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert (done.returncode, done.stderr) == (
        2,
        "run_agent: error: SPOT_TRAINING_SUPERVISOR=cron (auto, systemd or loop)\n",
    )


def test_a_term_during_the_pause_after_a_crash_starts_no_other_agent(tmp_path: Path) -> None:
    """The loop: an agent that crashes (here a stand-in that counts its starts and dies by SIGKILL) is started again
    after the pause, unless the node is told to stop during it."""
    starts = tmp_path / "starts"
    agent = tmp_path / "python"
    agent.write_text(f"#!/bin/sh\necho start >> {starts}\nkill -KILL $$\n")
    agent.chmod(0o755)
    env = {**os.environ, "SPOT_TRAINING_SUPERVISOR": "loop", "SPOT_TRAINING_AGENT_RESTART_PAUSE_S": "3"}
    argv = ["bash", str(BOOTSTRAP / "run_agent.sh"), str(tmp_path / "hand-back.sh"), str(agent), "--"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    said = [proc.stderr.readline() for _ in range(2)]  # bash's "Killed", then the loop's line, at once
    assert "node agent ended with signal KILL: starting it again (restart 1 of 3)" in said[-1], said
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 137  # the crashed agent's status; no restart after the pause
    assert starts.read_text().splitlines() == ["start"]
