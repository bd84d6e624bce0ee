"""The node agent's notice handling and restarts, against moto, with a small trainer process instead of torchrun.

A notice must reach the trainer as SIGTERM even when S3 fails (its two minutes are for the emergency checkpoint),
an S3 error while polling must not end the agent, and a node restarting after a peer left on a notice must wait
for that peer's final sync before it restores.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import node_agent
import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.parsers import ResponseParserError
from botocore.retries.standard import ExponentialBackoff
from spot_training.agent import checkpoint_store, errors
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.drain import DrainHold
from spot_training.agent.instance_signals import Imds as InstanceMetadata
from spot_training.agent.job import load_job
from spot_training.agent.supervisor import Agent
from spot_training.job_spec import DRAIN_HOOK
from spot_training.sync_state import COMPLETE

from emulator.imds import ImdsMock

from .conftest import REGION, TEAM, Cluster, address_map, states

NOTICE = '{"action": "terminate", "time": "2026-11-23T18:00:00Z"}'
# Writes "<out>.ready" once it handles SIGTERM; on SIGTERM writes "saved" to <out> and exits 143; by itself exits 0
# after ``seconds`` (bounded either way).
TRAINER = """
import signal, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
def term(*_):
    open(out, "w").write("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
open(out + ".ready", "w").close()
time.sleep(seconds)
"""


class Imds:
    """Delivers ``action`` as the spot notice once ``ready`` exists (the trainer handles SIGTERM by then) and
    ``gate`` is set (a test's own precondition)."""

    def __init__(
        self, action: Optional[str] = None, ready: Optional[Path] = None, gate: Optional[threading.Event] = None
    ) -> None:
        self.action, self.ready, self.gate = action, ready, gate

    def get(self, path: str) -> Optional[str]:
        if path != "spot/instance-action" or (self.ready is not None and not self.ready.exists()):
            return None
        if self.gate is not None and not self.gate.is_set():
            return None
        return self.action


class Lines(list[str]):
    """The agent's log (``log_shipping.Log``) as a list of its lines: no CloudWatch shipping."""

    shipper = None

    def __call__(self, message: str) -> None:
        self.append(message)

    raw = __call__


class NoSync:
    """The checkpoint sync thread's target: nothing to upload here."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def sync(self, final: bool = False) -> None:
        pass

    def last_write(self) -> float:  # the stall watchdog's: no checkpoint write seen
        return 0.0


def agent_for(cluster: Cluster, instance_id: Optional[str] = None) -> tuple[Any, Any, list[str]]:
    """The agent of ``instance_id`` (default: the cluster's first instance), its job, and the lines it logs."""
    instance_id = instance_id or cluster.instances()[0][0]
    lines = Lines()
    agent = Agent(
        node_agent.parse_args(
            [
                *("--region", REGION, "--team", TEAM, "--cluster", cluster.name),
                *("--job-spec-parameter", cluster.spec_parameter, "--instance-id", instance_id),
            ]
        )
    )
    agent.node.log = lines
    agent.node.imds = Imds()  # no notice; never the real metadata address
    # the test's own work dir per instance: never the host's /opt/spot-training/work, which parallel workers share
    tune(agent, poll_s=0.05, work_dir=str(cluster.root / "work" / instance_id))
    agent.node.group = cluster.group
    return agent, load_job(agent.node.ssm, cluster.spec_parameter), lines


def tune(agent: Any, **settings: Any) -> None:
    """Set some of the agent's settings (``AgentSettings``: ``poll_s``, ``barrier_s``, ``work_dir``, ...)."""
    agent.node.settings = dataclasses.replace(agent.node.settings, **settings)


def restarting(cluster: Cluster, instance_id: Optional[str] = None, *, started: float) -> tuple[Any, Any, list[str]]:
    """``agent_for``, after an attempt with every instance of the cluster whose trainer started at ``started``
    (each wrote its ``training`` marker then) and ended (here) now."""
    agent, job, lines = agent_for(cluster, instance_id)
    agent.rendezvous.peers = cluster.instances()
    agent.syncs.trainer_started, agent.syncs.trainer_ended = started, time.time()
    for peer, ip in agent.rendezvous.peers:
        put_old_marker(agent, job, f"nodes/{peer}/training", {"attempt": 0, "address": ip, "private_ip": ip}, started)
    return agent, job, lines


def put_old_marker(agent: Any, job: Any, name: str, body: dict[str, Any], written_at: float) -> None:
    """A marker as a peer's agent wrote it at ``written_at`` (``put_marker`` stamps the current time)."""
    body = dict(body, job_id=job.job_id, time=written_at)
    agent.node.s3.put_object(Bucket=job.bucket, Key=f"{job.job_prefix}{name}", Body=json.dumps(body).encode())


def raising(operation: str) -> Any:
    """A boto3 client method that answers SlowDown, as S3 does when it sheds load."""

    def call(**_: Any) -> Any:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, operation)

    return call


def store_of(agent: Any, job: Any) -> Any:
    return checkpoint_store.CheckpointStore(
        agent.node.s3, job.bucket, f"{job.job_prefix}ckpt/", job.job_id, agent.node.log
    )


def run(agent: Any, job: Any, tmp_path: Path, seconds: float) -> tuple[int, bool, Path]:
    saved = tmp_path / "saved"
    cmd = [sys.executable, "-c", TRAINER, str(saved), str(seconds)]
    rc, interrupted = agent.trainer.run(job, str(tmp_path), cmd, {}, NoSync(store_of(agent, job)))
    return rc, interrupted, saved


@pytest.fixture
def cluster(make_cluster: Any) -> Any:
    c = make_cluster(nodes=2, interruption_grace_s=30)
    c.submit("job-n", {"train.py": ""}, "python train.py")
    return c


def test_a_notice_reaches_the_trainer_even_when_s3_fails(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, job, lines = agent_for(cluster)
    agent.node.imds = Imds(NOTICE, ready=tmp_path / "saved.ready")
    monkeypatch.setattr(agent.node.s3, "put_object", raising("PutObject"))  # the leaving marker
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=60)
    assert (rc, interrupted) == (143, True)
    assert saved.read_text() == "saved"  # SIGTERM, not the SIGKILL of a crashed agent
    assert any("sending SIGTERM to the trainer" in line for line in lines)
    assert any("could not announce leaving or list checkpoints" in line and "SlowDown" in line for line in lines), lines
    assert agent.trainer.notice_newest is None


def test_a_notice_reaches_the_trainer_while_an_s3_call_of_the_agent_hangs(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notice is watched on its own thread: an S3 call stuck in the agent's poll loop (a brownout) does not
    hold up the trainer's SIGTERM."""
    agent, job, lines = agent_for(cluster)
    saved = tmp_path / "saved"
    entered, release = threading.Event(), threading.Event()
    # The notice comes only once the agent's loop is stuck in its S3 call: were it earlier, the loop would end
    # before that call and the test would not show what it is about (it failed that way on a loaded CI machine).
    agent.node.imds = Imds(NOTICE, ready=tmp_path / "saved.ready", gate=entered)

    def hanging(**kwargs: Any) -> Any:  # the STOP marker's listing, until the test releases it (bounded)
        entered.set()
        release.wait(60)
        return raising("ListObjectsV2")(**kwargs)

    monkeypatch.setattr(agent.node.s3, "list_objects_v2", hanging)
    result: list[tuple[int, bool, Path]] = []
    trainer = threading.Thread(target=lambda: result.append(run(agent, job, tmp_path, seconds=60)))
    trainer.start()
    for _ in range(400):  # bounded: 20 s
        if saved.exists():
            break
        time.sleep(0.05)
    saved_while_hanging = saved.exists() and trainer.is_alive()  # the agent's loop is still in the S3 call
    release.set()
    trainer.join(30)
    assert saved_while_hanging  # the trainer got its SIGTERM and saved while the agent's S3 call was stuck
    assert saved.read_text() == "saved"
    assert result[0][:2] == (143, True)
    assert any("spot interruption notice" in line and "sending SIGTERM" in line for line in lines), lines


class OddOnceImds(Imds):
    """Raises an error the agent does not expect (a bug, an odd answer) at the first read of the notice, then serves
    it."""

    raised = False

    def get(self, path: str) -> Optional[str]:
        if path == "spot/instance-action" and not self.raised:
            self.raised = True
            raise RuntimeError("unexpected")
        return super().get(path)


def test_an_unexpected_error_in_the_notice_watch_does_not_end_it(cluster: Cluster, tmp_path: Path) -> None:
    """The notice watch is the only reader of the spot notice while the trainer runs: an error other than a failed
    metadata read must not end its thread, or the trainer would run on through the notice until EC2 took the
    instance."""
    agent, job, lines = agent_for(cluster)
    agent.node.imds = OddOnceImds(NOTICE, ready=tmp_path / "saved.ready")
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=60)
    assert (rc, interrupted) == (143, True)
    assert saved.read_text() == "saved"
    assert "notice poll failed: RuntimeError: unexpected" in lines


def garbled(**_: Any) -> Any:
    """An answer botocore cannot parse (a proxy's HTML page): ResponseParserError, which is no BotoCoreError."""
    raise ResponseParserError("Unable to parse response (not well-formed), invalid XML received: <html>")


@pytest.mark.parametrize(("failing", "says"), [(raising("ListObjectsV2"), "SlowDown"), (garbled, "Unable to parse")])
def test_an_s3_error_while_polling_the_job_does_not_end_the_agent(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: Any, says: str
) -> None:
    agent, job, lines = agent_for(cluster)
    agent.node.imds = Imds()
    monkeypatch.setattr(agent.node.s3, "list_objects_v2", failing)  # the STOP marker
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=1)
    assert (rc, interrupted) == (0, False)  # the trainer ran to its end
    assert not saved.exists()
    assert any(line.startswith("job poll failed:") and says in line for line in lines), lines


class GarbledImds(Imds):
    """Metadata that answers with a cut-off body (http.client raises it as it is, not as a URLError)."""

    def get(self, path: str) -> Optional[str]:
        raise http.client.IncompleteRead(b"{", 10)


def test_a_garbled_metadata_answer_does_not_end_the_agent(cluster: Cluster, tmp_path: Path) -> None:
    """A garbled answer is a failed poll: escaping the loop would SIGKILL the trainer with no emergency checkpoint
    and FAIL the job."""
    agent, job, lines = agent_for(cluster)
    agent.node.imds = GarbledImds()
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=1)
    assert (rc, interrupted) == (0, False)  # the trainer ran to its end
    assert not saved.exists()
    assert any(line.startswith("IMDS poll failed: IncompleteRead") for line in lines), lines


