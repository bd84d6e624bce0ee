"""How a node agent ends, against moto: a stop seen late, the DONE barrier, errors, restarts of a flat checkpoint.

Each case guards against losing the last checkpoint or leaving a billed instance behind: a stop seen only after the
trainer exited must not scale the group to 0 while rank 0's node still uploads, nor may the DONE barrier do so to a
slow final upload; an error other than an unreadable checkpoint must not leave the node idle in the group; a restored
flat checkpoint is no new step to upload, or a crash-looping trainer would "make progress" forever.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from botocore.exceptions import ClientError
from moto.autoscaling.models import FakeAutoScalingGroup
from spot_training.agent import errors, supervisor
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.local_checkpoints import local_steps
from spot_training.protocol import MANIFEST
from spot_training.sync_state import COMPLETE, read_sync_state

from trainctl import jobs
from trainctl.cli import _client_factory as client_factory
from trainctl.cli import main as trainctl_main

from .conftest import REGION, TEAM, Cluster, address_map, states
from .test_agent_notice import agent_for, raising, restarting, store_of, tune


def test_a_stop_seen_after_the_trainer_exited_waits_for_the_peers_final_sync(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster(nodes=2, interruption_grace_s=30)
    cluster.submit("stop-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, _ = restarting(cluster, b, started=time.time() - 5)
    agent.markers.put_marker(job, "STOP", {})
    agent.attempt = lambda *args: (143, False)  # the ranks stopped together before this agent polled STOP

    def a_syncs_later() -> None:
        time.sleep(1.0)
        agent.markers.put_marker(job, f"nodes/{a}/synced", {"attempt": 0, "pending": None})

    threading.Thread(target=a_syncs_later, daemon=True).start()
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    # STOPPED and the group at 0 only after A's final sync, so the group does not cut off rank 0's upload.
    synced, stopped = cluster.marker("stop-run", f"nodes/{a}/synced"), cluster.marker("stop-run", "STOPPED")
    assert synced is not None and stopped is not None
    assert stopped["time"] >= synced["time"]
    assert cluster.desired_capacity() == 0


def test_the_done_barrier_leaves_a_slow_peer_to_finish_instead_of_scaling_to_zero(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("done-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    started = time.time()  # both trainers ran together
    agent, job, _ = restarting(cluster, b, started=started)
    tune(agent, barrier_s=0.5)
    assert agent.endings.finish(job, cluster.group)  # A (rank 0, say) is still uploading its final checkpoint
    assert cluster.marker("done-run", "DONE") is None
    assert [i for i, _ in cluster.instances()] == [a]  # B left, A keeps going
    assert cluster.desired_capacity() == 1
    # A finishes: B's done marker is there, so A does not wait; A writes DONE and scales to 0.
    slow, job_a, slow_lines = restarting(cluster, a, started=started)
    assert slow.endings.finish(job_a, cluster.group)
    assert cluster.marker("done-run", "DONE") is not None
    assert cluster.desired_capacity() == 0
    assert not any("did not report done" in line for line in slow_lines)


def test_a_done_marker_of_an_earlier_attempt_does_not_count_in_the_barrier(make_cluster: Any) -> None:
    """A wrote its done marker, then a peer lost before its final sync made the job train again. In that next
    attempt A's old marker must not tell B that A finished: B would write DONE while A may still upload."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("again-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = restarting(cluster, b, started=time.time() + 3600)
    agent.markers.put_marker(job, f"nodes/{a}/done", {})  # before this attempt's trainer started
    tune(agent, barrier_s=0.5)
    assert agent.endings.finish(job, cluster.group)
    assert cluster.marker("again-run", "DONE") is None
    assert any(line.startswith(f"peers {a} did not report done within") for line in lines), lines


