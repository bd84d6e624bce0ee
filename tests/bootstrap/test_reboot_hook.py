"""The reboot hook ``user_data.sh`` installs: a rebooted node hands itself back to its group.

cloud-init runs user data once per instance, so without the hook a node that rebooted would come back without its
agent (its state, rendezvous and checkpoint sync gone with the reboot) and stay InService and billed, doing nothing.
The user data installs a script in cloud-init's per-boot directory (``SPOT_TRAINING_PER_BOOT_DIR`` here: the node's own
directory) that terminates the instance in its group on any later boot without decrementing desired capacity, so
the group launches a replacement. cloud-init runs per-boot scripts before user data, so it does not run on the first
boot; here the test plays the later boot: it kills the node's process tree and runs the installed script itself.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK
from emulator.imds import ImdsMock

from .conftest import BOOTSTRAP, REGION, TEAM, Cluster, address_map, loopback

HOOK = "spot-training-reboot.sh"


def test_a_rebooted_node_leaves_its_group_for_a_replacement(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster(nodes=2)  # min_nodes 2: the first node waits for the second, which never boots
    cluster.submit("reboot-run", {"train.py": "raise SystemExit('the trainer must not run')"}, "python train.py")
    first, _ = make_nodes(cluster)
    first.start(address_map([first]))
    for line in first.lines(timeout=60, total=120):  # bounded: the node waits up to its 60 s join timeout
        if "not in the peer address map yet; waiting" in line:
            break
    first.stop()  # the reboot: every process of the node is gone; the instance stays InService
    assert f"reboot hook installed: {first.per_boot_dir / HOOK}" in first.text
    hook = first.per_boot_dir / HOOK
    assert hook.stat().st_mode & stat.S_IXUSR
    assert [i for i, _ in cluster.instances()].count(first.instance_id) == 1
    before = cluster.desired_capacity()

    # The later boot: cloud-init runs the per-boot scripts (with a short PATH; the hook knows its AWS CLI).
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(hook)], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [said] = done.stderr.splitlines()
    assert f"instance {first.instance_id} rebooted" in said and f"back to group {cluster.group}" in said
    assert first.instance_id not in [i for i, _ in cluster.instances()]
    [reservation] = cluster.aws.ec2.describe_instances(InstanceIds=[first.instance_id])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    assert cluster.desired_capacity() == before == 2  # not decremented: the group launches a replacement
    assert cluster.marker("reboot-run", "FAILED") is None


# Records each call's argv (one call per block, a "--" line after it); answers the lifecycle state read with
# $AWS_STATE (default "None": the instance is out of its group); the command named by $AWS_FAIL exits 255.
FAKE_AWS = """#!/usr/bin/env bash
printf '%s\\n' "$@" -- >> "$AWS_ARGV_FILE"
if [[ "$2" == describe-auto-scaling-instances ]]; then echo "${AWS_STATE:-None}"; fi
if [[ "$2" == "${AWS_FAIL:-}" ]]; then exit 255; fi
exit "${AWS_EXIT:-0}"
"""


def calls(path: Path) -> list[list[str]]:
    """The fake ``aws``'s recorded calls, then forget them."""
    found = [c.strip("\n").split("\n") for c in path.read_text().split("\n--\n") if c.strip()]
    path.unlink()
    return found


FAKE_PYTHON = "#!/usr/bin/env bash\nexit 0\n"  # passes user_data.sh's check; the agent it execs ends at once


