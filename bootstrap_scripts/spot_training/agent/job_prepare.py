"""What the agent does for a job before its first trainer on this node, once per agent start: the job's setup
(``job_setup``), then its data inputs (``job_inputs``), both kept on the claimed warm volume when there is one."""

from __future__ import annotations

from typing import Dict

from spot_training.agent.job import Job
from spot_training.agent.job_inputs import sync_inputs
from spot_training.agent.job_setup import CACHE_ENV, JobSetup
from spot_training.agent.log_shipping import Timed
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.warm_claim import WarmClaim


def prepare_job(node: Node, notices: Notices, warm: WarmClaim, job: Job, code_dir: str) -> Dict[str, str]:
    """Run the setup, then bring the inputs up to date; what the trainer's environment gets from them (the setup's
    cache directory). Raises ``AgentError`` (the job fails) or ``LeavingBeforeTraining`` (a notice meanwhile)."""
    volume_dir = warm.volume_dir()
    cache = JobSetup(node, notices).run(job, code_dir, volume_dir)
    inputs = job.spec.get("inputs") or []
    if inputs:
        with Timed(node.log, "input download"):
            sync_inputs(
                node.s3,
                inputs,
                node.settings.node_root,
                volume_dir,
                node.settings.work_dir,
                node.log,
                lambda: notices.check_notice("input download"),
            )
    return {} if cache is None else {CACHE_ENV: cache}
