"""Ad-hoc faults for a running ``python -m emulator up``: a control endpoint on loopback and its client.

    python -m emulator interrupt i-0123 --run-dir RUN      # a spot interruption notice (2 minutes)
    python -m emulator rebalance --any GROUP --run-dir RUN  # a rebalance recommendation to one running node
    python -m emulator end i-0123 --run-dir RUN            # its group ends it with no spot notice
    python -m emulator power-off i-0123 --run-dir RUN      # a power cut: no notice, nothing flushed

The process that runs the :class:`~emulator.nodes.NodeLauncher` (``emulator up``) serves :class:`ControlServer`:
HTTP on 127.0.0.1, a port the kernel picks, one route (``POST /faults``). It writes the endpoint's address and a
random token into ``control.json`` in its run directory, created with mode 0600, and answers only requests that
carry that token (``Authorization: Bearer ...``): only a user who can read the run directory's file can inject
faults. The file goes when the endpoint stops. :func:`send_fault` is the client: it reads the file, posts the fault
and returns the endpoint's one-line answer, or raises :class:`~emulator.cloud.EmulatorError` with one line.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from emulator.cloud import EmulatorError

if TYPE_CHECKING:  # the client side (send_fault) needs none of the launcher's imports
    from emulator.nodes import Node, NodeLauncher

CONTROL_FILE = "control.json"  # in the run directory: the control endpoint's address and token (mode 0600)
FAULTS = {
    "interrupt": "a spot interruption notice (the instance is taken when its time is up)",
    "rebalance": "a rebalance recommendation",
    "end": "its group ends it with no spot notice (the drain hook holds it while its agent saves)",
    "power-off": "a power cut: no notice, its processes killed at once",
}
MAX_BODY = 4096


class FaultError(Exception):
    """A fault the endpoint refuses, with the one-line reason the client prints."""


class ControlServer:
    """Serves ``POST /faults`` for ``launcher`` on 127.0.0.1; see the module doc."""

    def __init__(self, launcher: NodeLauncher, run_dir: Path) -> None:
        self.launcher = launcher
        self.file = run_dir.resolve() / CONTROL_FILE
        self.token = secrets.token_urlsafe(32)
        self._server: Optional[ThreadingHTTPServer] = None

    def start(self) -> ControlServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, name="emulator-control", daemon=True).start()
        self.file.unlink(missing_ok=True)  # left by an emulator that was killed: its endpoint is gone
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"url": f"http://127.0.0.1:{server.server_port}", "token": self.token, "pid": os.getpid()}, out)
        return self

    def stop(self) -> None:
        self.file.unlink(missing_ok=True)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def apply(self, request: dict[str, Any]) -> str:
        """Deliver the fault ``request`` names (``fault``, and ``instance`` or ``group``); its one-line outcome."""
        fault = request.get("fault")
        if fault not in FAULTS:
            raise FaultError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
        node = self._target(request.get("instance"), request.get("group"))
        if fault == "interrupt":
            self.launcher.interrupt(node.instance_id)
            return f"{node.instance_id} ({node.group}): spot interruption notice delivered (taken within 120 s)"
        if fault == "rebalance":
            self.launcher.recommend_rebalance(node.instance_id)
            return f"{node.instance_id} ({node.group}): rebalance recommendation delivered"
        self.launcher.terminate(node.instance_id, hard=fault == "power-off")
        how = "powered off with no notice" if fault == "power-off" else "ended by its group with no spot notice"
        return f"{node.instance_id} ({node.group}): {how}"

    def _target(self, instance: Optional[str], group: Optional[str]) -> Node:
        nodes = {n.instance_id: n for n in self.launcher.all_nodes()}
        if group is not None:  # a node that has had no notice and that its group is not ending
            running = sorted(
                (n for n in self.launcher.running(group) if n.notice_at is None and n.draining_at is None),
                key=lambda n: n.booted_at,
            )
            if not running:
                groups = sorted({n.group for n in self.launcher.running()})
                raise FaultError(
                    f"no running node without a notice in group {group} (groups with running nodes: "
                    f"{', '.join(groups) or 'none'})"
                )
            return running[-1]  # the newest: the oldest usually hosts the job's rendezvous
        if instance not in nodes:
            known = ", ".join(sorted(n.instance_id for n in self.launcher.running())) or "none"
            raise FaultError(f"unknown instance {instance}: no emulated node runs it (running: {known})")
        node = nodes[instance]
        if not node.running or node.terminated_at is not None:
            raise FaultError(f"instance {instance} is not running (its node has shut down)")
        return node


def _handler(control: ControlServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, code: int, answer: dict[str, str]) -> None:
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            given = self.headers.get("Authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {control.token}".encode()):
                return self._send(403, {"error": "wrong or missing token (read it from the run directory's file)"})
            if self.path != "/faults":
                return self._send(404, {"error": f"no route {self.path}"})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(min(length, MAX_BODY)) or b"{}")
                return self._send(200, {"message": control.apply(request)})
            except FaultError as exc:
                return self._send(400, {"error": str(exc)})
            except (ValueError, TypeError) as exc:
                return self._send(400, {"error": f"bad request: {exc}"})
            except Exception as exc:  # the launcher's own failure (an AWS call): one line for the client
                return self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler


def send_fault(run_dir: Path, fault: str, *, instance: Optional[str] = None, group: Optional[str] = None) -> str:
    """Ask the emulator of ``run_dir`` to deliver ``fault`` to ``instance`` (or to one running node of ``group``);
    its one-line answer. EmulatorError (one line) when no emulator runs there or it refuses the fault."""
    file = run_dir / CONTROL_FILE
    try:
        control = json.loads(file.read_text())
    except FileNotFoundError:
        raise EmulatorError(
            f"no emulator is running with run directory {run_dir} (no {CONTROL_FILE}): start one with "
            f"`python -m emulator up --run-dir {run_dir}`"
        ) from None
    except (OSError, ValueError) as exc:
        raise EmulatorError(f"cannot read {file}: {exc}") from None
    body = json.dumps({"fault": fault, "instance": instance, "group": group}).encode()
    request = urllib.request.Request(  # noqa: S310 (the loopback address our own file names)
        f"{control['url']}/faults",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {control['token']}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (loopback, from our own file)
            return str(json.loads(response.read())["message"])
    except urllib.error.HTTPError as exc:
        try:
            reason = str(json.loads(exc.read())["error"])
        except (ValueError, KeyError, TypeError):
            reason = f"the control endpoint answered {exc.code} {exc.reason}"
        raise EmulatorError(reason) from None
    except (urllib.error.URLError, ConnectionError) as exc:
        raise EmulatorError(
            f"the emulator of run directory {run_dir} does not answer on {control['url']} ({exc}): is it still running?"
        ) from None