def test_the_hook_bakes_in_its_values_quoted_and_hands_back_without_decrement(tmp_path: Path) -> None:
    """With a fake ``aws`` that records its argv: the hook's call, and metadata values with shell syntax in them
    (an Auto Scaling group name may hold quotes, ``$``, spaces) baked in as data, never run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("aws", FAKE_AWS), ("python-fake", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    pwned = tmp_path / "pwned"
    group = f"g 'x\" $(touch {pwned}) `touch {pwned}` ${{HOME}}"
    instance_id = "i-0123456789abcdef0"
    imds = ImdsMock(
        host=loopback(251),
        instance_id=instance_id,
        tags={"spot-training:team": TEAM, "spot-training:cluster": "c1", "aws:autoscaling:groupName": group},
    ).start()
    per_boot = tmp_path / "per-boot"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url,
        "SPOT_TRAINING_AGENT_PYTHON": str(bin_dir / "python-fake"),
        "SPOT_TRAINING_PER_BOOT_DIR": str(per_boot),
        "SPOT_TRAINING_WORK_DIR": str(tmp_path / "work"),  # hand-back.sh goes here, not the host's /opt
        "AWS_ARGV_FILE": str(tmp_path / "argv"),
    }
    try:
        args = ["--region", REGION, "--team", TEAM, "--cluster", "c1", "--job-spec-parameter", "/p"]
        booted = subprocess.run(
            ["bash", str(BOOTSTRAP / "user_data.sh"), *args], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        imds.stop()
    assert booted.returncode == 0, booted.stderr
    assert not (tmp_path / "argv").exists()  # the first boot hands nothing back
    hook = per_boot / HOOK
    assert f"reboot hook installed: {hook}" in booted.stderr

    later = {"PATH": "/usr/bin:/bin", "AWS_ARGV_FILE": str(tmp_path / "argv")}
    done = subprocess.run([str(hook)], env=later, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    terminate = [
        "autoscaling",
        "terminate-instance-in-auto-scaling-group",
        *("--region", REGION, "--instance-id", instance_id),
        "--no-should-decrement-desired-capacity",
        *("--cli-connect-timeout", "10", "--cli-read-timeout", "20"),
    ]
    state = [
        "autoscaling",
        "describe-auto-scaling-instances",
        *("--region", REGION, "--instance-ids", instance_id, "--output", "text"),
        *("--query", "AutoScalingInstances[0].LifecycleState"),
        *("--cli-connect-timeout", "10", "--cli-read-timeout", "20"),
    ]
    # out of its group at once (no drain hook): nothing to complete
    assert calls(tmp_path / "argv") == [terminate, state]
    assert f"back to group {group}," in done.stderr  # the name as it is
    assert not pwned.exists()

    # The group's drain hook holds it: the hook completes it (its name as job_spec.py has it), or the group would
    # keep the instance, billed, until the hook's heartbeat runs out.
    held = subprocess.run(
        [str(hook)], env={**later, "AWS_STATE": "Terminating:Wait"}, capture_output=True, text=True, timeout=60
    )
    assert held.returncode == 0, held.stderr
    assert calls(tmp_path / "argv") == [
        terminate,
        state,
        [
            "autoscaling",
            "complete-lifecycle-action",
            *("--region", REGION, "--auto-scaling-group-name", group, "--instance-id", instance_id),
            *("--lifecycle-hook-name", DRAIN_HOOK, "--lifecycle-action-result", "CONTINUE"),
            *("--cli-connect-timeout", "10", "--cli-read-timeout", "20"),
        ],
    ]
    assert not pwned.exists()

    # The group is ending it already (it rebooted meanwhile): the terminate is refused, the hook lets it go.
    ending = {**later, "AWS_FAIL": "terminate-instance-in-auto-scaling-group", "AWS_STATE": "Terminating:Wait"}
    refused = subprocess.run([str(hook)], env=ending, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 0, refused.stderr
    assert [c[:2] for c in calls(tmp_path / "argv")] == [
        ["autoscaling", "terminate-instance-in-auto-scaling-group"],
        ["autoscaling", "describe-auto-scaling-instances"],
        ["autoscaling", "describe-auto-scaling-instances"],
        ["autoscaling", "complete-lifecycle-action"],
    ]
    assert "terminate it by hand" not in refused.stderr

    failing = subprocess.run(
        [str(hook)], env={**later, "AWS_EXIT": "255"}, capture_output=True, text=True, timeout=60, check=False
    )
    assert failing.returncode == 1
    assert f"could not hand instance {instance_id} back to group {group}: terminate it by hand" in failing.stderr


class StubCloud:
    """What ``NodeLauncher`` asks of its cloud to start a node's user data: no server needed."""

    def client(self, service: str) -> object:
        return object()

    def client_env(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"]}


class StubImds:
    url = "http://127.0.0.1:9"  # never contacted: the script below only prints its environment


def test_the_emulators_nodes_install_the_hook_in_their_own_directory(tmp_path: Path) -> None:
    """``emulator/nodes.py`` points the user data at the node's own per-boot directory: an emulated node never
    writes into the host's /var/lib/cloud (on a machine with cloud-init the hook would run at its next boot)."""
    from emulator.nodes import NodeLauncher

    launcher = NodeLauncher(StubCloud(), tmp_path / "work")  # type: ignore[arg-type]
    root = tmp_path / "work" / "i-1" / "root"
    root.mkdir(parents=True)
    script, console = tmp_path / "user-data.sh", tmp_path / "console.log"
    script.write_text('printf "%s\\n" "${SPOT_TRAINING_PER_BOOT_DIR:-unset}"\n')
    proc = launcher._start_user_data(script, root, console, StubImds())  # type: ignore[arg-type]
    assert proc.wait(timeout=30) == 0
    assert console.read_text().splitlines() == [str(root / "var" / "lib" / "cloud" / "scripts" / "per-boot")]
