"""The job's setup: ``bash <setup>`` in the code directory, once per node boot, before the first trainer; its output
in the node's log like the trainer's; a cache directory it may fill (a virtual environment, downloaded wheels)
that a node claiming the same warm volume finds again.

The cache directory (``SPOT_TRAINING_SETUP_CACHE_DIR`` in the setup's environment) is keyed by the sha256 of the
setup script's content: ``<warm volume>/setup-cache/<sha256>`` on a node with a claimed warm volume, else
``<work dir>/setup-cache/<boot id>/<sha256>`` (this boot's). A marker file (``COMPLETE``) is written in it only
after the setup exits 0; a node finding the marker skips the setup. A directory without it (a setup that failed or
was cut off) is emptied and the setup runs again from scratch.

The trainer gets the same ``SPOT_TRAINING_SETUP_CACHE_DIR`` (to use what the setup built there, e.g. its virtual
environment's site-packages). The setup gets the agent's environment and the job's ``env``, not its secrets: what
it builds may stay on a warm volume that other jobs' nodes claim, so nothing derived from a secret is written
there."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from typing import Deque, Dict, List, Optional, Tuple

from spot_training.agent.errors import AgentError, LeavingBeforeTraining
from spot_training.agent.job import Job
from spot_training.agent.log_shipping import Timed, output_lines
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.proctree import kill_all, process_tree

CACHE_ENV = "SPOT_TRAINING_SETUP_CACHE_DIR"
COMPLETE = ".spot-training-setup-complete"
SETUP_CACHES = "setup-cache"  # the folder of the setup caches, on the warm volume or in the work directory
TAIL_LINES = 5  # of the setup's output, in the FAILED reason
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def script_key(path: str) -> str:
    """The sha256 of the setup script's content: the cache's key."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def boot_id() -> str:
    """This boot's id (Linux), so that an agent restarted within the boot finds its setup done."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or "boot"
    except OSError:
        return "boot"


class JobSetup:
    """Runs the job's setup script on this node (``run``)."""

    def __init__(self, node: Node, notices: Notices) -> None:
        self.node, self.notices = node, notices

    def cache_dir(self, key: str, volume_dir: Optional[str]) -> str:
        if volume_dir is not None:
            return os.path.join(volume_dir, SETUP_CACHES, key)
        return os.path.join(self.node.settings.work_dir, SETUP_CACHES, boot_id(), key)

    def keyed_cache(self, job: Job, code_dir: str, volume_dir: Optional[str]) -> Optional[Tuple[str, str]]:
        """(the script's key, the cache directory) of the job's setup; None when the job has no setup or its code
        archive lacks the script (``run`` refuses that job)."""
        setup = job.spec.get("setup")
        script = os.path.join(code_dir, setup or "")
        if not setup or not os.path.isfile(script):
            return None
        key = script_key(script)
        return key, self.cache_dir(key, volume_dir)

    def run(self, job: Job, code_dir: str, volume_dir: Optional[str]) -> Optional[str]:
        """Run the job's setup unless its cache says it ran; its cache directory (None: the job has no setup).
        ``AgentError`` with its last lines if it fails."""
        setup = job.spec.get("setup")
        if not setup:
            return None
        keyed = self.keyed_cache(job, code_dir, volume_dir)
        if keyed is None:
            raise AgentError(f"setup script {setup!r} is not in the code archive s3://{job.bucket}/{job.code_key}")
        key, cache = keyed
        script = os.path.join(code_dir, setup)
        where = "on the warm volume" if volume_dir is not None else "for this boot"
        if os.path.isfile(os.path.join(cache, COMPLETE)):
            self.node.log(f"setup: cached {where} (key {key[:12]}, {cache}); skipped")
            return cache
        shutil.rmtree(cache, ignore_errors=True)  # a setup that did not finish there starts from scratch
        os.makedirs(cache)
        self.node.log(f"setup: running bash {setup} (cache {where}: {cache})")
        env = dict(os.environ)
        env.update(job.spec.get("env") or {})
        env[CACHE_ENV] = cache
        with Timed(self.node.log, "setup"):
            rc, tail = self.execute(script, code_dir, env)
        if rc != 0:
            last = " | ".join(tail) or "no output"
            raise AgentError(f"setup {setup} exited with code {rc}; its last lines: {last}")
        with open(os.path.join(cache, COMPLETE), "w") as f:
            json.dump({"key": key, "job_id": job.job_id, "completed_at": time.time()}, f)
        self.node.log(f"setup: done; cached (key {key[:12]})")
        return cache

    def execute(self, script: str, code_dir: str, env: Dict[str, str]) -> Tuple[int, List[str]]:
        """Run the script to its end, its output in the log; (exit code, its last lines). A spot notice (or the
        agent's SIGTERM) meanwhile ends it and raises ``LeavingBeforeTraining``."""
        proc = subprocess.Popen(  # noqa: S603 - bash and a path in the job's own code directory, no shell string
            ["bash", script],  # noqa: S607 - the node's bash, as the job file says (setup: run with bash)
            cwd=code_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        pump = threading.Thread(target=self.pump, args=(proc, tail), name="setup-output", daemon=True)
        pump.start()
        try:
            while proc.poll() is None:
                self.notices.check_notice("setup")
                try:
                    proc.wait(timeout=self.node.poll_s)
                except subprocess.TimeoutExpired:
                    pass
        except LeavingBeforeTraining:
            kill_all(process_tree(proc.pid))
            proc.wait()
            raise
        finally:
            pump.join(timeout=10)
        return proc.wait(), list(tail)

    def pump(self, proc: "subprocess.Popen[bytes]", tail: Deque[str]) -> None:
        assert proc.stdout is not None
        for line in output_lines(proc.stdout):
            tail.append(line)
            self.node.log.raw(f"[setup {self.node.instance_id}] {line}")
