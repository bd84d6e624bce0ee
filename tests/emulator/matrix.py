"""The interruption matrix (issue #6) end to end on the emulated cloud: the example job (2 nodes, fixed seed)
through each kind of interruption, every fact read back from S3, CloudWatch Logs and the Auto Scaling API. This
module holds the fixtures and checks; the cases are in three modules, each on a TrainingStack deployed for it, so
that pytest-xdist runs them side by side.

(a) a notice and (g) the rendezvous host interrupted are in ``test_e2e.py``. ``test_matrix_notices.py``: (b)
rebalance recommendation then notice, (d) a notice while a checkpoint upload is in flight, (f) both nodes interrupted
at once. ``test_matrix_hard.py``: (c) hard termination with no notice, (i) a notice to a node while it restores.
``test_matrix_restores.py``: (e) a node powered off while it restores, (h) three interruptions in one job, (j) its
group ends a node with no notice (the drain hook). For each: the job ends DONE with the group at 0 and nothing of it
left running; a thread checks the bucket all along that no manifest ever points at a missing or corrupt object; with
a notice (or the drain hook, j) no step is redone, without one (c, e) at most one checkpoint interval (in steps, from
the configured interval and step time; (c) twice: right after a checkpoint became durable, and mid-upload with
``checkpoint_wait_for_upload``, where exactly the one interval is lost); the final weights equal an
uninterrupted run's bit for bit (with and without a notice: resuming from any checkpoint replays exactly).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from bootstrap_scripts.spot_training.checkpoint import CHECK_S
from emulator import EmulatedCloud
from emulator.demo import _DURABLE as _DURABLE  # the demo's log patterns, for the cases too
from emulator.demo import _INTERRUPTED as _INTERRUPTED
from emulator.demo import JobEvent, JobRun, Scenario, Summary, run_job
from emulator.deploy import bootstrap, deploy
from emulator.nodes import Node
from tests.emulator.reference import reference_weights
from trainctl import jobs

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 2
STEP_SLEEP_S = 0.15  # 2 epochs are 42 steps: slow enough that every interruption lands mid-training
INTERVAL_S = 2.0
MANIFEST = "spot-training-manifest.json"
# Every rank logs every step: the furthest step is known even when the node of rank 0 vanishes with its logs.
TRAIN_ARGS = "--log-every 1"
_RANK_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss \S+ rank (\d+)")
_RANK0_STEP = re.compile(r"\bstep \d+ epoch \d+ loss \S+ rank 0$")
_RESTORING = re.compile(r"restoring checkpoint (\d+) from s3://")
_PEERS = re.compile(r"peers: (.*); rendezvous host")
# The most steps one checkpoint interval can hold, from the configuration (not from the checkpoints the job wrote:
# a job that skipped checkpoints would widen its own bound). Every step takes at least STEP_SLEEP_S, so the
# interval's deadline (training time since the last save, the wait for an upload not counted) has passed by the
# ceil(INTERVAL_S / STEP_SLEEP_S)-th step after a save; rank 0 looks at the clock about every CHECK_S of training,
# at most ceil(CHECK_S / STEP_SLEEP_S) steps later (1 here: it looks after every step). A loaded machine makes
# steps slower, so an interval holds fewer of them, never more.
INTERVAL_STEPS = math.ceil(INTERVAL_S / STEP_SLEEP_S) + math.ceil(CHECK_S / STEP_SLEEP_S)


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    run_dir = tmp_path_factory.mktemp("matrix")
    with EmulatedCloud(run_dir=run_dir) as c:
        bootstrap(c)
        deploy(c, "TrainingStack")
        yield c


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted 2-process run of the same job (same seed and epochs)."""
    return reference_weights(tmp_path_factory.mktemp("reference"), EPOCHS)


