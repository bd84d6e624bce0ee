"""The node launcher (emulator/nodes.py) on groups made through the APIs, with tiny user data (no CDK, no agent)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from emulator import EmulatedCloud
from emulator.nodes import Node, NodeLauncher

POLL_S = 0.1
WAIT_S = 30.0  # upper bound of every wait below; they end as soon as their condition holds
MANUAL = 3600.0  # poll_s of a launcher whose rounds the test runs itself (launcher.poll())


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("nodes-cloud")) as c:
        yield c


def _group(cloud: EmulatedCloud, name: str, user_data: Optional[str], desired: int = 1) -> str:
    """An Auto Scaling group of ``desired`` instances whose launch template has ``user_data`` (None: none)."""
    data: dict[str, Any] = {"ImageId": next(iter(cloud.seeded_parameters.values())), "InstanceType": "t3.micro"}
    if user_data is not None:
        data["UserData"] = base64.b64encode(user_data.encode()).decode()
    cloud.client("ec2").create_launch_template(LaunchTemplateName=f"{name}-template", LaunchTemplateData=data)
    cloud.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-template", "Version": "$Latest"},
        MinSize=0,
        MaxSize=3,
        DesiredCapacity=desired,
        AvailabilityZones=["us-east-1a"],
    )
    return name


def _instances(cloud: EmulatedCloud, group: str) -> list[str]:
    [found] = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
        "AutoScalingGroups"
    ]
    return [i["InstanceId"] for i in found["Instances"]]


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def _alive(pid: int) -> bool:
    """Running (a zombie runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _imds_listens(node: Node) -> bool:
    with socket.socket() as s:
        return s.connect_ex((node.host, int(node.imds_url.rsplit(":", 1)[1]))) == 0


def test_no_signal_reaches_a_node_whose_process_was_reaped(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the user data's process is reaped its pid may be any process's: neither the instance leaving nor stop()
    may signal it (a SIGKILL to its process group from either, the second after the node is shut down, would hit
    whatever process holds that pid by then)."""
    group = _group(cloud, "reaped", "#!/bin/bash\nexit 0\n")
    sent: list[tuple[int, int]] = []
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], poll_s=POLL_S) as launcher:
        launcher.wait_for(lambda: [n.exit_code for n in launcher.all_nodes()] == [0], WAIT_S, "the user data to exit")
        [node] = launcher.all_nodes()
        node.proc.wait()  # reaped by someone else

        def recorded(real: Callable[[int, int], None]) -> Callable[[int, int], None]:
            def send(pid: int, sig: int) -> None:
                if abs(pid) == node.proc.pid:
                    sent.append((pid, sig))  # recorded, not sent: the pid may be another process's now
                else:
                    real(pid, sig)

            return send

        monkeypatch.setattr(os, "killpg", recorded(os.killpg))
        monkeypatch.setattr(os, "kill", recorded(os.kill))
        cloud.client("autoscaling").set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
        launcher.wait_for(lambda: node.terminated_at is not None, WAIT_S, "the instance to leave its group")
    assert sent == []
    assert not _imds_listens(node)  # what is provably the node's is still ended


def test_what_a_node_left_running_ends_when_its_instance_leaves(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """The user data's process stays unreaped until the node is shut down, so its process group is still the node's."""
    group = _group(cloud, "leftover", "#!/bin/bash\nsleep 300 &\necho $! > leftover.pid\n")
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], poll_s=POLL_S) as launcher:
        launcher.wait_for(lambda: [n.exit_code for n in launcher.all_nodes()] == [0], WAIT_S, "the user data to exit")
        [node] = launcher.all_nodes()
        leftover = int((node.root / "leftover.pid").read_text())
        assert _alive(leftover) and node.proc.returncode is None  # exited, not reaped
        cloud.client("autoscaling").set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
        launcher.wait_for(lambda: node.terminated_at is not None, WAIT_S, "the instance to leave its group")
        _until(lambda: not _alive(leftover), f"the leftover process {leftover} to end")
    assert node.proc.returncode == 0 and not _imds_listens(node)


def test_an_instance_is_taken_when_its_notice_time_is_up(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """User data that ignores the notice does not keep its instance: at the notice's time the node is SIGKILLed and
    the instance reclaimed (the group launches a replacement). Without the deadline, it would run on for as long as
    it liked."""
    group = _group(cloud, "deadline", "#!/bin/bash\nsleep 300\n")
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], poll_s=POLL_S) as launcher:
        launcher.wait_for(lambda: len(launcher.running()) == 1, WAIT_S, "the node to boot")
        [node] = launcher.all_nodes()
        launcher.interrupt(node.instance_id, in_s=1)
        launcher.wait_for(
            lambda: node.terminated_at is not None and node.instance_id not in _instances(cloud, group),
            WAIT_S,
            "the instance to be taken",
        )
        launcher.wait_for(lambda: len(launcher.running()) == 1, WAIT_S, "the replacement to boot")
        [replacement] = launcher.running()
    assert node.exit_code == -signal.SIGKILL and node.shut_down
    assert replacement.instance_id != node.instance_id


def test_reclaiming_an_instance_its_agent_already_handed_back_is_no_error(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent hands the instance back after the round's snapshot of the group; the reclaim's error (moto: 500)
    is no error of the launcher. Otherwise it would end the round and stay in ``errors``, failing every later
    wait_for."""
    group = _group(cloud, "handback", "#!/bin/bash\nexit 0\n")
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], poll_s=MANUAL) as launcher:
        launcher.poll()
        [node] = launcher.all_nodes()
        _until(lambda: not node.running, "the user data to exit")
        launcher.interrupt(node.instance_id)
        snapshot = launcher._in_service()
        cloud.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=node.instance_id, ShouldDecrementDesiredCapacity=True
        )
        monkeypatch.setattr(launcher, "_in_service", lambda: snapshot)
        launcher.poll()
        assert node.terminated_at is not None and launcher.errors == []
    assert _instances(cloud, group) == []