def test_a_metadata_answer_that_is_not_utf8_is_a_failed_poll_and_an_expired_token_is_renewed(
    cluster: Cluster,
) -> None:
    """A notice read that is not UTF-8 is a failed poll: a UnicodeDecodeError out of ``notice()`` would end the
    notice watcher's thread, and the trainer would run on through the notice."""
    agent, _, lines = agent_for(cluster)
    with ImdsMock(instance_id=agent.node.instance_id) as mock:
        mock.terminating()
        mock.values["spot/instance-action"] = b"\xff\xfe{"
        agent.node.imds = InstanceMetadata(mock.url)
        assert agent.node.imds.get("autoscaling/target-lifecycle-state") == "Terminated"
        mock.tokens.clear()  # from here on the agent's token is void: 401, a new token, the answer
        assert agent.node.imds.get("autoscaling/target-lifecycle-state") == "Terminated"
        assert [r for r in mock.requests if r.startswith("PUT")] == ["PUT /latest/api/token"] * 2
        assert agent.notices.notice() is None
        assert any(line.startswith("IMDS poll failed: 'utf-8' codec can't decode") for line in lines), lines


def test_a_restart_waits_for_the_final_sync_of_a_peer_leaving_on_a_notice(cluster: Cluster) -> None:
    (survivor, _), (leaver, _) = cluster.instances()
    agent, job, lines = restarting(cluster, survivor, started=time.time() - 1)
    peer, _, _ = agent_for(cluster, leaver)
    peer.markers.put_marker(job, f"nodes/{leaver}/leaving", {"notice": NOTICE})
    events: list[str] = []

    def restart() -> None:
        agent.syncs.wait_for_final_syncs(job)
        events.append("restoring")

    waiter = threading.Thread(target=restart)
    waiter.start()
    for _ in range(200):  # bounded: 10 s
        if any("waiting for the final checkpoint sync" in line for line in lines):
            break
        time.sleep(0.05)
    assert f"waiting for the final checkpoint sync of peer(s) {leaver}" in lines
    assert events == []  # still waiting: the leaving peer has not synced
    events.append("peer synced")
    peer.markers.put_marker(job, f"nodes/{leaver}/synced", {"attempt": 0, "pending": None})
    waiter.join(timeout=20)
    assert events == ["peer synced", "restoring"]
    assert f"peer(s) {leaver} synced their final checkpoints" in lines