def trained_well(make_cluster: Any, job_id: str) -> tuple[Cluster, str, Any, Any, list[str]]:
    """Two nodes A and B; B's agent (returned with its job and lines) whose trainer finishes well."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit(job_id, {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = restarting(cluster, b, started=time.time())
    agent.attempt = lambda *args: (0, False)
    return cluster, a, agent, job, lines


@pytest.mark.parametrize(
    "synced, done",
    [
        (None, False),  # reclaimed before it reported its final sync
        ({"pending": "checkpoint 7 (model.pt)"}, False),  # its final upload failed
        ({"pending": None}, True),  # its final checkpoint is durable: it just did not get to its done marker
        ({"pending": None, "rc": 0, "interrupted": False}, True),  # the same, as an agent reports it
        # it left on a spot notice mid-training, its emergency checkpoint durable; B's script ended its loop when
        # the helper said stop and exited 0 (counting A as finished, B would write DONE and scale to 0)
        ({"pending": None, "rc": 1, "interrupted": True}, False),
    ],
)
def test_a_peer_that_left_before_its_final_checkpoint_was_durable_makes_the_job_train_again(
    make_cluster: Any, synced: Any, done: bool
) -> None:
    """A (rank 0, say) is reclaimed during the final sync of a training that ended well. B's done barrier does not
    write DONE for a peer that left the group before its final sync was reported durable (a finished job without its
    final checkpoint): B trains again from the newest durable checkpoint (and the group replaces A)."""
    cluster, a, agent, job, lines = trained_well(make_cluster, "final-run")
    attempts: list[int] = []

    def attempt(*_: Any) -> tuple[int, bool]:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            return 0, False
        raise errors.LeavingBeforeTraining("the test ends here")  # bounded: the next attempt never trains

    agent.attempt = attempt
    job.max_restarts = 0  # a retrain for a lost final checkpoint is no restart without progress
    if synced is not None:
        agent.markers.put_marker(job, f"nodes/{a}/synced", dict(synced, attempt=0))
    agent.node.asg.terminate_instance_in_auto_scaling_group(InstanceId=a, ShouldDecrementDesiredCapacity=False)
    if done:
        assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
        assert cluster.marker("final-run", "DONE") is not None and cluster.desired_capacity() == 0
        assert f"peers {a} left the group after their final sync; not waiting for them" in lines
        return
    with pytest.raises(errors.LeavingBeforeTraining, match="the test ends here"):
        agent.attempts(job, cluster.group, "/tmp", store_of(agent, job))
    assert attempts == [0, 1]
    assert cluster.marker("final-run", "DONE") is None and cluster.desired_capacity() == 2
    assert (
        f"peer(s) {a} left the group before they finished training with their final checkpoint durable: the job is "
        "not DONE; training again from the newest durable checkpoint to make the final one again"
    ) in lines


class Pending:
    """A syncer whose final checkpoint S3 keeps refusing."""

    def sync(self, final: bool = False) -> None:
        pass

    def pending(self) -> str:
        return "checkpoint 9 (model.pt)"


def test_a_node_whose_final_checkpoint_is_not_durable_does_not_report_done(make_cluster: Any) -> None:
    """The node of rank 0 whose final sync failed writes no done marker: a peer would then write DONE and scale the
    group to 0 without the final checkpoint."""
    cluster, _, agent, job, lines = trained_well(make_cluster, "pending-run")
    agent.syncs.syncer = Pending()
    tune(agent, barrier_s=0.3)
    assert not agent.endings.finish(job, cluster.group)
    assert cluster.marker("pending-run", f"nodes/{agent.node.instance_id}/done") is None
    assert lines[-1] == "checkpoint 9 (model.pt) not durable in S3 within 0 s: not reporting done; training again"


@pytest.mark.parametrize(
    "peer",
    ["restored and runs a trainer again", "still restores a large final checkpoint", "failed mid-run and rejoined"],
)
def test_the_done_barrier_trains_again_with_a_peer_that_trains_again_instead_of_finishing(
    make_cluster: Any, peer: str
) -> None:
    """A's trainer failed where B's finished (say at teardown): A reports its final sync (exit code 1), restores and
    starts a trainer again, which waits for B at its rendezvous. B trains again with A instead of waiting the barrier
    out and leaving the group (A, short of min_nodes, would wait for peers until it wrote FAILED over a finished
    training). With a large checkpoint A's new trainer marker comes after the barrier's 120 s: the exit code says it.
    A trainer A started before B's ended (it failed mid-run and rejoined B's training) finishes with B: B waits for
    it."""
    cluster, a, agent, job, lines = trained_well(make_cluster, "again-run")
    tune(agent, barrier_s=1)
    other, _, _ = agent_for(cluster, a)
    training = {"attempt": 1, "address": "127.0.0.1", "private_ip": "10.0.0.1"}
    other.markers.put_marker(job, f"nodes/{a}/synced", {"attempt": 0, "pending": None, "rc": 1, "interrupted": False})
    time.sleep(0.01)
    if peer == "restored and runs a trainer again":
        other.markers.put_marker(job, f"nodes/{a}/training", training)
    elif peer == "failed mid-run and rejoined":
        other.markers.put_marker(job, f"nodes/{a}/training", training)
        agent.syncs.trainer_ended = time.time() + 0.01  # ours ended after A's new trainer started
    assert agent.endings.finish(job, cluster.group) is (peer == "failed mid-run and rejoined")
    if peer == "failed mid-run and rejoined":
        assert any(line.startswith(f"peers {a} did not report done within") for line in lines), lines
        return
    assert lines[-1] == (
        f"peer(s) {a} train again (their trainer failed where this one finished): training again with them from "
        "the final checkpoint"
    )
    assert len(cluster.instances()) == 2 and cluster.desired_capacity() == 2
    assert cluster.marker("again-run", "DONE") is None


def test_a_final_checkpoint_s3_keeps_refusing_fails_the_job_after_bounded_retrains(make_cluster: Any) -> None:
    """Each training ends well, but S3 keeps refusing the final checkpoint (a bucket policy, a KMS grant): the node
    trains again, and a training that finished is no restart without progress. The retrains are bounded: the job ends
    FAILED instead of looping forever, billed. Each retrain waits the grace (1 s here) for the pending checkpoint
    first."""
    cluster: Cluster = make_cluster(nodes=1, interruption_grace_s=1)
    cluster.submit("refused-run", {"train.py": ""}, "python train.py")
    agent, job, _ = restarting(cluster, started=time.time())
    agent.syncs.syncer = Pending()
    tune(agent, barrier_s=0.05)
    runs: list[int] = []

    def attempt(*_: Any) -> tuple[int, bool]:
        runs.append(len(runs))
        if len(runs) > 6:
            raise errors.LeavingBeforeTraining("bounded: the test ends here")
        return 0, False

    agent.attempt = attempt
    job.max_restarts = 1
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == errors.EXIT_FAILED
    assert len(runs) == 3  # max_restarts + 1 retrains after the first finish
    failed = cluster.marker("refused-run", "FAILED")
    assert failed is not None
    assert failed["reason"] == (
        "the training finished 3 times without the job becoming DONE: checkpoint 9 (model.pt) of this node not "
        "durable in S3 within 0 s"
    )
    assert cluster.desired_capacity() == 0


def test_a_stop_that_s3_refuses_to_mark_leaves_the_group_instead_of_failing_the_job(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 error does not reach the agent's catch-all, which would write FAILED (or try to) over a stopped job and
    set the group to 0 under peers still making their final checkpoint durable."""
    cluster, a, agent, job, lines = trained_well(make_cluster, "stop-refused-run")
    monkeypatch.setattr(agent.node.s3, "put_object", raising("PutObject"))
    assert agent.endings.stopped(job, cluster.group, store_of(agent, job)) == 0
    assert any(line.startswith("the stop failed to finish (") and "SlowDown" in line for line in lines), lines
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1  # this node left


def test_a_stop_whose_final_checkpoint_was_lost_still_ends_stopped(make_cluster: Any) -> None:
    """The trainer finished despite trainctl stop, and rank 0's node A left before its final sync: not DONE but
    STOPPED. Without this, the node would hand its instance back as if reclaimed, and no node would write STOPPED."""
    cluster, a, agent, job, _ = trained_well(make_cluster, "stop-final-run")

    def attempt(*_: Any) -> tuple[int, bool]:
        agent.trainer.stop_requested, agent.trainer.notice_at = True, time.monotonic()
        return 0, True

    agent.attempt = attempt
    agent.node.asg.terminate_instance_in_auto_scaling_group(InstanceId=a, ShouldDecrementDesiredCapacity=False)
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    assert cluster.marker("stop-final-run", "STOPPED") is not None and cluster.marker("stop-final-run", "DONE") is None
    assert cluster.desired_capacity() == 0


