"""The emulator always stops: no process and no listening port are left, however its user ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator import EmulatedCloud

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0  # upper bound for a stop to complete; loops below poll and end early


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) holds no port and runs nothing.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_until_gone(pid: int, ports: list[int]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and (_alive(pid) or any(_listening(p) for p in ports)):
        time.sleep(0.2)
    assert not _alive(pid), f"emulator server {pid} still running"
    assert not [p for p in ports if _listening(p)], "a port is still listening"


def test_context_manager_stops_server_and_frees_ports() -> None:
    with EmulatedCloud() as cloud:
        assert cloud.pid is not None and cloud.port is not None and cloud.insecure_port is not None
        pid, ports = cloud.pid, [cloud.port, cloud.insecure_port]
        assert _alive(pid)
        assert all(_listening(p) for p in ports)
        assert cloud.client("sts").get_caller_identity()["Account"] == "123456789012"
        run_dir = cloud.run_dir
    assert not cloud.running
    _wait_until_gone(pid, ports)
    assert run_dir is not None and not run_dir.exists()  # the temporary run directory is removed


def test_the_run_directory_keeps_the_requests_the_endpoint_answered(tmp_path: Path) -> None:
    with EmulatedCloud(run_dir=tmp_path / "run") as cloud:
        for _ in range(2):
            cloud.client("sts").get_caller_identity()
        requests_file = cloud.requests_file
    counted = json.loads(requests_file.read_text())  # written whole when the server stops
    assert counted["by_caller"]["other"]["sts:GetCallerIdentity"] == 2, counted
    assert counted["total"] == sum(counted["by_action"].values()) >= 2


def test_exception_in_block_still_stops_server() -> None:
    pid = ports = None
    with pytest.raises(KeyboardInterrupt), EmulatedCloud() as cloud:
        assert cloud.pid is not None and cloud.port is not None and cloud.insecure_port is not None
        pid, ports = cloud.pid, [cloud.port, cloud.insecure_port]
        raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
    assert pid is not None and ports is not None
    _wait_until_gone(pid, ports)


# Like `python -m emulator`, the child restores the default Ctrl-C handler: a process started in the
# background by a non-interactive shell inherits SIGINT ignored (as `make test &` does).
_CHILD = """
import json, signal, sys, threading
from emulator import EmulatedCloud
signal.signal(signal.SIGINT, signal.default_int_handler)
with EmulatedCloud() as cloud:
    print(json.dumps({"pid": cloud.pid, "ports": [cloud.port, cloud.insecure_port]}), flush=True)
    threading.Event().wait()
"""


def _start_child(stderr: Path) -> tuple[subprocess.Popen[str], int, list[int]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(stderr, "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    assert child.stdout is not None
    line = child.stdout.readline()  # the child prints once the server is up (or exits: empty line)
    assert line, f"child failed to start the emulator (exit code {child.poll()}): {stderr.read_text()}"
    info = json.loads(line)
    return child, int(info["pid"]), [int(p) for p in info["ports"]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "term", "kill"])
def test_launcher_process_ending_stops_server(sig: signal.Signals, tmp_path: Path) -> None:
    """Ctrl-C and SIGTERM unwind the ``with`` block; after SIGKILL the server sees its stdin close and stops."""
    child, pid, ports = _start_child(tmp_path / "child.stderr")
    try:
        assert _alive(pid)
        child.send_signal(sig)
        child.wait(timeout=WAIT_S)
        _wait_until_gone(pid, ports)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=WAIT_S)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