def test_a_leaving_peer_that_never_syncs_holds_a_restart_only_for_the_grace(make_cluster: Any) -> None:
    cluster = make_cluster(nodes=2, interruption_grace_s=1)
    cluster.submit("job-g", {"train.py": ""}, "python train.py")
    (survivor, _), (leaver, _) = cluster.instances()
    agent, job, lines = restarting(cluster, survivor, started=time.time() - 1)
    agent.markers.put_marker(job, f"nodes/{leaver}/leaving", {"notice": NOTICE})
    # a final sync from before this attempt's trainer started does not count
    put_old_marker(
        agent, job, f"nodes/{leaver}/synced", {"attempt": 0, "pending": None}, agent.syncs.trainer_started - 60
    )
    agent.syncs.wait_for_final_syncs(job)
    assert lines[-1] == f"no final sync from peer(s) {leaver} within 1 s; restarting from what S3 holds"


def test_a_restart_does_not_wait_for_a_peer_that_left_the_group(cluster: Cluster) -> None:
    (survivor, _), (gone, _) = cluster.instances()
    agent, job, lines = restarting(cluster, survivor, started=time.time())
    agent.node.asg.terminate_instance_in_auto_scaling_group(InstanceId=gone, ShouldDecrementDesiredCapacity=False)
    agent.syncs.wait_for_final_syncs(job)  # unsynced, but gone: a hard kill, it has nothing more to give
    assert lines == []


def test_a_peers_late_sync_of_its_previous_trainer_is_not_the_sync_of_the_one_it_ran_with_ours(
    cluster: Cluster,
) -> None:
    """B (rank 0) synced the previous attempt after the grace: A had restarted without it, and B reported that
    sync after A's trainer started, then joined A's trainer. That late ``synced`` is not the sync of this attempt:
    counted for it, A would restart without waiting for B's emergency checkpoint, and with B hard-killed, A's done
    barrier would count B's final checkpoint durable (DONE without it)."""
    (a, _), (b, b_ip) = cluster.instances()
    agent, job, _ = restarting(cluster, a, started=time.time() - 10)
    late = agent.syncs.trainer_started + 2
    put_old_marker(agent, job, f"nodes/{b}/synced", {"attempt": 0, "pending": None}, late)
    put_old_marker(agent, job, f"nodes/{b}/training", {"attempt": 1, "address": b_ip, "private_ip": b_ip}, late + 2)
    assert agent.syncs.unsynced_peers(job) == [b]
    assert not agent.syncs.synced_durably(job, b)
    agent.markers.put_marker(job, f"nodes/{b}/synced", {"attempt": 1, "pending": None})  # B's final sync of this one
    assert agent.syncs.unsynced_peers(job) == [] and agent.syncs.synced_durably(job, b)


@pytest.mark.parametrize("last_trainer", ["synced before this attempt", "none (still restoring)"])
def test_a_restart_does_not_wait_for_a_peer_that_started_no_trainer_since_its_last_sync(
    make_cluster: Any, last_trainer: str
) -> None:
    """A peer found at the attempt's start (InService) that had not started its trainer when ours ended: a
    replacement still restoring a checkpoint, or a peer still in its own restart. It owes no final sync, so the
    restart does not wait for one; without this, it would wait the whole grace (``no final sync from peer(s) ...``)."""
    cluster = make_cluster(nodes=2, interruption_grace_s=1)
    cluster.submit("job-r", {"train.py": ""}, "python train.py")
    (survivor, _), (peer, peer_ip) = cluster.instances()
    agent, job, lines = restarting(cluster, survivor, started=time.time() - 1)
    agent.node.s3.delete_object(Bucket=job.bucket, Key=f"{job.job_prefix}nodes/{peer}/training")
    if last_trainer == "synced before this attempt":
        earlier = agent.syncs.trainer_started - 60
        training = {"attempt": 0, "address": peer_ip, "private_ip": peer_ip}
        put_old_marker(agent, job, f"nodes/{peer}/training", training, earlier)
        put_old_marker(agent, job, f"nodes/{peer}/synced", {"attempt": 0, "pending": None}, earlier + 30)
    agent.syncs.wait_for_final_syncs(job)
    assert agent.syncs.unsynced_peers(job) == []
    assert lines == []


