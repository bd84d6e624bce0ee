"""The interruption matrix (issue #6) end to end on the emulated cloud: the example job (2 nodes, fixed seed)
through each kind of interruption, every fact read back from S3, CloudWatch Logs and the Auto Scaling API.

(a) a notice and (g) the rendezvous host interrupted are in ``test_e2e.py``. Here, on one deployed TrainingStack:
(b) rebalance recommendation then notice, (c) hard termination with no notice, (d) a notice while a checkpoint
upload is in flight, (e) a node powered off while it restores, (f) both nodes interrupted at once, (h) three
interruptions in one job, (i) a notice to a node while it restores, (j) its group ends a node with no notice (the
drain hook). For each: the job ends DONE with the group at 0 and nothing of it left running; a thread checks the
bucket all along that no manifest ever points at a missing or corrupt object; with a notice (or the drain hook, j)
no step is redone, without one (c, e) at most one checkpoint interval (in steps, from
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
from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK
from emulator import EmulatedCloud
from emulator.demo import JobEvent, JobRun, Scenario, Summary, run_job
from emulator.deploy import bootstrap, deploy
from emulator.nodes import Node
from tests.emulator.reference import reference_weights
from trainctl import jobs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 2
STEP_SLEEP_S = 0.15  # 2 epochs are 42 steps: slow enough that every interruption lands mid-training
INTERVAL_S = 2.0
MANIFEST = "spot-training-manifest.json"
# Every rank logs every step: the furthest step is known even when the node of rank 0 vanishes with its logs.
TRAIN_ARGS = "--log-every 1"
_RANK_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss \S+ rank (\d+)")
_RANK0_STEP = re.compile(r"\bstep \d+ epoch \d+ loss \S+ rank 0$")
_DURABLE = re.compile(r"checkpoint (\d+) durable in s3://")
_INTERRUPTED = re.compile(r"interrupted: checkpoint (\d+) saved")
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


# ---------------------------------------------------------------------------------------------------- the cases
def test_b_rebalance_recommendation_then_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """A rebalance recommendation to the node *without* rank 0 still gets a checkpoint (the agents relay it);
    the notice that follows loses nothing. No periodic checkpoints: only the recommendation and the notice save."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_step(5)
        victim = next(i for i in run.running() if i != rank0_node(run))
        rebalance = run.recommend_rebalance(victim)
        facts["rebalance_step"] = saved = run.wait_durable(0)
        run.wait_step(saved + 3)  # train on, so the notice has something to save
        run.wait_for_replacement(run.interrupt(victim))
        facts.update(victim=victim, rebalance=rebalance)

    # The relay takes two agents' metadata polls and the notice one more: slower steps keep the notice mid-training
    # (at 0.15 s a step, a run whose relay took 4 s saw the notice only after the last step; at 0.3 s a step a loaded
    # runner's shipped logs, 2 s behind, could leave about 1.5 s: 0.4 s a step adds 4 s).
    case = run_case(cloud, "b-rebalance", scenario, checkpoint_interval_s=3600.0, step_sleep_s=0.4)
    assert_done_and_clean(cloud, case, reference)
    victim, rebalance, notice = facts["victim"], facts["rebalance"], notices(case)[0]
    assert notice.instance_id == victim and rebalance.at < notice.at
    assert case.lines(re.compile(r"rebalance recommendation .*asking the trainer for a checkpoint"), victim)
    relayed = case.lines(re.compile(rf"peer {victim} got a rebalance recommendation"))
    assert relayed and relayed[0][0] < notice.at
    durable = case.lines(_DURABLE)
    assert min(ts for ts, _ in durable) > rebalance.at  # nothing was saved before the recommendation ...
    before_notice = [int(m.group(1)) for ts, m in durable if ts < notice.at]
    assert before_notice == [facts["rebalance_step"]]  # ... and exactly its checkpoint before the notice
    assert_nothing_redone(case)