def test_an_s3_outage_in_the_done_barrier_does_not_mark_a_finished_job_failed(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, a, agent, job, lines = trained_well(make_cluster, "outage-run")
    monkeypatch.setattr(agent.node.s3, "put_object", raising("PutObject"))  # S3 still refuses after the retries
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    assert cluster.marker("outage-run", "FAILED") is None  # the catch-all of _run never sees it
    assert any(line.startswith("done barrier failed (") and "SlowDown" in line for line in lines), lines
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1  # B left, one fewer


def test_done_written_but_its_answer_lost_still_scales_the_group_to_zero(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peers saw DONE and exited, leaving the scaling to this node: an error after DONE must not leave them."""
    cluster, a, agent, job, lines = trained_well(make_cluster, "lost-run")
    agent.markers.put_marker(job, f"nodes/{a}/done", {})
    put = agent.node.s3.put_object

    def answer_lost(**kwargs: Any) -> Any:
        put(**kwargs)
        if kwargs["Key"].endswith("/DONE"):
            raising("PutObject")(**kwargs)

    monkeypatch.setattr(agent.node.s3, "put_object", answer_lost)
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    assert cluster.marker("lost-run", "DONE") is not None and cluster.marker("lost-run", "FAILED") is None
    assert cluster.desired_capacity() == 0
    assert any(line.startswith("done barrier failed after DONE") for line in lines), lines


def test_a_node_that_cannot_find_its_peers_fails_the_job_and_scales_to_zero(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("wait-run", {"train.py": ""}, "python train.py")
    first, _ = make_nodes(cluster)
    assert first.start(address_map([first]), SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S="2").wait(60) == 1  # FAILED
    failed = cluster.marker("wait-run", "FAILED")
    assert failed is not None
    assert failed["reason"].startswith("fewer than 2 InService peers in ")  # the second node never booted
    assert cluster.desired_capacity() == 0


def test_a_node_past_max_nodes_waits_for_a_place_then_leaves_without_failing_the_job(make_cluster: Any) -> None:
    """The wait does not end in "fewer than 1 InService peers", which would mean FAILED and the running job's group
    scaled to 0."""
    cluster: Cluster = make_cluster(nodes=2, min_nodes=1, max_nodes=1)  # capacity rebalancing: one over
    cluster.submit("key-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)
    tune(agent, join_timeout_s=0.3)
    tune(agent, work_dir=str(cluster.root / "work-b"))
    job.checkpoint_dir = str(cluster.root / "ckpt-b")
    assert agent._run(job) == 0
    assert "2 InService, more than max_nodes 1; waiting for a place" in lines
    assert any(line.startswith("still past max_nodes 1 after 0 s (2 InService in ") for line in lines), lines
    assert cluster.marker("key-run", "FAILED") is None
    assert cluster.marker("key-run", f"nodes/{b}/leaving") is not None
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "LEAVING"]
    assert a in [i for i, _ in cluster.instances()] and b not in [i for i, _ in cluster.instances()]


def test_a_node_that_cannot_write_its_boot_marker_leaves_the_group_instead_of_idling(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error does not escape the agent before its catch-all (no FAILED, no scaling, an idle billed node)."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("boot-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)
    monkeypatch.setattr(agent.node.s3, "put_object", raising("PutObject"))
    with pytest.raises(errors.AgentError, match=r"^before training: An error occurred \(SlowDown\)"):
        agent._run(job)  # one line, exit code 2 (main)
    assert any(line.startswith("error: before training: ") and "SlowDown" in line for line in lines), lines
    assert states(lines) == ["BOOT", "LEAVING"]
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1  # one node fewer


def test_a_group_that_cannot_be_scaled_to_zero_still_goes_to_zero(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed SetDesiredCapacity at the job's end does not leave every node up, idle: the node that wrote DONE
    leaves the group, and its peer, seeing DONE, scales the group to 0 as well."""
    cluster, a, agent, job, lines = trained_well(make_cluster, "scale-run")
    agent.markers.put_marker(job, f"nodes/{a}/done", {})  # A finished first and waits in its barrier
    both = cluster.instances()
    monkeypatch.setattr(agent.node.asg, "set_desired_capacity", raising("SetDesiredCapacity"))
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    assert cluster.marker("scale-run", "DONE") is not None
    assert any(line.startswith(f"could not scale {cluster.group} to 0 (") for line in lines), lines
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1  # B left, one fewer
    peer, peer_job, peer_lines = restarting(cluster, a, started=time.time())
    peer.rendezvous.peers = both  # A's attempt ran with B
    peer.endings.finish(peer_job, cluster.group)  # A's next poll of its barrier
    assert f"job {job.job_id} is DONE (a peer finished it)" in peer_lines
    assert cluster.desired_capacity() == 0


@pytest.mark.parametrize("outage", [2, 99])
def test_an_auto_scaling_outage_at_the_jobs_end_is_waited_out(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, outage: int
) -> None:
    """When SetDesiredCapacity and then TerminateInstanceInAutoScalingGroup both fail after botocore's retries,
    exiting would leave the instance idle in its group, billed, for good. The agent tries to leave again, the pause
    doubling (``GroupExit.pause_s``), until ``GroupExit.retry_s``; "terminate it by hand" only after that."""
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("outage-run", {"train.py": ""}, "python train.py")
    agent, job, lines = restarting(cluster, started=time.time())
    agent.attempt = lambda *args: (0, False)
    # two refusals end within the 60 s however slow each attempt's calls are; 99 outlast the 3 s
    agent.group_exit.pause_s, agent.group_exit.retry_s = (0.05, 0.1), 60.0 if outage == 2 else 3.0
    refused: list[Any] = []
    terminate = agent.node.asg.terminate_instance_in_auto_scaling_group

    def until_the_outage_ends(**kwargs: Any) -> Any:
        if len(refused) < outage:
            refused.append(kwargs)
            raising("TerminateInstanceInAutoScalingGroup")()
        return terminate(**kwargs)

    monkeypatch.setattr(agent.node.asg, "set_desired_capacity", raising("SetDesiredCapacity"))
    monkeypatch.setattr(agent.node.asg, "terminate_instance_in_auto_scaling_group", until_the_outage_ends)
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == 0
    assert cluster.marker("outage-run", "DONE") is not None
    retries = [line for line in lines if line.startswith(f"could not leave {cluster.group} (") and "again in" in line]
    if outage == 2:
        assert len(retries) == 2 and f"left {cluster.group}: one node fewer" in lines
        assert cluster.instances() == [] and cluster.desired_capacity() == 0
        assert not [line for line in lines if "by hand" in line]
    else:  # HAND_BACK_RETRY_S passed: the log says so, and the instance is still there
        assert 2 <= len(retries) < len(refused) < 99 and lines[-1].endswith("terminate it by hand"), lines[-3:]
        assert len(cluster.instances()) == 1


def test_a_hand_back_iam_refuses_is_not_tried_again(make_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage is waited out (above); a refusal by IAM would only be repeated for hours: "by hand" at once."""
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("denied-run", {"train.py": ""}, "python train.py")
    agent, _, lines = agent_for(cluster)
    calls: list[Any] = []

    def denied(**kwargs: Any) -> Any:
        calls.append(kwargs)
        error = {"Code": "AccessDenied", "Message": "not authorized to perform TerminateInstanceInAutoScalingGroup"}
        raise ClientError({"Error": error}, "TerminateInstanceInAutoScalingGroup")

    monkeypatch.setattr(agent.node.asg, "terminate_instance_in_auto_scaling_group", denied)
    agent.group_exit.leave_group(cluster.group, for_good=True)
    assert len(calls) == 1 and lines[-1].endswith("terminate it by hand")


CRASHING = """
import os, sys
path = os.path.join(os.environ["SPOT_TRAINING_CHECKPOINT_DIR"], "model.bin")
if not os.path.exists(path):
    open(path, "w").write("weights")
print("attempt", os.environ["SPOT_TRAINING_ATTEMPT"], flush=True)
print("resumed", os.environ["SPOT_TRAINING_RESUMED"], "step", repr(os.environ["SPOT_TRAINING_RESUME_STEP"]))
sys.exit(3)
"""


def test_a_crash_looping_trainer_with_a_flat_checkpoint_fails_after_max_restarts(
    make_cluster: Any, make_nodes: Any
) -> None:
    cluster: Cluster = make_cluster(nodes=1, max_restarts=1)
    cluster.submit("flat-run", {"crash.py": CRASHING}, "python crash.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait(120) == 1
    # Attempt 0 uploads its checkpoint (progress); attempt 1 restores it and makes none; attempt 2 neither: FAILED.
    assert node.text.count("training attempt") == 3
    assert cluster.manifests("flat-run") == [1]
    # its number is no training step ("resume step: 1" would be taken by trainctl cost for step 1)
    assert node.text.count("resume step: unknown (flat checkpoint 1)") == 2 and "resume step: 1" not in node.text
    assert node.text.count("resumed 1 step ''") == 2  # nor is it handed to the trainer as one (not '1')
    failed = cluster.marker("flat-run", "FAILED")
    assert failed is not None and "restart(s) without a new checkpoint" in failed["reason"]


SAVES_ONCE = """
import os, sys
if os.environ["SPOT_TRAINING_ATTEMPT"] == "0":
    open(os.path.join(os.environ["SPOT_TRAINING_CHECKPOINT_DIR"], "model.bin"), "w").write("trained on from step 1")
print("attempt", os.environ["SPOT_TRAINING_ATTEMPT"], flush=True)
sys.exit(3)
"""


def test_a_checkpoint_saved_over_an_unreadable_one_counts_as_progress(
    make_cluster: Any, make_nodes: Any, tmp_path: Path
) -> None:
    """The newest flat checkpoint (2) fails its sha256, so the node restores 1; its next save is numbered after every
    step in S3 (3). Progress is compared with the newest listed after the restore (1), not before it (2): that save
    counts as a new checkpoint, and the job is not FAILED one restart early."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=1)
    log: list[str] = []
    store = CheckpointStore(cluster.aws.s3, cluster.bucket, f"{cluster.name}/bad-run/ckpt/", "bad-run", log.append)
    for step in (1, 2):
        (tmp_path / "model.bin").write_text(f"state {step}")
        store.upload(step, {"model.bin": str(tmp_path / "model.bin")}, "flat")
    key = f"{cluster.name}/bad-run/ckpt/2/model.bin"
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=key, Body=b"STATE 2")  # same size, other bytes
    cluster.submit("bad-run", {"train.py": SAVES_ONCE}, "python train.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait(120) == 1
    assert "restoring checkpoint 1 from" in node.text
    # Attempt 0 saves (progress: 2 again, now readable); attempts 1 and 2 save nothing: FAILED after 1 restart.
    assert node.text.count("training attempt") == 3
    assert node.text.count("progress was made") == 1
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (3, "flat")
    assert (out / "model.bin").read_text() == "trained on from step 1"
    failed = cluster.marker("bad-run", "FAILED")
    assert failed is not None and "after 1 restart(s) without a new checkpoint" in failed["reason"]


def flat_syncer(aws: Any, tmp_path: Path, interval_s: Optional[float]) -> tuple[Any, Any, list[str]]:
    """A checkpoint store in a new bucket, a syncer of ``tmp_path`` (a trainer's flat checkpoint directory) with
    a fixed interval (None: Young/Daly), and the lines they log."""
    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    aws.s3.create_bucket(Bucket=bucket)
    log: list[str] = []
    store = CheckpointStore(aws.s3, bucket, "c/j/ckpt/", "j", log.append)
    job = type("Job", (), {"checkpoint_dir": str(tmp_path), "checkpoint_interval_s": interval_s, "mtbi_s": 3600.0})
    return store, Syncer(store, job, log.append, 2), log


def test_a_restored_flat_checkpoint_is_not_uploaded_again_as_a_new_step(aws: Any, tmp_path: Path) -> None:
    """Rank 0's node A saves an emergency checkpoint; node B only holds the copy it restored. B's final sync does not
    upload that copy as the same next step as A's (whichever came last would win)."""
    store, _, log = flat_syncer(aws, tmp_path, None)
    (tmp_path / "model.bin").write_text("state at step 4")
    store.upload(4, {"model.bin": str(tmp_path / "model.bin")}, "flat")
    syncers = {}
    for node in ("A", "B"):
        directory = tmp_path / node
        directory.mkdir()
        assert store.restore_newest(str(directory)) == (4, "flat")
        job = type("Job", (), {"checkpoint_dir": str(directory), "checkpoint_interval_s": None, "mtbi_s": 3600.0})
        syncers[node] = Syncer(store, job, log.append, 2)
        syncers[node].restored_flat()
    (tmp_path / "A" / "model.bin").write_text("emergency state at step 9")
    assert syncers["A"].sync(final=True) == 5
    assert syncers["B"].pending() is None
    assert syncers["B"].sync(final=True) == 4  # nothing new on B: nothing uploaded (it knows of 4 only)
    out = tmp_path / "replacement"
    out.mkdir()
    assert store.restore_newest(str(out)) == (5, "flat")
    assert (out / "model.bin").read_text() == "emergency state at step 9"
    assert sum("durable" in line for line in log) == 1


def test_a_flat_file_of_a_killed_trainer_is_uploaded_only_if_it_was_already_unchanged(aws: Any, tmp_path: Path) -> None:
    """A trainer SIGKILLed after the grace may have been writing its flat file: the final sync does not upload
    whatever is there as the newest checkpoint, which every restore would then pick."""
    store, syncer, _ = flat_syncer(aws, tmp_path, 3600)
    (tmp_path / "model.bin").write_text("half of a sta")  # the kill struck mid-write
    syncer.trainer_cut_off = True
    assert syncer.sync(final=True) is None
    assert syncer.sync(final=True) is None  # the wait for a durable checkpoint syncs again: still not uploaded
    assert syncer.pending() is None  # and nothing to wait for
    assert store.complete_steps() == []
    syncer.sync()  # a poll sees it, and the next one sees it unchanged: a complete file
    assert syncer.sync(final=True) == 1
    assert store.complete_steps() == [1]


def test_a_flat_file_rewritten_while_it_uploads_gets_no_manifest_until_it_uploads_whole(
    aws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer saves model.bin again while the agent uploads it (s3transfer and the hashing each open it by
    name): the object and the manifest's hashes may then be of two versions. That step gets no manifest until it
    uploads whole; recorded durable, pruning would delete the older good checkpoints for it."""
    store, syncer, log = flat_syncer(aws, tmp_path, 0.01)
    model = tmp_path / "model.bin"
    model.write_text("state at step 10")
    upload_file = aws.s3.upload_file
    saves = ["state at step 20, a longer one"]

    def rewritten_meanwhile(path: str, *args: Any, **kwargs: Any) -> Any:
        upload_file(path, *args, **kwargs)
        if saves:
            model.write_text(saves.pop())

    monkeypatch.setattr(aws.s3, "upload_file", rewritten_meanwhile)
    syncer.sync()  # seen once
    syncer.sync()  # unchanged since: uploads, and the trainer saves again meanwhile
    assert store.complete_steps() == []
    assert any("changed on disk while it was uploaded" in line for line in log), log
    assert syncer.pending() == "the checkpoint directory"
    syncer.sync()  # seen unchanged again
    assert syncer.sync(final=True) == 2  # numbered after the objects step 1's failed round left in S3
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (2, "flat")
    assert (out / "model.bin").read_text() == "state at step 20, a longer one"


def test_a_step_saved_again_while_it_uploads_gets_no_manifest_until_it_uploads_whole(
    aws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint helper saves a step a second time (the trainer's final save lands on the step of the last
    periodic one) while the agent uploads it: the directory is replaced. That step is not recorded durable with
    objects and hashes that could be of two versions (the job's final checkpoint would then fail its check)."""
    store, syncer, log = flat_syncer(aws, tmp_path, 3600)
    step = tmp_path / "7"
    step.mkdir()
    (step / "state.pt").write_text("periodic save of step 7")
    (step / COMPLETE).touch()
    upload_file = aws.s3.upload_file
    saves = ["final save of step 7, a longer one"]

    def saved_again_meanwhile(path: str, *args: Any, **kwargs: Any) -> Any:
        upload_file(path, *args, **kwargs)
        if saves:  # as Checkpointer._write: a new directory renamed over the old one
            tmp = tmp_path / ".tmp-7"
            tmp.mkdir()
            (tmp / "state.pt").write_text(saves.pop())
            (tmp / COMPLETE).touch()
            shutil.rmtree(step)
            tmp.replace(step)

    monkeypatch.setattr(aws.s3, "upload_file", saved_again_meanwhile)
    assert syncer.sync() is None
    assert store.complete_steps() == []
    assert any("changed on disk while it was uploaded" in line for line in log), log
    assert syncer.sync(final=True) == 7
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (7, "step")
    assert (out / "7" / "state.pt").read_text() == "final save of step 7, a longer one"


def test_a_step_saved_again_after_its_upload_is_uploaded_again(aws: Any, tmp_path: Path) -> None:
    """The final save lands on the step of the last periodic one after the agent made that one durable: the step is
    uploaded again. Without this, S3 would keep the periodic version for good (the step counted as uploaded), and a
    resume would get another state than the node's disk held."""
    store, syncer, log = flat_syncer(aws, tmp_path, 3600)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "state.pt").write_text("periodic save of step 7")
    (tmp_path / "7" / COMPLETE).touch()
    assert syncer.sync() == 7
    assert syncer.sync() == 7 and sum("uploading checkpoint 7" in line for line in log) == 1  # nothing new
    tmp = tmp_path / ".tmp-7"
    tmp.mkdir()
    (tmp / "state.pt").write_text("final save of step 7, a longer one")
    (tmp / COMPLETE).touch()
    shutil.rmtree(tmp_path / "7")
    tmp.replace(tmp_path / "7")
    assert syncer.sync(final=True) == 7
    assert any("uploading checkpoint 7 (1 file(s)) again: saved anew since its upload" in line for line in log), log
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (7, "step")
    assert (out / "7" / "state.pt").read_text() == "final save of step 7, a longer one"


def test_a_dangling_link_in_a_flat_checkpoint_directory_is_left_out(aws: Any, tmp_path: Path) -> None:
    """A script keeps ``last.pt`` pointing at a file it has rotated away. The link is left out: failing every sync
    round on it would upload no flat checkpoint for the rest of the attempt, and ``pending()`` would raise, failing a
    finished job."""
    store, syncer, log = flat_syncer(aws, tmp_path, 3600)
    (tmp_path / "model-20.bin").write_text("state at step 20")
    (tmp_path / "last.bin").symlink_to(tmp_path / "model-10.bin")  # rotated away
    assert syncer.pending() == "the checkpoint directory"
    assert syncer.sync(final=True) == 1
    assert syncer.pending() is None
    assert not [line for line in log if "sync failed" in line], log
    manifest = aws.s3.get_object(Bucket=store.bucket, Key=f"c/j/ckpt/1/{MANIFEST}")["Body"].read()
    assert json.loads(manifest)["files"].keys() == {"model-20.bin"}


def test_a_zero_padded_folder_is_a_flat_checkpoint_not_an_empty_step(aws: Any, tmp_path: Path) -> None:
    """A script saves to ``<dir>/000500/``. That is no step folder: taken for step 500, the agent would walk
    ``<dir>/500/`` (absent) and make an empty checkpoint 500 durable, pruning the good ones for it."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "000500").mkdir(parents=True)
    (ckpt / "000500" / "model.pt").write_text("state at step 500")
    store, syncer, _ = flat_syncer(aws, ckpt, 0.01)
    assert local_steps(str(ckpt)) == []
    syncer.sync()  # seen once
    assert syncer.sync() == 1  # unchanged since: uploaded whole, as flat step 1
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (1, "flat")
    assert (out / "000500" / "model.pt").read_text() == "state at step 500"


def test_a_step_folder_written_in_place_is_uploaded_once_two_rounds_see_it_unchanged(aws: Any, tmp_path: Path) -> None:
    """A script writes ``<dir>/<step>/`` file by file (as torch.distributed.checkpoint does). The first round after
    its mkdir does not upload what is there (one file of two, or none) as the newest checkpoint, for which pruning
    would delete the good one before it."""
    store, syncer, log = flat_syncer(aws, tmp_path, 3600)
    (tmp_path / "100").mkdir()
    assert syncer.sync() is None and syncer.pending() is None  # an empty folder: nothing to upload or wait for
    (tmp_path / "100" / "a.pt").write_text("half a")
    assert syncer.sync() is None  # changed since the round before: maybe still being written
    (tmp_path / "100" / "b.pt").write_text("half b")
    assert syncer.sync() is None
    assert syncer.pending() == "checkpoint 100"
    assert syncer.sync() == 100  # unchanged since the round before
    manifest = aws.s3.get_object(Bucket=store.bucket, Key=f"c/j/ckpt/100/{MANIFEST}")["Body"].read()
    assert json.loads(manifest)["files"].keys() == {"a.pt", "b.pt"}
    # The trainer is killed while it writes 200: never uploaded, and deleted, so no restart here resumes from it.
    (tmp_path / "200").mkdir()
    (tmp_path / "200" / "a.pt").write_text("cut off")
    syncer.trainer_cut_off = True
    assert syncer.sync(final=True) == 100
    assert not (tmp_path / "200").exists() and syncer.pending() is None
    assert store.complete_steps() == [100]
    assert any("deleting checkpoint folder 200 unuploaded: the trainer, killed or failed," in line for line in log), log


def test_an_empty_step_folder_neither_hides_a_later_checkpoint_nor_is_resumed_from(aws: Any, tmp_path: Path) -> None:
    """A script made ``900/`` and crashed; the next attempt resumes from 800 and writes 850. The empty 900 is no
    step: as the newest, it would be the resume step handed to the trainer and the only folder the sync looks at, so
    850 would never go up nor be pending."""
    store, syncer, _ = flat_syncer(aws, tmp_path, 3600)
    assert store.complete_steps() == []
    for step in ("800", "900"):
        (tmp_path / step).mkdir()
    (tmp_path / "800" / "model.pt").write_text("state at step 800")
    (tmp_path / "800" / COMPLETE).touch()
    assert local_steps(str(tmp_path)) == [800]
    assert syncer.sync() == 800
    (tmp_path / "850").mkdir()
    (tmp_path / "850" / "model.pt").write_text("state at step 850")
    assert syncer.pending() == "checkpoint 850"
    syncer.sync()
    assert syncer.sync() == 850 and syncer.pending() is None
    assert store.complete_steps() == [850, 800]


def test_a_flat_checkpoint_is_numbered_after_every_step_in_s3(aws: Any, tmp_path: Path) -> None:
    """Rank 0 moves to node B during an attempt (a late joiner) after node A uploaded steps 1 and 2. B numbers its
    save from S3, not from what it knew at the attempt's start (nothing: step 1, over A's objects of 1)."""
    (tmp_path / "A").mkdir()
    store, syncer_a, _ = flat_syncer(aws, tmp_path / "A", None)
    (tmp_path / "B").mkdir()
    job_b = type("Job", (), {"checkpoint_dir": str(tmp_path / "B"), "checkpoint_interval_s": None, "mtbi_s": 3600.0})
    syncer_b = Syncer(store, job_b, lambda line: None, 2)
    for step in (1, 2):
        (tmp_path / "A" / "model.bin").write_text(f"A's state {step}")
        assert syncer_a.sync(final=True) == step
    (tmp_path / "B" / "model.bin").write_text("B's newer state")
    assert syncer_b.sync(final=True) == 3
    out = tmp_path / "restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (3, "flat")
    assert (out / "model.bin").read_text() == "B's newer state"


@pytest.mark.parametrize("failed_writable", [True, False])
def test_an_aws_error_that_outlasts_the_retries_fails_the_job_in_one_line(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failed_writable: bool
) -> None:
    """A ClientError past the retries ends the agent with a one-line reason and FAILED, not a traceback (and, when
    FAILED cannot be written either, still with the one-line reason); the group goes to 0 either way."""
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("aws-run", {"train.py": ""}, "python train.py")
    agent, job, lines = agent_for(cluster)
    tune(agent, work_dir=str(tmp_path / "work"))
    refuse = raising("PutObject")
    agent.attempts = lambda *args: refuse()  # say the synced marker, eight SlowDowns in a row
    if not failed_writable:
        put = agent.node.s3.put_object
        monkeypatch.setattr(
            agent.node.s3, "put_object", lambda **kw: refuse() if kw["Key"].endswith("/FAILED") else put(**kw)
        )
    with pytest.raises(errors.JobFailed) as failed:
        agent._run(job)
    reason = str(failed.value)
    assert (
        reason.startswith("AWS did not answer after the retries: An error occurred (SlowDown)") and "\n" not in reason
    )
    marker = cluster.marker("aws-run", "FAILED")
    assert (marker is not None and marker["reason"] == reason) if failed_writable else marker is None
    assert cluster.desired_capacity() == 0
    assert states(lines) == ["BOOT", "FAILED"]  # the attempts (here: their S3 error) come after the boot


@pytest.mark.parametrize(
    ("peer", "min_nodes", "leaves"),
    [
        ("training", 1, True),  # elastic: A trains on alone
        ("training", 2, False),  # A's trainer waits for B at its rendezvous: it cannot go on without B
        ("restarting", 1, False),  # A's attempt ended (a lost peer): it waits for this node
    ],
)
def test_a_replacement_that_cannot_boot_leaves_a_job_its_peers_train_on(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, peer: str, min_nodes: int, leaves: bool
) -> None:
    """An error on a node that never started its trainer (here: the code download past S3's retries) does not mark
    the whole job FAILED while peers train fine (min_nodes < max_nodes): the node leaves the group, one node fewer.
    With fewer peers training than min_nodes (they wait for this node), or none (a restart after a lost peer, or
    every node meeting the same error at the first boot) the job still fails."""
    cluster: Cluster = make_cluster(nodes=2, min_nodes=min_nodes, max_nodes=2)
    cluster.submit("boot-run", {"train.py": ""}, "python train.py")
    (a, a_ip), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)  # B: a replacement booting while A's trainer runs (or restarts)
    tune(agent, work_dir=str(tmp_path / "work"))
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.markers.put_marker(job, f"nodes/{a}/training", {"attempt": 0, "address": a_ip, "private_ip": a_ip})
    if peer == "restarting":  # A's attempt ended (a lost peer): it waits for B in its next rendezvous
        time.sleep(0.01)
        agent.markers.put_marker(job, f"nodes/{a}/synced", {"attempt": 0, "pending": None})
    monkeypatch.setattr(supervisor, "download_code", lambda *args: raising("GetObject")())
    with pytest.raises(errors.AgentError) as error:
        agent._run(job)
    assert "AWS did not answer after the retries: An error occurred (SlowDown)" in str(error.value)
    assert states(lines) == ["BOOT", "LEAVING" if leaves else "FAILED"]
    if leaves:
        assert not isinstance(error.value, errors.JobFailed)
        assert cluster.marker("boot-run", "FAILED") is None
        assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1
        assert any(
            f"(peers {a} train on without this node); leaving the group (one node fewer)" in line for line in lines
        )
    else:
        assert isinstance(error.value, errors.JobFailed)
        assert cluster.marker("boot-run", "FAILED") is not None and cluster.desired_capacity() == 0


def test_s3_errors_after_a_failed_attempt_count_as_no_progress_instead_of_ending_the_agent(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The STOP marker and the checkpoint listing after a trainer failure: an error is logged, the restart
    bookkeeping goes on (here max_restarts 0: FAILED), no exception leaves the agent."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0, interruption_grace_s=1)
    cluster.submit("list-run", {"train.py": ""}, "python train.py")
    agent, job, lines = restarting(cluster, started=time.time())
    agent.attempt = lambda *args: (1, False)
    monkeypatch.setattr(agent.node.s3, "list_objects_v2", raising("ListObjectsV2"))
    assert agent.attempts(job, cluster.group, "/tmp", store_of(agent, job)) == errors.EXIT_FAILED
    assert any(line.startswith("could not read the STOP marker (") for line in lines), lines
    assert any(line.startswith("could not list the checkpoints after the attempt (") for line in lines), lines
    failed = cluster.marker("list-run", "FAILED")
    assert failed is not None
    assert failed["reason"] == "trainer exited with code 1 after 0 restart(s) without a new checkpoint"
    assert cluster.desired_capacity() == 0


def test_a_stop_while_a_node_waits_for_its_peers_takes_it_out_of_the_group(make_cluster: Any, tmp_path: Path) -> None:
    """A node waiting for capacity that never comes does not sit out the whole join timeout after trainctl stop (or
    the budget guard) and then write FAILED: it leaves the group for good, no replacement, no FAILED."""
    cluster: Cluster = make_cluster(nodes=2, min_nodes=3, max_nodes=3)  # waits for a third node
    cluster.submit("wait-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)
    tune(agent, work_dir=str(tmp_path / "work"))
    job.checkpoint_dir = str(tmp_path / "ckpt")
    tune(agent, join_timeout_s=5.0)  # a missed stop ends in FAILED after this

    def stop_later() -> None:
        time.sleep(0.5)
        agent.markers.put_marker(job, "STOP", {"requested_at": time.time()})

    threading.Thread(target=stop_later, daemon=True).start()
    assert agent._run(job) == 0
    assert any(line == "stop requested (STOP marker) during peer discovery: leaving before the trainer starts"
               for line in lines), lines  # fmt: skip
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1  # one node fewer
    assert cluster.marker("wait-run", "FAILED") is None
    assert cluster.marker("wait-run", f"nodes/{b}/leaving") is None  # the peers stop anyway
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "STOPPED"]


def test_a_flat_checkpoints_dot_files_are_uploaded_and_restored_the_agents_own_entries_not(
    aws: Any, tmp_path: Path
) -> None:
    """torch.distributed.checkpoint writes its index as ``.metadata`` beside the shards. A flat upload keeps dot
    files at any depth (without its index, no restore could load a checkpoint); only the helper's and the agent's own
    top-level entries stay out."""
    store, syncer, _ = flat_syncer(aws, tmp_path, 3600)
    for rel, text in {
        "latest/.metadata": "dcp index",
        "latest/__0_0.distcp": "shard 0",
        ".metadata": "dcp index of a save into the directory itself",
        ".spot-training/sync-state.json": "{}",
        ".tmp-7-123/state.pt": "the helper's save under way",
        ".restore-3-abc/x": "a restore under way",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    syncer.sync()
    assert syncer.sync(final=True) == 1
    out = tmp_path.parent / f"{tmp_path.name}-restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (1, "flat")
    restored = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert restored == [".metadata", "latest/.metadata", "latest/__0_0.distcp"]
    assert (out / "latest" / ".metadata").read_text() == "dcp index"


def test_a_stop_while_spot_capacity_is_short_cancels_the_launches_not_made(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job of 2 nodes got 1 (no spot capacity for the other); its node waits for its peer when the operator stops
    it. ``trainctl stop`` cancels the launch not made, and the job ends STOPPED: a node leaving for good (desired 1)
    with no trainer to write STOPPED or set 0 would leave the group wanting a node, and once capacity came back, a
    billed node would boot into the stopped job, which would show STOPPING for good."""
    cluster = make_cluster(nodes=1, min_nodes=2, max_nodes=2)
    cluster.submit("short-run", {"train.py": "raise SystemExit('the trainer must not run')"}, "python train.py")
    launch = FakeAutoScalingGroup.set_desired_capacity

    def no_spot_capacity(group: Any, capacity: Optional[int]) -> None:
        if capacity is not None and capacity > len(group.active_instances()):
            group.desired_capacity = capacity  # wanted, not launched
        else:
            launch(group, capacity)

    monkeypatch.setattr(FakeAutoScalingGroup, "set_desired_capacity", no_spot_capacity)
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=2)
    [(node, _)] = cluster.instances()
    agent, job, lines = agent_for(cluster, node)
    tune(agent, work_dir=str(tmp_path / "work"))
    job.checkpoint_dir = str(tmp_path / "checkpoints")
    said: dict[str, Any] = {}

    def operator_stops() -> None:
        deadline = time.monotonic() + 30
        while not any("resume step:" in line for line in list(lines)) and time.monotonic() < deadline:  # then peers
            time.sleep(0.05)
        said["rc"] = trainctl_main(["stop", "--team", TEAM, "--cluster", cluster.name, "short-run"])

    operator = threading.Thread(target=operator_stops, daemon=True)
    operator.start()
    assert agent._run(job) == 0
    operator.join(timeout=60)
    assert said["rc"] == 0
    assert capsys.readouterr().out.strip() == (
        "job short-run: stop requested; the nodes save a final checkpoint, then the group goes to 0; "
        "1 launch(es) not made yet cancelled (group set to 1)"
    )
    assert (cluster.desired_capacity(), cluster.instances()) == (0, [])
    client = client_factory(REGION)
    assert jobs.job_state(client, jobs.find_cluster(client, TEAM, cluster.name), "short-run") == "STOPPED"


def test_step_folders_are_uploaded_though_flat_checkpoints_took_their_numbers_first(aws: Any, tmp_path: Path) -> None:
    """A script keeps a file in the checkpoint directory (a config dump, rewritten as it goes) before writing its
    first step folder. The agent uploads that file as flat checkpoints 1 to 4 (3 and 4 kept). Step folder 1 still
    goes up (not taken as "durable" already and below 4, which would leave nothing pending on a notice and every
    restore taking flat checkpoint 4: the config, no weights), and the flat ones above it still in S3 are deleted
    (those pruned long ago are only forgotten)."""
    store, syncer, log = flat_syncer(aws, tmp_path, 0.001)
    config = tmp_path / "config.json"
    for version in (1, 2, 3, 4):
        config.write_text(f'{{"version": {version}}}')
        syncer.sync()  # seen
        time.sleep(0.01)  # the interval passed
        assert syncer.sync() == version  # unchanged since: uploaded as the next flat checkpoint
    assert store.complete_steps() == [4, 3]
    assert read_sync_state(str(tmp_path))["last_uploaded_step"] is None  # no step of the script's is durable
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.pt").write_text("weights at step 1")
    assert syncer.pending() == "checkpoint 1"
    syncer.sync()  # seen
    assert syncer.sync() == 1  # unchanged since: uploaded
    assert store.complete_steps() == [1]
    assert syncer.pending() is None
    assert read_sync_state(str(tmp_path))["last_uploaded_step"] == 1
    assert "uploading checkpoint 1 (1 file(s)) (flat checkpoint 1 had its number)" in log
    deleted = [line for line in log if "deleted: the script numbers its checkpoints" in line]
    assert deleted == [
        f"flat checkpoint {n} deleted: the script numbers its checkpoints (step folder 1)" for n in (3, 4)
    ]  # not 2: pruned when 4 came
    out = tmp_path.parent / f"{tmp_path.name}-restored"
    out.mkdir()
    assert store.restore_newest(str(out)) == (1, "step")
    assert (out / "1" / "model.pt").read_text() == "weights at step 1"
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.pt").write_text("weights at step 2")
    syncer.sync()
    assert syncer.sync() == 2
    assert store.complete_steps() == [2, 1]
