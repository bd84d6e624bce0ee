"""checkov over synthesized templates, from its own venv (``.venv-checkov``, installed by ``make deps`` from
requirements-checkov.txt: it pins a boto3 that conflicts with ours), with no update check and a guard that refuses
any lookup or connection off loopback (``NETWORK_GUARD``). A check may be skipped only in the construct
(``skip_checkov``, CloudFormation ``Metadata: checkov: skip``, with a reason); tests/test_security_gates.py lists
the reviewed skips."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from review_gates import REPO, GateError

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
CHECKOV_TIMEOUT_S = 300

# Loaded by checkov's interpreter (a sitecustomize on PYTHONPATH): refuses, and writes down, every name lookup and
# every connection that is not on loopback, before anything leaves the machine; writes "loaded" when it is in place.
NETWORK_GUARD = """
import ipaddress, os, socket

_log = os.environ["SPOT_TRAINING_NETWORK_LOG"]
_getaddrinfo, _connect = socket.getaddrinfo, socket.socket.connect


def _note(line):
    with open(_log, "a") as f:
        f.write(line + "\\n")


def _loopback(host):
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def getaddrinfo(host, *args, **kwargs):
    if host is not None and not _loopback(host):
        _note(f"lookup of {host}")
        raise socket.gaierror(socket.EAI_NONAME, f"network guard: {host} is not on loopback")
    return _getaddrinfo(host, *args, **kwargs)


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        _note(f"connect to {address[0]}:{address[1]}")
        raise ConnectionRefusedError(f"network guard: {address[0]} is not on loopback")
    return _connect(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
_note("loaded")
"""


def checkov_env(work: Path) -> dict[str, str]:
    """The environment checkov runs in: no platform key or settings from ours (nothing of the templates leaves the
    machine), no update check, and the network guard, which writes to ``work / "network.log"``."""
    (work / "guard").mkdir()
    (work / "guard" / "sitecustomize.py").write_text(NETWORK_GUARD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_", "CKV_"))}
    env.update(
        {
            # checkov asks pypi.org for a newer version at every start (checkov/common/util/banner.py)
            "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true",
            # no run config or guideline mapping from the platform (what --skip-download also turns off)
            "BC_SKIP_MAPPING": "TRUE",
            # the update checker's cached answer (platformdirs) would hide a lookup from the guard
            "XDG_CACHE_HOME": str(work / "cache"),
            "PYTHONPATH": str(work / "guard"),
            "SPOT_TRAINING_NETWORK_LOG": str(work / "network.log"),
        }
    )
    return env


def network_log(work: Path) -> tuple[bool, list[str]]:
    """Whether the guard loaded (in every interpreter checkov starts), and each lookup or connection it refused."""
    log = work / "network.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return "loaded" in lines, [line for line in lines if line != "loaded"]


def checkov(files: list[Path], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if not CHECKOV.exists():
        raise GateError(f"checkov is not installed at {CHECKOV}: run `make deps` (requirements-checkov.txt)")
    args = [str(CHECKOV), "--framework", "cloudformation", "--output", "json", "--compact", "--skip-download"]
    for f in files:
        args += ["--file", str(f)]
    return subprocess.run(  # noqa: S603 - checkov's venv, on our templates
        args, capture_output=True, text=True, timeout=CHECKOV_TIMEOUT_S, env=env
    )


def run_checkov(files: list[Path]) -> list[dict[str, Any]]:
    """checkov's JSON report (one entry per framework) for ``files``; it reaches nothing off loopback."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = checkov(files, checkov_env(work))
        loaded, attempts = network_log(work)
    if not loaded:
        raise GateError(f"the network guard did not load in checkov: {result.stderr[-3000:]}")
    if attempts:
        raise GateError(f"checkov tried to reach the network: {attempts}")
    # Exit code 1 means "failed checks" (in the report); anything else but 0 is checkov itself failing.
    if result.returncode not in (0, 1):
        raise GateError(f"checkov failed (exit {result.returncode}): {result.stderr[-3000:]}")
    report = json.loads(result.stdout)
    return report if isinstance(report, list) else [report]


def checks(reports: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for r in reports for c in r.get("results", {}).get(kind, [])]


def describe(check: dict[str, Any]) -> str:
    return f"{Path(check['file_path']).name}: {check['check_id']} {check['resource']} ({check['check_name']})"