def test_a_restart_judges_progress_after_the_final_sync_of_a_peer_that_stays(make_cluster: Any, tmp_path: Path) -> None:
    """B's trainer failed; A (rank 0, no notice, staying) still uploads the checkpoint its trainer saved in this
    attempt. B waits for A's final sync too, not only for peers leaving on a notice: listing S3 before A's upload
    lands, B would see no new checkpoint and, with max_restarts 0, write FAILED over a job that made progress."""
    cluster: Cluster = make_cluster(nodes=2, max_restarts=0, interruption_grace_s=30)
    cluster.submit("sync-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = restarting(cluster, b, started=time.time() - 5)
    store = store_of(agent, job)
    (tmp_path / "model.bin").write_text("state 1")
    store.upload(1, {"model.bin": str(tmp_path / "model.bin")}, "flat")
    calls: list[int] = []

    def attempt(*_: Any) -> tuple[int, bool]:
        calls.append(len(calls))
        if len(calls) == 1:
            agent.trainer.newest_before = 1  # what the attempt's restore found
            return 1, False
        raise errors.LeavingBeforeTraining("the test ends here")  # bounded: the second attempt never trains

    def a_uploads_then_syncs() -> None:  # once the agent waits for it, however long the agent's reads took
        waiting = f"waiting for the final checkpoint sync of peer(s) {a}"
        deadline = time.monotonic() + 30
        while waiting not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        (tmp_path / "model.bin").write_text("state 2")
        store.upload(2, {"model.bin": str(tmp_path / "model.bin")}, "flat")
        agent.markers.put_marker(job, f"nodes/{a}/synced", {"attempt": 0, "pending": None})

    agent.attempt = attempt
    threading.Thread(target=a_uploads_then_syncs, daemon=True).start()
    with pytest.raises(errors.LeavingBeforeTraining, match="the test ends here"):
        agent.attempts(job, cluster.group, "/tmp", store)
    assert f"waiting for the final checkpoint sync of peer(s) {a}" in lines
    assert "trainer exited with code 1; progress was made; restarts without progress: 0/0" in lines
    assert cluster.marker("sync-run", "FAILED") is None


def test_an_s3_brownout_of_several_seconds_does_not_end_the_agent(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SlowDown answers in a row to one PutObject (S3 shedding load for a while): the agent's clients make 8
    attempts (botocore's standard mode) before a call fails, instead of raising out of ``_run`` after 3 and leaving
    an idle instance behind. Back-off zeroed for the test; the policy's other settings are the agent's."""
    agent, job, _ = agent_for(cluster)
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0)
    answered: list[int] = []
    slow_downs = [7]

    def slow_down(request: Any, **_: Any) -> Optional[AWSResponse]:
        if request.method != "PUT" or len(answered) >= slow_downs[0]:
            return None  # the request goes to moto
        answered.append(503)
        return AWSResponse(request.url, 503, {}, SlowDownBody())

    agent.node.s3.meta.events.register("before-send.s3.PutObject", slow_down)
    agent.markers.put_marker(job, "nodes/i-test/done", {})
    assert answered == [503] * 7  # the eighth attempt went through
    assert cluster.marker(job.job_id, "nodes/i-test/done") is not None
    answered.clear()
    slow_downs[0] = 8
    with pytest.raises(ClientError, match="SlowDown"):
        agent.markers.put_marker(job, "nodes/i-test/other", {})
    assert answered == [503] * 8  # eight attempts, then the error


class SlowDownBody:
    """The raw body of S3's 503 SlowDown answer."""

    def stream(self, **_: Any) -> Any:
        yield b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


def test_a_notice_while_looking_for_peers_hands_the_instance_back_without_training(
    make_cluster: Any, make_nodes: Any
) -> None:
    """Real user data: a node that gets its notice before its trainer runs (here while it waits for a peer that has
    not booted) announces it leaves before training and hands the instance back, instead of joining a rendezvous
    it cannot finish and holding the instance until the reclaim."""
    cluster = make_cluster(nodes=2, interruption_grace_s=30)
    cluster.submit("job-p", {"train.py": "raise SystemExit('the trainer must not run')"}, "python train.py")
    first, second = make_nodes(cluster)
    first.start(address_map([first]))  # the second instance never boots: its address is never mapped
    waiting = f"peer(s) {second.instance_id} not in the peer address map yet; waiting"
    for line in first.lines(timeout=60):
        if waiting in line:
            first.imds.interrupt()
            break
    assert first.wait(timeout=60) == 0, first.text
    assert "during peer discovery: leaving before the trainer starts" in first.text
    assert "spot interruption notice" in first.text
    assert "running:" not in first.text  # torchrun never started
    marker = cluster.marker("job-p", f"nodes/{first.instance_id}/leaving")
    assert marker is not None and marker["trainer"] is False
    assert f"left {cluster.group}" in first.text
    assert first.instance_id not in [i for i, _ in cluster.instances()]  # handed back: the group replaces it
    assert cluster.marker("job-p", "FAILED") is None


@pytest.mark.parametrize(
    ("leaving", "expected"),
    [
        (None, "left the group without a notice"),
        ({"notice": NOTICE, "trainer": False}, "left on a notice before its trainer started"),
        ({"notice": NOTICE, "trainer": True}, None),  # its trainer's exit stops ours; nothing to restart early
    ],
)
def test_a_peer_that_left_before_its_trainer_ran_restarts_ours(
    cluster: Cluster, leaving: Optional[dict[str, Any]], expected: Optional[str]
) -> None:
    (survivor, _), (peer, _) = cluster.instances()
    agent, job, _ = restarting(cluster, survivor, started=time.time())
    if leaving is not None:
        agent.markers.put_marker(job, f"nodes/{peer}/leaving", leaving)
    assert agent.rendezvous.lost_peer(job) is None  # still in the group
    agent.node.asg.terminate_instance_in_auto_scaling_group(InstanceId=peer, ShouldDecrementDesiredCapacity=True)
    assert agent.rendezvous.lost_peer(job) == ((peer, expected) if expected else None)


def joined_later(cluster: Cluster, tmp_path: Path) -> tuple[Any, Any, list[str], Any, str, str]:
    """A's agent, which found no peer at its start (min_nodes < max_nodes), with its job and lines; B's agent, id
    and address. A's torchrun records its rounds in ``tmp_path / "world.json"``."""
    (a, a_ip), (b, b_ip) = cluster.instances()
    agent, job, lines = restarting(cluster, a, started=time.time() - 5)
    agent.rendezvous.peers = [(a, a_ip)]
    agent.rendezvous.world_file = str(tmp_path / "world.json")
    joiner, _, _ = agent_for(cluster, b)
    return agent, job, lines, joiner, b, b_ip


def new_round(agent: Any, *addresses: str) -> None:
    """What spot_training.launch writes after a rendezvous round."""
    Path(agent.rendezvous.world_file).write_text(json.dumps({"addresses": sorted(addresses)}))


def test_a_peer_that_joins_the_training_later_is_watched_like_the_first_ones(cluster: Cluster, tmp_path: Path) -> None:
    """A trained alone; B booted later and joined A's rendezvous (torchrun restarts the workers with it). The
    round's addresses and B's training marker make B a peer of A's attempt: with only the peers found at its start,
    A's agent would miss B's hard kill until the collective timed out."""
    agent, job, lines, joiner, b, b_ip = joined_later(cluster, tmp_path)
    a_ip = agent.rendezvous.peers[0][1]
    joiner.markers.put_marker(job, f"nodes/{b}/training", {"attempt": 0, "address": b_ip, "private_ip": b_ip})
    ready = tmp_path / "saved.ready"

    def b_joins_then_vanishes() -> None:
        for _ in range(200):  # bounded: 10 s
            if ready.exists():
                break
            time.sleep(0.05)
        new_round(agent, a_ip, b_ip)
        for _ in range(200):
            if f"peer {b} joined the training" in lines:
                break
            time.sleep(0.05)
        agent.node.asg.terminate_instance_in_auto_scaling_group(InstanceId=b, ShouldDecrementDesiredCapacity=False)

    threading.Thread(target=b_joins_then_vanishes, daemon=True).start()
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=30)
    assert (rc, interrupted, saved.read_text()) == (143, False, "saved")  # restarted at once, not after 30 s
    assert (b, b_ip) in agent.rendezvous.peers
    assert f"peer {b} left the group without a notice: restarting with the current peers" in lines


@pytest.mark.parametrize("in_round", [True, False])
def test_the_done_barrier_waits_for_a_peer_that_joined_the_training_later(
    cluster: Cluster, tmp_path: Path, in_round: bool
) -> None:
    """B joined A's training: A's barrier waits for B's done marker (B may hold rank 0 and still upload the final
    checkpoint). B's trainer started but never made it into a round (the training ended first): not a peer, A
    writes DONE at once."""
    agent, job, lines, joiner, b, b_ip = joined_later(cluster, tmp_path)
    joiner.markers.put_marker(job, f"nodes/{b}/training", {"attempt": 0, "address": b_ip, "private_ip": b_ip})
    new_round(agent, agent.rendezvous.peers[0][1], *([b_ip] if in_round else []))
    agent.rendezvous.add_joined_peers(job, agent.markers.node_markers(job))
    tune(agent, barrier_s=0.5)
    assert agent.endings.finish(job, cluster.group)
    if in_round:
        assert cluster.marker(job.job_id, "DONE") is None
        assert any(line.startswith(f"peers {b} did not report done within") for line in lines), lines
        assert [i for i, _ in cluster.instances()] == [b]
    else:
        assert cluster.marker(job.job_id, "DONE") is not None and cluster.desired_capacity() == 0


def test_a_notice_while_waiting_for_a_leaving_peer_ends_the_wait(cluster: Cluster, tmp_path: Path) -> None:
    """A restart waits up to the grace for a leaving peer's final sync; a notice to this node meanwhile ends the
    wait, and the node leaves without waiting for that peer at all (no trainer ran here since: nothing of the
    peer's waits on this node), instead of spending the grace, most of its own two minutes, on it."""
    (survivor, _), (leaver, _) = cluster.instances()
    agent, job, lines = restarting(cluster, survivor, started=time.time() - 1)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.syncs.syncer = Syncer(store_of(agent, job), job, agent.node.log, keep=2)  # an earlier attempt's
    agent.markers.put_marker(job, f"nodes/{leaver}/leaving", {"notice": NOTICE, "trainer": True})  # never syncs
    agent.node.imds = Imds(NOTICE)
    with pytest.raises(errors.LeavingBeforeTraining, match=r"spot interruption notice .* during a restart") as e:
        agent.syncs.wait_for_final_syncs(job)
    assert agent.endings.leave_before_training(job, cluster.group, str(e.value)) == 0
    assert not [line for line in lines if "within the grace" in line], lines  # the bug waited 30 s and said so
    assert f"left {cluster.group}: the group launches a replacement" in lines
    assert survivor not in [i for i, _ in cluster.instances()]


def test_leaving_before_training_makes_the_nodes_own_unsynced_checkpoint_durable_first(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An earlier attempt's checkpoint still only on this node's disk (its final sync failed) goes to S3 before the
    node hands its instance back: nothing is lost."""
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "7").mkdir(parents=True)
    (tmp_path / "ckpt" / "7" / "state.pt").write_bytes(b"weights")
    agent.syncs.syncer = Syncer(store_of(agent, job), job, agent.node.log, keep=2)
    assert cluster.manifests(job.job_id) == []
    assert agent.endings.leave_before_training(job, cluster.group, "spot interruption notice x during a restart") == 0
    assert cluster.manifests(job.job_id) == [7]
    marker = cluster.marker(job.job_id, f"nodes/{agent.node.instance_id}/leaving")
    assert marker is not None and marker["trainer"] is False
    assert lines[-1] == f"left {cluster.group}: the group launches a replacement"


def test_leaving_before_training_hands_the_instance_back_even_when_s3_fails(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "7").mkdir(parents=True)
    (tmp_path / "ckpt" / "7" / "state.pt").write_text("not in S3 yet")
    agent.syncs.syncer = Syncer(store_of(agent, job), job, agent.node.log, keep=2)
    monkeypatch.setattr(agent.syncs.syncer.store, "listing", raising("ListObjectsV2"))
    monkeypatch.setattr(agent.node.s3, "put_object", raising("PutObject"))  # the leaving marker
    assert agent.endings.leave_before_training(job, cluster.group, "spot interruption notice x during a restart") == 0
    assert any(line.startswith("could not announce leaving:") and "SlowDown" in line for line in lines), lines
    assert any("could not make this node's last checkpoint durable" in line for line in lines), lines
    assert agent.node.instance_id not in [i for i, _ in cluster.instances()]


def test_a_notice_during_a_restore_stops_it_at_the_next_part(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore of many GB can outlast the two-minute notice: it stops between parts, leaving nothing behind."""
    agent, job, _ = agent_for(cluster)
    store = store_of(agent, job)
    monkeypatch.setattr(checkpoint_store, "PART_MIN", 4)  # 32 bytes: 8 ranged GETs
    monkeypatch.setattr(checkpoint_store.TRANSFER, "max_concurrency", 2)  # fewer in flight than parts
    src = tmp_path / "state.pt"
    src.write_bytes(bytes(range(32)))
    store.upload(7, {"state.pt": str(src)}, "step")
    started, fetched = threading.Event(), []
    get_range = store.download.get_range

    def counted(*args: Any) -> Any:
        started.set()  # the notice comes once the download is under way
        fetched.append(args)
        return get_range(*args)

    monkeypatch.setattr(store.download, "get_range", counted)
    agent.node.imds = Imds(NOTICE, gate=started)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    with pytest.raises(errors.LeavingBeforeTraining, match="during checkpoint restore"):
        agent.attempt(job, cluster.group, str(tmp_path), store, 0)
    assert len(fetched) < 8  # not every part: it stopped at the next one
    assert list((tmp_path / "ckpt").iterdir()) == []  # no half-downloaded checkpoint, no temporary directory


def test_a_failed_upload_is_retried_next_round_not_the_end_of_the_job(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3's upload_file wraps every S3 error in S3UploadFailedError (no ClientError): it must not escape the
    sync (the sync thread died; after the trainer, the job was marked FAILED)."""
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path)
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "state.pt").write_bytes(b"weights")
    store = store_of(agent, job)

    def failed(*_: Any, **__: Any) -> Any:
        raise S3UploadFailedError("Failed to upload state.pt: An error occurred (SlowDown) when calling PutObject")

    monkeypatch.setattr(store.s3, "upload_file", failed)
    syncer = Syncer(store, job, agent.node.log, keep=1)
    syncer.sync(final=True)
    assert any(line.startswith("checkpoint sync failed (S3UploadFailedError") for line in lines), lines
    assert syncer.pending() is not None  # still to upload: the next round tries again


def held_by_its_group(agent: Any, monkeypatch: pytest.MonkeyPatch, held: str, group: str) -> list[dict[str, Any]]:
    """Auto Scaling answers as when the group holds ``held`` in Terminating:Wait (its drain hook; plain moto has no
    hooks): describes say so, a terminate of it is refused, and CompleteLifecycleAction calls are recorded."""
    describe_groups = agent.node.asg.describe_auto_scaling_groups
    completed: list[dict[str, Any]] = []

    def groups(**kwargs: Any) -> Any:
        answer = describe_groups(**kwargs)
        for found in answer["AutoScalingGroups"]:
            for instance in found["Instances"]:
                if instance["InstanceId"] == held:
                    instance["LifecycleState"] = "Terminating:Wait"
        return answer

    def instances(InstanceIds: list[str]) -> Any:
        assert InstanceIds == [held]
        return {
            "AutoScalingInstances": [
                {"InstanceId": held, "AutoScalingGroupName": group, "LifecycleState": "Terminating:Wait"}
            ]
        }

    def terminate(**_: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "ValidationError", "Message": f"The instance {held} is not in InService or Standby."}},
            "TerminateInstanceInAutoScalingGroup",
        )

    monkeypatch.setattr(agent.node.asg, "describe_auto_scaling_groups", groups)
    monkeypatch.setattr(agent.node.asg, "describe_auto_scaling_instances", instances)
    monkeypatch.setattr(agent.node.asg, "terminate_instance_in_auto_scaling_group", terminate)
    monkeypatch.setattr(agent.node.asg, "complete_lifecycle_action", lambda **kwargs: completed.append(kwargs))
    return completed


def test_a_peer_its_group_holds_is_not_lost(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer its group ends (capacity rebalancing, a scale-in, on AWS a spot notice too) waits in Terminating:Wait,
    running: its agent saves and announces ``leaving``, and its trainer's exit stops ours. It is not powered off:
    counted as lost, ours would be stopped at once with a 10 s grace, its checkpoint cut short."""
    (survivor, _), (peer, _) = cluster.instances()
    agent, job, _ = restarting(cluster, survivor, started=time.time())
    held_by_its_group(agent, monkeypatch, peer, cluster.group)
    assert agent.rendezvous.lost_peer(job) is None


def test_an_instance_its_group_ends_already_is_let_go_and_its_hook_completed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a notice the agent hands its instance back; on AWS, under capacity rebalancing, the group may hold it in
    Terminating:Wait already, and refuses the terminate. The agent lets it go and completes the drain hook, instead
    of asking for a termination by hand and leaving the hook to time out (the instance billed for 300 s more)."""
    agent, _, lines = agent_for(cluster)
    completed = held_by_its_group(agent, monkeypatch, agent.node.instance_id, "its-group")
    agent.group_exit.hand_back(cluster.group)
    agent.complete_drain()
    assert f"leaving {cluster.group}: it is ending this instance already (Terminating:Wait)" in lines
    assert not [line for line in lines if "terminate it by hand" in line]
    assert completed == [
        {
            "AutoScalingGroupName": "its-group",  # the group Auto Scaling names, whatever the agent was told
            "LifecycleHookName": DRAIN_HOOK,
            "InstanceId": agent.node.instance_id,
            "LifecycleActionResult": "CONTINUE",
        }
    ]
    assert f"completed {DRAIN_HOOK}: its-group terminates this instance now" in lines


def test_the_drain_is_completed_once_terminating_becomes_the_wait(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Auto Scaling passes through ``Terminating`` before the hook holds the instance in ``Terminating:Wait``. Read
    then, the agent (ended while its group was ending the instance unseen) took it for past the hook and exited
    without completing it: the instance stayed billed for the hook's 300 s heartbeat. It waits for the hold, as the
    user data's ``complete_drain`` does."""
    agent, _, lines = agent_for(cluster)
    completed = held_by_its_group(agent, monkeypatch, agent.node.instance_id, "its-group")
    states = iter(["Terminating", "Terminating:Wait"])

    def instances(InstanceIds: list[str]) -> Any:
        state = next(states)
        return {"AutoScalingInstances": [{"AutoScalingGroupName": "its-group", "LifecycleState": state}]}

    monkeypatch.setattr(agent.node.asg, "describe_auto_scaling_instances", instances)
    agent.complete_drain()
    assert [c["InstanceId"] for c in completed] == [agent.node.instance_id]
    assert f"completed {DRAIN_HOOK}: its-group terminates this instance now" in lines


class Ending:
    """IMDS as on an instance its group ends, once ``on``: ``autoscaling/target-lifecycle-state`` reads
    ``Terminated``."""

    on = False

    def get(self, path: str) -> Optional[str]:
        return "Terminated" if self.on and path == "autoscaling/target-lifecycle-state" else None


def test_the_drain_hold_records_the_hooks_heartbeat_only_while_checkpoint_bytes_go_out_and_the_group_ends_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The drain hold (against the hook itself: tests/emulator/test_lifecycle_hooks.py) runs from the job's start. It
    records the hook's heartbeat only while checkpoint bytes go to S3, no trainer runs and the group ends the
    instance, and stops before the agent completes the hook. Without it, an upload longer than the hook's 300 s
    heartbeat (a large final checkpoint, or rank 0's upload when a stop scales the group to 0) would be cut off."""
    agent, job, lines = agent_for(cluster)
    completed = held_by_its_group(agent, monkeypatch, agent.node.instance_id, "its-group")
    beats: list[dict[str, Any]] = []
    monkeypatch.setattr(agent.node.asg, "record_lifecycle_action_heartbeat", lambda **kw: beats.append(kw))
    agent.drain_hold.look_s, agent.drain_hold.beat_s = 0.05, 0.1
    agent.node.imds = ending = Ending()
    tune(agent, work_dir=str(tmp_path / "work"))
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.node.stop_signal.set()  # the agent's SIGTERM: it leaves at boot, once it has made the job's store (and hold)
    assert agent._run(job) == 0
    assert states(lines) == ["BOOT", "LEAVING"]
    assert "state BOOT -> LEAVING: agent received SIGTERM during boot" in lines
    store = agent.store
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"x" * (20 * 2**20))  # above the 16 MiB multipart threshold
    store.upload(7, {"model.pt": str(checkpoint)}, "flat")
    assert store.sent_bytes == 20 * 2**20
    time.sleep(0.3)  # six looks after the upload
    assert beats == []  # the group keeps the instance: a routine upload extends nothing

    ending.on = True
    agent.trainer.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a trainer still runs: an agent that missed the group's notice does not renew the hook
        store.upload(8, {"model.pt": str(checkpoint)}, "flat")
        time.sleep(0.3)
        assert beats == []
    finally:
        agent.trainer.proc.kill()
        agent.trainer.proc.wait(10)

    store.upload(9, {"model.pt": str(checkpoint)}, "flat")  # the final sync, no trainer left: it renews the hook
    beat_line = re.compile(
        rf"checkpoint upload under way \([0-9.]+ MiB in the last 0\.05 s\): recorded {DRAIN_HOOK}'s heartbeat, "
        "its-group holds this instance up to 300 s more"
    )
    for _ in range(100):  # bounded: 5 s
        if any(beat_line.fullmatch(line) for line in lines):
            break
        time.sleep(0.05)
    assert [line for line in lines if beat_line.fullmatch(line)], lines
    assert beats[0] == {
        "AutoScalingGroupName": "its-group",
        "LifecycleHookName": DRAIN_HOOK,
        "InstanceId": agent.node.instance_id,
    }
    time.sleep(0.3)
    after = len(beats)
    time.sleep(0.3)  # no bytes: no heartbeat
    assert len(beats) == after

    agent.complete_drain()
    assert [c["InstanceId"] for c in completed] == [agent.node.instance_id]
    store.upload(10, {"model.pt": str(checkpoint)}, "flat")
    time.sleep(0.3)
    assert len(beats) == after  # stopped before the hook was completed


def test_a_failed_heartbeat_is_logged_and_tried_again_at_the_next_look_with_bytes_sent() -> None:
    """The hold's looks driven by hand (no thread): Auto Scaling throttles the first heartbeat."""
    calls: list[dict[str, Any]] = []

    class Asg:
        def describe_auto_scaling_instances(self, InstanceIds: list[str]) -> Any:
            return {"AutoScalingInstances": [{"AutoScalingGroupName": "g", "LifecycleState": "Terminating:Wait"}]}

        def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> None:
            calls.append(kwargs)
            if len(calls) == 1:
                error = {"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}
                raise ClientError(error, "RecordLifecycleActionHeartbeat")

    lines: list[str] = []
    sent = [0]
    hold = DrainHold(Asg(), "i-1", lines.append, lambda: sent[0], lambda: True, look_s=10.0, beat_s=0.0)
    sent[0] = 2**20
    hold.look()
    hold.look()  # no bytes since: no try
    assert len(calls) == 1
    assert len(lines) == 1 and "Rate exceeded" in lines[0], lines
    assert lines[0].startswith(f"could not record {DRAIN_HOOK}'s heartbeat (")
    assert lines[0].endswith("); the next look with bytes sent tries again")
    sent[0] += 2**20
    hold.look()
    assert len(calls) == 2 and lines[-1].startswith("checkpoint upload under way (1.0 MiB in the last 10 s)"), lines


def test_a_peer_whose_final_sync_left_a_checkpoint_pending_is_waited_for_until_it_reports_it_durable(
    cluster: Cluster, tmp_path: Path
) -> None:
    """B (rank 0's node) reported its final sync with a checkpoint still pending (S3 refused it); its agent retries.
    A waits until B reports it durable: ending the wait at any ``synced``, A would restore the older checkpoint and
    train on without B's newer one."""
    (a, _), (b, _) = cluster.instances()
    agent, job, _ = restarting(cluster, a, started=time.time() - 1)
    peer, peer_job, peer_lines = agent_for(cluster, b)
    peer_job.checkpoint_dir = str(tmp_path / "b")
    (tmp_path / "b" / "7").mkdir(parents=True)
    (tmp_path / "b" / "7" / "state.pt").write_text("emergency checkpoint 7")
    (tmp_path / "b" / "7" / COMPLETE).touch()
    peer.syncs.syncer = Syncer(store_of(peer, peer_job), peer_job, peer.node.log, keep=2)
    report = {"attempt": 0, "pending": peer.syncs.syncer.pending(), "rc": 143, "interrupted": True}
    assert report["pending"] == "checkpoint 7"
    peer.syncs.synced_report = peer_job, report
    peer.markers.put_marker(peer_job, f"nodes/{b}/synced", report)
    assert agent.syncs.unsynced_peers(job) == [b]
    assert peer.syncs.own_pending() is None  # the retry went through: 7 is durable, and B says so
    assert "checkpoint 7 is durable in S3 now: reported to the peers" in peer_lines
    assert agent.syncs.unsynced_peers(job) == [] and agent.syncs.synced_durably(job, b)


def test_a_restart_first_retries_this_node_s_own_final_sync(make_cluster: Any, tmp_path: Path) -> None:
    """The trainer wrote a newer flat checkpoint and crashed; the final sync did not get it to S3. The restart first
    retries that sync: the next attempt's restore would otherwise write S3's older copy over it, and that progress
    would be lost."""
    cluster = make_cluster(nodes=1, interruption_grace_s=30)
    cluster.submit("job-f", {"train.py": ""}, "python train.py")
    agent, job, lines = restarting(cluster, started=time.time() - 1)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    store = store_of(agent, job)
    (tmp_path / "ckpt" / "model.bin").write_text("state at step 10")
    store.upload(1, {"model.bin": str(tmp_path / "ckpt" / "model.bin")}, "flat")
    seen: list[tuple[Optional[int], str]] = []

    def attempt(job: Any, group: str, code_dir: str, store: Any, attempt: int) -> tuple[int, bool]:
        if attempt == 0:  # trained on, saved, crashed; its final sync did not get the file to S3
            agent.trainer.newest_before = 1
            syncer = Syncer(store, job, agent.node.log, keep=2)
            syncer.restored_flat()
            (tmp_path / "ckpt" / "model.bin").write_text("state at step 20")
            agent.syncs.syncer = syncer
            return 1, False
        out = tmp_path / f"restore-{attempt}"  # what this attempt's restore would put in place
        out.mkdir()
        restored = store.restore_newest(str(out))
        seen.append((restored[0] if restored else None, (out / "model.bin").read_text()))
        return 0, False

    agent.attempt = attempt
    assert agent.attempts(job, cluster.group, str(tmp_path), store) == 0
    assert seen == [(2, "state at step 20")]
    assert "progress was made" in " ".join(lines)


def test_a_failed_re_report_of_a_durable_checkpoint_is_tried_again(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report counts as written only once its PUT succeeds: after one SlowDown the peers would otherwise see
    "pending" for good, wait the whole grace, and the done barrier would count this node as lost."""
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.syncs.syncer = Syncer(store_of(agent, job), job, agent.node.log, keep=2)  # nothing pending (any more)
    agent.syncs.synced_report = job, {"attempt": 0, "pending": "checkpoint 7", "rc": 143, "interrupted": True}
    put_marker, calls = agent.markers.put_marker, []

    def slow_down_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        if len(calls) == 1:
            raising("PutObject")()
        return put_marker(*args, **kwargs)

    monkeypatch.setattr(agent.markers, "put_marker", slow_down_once)
    assert agent.syncs.own_pending() is None
    assert any(line.startswith("could not report this node's final sync again") for line in lines), lines
    assert agent.syncs.own_pending() is None
    synced = cluster.marker(job.job_id, f"nodes/{agent.node.instance_id}/synced")
    assert synced is not None and synced["pending"] is None and synced["rc"] == 143
    assert calls == [f"nodes/{agent.node.instance_id}/synced"] * 2
    assert agent.syncs.own_pending() is None and len(calls) == 2  # reported: not again


def test_a_notice_during_a_restart_s_retry_of_its_own_final_sync_makes_the_node_leave(cluster: Cluster) -> None:
    """The retry (at most the grace, plus the upload under way) looks for a notice before each try."""
    agent, _, _ = agent_for(cluster)
    agent.node.imds = Imds(NOTICE)
    with pytest.raises(errors.LeavingBeforeTraining, match="during a restart"):
        agent.syncs.own_pending_until(time.monotonic() + 30, during="a restart")


def test_a_trainer_that_fails_on_its_own_may_have_cut_its_checkpoint_folder_short(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The trainer creates <dir>/800/ and dies (a crash, or torchrun ending its workers after a peer failed) before
    its second shard. Its final sync does not take 800 for complete: uploaded with one shard of two, every restore
    would take it, and the job would crash-loop to FAILED."""
    agent, job, _ = agent_for(cluster)
    ckpt = tmp_path / "ckpt"
    job.checkpoint_dir = str(ckpt)
    ckpt.mkdir()
    store = store_of(agent, job)

    class FinalOnly(Syncer):
        """No periodic round sees the folder while the trainer lives (one could, on a slow machine, see it twice)."""

        def sync(self, final: bool = False) -> Optional[int]:
            return super().sync(final) if final else self.newest

    syncer = FinalOnly(store, job, agent.node.log, keep=2)
    crash = (
        "import os, sys; os.makedirs(sys.argv[1]); open(sys.argv[1] + '/shard0.distcp', 'w').write('0'); sys.exit(1)"
    )
    cmd = [sys.executable, "-c", crash, str(ckpt / "800")]
    assert agent.trainer.run(job, str(tmp_path), cmd, {}, syncer) == (1, False)
    assert syncer.trainer_cut_off
    syncer.sync(final=True)
    assert store.complete_steps() == [] and not (ckpt / "800").exists()


def test_a_notice_after_a_flat_restore_does_not_upload_the_restored_copy_as_a_new_checkpoint(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart restores the flat checkpoint its last attempt uploaded; a notice comes right after. The leave asks
    the last attempt's syncer, to which the restored files (new inodes and times) must not look new: they would go up
    as the next, newest checkpoint, inside the notice's two minutes, and pruning would drop an older distinct one for
    it."""
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    store = store_of(agent, job)
    (tmp_path / "ckpt" / "model.bin").write_text("state of the last attempt")
    agent.syncs.syncer = Syncer(store, job, agent.node.log, keep=2)  # the last attempt's
    assert agent.syncs.syncer.sync(final=True) == 1
    restored = threading.Event()
    restore_newest = store.restore_newest

    def restore_then_notice(directory: str) -> Any:
        found = restore_newest(directory)
        restored.set()
        return found

    monkeypatch.setattr(store, "restore_newest", restore_then_notice)
    agent.node.imds = Imds(NOTICE, gate=restored)
    with pytest.raises(errors.LeavingBeforeTraining, match="during checkpoint restore"):
        agent.attempt(job, cluster.group, str(tmp_path), store, 1)
    assert any(line.startswith("restoring checkpoint 1 from") for line in lines), lines
    assert agent.syncs.own_pending() is None
    assert store.complete_steps() == [1]