def test_c_hard_termination_without_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """The node of rank 0 (it writes and uploads the checkpoints) loses power: its unsynced work and unshipped
    logs are gone. The survivor notices its peer left, the replacement restores; at most one interval redone."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        first = run.wait_durable(0)
        facts["durable_at_kill"] = run.wait_durable(first + 1)
        victim = run.checkpoint_writer()
        run.wait_for_replacement(run.power_off(victim))

    # The kill comes after the agent's sync poll, the upload and the test's poll: at most one interval redone needs
    # it within about 2.3 s of the save; polling every 0.25 s, not 1 s, leaves room on a loaded runner.
    case = run_case(cloud, "c-power-off", scenario, node_env={"SPOT_TRAINING_POLL_INTERVAL_S": "0.25"})
    assert_done_and_clean(cloud, case, reference)
    (kill,) = case.summary.events
    assert kill.kind == "power-off"
    markers = jobs.node_markers(cloud.client, case.ref, case.job_id)
    assert "leaving" not in markers[kill.instance_id]  # it never knew
    assert facts["durable_at_kill"] < case.summary.steps_trained  # it struck mid-training
    restart = next(r for r in case.summary.restarts if r.at > kill.at)
    assert restart.resumed_from >= facts["durable_at_kill"]  # from the newest durable checkpoint (or newer)
    assert 0 <= restart.steps_redone <= INTERVAL_STEPS
    assert all(r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)


def test_c_hard_termination_mid_upload_loses_at_most_one_interval_with_wait_for_upload(
    cloud: EmulatedCloud, reference: Any
) -> None:
    """(c) at the worst moment: the node of rank 0 loses power while a checkpoint uploads (objects in S3, no
    manifest; uploads held by SPOT_TRAINING_TEST_UPLOAD_DELAY_S). With the job's ``checkpoint_wait_for_upload``
    training waited for that upload, so exactly one interval is redone: from the last durable checkpoint to the
    step of the one in flight, and not a step beyond it. (By default training goes on during the upload and those
    steps are lost too: the README's trade-off.)"""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        writer, durable, flying = wait_for_upload_in_flight(cloud, run)
        kill = run.power_off(writer)
        facts.update(kill=kill, durable=durable, flying=max(flying), after=in_flight(cloud, run.ref, run.job_id))
        run.wait_for_replacement(kill)

    env = {"SPOT_TRAINING_TEST_UPLOAD_DELAY_S": "3"}
    case = run_case(cloud, "c-mid-upload", scenario, node_env=env, checkpoint_wait_for_upload=True)
    assert_done_and_clean(cloud, case, reference)
    (kill,) = case.summary.events
    assert kill.kind == "power-off"
    durable, flying = facts["durable"], facts["flying"]
    assert facts["after"].get(flying) == ["state.pt"]  # still in flight after the kill: it never became durable
    durable_before_kill = [int(m.group(1)) for ts, m in case.lines(_DURABLE) if ts < kill.at]
    assert max(durable_before_kill) == durable < flying
    restart = next(r for r in case.summary.restarts if r.at > kill.at)
    assert restart.resumed_from == durable
    # one interval: the steps between the last durable checkpoint and the one in flight, nothing trained past it
    assert restart.furthest_before == flying
    assert restart.steps_redone == flying - durable <= INTERVAL_STEPS
    assert all(r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)


def test_d_notice_while_a_checkpoint_upload_is_in_flight(cloud: EmulatedCloud, reference: Any) -> None:
    """Uploads are held between their objects and their manifest (SPOT_TRAINING_TEST_UPLOAD_DELAY_S); the notice
    reaches the uploading node while S3 holds a checkpoint's objects without its manifest."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        writer, newest, flying = wait_for_upload_in_flight(cloud, run)
        notice = run.interrupt(writer)
        facts["after_notice"] = in_flight(cloud, run.ref, run.job_id)
        facts.update(before_notice=flying, notice=notice, newest=newest)
        run.wait_for_replacement(notice)

    # held uploads lag 3 s behind: slower steps, so that the notice still lands mid-training
    env = {"SPOT_TRAINING_TEST_UPLOAD_DELAY_S": "3"}
    case = run_case(cloud, "d-upload", scenario, node_env=env, step_sleep_s=0.25)
    assert_done_and_clean(cloud, case, reference)
    notice = facts["notice"]
    flying = sorted(set(facts["before_notice"]) & set(facts["after_notice"]))
    assert flying, "no checkpoint was in flight across the notice"
    step = flying[-1]
    assert step > facts["newest"] and facts["after_notice"][step] == ["state.pt"]  # objects, no manifest
    # that upload completed after the notice (its manifest came last), then the emergency checkpoint
    completed = [ts for ts, m in case.lines(_DURABLE, notice.instance_id) if int(m.group(1)) == step]
    assert completed and completed[0] > notice.at
    assert step in case.manifest_steps
    emergency = [int(m.group(1)) for _, m in case.lines(_INTERRUPTED, after=notice.at)]
    assert emergency and emergency[0] > step and emergency[0] in case.manifest_steps
    assert_nothing_redone(case)


def test_e_power_off_while_a_node_restores(cloud: EmulatedCloud, reference: Any) -> None:
    """After a notice, the replacement loses power while it restores (restores held back by
    SPOT_TRAINING_TEST_RESTORE_DELAY_S); the survivor drops it, a second replacement restores; the job goes on."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        replacement = replacement_restoring(run)
        kill = run.power_off(replacement.instance_id)
        run.wait_for_replacement(kill)
        facts.update(kill=kill)

    case = run_case(cloud, "e-restore", scenario, node_env={"SPOT_TRAINING_TEST_RESTORE_DELAY_S": "6"})
    assert_done_and_clean(cloud, case, reference)
    kill = facts["kill"]
    assert [e.kind for e in case.summary.events] == ["notice", "power-off"]
    # it was restoring: it started and never finished, never resumed, never trained
    assert case.lines(_RESTORING, kill.instance_id)
    for unfinished in (r"step 'restore checkpoint' took", r"resume step:", r"running: "):
        assert not case.lines(re.compile(unfinished), kill.instance_id), unfinished
    assert "leaving" not in jobs.node_markers(cloud.client, case.ref, case.job_id).get(kill.instance_id, {})
    assert len(case.summary.nodes) == 4  # 2 + the replacement that died + its replacement
    assert all(0 <= r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)
    assert case.summary.restarts[0].steps_redone == 0  # the notice


def test_f_both_nodes_interrupted_at_once(cloud: EmulatedCloud, reference: Any) -> None:
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        first, second = run.running()
        events = [run.interrupt(first), run.interrupt(second)]
        run.wait_for(lambda: sum(n.booted_at > events[0].at for n in run.launcher.all_nodes()) >= 2, "two replacements")
        facts["originals"] = {first, second}

    case = run_case(cloud, "f-both", scenario)
    assert_done_and_clean(cloud, case, reference)
    originals = facts["originals"]
    assert {e.instance_id for e in notices(case)} == originals
    markers = jobs.node_markers(cloud.client, case.ref, case.job_id)
    assert {i for i, names in markers.items() if "leaving" in names} == originals
    assert len(case.summary.nodes) == 4
    # the job went on on two new nodes only: every later step line comes from a replacement's stream
    restart = case.summary.restarts[0]
    later = {stream.rsplit("/", 1)[1] for ts, stream, msg in case.log if ts > restart.at and _RANK_STEP.search(msg)}
    assert later and not later & originals
    assert_nothing_redone(case)


def test_h_three_interruptions_in_one_job(cloud: EmulatedCloud, reference: Any) -> None:
    """Three notices, each once training has made a checkpoint past the last restart: a plain node, the
    replacement of the first one, then the rendezvous host."""

    def scenario(run: JobRun) -> None:
        last = -1
        for number, pick in enumerate(("plain", "replacement", "host"), start=1):
            last = run.wait_durable(last + 1)
            assert last < run.planned_steps(), f"the job reached its end before interruption {number}"
            if pick == "replacement":
                victim = max(run.launcher.all_nodes(), key=lambda n: n.booted_at).instance_id
            else:
                victim = run.running()[0 if pick == "host" else -1]
            notice = run.interrupt(victim)
            run.wait_for_replacement(notice)
            last = max(last, run.durable_step())

    # 3 checkpoints past 3 restarts within 2 epochs (42 steps): a shorter interval than the other cases
    case = run_case(cloud, "h-three", scenario, checkpoint_interval_s=INTERVAL_S / 2, step_sleep_s=0.3)
    assert_done_and_clean(cloud, case, reference)
    sent = notices(case)
    assert len(sent) == 3 and len({e.instance_id for e in sent}) == 3
    assert len(case.summary.nodes) == 5
    stopped = [int(m.group(1)) for _, m in case.lines(_INTERRUPTED)]
    assert len(set(stopped)) == 3 and max(stopped) < case.summary.steps_trained  # three saves mid-training
    assert len({r.resumed_from for r in case.summary.restarts}) >= 3
    assert_nothing_redone(case)


def test_i_notice_while_a_node_restores(cloud: EmulatedCloud, reference: Any) -> None:
    """After a notice, the replacement gets a notice of its own while it restores (restores held back by
    SPOT_TRAINING_TEST_RESTORE_DELAY_S): it leaves before its trainer starts instead of joining the rendezvous, the
    survivor, which already waits for it there, restarts without it, a second replacement restores; nothing is
    redone."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        # The first notice goes to the node without rank 0: the survivor then holds the emergency checkpoint and
        # restores it locally at once (no held download), so it launches its trainer with the replacement ...
        survivor = rank0_node(run)  # the checkpoint writer; its step lines are shipped already (no 2 s log flush)
        replacement = run.wait_for_replacement(run.interrupt(next(i for i in run.running() if i != survivor)))

        def survivor_counts_on_it() -> bool:
            return any(
                stream.endswith("/" + survivor) and (m := _PEERS.search(msg)) and replacement.instance_id in m.group(1)
                for _, stream, msg in run.log_events()
            )

        def is_restoring() -> bool:
            return any(
                stream.endswith("/" + replacement.instance_id) and _RESTORING.search(msg)
                for _, stream, msg in run.log_events()
            )

        run.wait_for(survivor_counts_on_it, f"{survivor} to launch its trainer with {replacement.instance_id}")
        run.wait_for(is_restoring, f"{replacement.instance_id} to restore")
        # ... which gets its own notice while its restore is held
        second = run.interrupt(replacement.instance_id)
        run.wait_for_replacement(second)
        facts.update(second=second, survivor=survivor)

    # 10 s: the notice must land while the restore is held, after the "restoring" line reached CloudWatch Logs
    env = {"SPOT_TRAINING_TEST_RESTORE_DELAY_S": "10"}
    case = run_case(cloud, "i-restore-notice", scenario, node_env=env, step_sleep_s=0.25)  # room for the notices
    assert_done_and_clean(cloud, case, reference)
    leaver = facts["second"].instance_id
    assert [e.kind for e in case.summary.events] == ["notice", "notice"]
    # (if a loaded machine delays the notice past the restore, the check before the rendezvous catches it)
    assert case.lines(
        re.compile(r"during (checkpoint restore|peer discovery): leaving before the trainer starts"), leaver
    )
    assert not case.lines(re.compile(r"running: "), leaver)  # it never launched torchrun
    assert (jobs.marker(cloud.client, case.ref, case.job_id, f"nodes/{leaver}/leaving") or {}).get("trainer") is False
    assert case.lines(re.compile(r"left \S+: the group launches a replacement"), leaver)
    # Every trainer the other nodes launched after the first notice (the survivor's, the second replacement's)
    # either left the leaver out of its peers or, launched with it (the survivor's first, at least), restarted when it
    # went instead of waiting for it at the rendezvous until the join timeout; the last launch on each node, the one
    # that finished the job, did not count on it.
    after = case.summary.events[0].at
    left_early = re.compile(rf"peer {leaver} left on a notice before its trainer started: restarting")
    launches: dict[str, list[list[str]]] = {}  # stream -> the peers of each of its launches, in time order
    restarts: dict[str, int] = {}  # stream -> its restarts because the leaver went
    for ts, stream, msg in case.log:
        if ts < after or stream.endswith("/" + leaver):
            continue
        if m := _PEERS.search(msg):
            launches.setdefault(stream, []).append(m.group(1).split(", "))
        elif left_early.search(msg):
            restarts[stream] = restarts.get(stream, 0) + 1
    assert launches, "no trainer launched after the first notice"
    counted_on_it = {stream: sum(leaver in peers for peers in each) for stream, each in launches.items()}
    survivor = f"{case.job_id}/{facts['survivor']}"
    assert counted_on_it.get(survivor, 0) >= 1, launches  # the scenario waited for that launch
    assert restarts == {stream: n for stream, n in counted_on_it.items() if n}
    assert all(leaver not in each[-1] for each in launches.values()), launches
    assert len(case.summary.nodes) == 4  # 2 + the replacement that left + its replacement
    assert_nothing_redone(case)


def test_j_the_group_ends_a_node_with_no_spot_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """Capacity rebalancing ends the old instance once its replacement runs, with no spot notice (a scale-in the
    same). Before, the node was shut down mid-training and up to one interval was redone. Now the group's drain hook
    holds it in Terminating:Wait; its agent reads ``autoscaling/target-lifecycle-state`` ``Terminated``, has the
    trainer save, makes that checkpoint durable and completes the hook: nothing is redone, and the instance goes
    once the agent is done, not after the hook's heartbeat."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        # rank 0's node (its emergency checkpoint is the one the job resumes from; its step lines are shipped
        # already, where the checkpoint's "durable" line may take the agent's 2 s log flush)
        victim = rank0_node(run)
        run.wait_for_replacement(run.end_by_group(victim))

        def left_the_group() -> bool:
            return victim not in {i["InstanceId"] for i in jobs.group(run.client, run.ref)["Instances"]}

        run.wait_for(left_the_group, f"{victim} to leave its group")
        facts["victim"] = victim

    case = run_case(cloud, "j-ended-by-group", scenario, step_sleep_s=0.25)  # room for the group's end mid-training
    assert_done_and_clean(cloud, case, reference)
    victim = facts["victim"]
    assert [(e.kind, e.instance_id) for e in case.summary.events] == [("ended", victim)]
    assert case.lines(re.compile(r"its Auto Scaling group is ending this instance .*sending SIGTERM"), victim)
    assert case.lines(re.compile(rf"completed {DRAIN_HOOK}: \S+ terminates this instance now"), victim)
    assert "leaving" in jobs.node_markers(cloud.client, case.ref, case.job_id)[victim]
    [reservation] = cloud.client("ec2").describe_instances(InstanceIds=[victim])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"
    assert_nothing_redone(case)