# ---------------------------------------------------------------------------------------------------- the bucket
class ManifestWatch:
    """While a case runs, verifies every checkpoint manifest under the cluster's prefix, again and again: each
    object it lists must exist with its size and sha256. An object that is gone is fine only if its manifest went
    first (the agent prunes manifest first); a manifest still there over a missing or corrupt object is a problem.
    """

    def __init__(self, cloud: EmulatedCloud, ref: jobs.ClusterRef) -> None:
        self.s3 = cloud.client("s3")
        self.bucket, self.prefix = ref.bucket, ref.prefix
        self.verified: set[tuple[str, str]] = set()  # (manifest key, ETag)
        self.problems: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="manifest-watch", daemon=True)

    def __enter__(self) -> ManifestWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.check()  # and once more at the end

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.check()
            except Exception as exc:  # a listing error is not a finding; note it and go on
                self.problems.append(f"watch error: {type(exc).__name__}: {exc}")

    def _manifest_etag(self, key: str) -> Optional[str]:
        try:
            return str(self.s3.head_object(Bucket=self.bucket, Key=key)["ETag"])
        except self.s3.exceptions.ClientError:
            return None

    def check(self) -> None:
        self.rounds += 1
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for obj in page.get("Contents", []):
                key, etag = obj["Key"], obj["ETag"]
                if "/ckpt/" not in key or not key.endswith("/" + MANIFEST) or (key, etag) in self.verified:
                    continue
                problem = self._verify(key)
                if problem is None:
                    self.verified.add((key, etag))
                elif self._manifest_etag(key) == etag:  # still the same manifest: a real finding
                    self.problems.append(problem)

    def _verify(self, key: str) -> Optional[str]:
        base = key[: -len(MANIFEST)]
        try:
            manifest = json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return None  # pruned since the listing
        if str(manifest.get("step")) != base.rstrip("/").rsplit("/", 1)[1]:
            return f"{key}: manifest names step {manifest.get('step')}"
        for rel, meta in manifest["files"].items():
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=base + rel)["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                return f"{key}: object {rel} is missing"
            if len(body) != meta["size"] or hashlib.sha256(body).hexdigest() != meta["sha256"]:
                return f"{key}: object {rel} does not match its size/sha256"
        return None


def manifest_steps(cloud: EmulatedCloud, ref: jobs.ClusterRef, job_id: str) -> list[int]:
    """Every checkpoint step of the job that ever got a manifest (the bucket is versioned: pruned ones too)."""
    s3 = cloud.client("s3")
    prefix = f"{ref.job_prefix(job_id)}ckpt/"
    steps: set[int] = set()
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=ref.bucket, Prefix=prefix):
        for version in page.get("Versions", []):
            step, _, rel = version["Key"][len(prefix) :].partition("/")
            if rel == MANIFEST and step.isdigit():
                steps.add(int(step))
    return sorted(steps)


