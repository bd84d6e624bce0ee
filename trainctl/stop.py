"""``trainctl stop``: ask a job's nodes to save a final checkpoint and stop; or set the group to 0 now."""

from __future__ import annotations

import json
import time

from bootstrap_scripts.spot_training.job_spec import DRAIN_HEARTBEAT_S
from bootstrap_scripts.spot_training.protocol import STOP
from trainctl.checkpoints import checkpoints
from trainctl.cluster import ClientFactory, ClusterRef, group
from trainctl.job_state import ENDED, job_state, object_time


def stop(client: ClientFactory, ref: ClusterRef, job_id: str, force: bool = False) -> str:
    """Ask the nodes to checkpoint and stop (they write STOPPED and scale to 0). With no node in the group (the
    job waits for capacity), nothing would write STOPPED: write it here and scale to 0. A job that is not the
    current one has no node: nothing to do (the group belongs to the current job). ``force``: also set the group
    to 0 now, for nodes whose agents do not answer (the ones that do save as on a spot notice)."""
    state = job_state(client, ref, job_id)
    if state in ENDED:
        return f"job {job_id} is already {state}"
    if state == "QUEUED":
        return (
            f"job {job_id} is queued, not running; take it out of the queue with: trainctl cancel "
            f"--team {ref.team} --cluster {ref.cluster} {job_id}"
        )
    if state == "UNFINISHED":
        return f"job {job_id} is not running (UNFINISHED: no node runs it); nothing to stop"
    s3, prefix = client("s3"), ref.job_prefix(job_id)
    if not group(client, ref)["Instances"]:
        newest = checkpoints(client, ref, job_id)
        body = {"by": "trainctl stop", "last_checkpoint": newest[-1].step if newest else None, "time": time.time()}
        s3.put_object(Bucket=ref.bucket, Key=f"{prefix}STOPPED", Body=json.dumps(body).encode())
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
        return f"job {job_id}: no node running; STOPPED, group set to 0"
    asked = object_time(client, ref, f"{prefix}{STOP}")
    if asked is None:  # not rewritten: the budget guard times an overdue stop from when S3 stored it
        s3.put_object(Bucket=ref.bucket, Key=f"{prefix}{STOP}", Body=json.dumps({"requested_at": time.time()}).encode())
    not_made = "" if force else cancel_launches_not_made(client, ref)
    if force:
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
        return (
            f"job {job_id}: group set to 0 now; nodes whose agents answer save a final checkpoint as on a spot notice "
            f"(at most the drain hook's {DRAIN_HEARTBEAT_S:.0f} s), the others are terminated"
        )
    if asked is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(asked))
        return (
            f"job {job_id}: stop already requested at {when}; not asked again (the nodes are saving a final "
            f"checkpoint; if none answers, `trainctl stop --force` sets the group to 0 now){not_made}"
        )
    return f"job {job_id}: stop requested; the nodes save a final checkpoint, then the group goes to 0{not_made}"


def cancel_launches_not_made(client: ClientFactory, ref: ClusterRef) -> str:
    """Set a stopping job's group to the nodes it has when it wants more (no spot capacity for them): a node booting
    into a stopping job is billed for nothing, and the nodes that wait for it leave one by one, each lowering the
    count by one only. Read again just before (after the STOP write): an agent may have set 0 or left meanwhile;
    the count is only ever lowered. What was done, for the message ("" if nothing)."""
    members = group(client, ref)
    live = sum(i["LifecycleState"].startswith(("Pending", "InService")) for i in members["Instances"])
    cancelled = int(members["DesiredCapacity"]) - live
    if cancelled <= 0:
        return ""
    client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=live)
    return f"; {cancelled} launch(es) not made yet cancelled (group set to {live})"
