"""The end of a job on this node: the cluster's queue decides what comes next (``spot_training.job_queue``). With a
queued job, the group stays up and this node goes on to it without a new boot when the job's node count has room
for it (the surplus nodes leave the group, one fewer each; a larger job raised the group's desired capacity when it
was taken from the queue). With an empty queue, the group goes to 0 as it always does."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from spot_training import job_queue
from spot_training.agent.errors import AWS_ERRORS, one_line
from spot_training.agent.group_exit import GroupExit
from spot_training.agent.job import Job
from spot_training.agent.node import Node
from spot_training.agent.peers import group_instances


class Handover:
    """``next``: the queued job this node goes on to once its part in the current one ends (None: it exits)."""

    def __init__(self, node: Node, group_exit: GroupExit) -> None:
        self.node, self.group_exit = node, group_exit
        self.next: Optional[Dict[str, Any]] = None
        self.ended = ""  # the end marker of the job handed over (DONE, FAILED, STOPPED)

    def cluster(self, job: Job, group: str) -> job_queue.Cluster:
        clients = {"s3": self.node.s3, "ssm": self.node.ssm, "autoscaling": self.node.asg}
        return job_queue.Cluster(clients.__getitem__, job.bucket, job.prefix, job.spec["current_job_parameter"], group)

    def after_end(self, job: Job, group: str, ended: str) -> None:
        """In place of the group to 0 at the end of ``job`` (its end marker ``ended`` is written): take the queue's
        next job, or scale the group to 0 when there is none (:func:`job_queue.after_end`)."""
        self.next, self.ended = None, ended
        try:
            found, let_go = job_queue.after_end(
                self.cluster(job, group), job.job_id, lambda: self.group_exit.scale_to_zero(group)
            )
        except AWS_ERRORS as exc:  # the queue cannot be read: as without a queue; the next submit starts its head
            self.node.log(f"could not read the queue of the cluster ({one_line(exc)}); scaling {group} to 0")
            self.group_exit.scale_to_zero(group)
            return
        if found is None:
            return
        if let_go:  # a submit queued it just as this node scaled the group to 0: the group starts it
            state = self.group_exit.lifecycle_state()
            self.node.log(f"job {found['job_id']} was queued as {group} went to 0; the group runs it (state {state})")
            if state != "InService":
                return
            self.group_exit.released = False  # still in service: this node runs it, instead of idling billed
        self.next = found

    def take(self, job: Job, group: str, peers: List[Tuple[str, str]]) -> Optional[Dict[str, Any]]:
        """The next job, if this node goes on to it: one of the first ``nodes`` of the group's instances (in the
        order of the ended job's peers: the rendezvous host first). A surplus node leaves the group (one fewer)."""
        found, self.next = self.next, None
        if found is None:
            return None
        nodes, next_id = int(found["nodes"]), found["job_id"]
        try:
            members = group_instances(self.node.asg, group, "InService")
        except AWS_ERRORS as exc:
            self.node.log(f"could not list {group} ({one_line(exc)}); leaving it for job {next_id}'s own nodes")
            members = set()
        ordered = [i for i, _ in peers if i in members] + sorted(members - {i for i, _ in peers})
        if self.node.instance_id in ordered[:nodes]:
            self.node.log(
                f"job {job.job_id} {self.ended.lower()}; next job {next_id} from the queue on this node (no new boot)"
            )
            return found
        self.node.log(f"job {job.job_id} {self.ended.lower()}; next job {next_id} runs on {nodes} node(s): leaving")
        self.group_exit.hand_back(group, for_good=True)
        return None