def test_an_instance_that_cannot_boot_keeps_no_other_from_booting(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """Reported once (event and error) and not tried again. Were its error to end every round, no instance sorted
    after it would ever boot, and ``emulator up`` would show nothing."""
    bad = _group(cloud, "no-user-data", None)
    good = _group(cloud, "boots", "#!/bin/bash\nexit 0\n")
    events: list[str] = []
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[bad, good], poll_s=MANUAL, on_event=events.append) as launcher:
        launcher.poll()
        launcher.poll()
        [bad_id] = _instances(cloud, bad)
        assert [n.group for n in launcher.all_nodes()] == [good]
        assert list(launcher.failed_boots) == [bad_id]
        [error] = launcher.errors
        assert bad_id in error and "has no user data" in error
        assert [e for e in events if "did not boot" in e] == [error]


def test_a_relative_work_dir_works(cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The work directory is made absolute: the node runs in its own root directory, where a relative script path
    would not resolve."""
    group = _group(cloud, "relative", "#!/bin/bash\necho booted > booted.txt\n")
    monkeypatch.chdir(tmp_path)
    with NodeLauncher(cloud, Path("relative-nodes"), groups=[group], poll_s=POLL_S) as launcher:
        launcher.wait_for(lambda: [n.exit_code for n in launcher.all_nodes()] == [0], WAIT_S, "the user data to exit")
        [node] = launcher.all_nodes()
    assert launcher.work_dir == (tmp_path / "relative-nodes").resolve()
    assert (tmp_path / "relative-nodes" / node.instance_id / "root" / "booted.txt").read_text() == "booted\n"


DRAINING_USER_DATA = """#!/bin/bash
# polls its metadata (bounded) until its group is ending it, then says so and exits 0: its agent's part
IMDS="$AWS_EC2_METADATA_SERVICE_ENDPOINT/latest"
TOKEN=$(curl -sf -X PUT "$IMDS/api/token" -H 'X-aws-ec2-metadata-token-ttl-seconds: 600')
for _ in $(seq 1 600); do
  state=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/meta-data/autoscaling/target-lifecycle-state")
  if [[ "$state" == Terminated ]]; then echo "target lifecycle state: $state"; exit 0; fi
  sleep 0.1
done
exit 1
"""


def test_an_instance_its_group_holds_keeps_its_node_and_learns_it_is_ending(
    cloud: EmulatedCloud, tmp_path: Path
) -> None:
    """With a terminating lifecycle hook, an instance its group ends waits in Terminating:Wait: its node keeps running
    and its metadata says ``Terminated``, so its agent can save first; without this, the launcher would shut the
    node down as soon as the instance left InService. Completing the hook ends it; the group replaced it meanwhile."""
    group = _group(cloud, "drain", DRAINING_USER_DATA)
    asg = cloud.client("autoscaling")
    asg.put_lifecycle_hook(
        AutoScalingGroupName=group,
        LifecycleHookName="drain-hook",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=3600,
        DefaultResult="CONTINUE",
    )
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], poll_s=MANUAL) as launcher:
        launcher.poll()
        [node] = launcher.all_nodes()
        assert node.imds.values["autoscaling/target-lifecycle-state"] == "InService"
        launcher.terminate(node.instance_id)  # as capacity rebalancing does: no decrement, no spot notice
        _until(lambda: not node.running, "the user data to see its target lifecycle state")
        launcher.poll()
        assert node.exit_code == 0 and not node.shut_down and node.terminated_at is None
        assert node.draining_at is not None
        assert "target lifecycle state: Terminated" in node.console.read_text()
        [waiting] = [
            i
            for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0][
                "Instances"
            ]
            if i["InstanceId"] == node.instance_id
        ]
        assert waiting["LifecycleState"] == "Terminating:Wait"
        replacements = [n for n in launcher.all_nodes() if n is not node]
        assert len(replacements) == 1 and replacements[0].running

        asg.complete_lifecycle_action(
            AutoScalingGroupName=group,
            LifecycleHookName="drain-hook",
            InstanceId=node.instance_id,
            LifecycleActionResult="CONTINUE",
        )
        launcher.poll()
        assert node.terminated_at is not None
        assert node.instance_id not in _instances(cloud, group)


STUBBORN = "#!/bin/bash\ntrap '' TERM\nsleep 300 &\necho $! > child.pid\nwait\n"  # ignores SIGTERM, so does its child


def stubborn_nodes(cloud: EmulatedCloud, tmp_path: Path, name: str, count: int, **kwargs: Any) -> tuple[Any, list[int]]:
    """A started launcher with ``count`` nodes that ignore SIGTERM, and the pids of their children."""
    launcher = NodeLauncher(cloud, tmp_path / "nodes", groups=[_group(cloud, name, STUBBORN, count)], **kwargs)
    launcher.start()
    launcher.wait_for(
        lambda: len(launcher.running()) == count and all((n.root / "child.pid").exists() for n in launcher.running()),
        WAIT_S,
        f"{count} stubborn node(s)",
    )
    return launcher, [int((n.root / "child.pid").read_text()) for n in launcher.running()]


def test_a_second_ctrl_c_while_nodes_stop_leaves_none_running(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() gives each node its grace in turn. A second Ctrl-C in that wait (or a CI cancel) skipped the SIGKILL
    of that node's tree and never signalled the nodes after it: in sessions of their own, no terminal signal reaches
    them, and their agents kept trying to hand their instances back to a dead endpoint, for hours."""
    launcher, children = stubborn_nodes(cloud, tmp_path, "stubborn", 2, poll_s=POLL_S)
    try:
        sleep, cut = time.sleep, list[float]()

        def second_ctrl_c(seconds: float) -> None:  # in the first node's grace
            if not cut:
                cut.append(seconds)
                raise KeyboardInterrupt
            sleep(seconds)

        monkeypatch.setattr(time, "sleep", second_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            launcher.stop()
        monkeypatch.undo()
        assert cut  # the interrupt came while a node was given its grace
        _until(lambda: not any(_alive(pid) for pid in children), "every node's processes to end")
    finally:
        launcher.stop()


def test_a_second_ctrl_c_while_a_poll_round_ends_leaves_none_running(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """The same while stop() waits for the poll thread's round (it holds the launcher's lock, e.g. for a gone
    node's grace): the nodes are signalled first; otherwise the interrupt would come before any node was
    signalled."""
    launcher, children = stubborn_nodes(cloud, tmp_path, "stubborn-poll", 1, poll_s=POLL_S)
    poll, in_round = launcher.poll, threading.Event()

    def slow_poll() -> None:
        with launcher._lock:
            in_round.set()
            time.sleep(2)
        poll()

    launcher.poll = slow_poll
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        assert in_round.wait(WAIT_S)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            launcher.stop()
        _until(lambda: not any(_alive(pid) for pid in children), "every node's processes to end")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        launcher.stop()


def test_a_terminal_that_hung_up_does_not_keep_stop_from_ending_the_nodes(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """SIGHUP (a closed terminal) stops ``emulator up``; the launcher's first line to the hung-up terminal raised
    OSError (EIO) before any node was stopped."""
    hung_up: list[bool] = []

    def on_event(line: str) -> None:
        if hung_up:
            raise OSError(5, "Input/output error")

    launcher, children = stubborn_nodes(cloud, tmp_path, "hung-up", 1, poll_s=POLL_S, on_event=on_event)
    try:
        hung_up.append(True)
        launcher.stop()
        _until(lambda: not any(_alive(pid) for pid in children), "every node's processes to end")
    finally:
        hung_up.clear()
        launcher.stop()
