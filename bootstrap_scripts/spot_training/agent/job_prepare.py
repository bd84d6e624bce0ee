"""What the agent does for a job before its first trainer on this node, once per agent start: on a claimed warm
volume, room for the job (``warm_cache_pruning``); then the job's setup (``job_setup``), then its data inputs
(``job_inputs``), both kept on the warm volume when there is one."""

from __future__ import annotations

from typing import Dict, List

from spot_training.agent.job import Job
from spot_training.agent.job_inputs import store_dir, sync_inputs
from spot_training.agent.job_setup import CACHE_ENV, JobSetup
from spot_training.agent.log_shipping import Timed
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.warm_cache_pruning import prune
from spot_training.agent.warm_claim import WarmClaim
from spot_training.job_spec import MIN_FREE_PERCENT_DEFAULT


def prepare_job(node: Node, notices: Notices, warm: WarmClaim, job: Job, code_dir: str) -> Dict[str, str]:
    """Make room on the warm volume, run the setup, then bring the inputs up to date; what the trainer's environment
    gets from them (the setup's cache directory). Raises ``AgentError`` (the job fails) or ``LeavingBeforeTraining``
    (a notice meanwhile)."""
    volume_dir = warm.volume_dir()
    setup = JobSetup(node, notices)
    inputs = job.spec.get("inputs") or []
    if volume_dir is not None:
        min_free = (job.warm_pool or {}).get("min_free_percent", MIN_FREE_PERCENT_DEFAULT)
        prune(volume_dir, warm_entries(setup, job, code_dir, volume_dir), min_free, node.log)
    cache = setup.run(job, code_dir, volume_dir)
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


def warm_entries(setup: JobSetup, job: Job, code_dir: str, volume_dir: str) -> List[str]:
    """The job's own entries on the warm volume, there or not yet: its setup's cache and its inputs' stores."""
    found = [store_dir(entry["s3"], volume_dir, "") for entry in job.spec.get("inputs") or []]
    keyed = setup.keyed_cache(job, code_dir, volume_dir)
    return found if keyed is None else [*found, keyed[1]]