def in_flight(cloud: EmulatedCloud, ref: jobs.ClusterRef, job_id: str) -> dict[int, list[str]]:
    """Checkpoints with objects in S3 but no manifest yet (an upload in flight): {step: [object names]}."""
    s3 = cloud.client("s3")
    prefix = f"{ref.job_prefix(job_id)}ckpt/"
    found: dict[int, list[str]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            step, _, rel = obj["Key"][len(prefix) :].partition("/")
            if step.isdigit():
                found.setdefault(int(step), []).append(rel)
    return {step: sorted(rels) for step, rels in found.items() if MANIFEST not in rels}


def wait_for_upload_in_flight(cloud: EmulatedCloud, run: JobRun) -> tuple[str, int, dict[int, list[str]]]:
    """After the first durable checkpoint, wait until S3 holds a newer one's objects without its manifest (uploads
    held by SPOT_TRAINING_TEST_UPLOAD_DELAY_S), not the job's last: (its uploader, the newest durable step then,
    what is in flight)."""
    run.wait_durable(0)
    writer = run.checkpoint_writer()
    durable = run.durable_step()
    flying: dict[int, list[str]] = {}

    def upload_in_flight() -> bool:
        flying.clear()
        flying.update(in_flight(cloud, run.ref, run.job_id))
        return any(step > durable for step in flying)

    run.wait_for(upload_in_flight, "an upload in flight")
    assert max(flying) < run.planned_steps(), "the upload in flight is the job's last checkpoint"
    return writer, durable, flying


# ---------------------------------------------------------------------------------------------------- one case
@dataclass
class Case:
    summary: Summary
    ref: jobs.ClusterRef
    watch: ManifestWatch
    log: list[tuple[float, str, str]]  # every shipped log line of the job (time, stream, message)
    manifest_steps: list[int]

    @property
    def job_id(self) -> str:
        return self.summary.job_id

    def lines(self, pattern: re.Pattern[str], instance: Optional[str] = None, after: float = 0.0) -> list[Any]:
        """(time, match) of the job's log lines matching ``pattern`` (of one node's stream), in time order."""
        return [
            (ts, m)
            for ts, stream, msg in self.log
            if ts >= after and (instance is None or stream.endswith("/" + instance)) and (m := pattern.search(msg))
        ]


def run_case(cloud: EmulatedCloud, name: str, scenario: Scenario, **options: Any) -> Case:
    assert cloud.run_dir is not None
    ref = jobs.find_cluster(cloud.client, "default", "main")
    options.setdefault("checkpoint_interval_s", INTERVAL_S)
    options.setdefault("step_sleep_s", STEP_SLEEP_S)
    with ManifestWatch(cloud, ref) as watch:
        summary, ref = run_job(
            cloud,
            cloud.run_dir / name,
            epochs=EPOCHS,
            train_args=TRAIN_ARGS,
            scenario=scenario,
            timeout_s=420.0,
            progress=lambda _: None,
            **options,
        )
    log = jobs.log_events(cloud.client, ref, summary.job_id)
    return Case(summary, ref, watch, log, manifest_steps(cloud, ref, summary.job_id))


def replacement_restoring(run: JobRun) -> Node:
    """Once a checkpoint is durable, a notice to one node; its replacement, once it logs that it restores (cases
    that hold restores back with SPOT_TRAINING_TEST_RESTORE_DELAY_S act on it while it does)."""
    run.wait_durable(0)
    replacement = run.wait_for_replacement(run.interrupt(run.running()[-1]))

    def is_restoring() -> bool:
        return any(
            stream.endswith("/" + replacement.instance_id) and _RESTORING.search(msg)
            for _, stream, msg in run.log_events()
        )

    run.wait_for(is_restoring, f"{replacement.instance_id} to restore")
    return replacement


def rank0_node(run: JobRun) -> str:
    """The node running rank 0 now: its stream has the newest ``... rank 0`` step line (waits for one)."""
    return run.stream_of(_RANK0_STEP)


def assert_done_and_clean(cloud: EmulatedCloud, case: Case, reference: dict[str, torch.Tensor]) -> None:
    """Common to every case: DONE, group at 0, nothing left, bucket sound throughout, weights bitwise equal."""
    client, ref, summary = cloud.client, case.ref, case.summary
    assert jobs.marker(client, ref, case.job_id, "DONE") is not None
    assert jobs.marker(client, ref, case.job_id, "FAILED") is None
    group = jobs.group(client, ref)
    assert group["DesiredCapacity"] == 0 and group["Instances"] == []
    # the bucket: checked all along (many rounds, every manifest of the job seen) and never wrong
    assert case.watch.problems == []
    seen = {key for key, _ in case.watch.verified if f"/{case.job_id}/ckpt/" in key}
    assert len(seen) >= 2 and case.watch.rounds >= 10
    # nothing of the job left running: no node process (any session), no process in a node's directory, no IMDS
    assert summary.nodes_running_after == 0
    for node in summary.nodes:
        assert node.proc.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(node.proc.pid, 0)
        for entry in Path("/proc").iterdir():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            assert not cwd.startswith(str(node.root)), f"process {entry.name} of {node.instance_id} is left"
        with socket.socket() as s:
            assert s.connect_ex((node.host, int(node.imds_url.rsplit(":", 1)[1]))) != 0
    # the result: the final checkpoint is the planned end of training, bit for bit the uninterrupted run's
    planned = jobs.planned_steps(client, ref, case.job_id)
    assert planned is not None and summary.steps_trained == planned == case.manifest_steps[-1]
    key = f"{ref.job_prefix(case.job_id)}ckpt/{summary.steps_trained}/state.pt"
    body = cloud.client("s3").get_object(Bucket=ref.bucket, Key=key)["Body"].read()
    state = torch.load(io.BytesIO(body), weights_only=False)
    assert state["model"].keys() == reference.keys()
    assert all(torch.equal(state["model"][k], reference[k]) for k in reference)
    assert summary.final_world_size == 2


def assert_nothing_redone(case: Case) -> None:
    """With a notice: every restart resumed from the furthest step the job had reached (its emergency checkpoint)."""
    assert case.summary.restarts
    assert [r.steps_redone for r in case.summary.restarts] == [0] * len(case.summary.restarts)
    stopped = {int(m.group(1)) for _, m in case.lines(_INTERRUPTED)}
    assert {r.resumed_from for r in case.summary.restarts} <= stopped  # each from an emergency checkpoint


def notices(case: Case) -> list[JobEvent]:
    return [e for e in case.summary.events if e.kind == "notice"]
