#!/usr/bin/env python3
"""Node agent: runs one training job on one spot instance and loses nothing when the instance goes.

Started by ``user_data.sh`` (which reads the instance identity from IMDSv2). Python 3.8+, stdlib + boto3 only.
This file parses the arguments and runs the supervisor (``spot_training.agent.supervisor.Agent``); the duties are
modules of ``spot_training.agent``, whose docstring maps each one to its module.

What it does, in order: read and validate the job (SSM job-spec parameter merged with the per-job
``current-job`` parameter); claim a pre-warmed volume of the pool (if any); download and safely
unpack the code; restore the newest *complete* checkpoint from S3; find the peers (InService instances of
the Auto Scaling group; the oldest launch hosts the rendezvous); run torchrun; meanwhile poll IMDS for spot
interruption notices and rebalance recommendations, sync the checkpoint directory to S3 and ship logs to
CloudWatch Logs; finally write ``DONE`` or ``FAILED`` and hand the cluster over to its next queued job (this node
goes on to it without a new boot when its node count has room, else leaves the group) or, with an empty queue,
scale the group to 0; or leave the group (one node fewer) when a peer is still finishing: the last node writes
``DONE``.

S3 layout, under ``s3://<bucket>/<cluster>/<job>/`` (its names and key builders: ``spot_training.protocol``, which
``trainctl``, the budget guard and the stack use too):
  ckpt/<step>/<files...>                 one checkpoint; ``ckpt/<step>/spot-training-manifest.json`` is
                                         written last (size, sha256 and the sha256 of every part of every file).
                                         No manifest: it does not exist.
  nodes/<instance-id>/done               a node finished (barrier before the job's DONE)
  nodes/<instance-id>/leaving            a node got a notice and will not join another rendezvous; "trainer": false
                                         if it came before its trainer started (no trainer of its stops the peers':
                                         they restart without it as soon as it leaves the group)
  nodes/<instance-id>/synced             a node's final checkpoint sync of a training attempt is over (nodes leaving on
                                         a notice or a stop wait for their peers' before they go)
  nodes/<instance-id>/save-request       a node got a rebalance recommendation; every agent asks its trainer for a
                                         checkpoint (rank 0, which decides, may run on another node)
  nodes/<instance-id>/state              the node's lifecycle state (JSON: state, previous, since, reason), rewritten at
                                         each transition (spot_training/agent/lifecycle.py); trainctl status shows it
  nodes/<instance-id>/progress           with the stall watchdog on: the node's trainer printed or wrote a checkpoint
                                         (rewritten at most every stall_timeout_s / 4); its S3 time is progress for
                                         every node of the job
  DONE, FAILED, STOPPED                  job markers (JSON); STOP: a stop request (trainctl stop)
  NEXT                                   the queued job that follows this one (created only if absent; see
                                         spot_training/job_queue.py)
and ``s3://<bucket>/<cluster>/queue/<job>.json``: the cluster's queued jobs.
Logs: log group from the job spec, stream ``<job>/<instance-id>``.

Local checkpoint directory (``checkpoint_dir`` of the spec):
  <step>/                                a complete checkpoint (a directory named by an integer appears atomically:
                                         written elsewhere, then renamed; the helper spot_training.checkpoint does so)
  any other files (no integer dirs)      "flat" layout of an unmodified script: snapshotted when unchanged for one poll
  .spot-training/                        agent state (sync-state.json, save-request); dot entries are never synced

Environment given to the trainer (besides torchrun's RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ...):
  SPOT_TRAINING_JOB_ID, SPOT_TRAINING_CHECKPOINT_DIR, SPOT_TRAINING_RESUME_STEP (step restored, "" if none or flat),
  SPOT_TRAINING_RESUMED ("1"/"0"), SPOT_TRAINING_CHECKPOINT_INTERVAL_S ("" = Young/Daly), SPOT_TRAINING_MTBI_S,
  SPOT_TRAINING_INSTANCE_ID, SPOT_TRAINING_NODE_INDEX (position among the peers in launch order; 0 = rendezvous host),
  SPOT_TRAINING_NUM_PEERS, SPOT_TRAINING_ATTEMPT (0, 1, ... per restart), PYTHONPATH (+ this directory),
  PYTHONUNBUFFERED=1 (unless set: through a pipe Python's output is block-buffered, and a trainer printing a line a
  minute would reach the log, and the stall watchdog, once an hour or so).

Environment read by the agent:
  AWS_EC2_METADATA_SERVICE_ENDPOINT   IMDS base URL (default http://169.254.169.254), as botocore reads it
  AWS_ENDPOINT_URL                    AWS endpoint for every client (an emulator)
  SPOT_TRAINING_PEER_ADDRESS_MAP      path of a JSON file {private_ip: address}; peers' private IPs are mapped
                                      through it (default identity). For single-machine emulation map every
                                      private IP to a loopback address; the agent then also sets
                                      GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME/TP_SOCKET_IFNAME=lo (unless set).
  SPOT_TRAINING_NODE_ROOT             prefix for the node's local paths (checkpoint_dir, work dir), so several
                                      emulated nodes can share one machine (default: none, i.e. "/")
  SPOT_TRAINING_WORK_DIR              where code is unpacked (default <node root>/opt/spot-training/work)
  SPOT_TRAINING_POLL_INTERVAL_S       IMDS / sync poll interval (default 5)
  SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S   peer discovery and rendezvous join timeout (default 600)
  SPOT_TRAINING_DONE_BARRIER_S        how long a finished node waits for its peers' done markers (default 120)
  SPOT_TRAINING_KEEP_CHECKPOINTS      complete checkpoints kept in S3 (default 2; the newest is never deleted)
  SPOT_TRAINING_TEST_UPLOAD_DELAY_S   tests only (default 0): hold every checkpoint upload this long after its
                                      objects are in S3 and before its manifest, so an interruption can land
                                      while an upload is in flight
  SPOT_TRAINING_TEST_RESTORE_DELAY_S  tests only (default 0): wait this long after "restoring checkpoint N" and
                                      before downloading it, so an interruption can land while a node restores
  SPOT_TRAINING_TEST_STALL_TIMEOUT_S  tests only (default: the job's stall_timeout_s): end a trainer that made no
                                      progress for this long (seconds, below the job's 300 s minimum)
  SPOT_TRAINING_TEST_RDZV_LAST_CALL_S tests only (default: torch's 30 s): how long a rendezvous round that has
                                      min_nodes waits for more nodes before it starts (torchrun's last_call_timeout)

Exit codes: 0 job done or instance interrupted cleanly; 1 job failed (FAILED written); 2 bad input, or no job
spec, S3 or Auto Scaling answer at boot (the node left its group, one fewer); one line each.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from spot_training.agent.errors import EXIT_BAD_INPUT, EXIT_FAILED, AgentError, JobFailed
from spot_training.agent.supervisor import Agent


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Spot training node agent (started by user_data.sh).")
    p.add_argument("--region", required=True)
    p.add_argument("--team", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--job-spec-parameter", required=True)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--availability-zone", default="")
    p.add_argument("--launch-index", default="0")
    p.add_argument("--asg-name", default="", help="aws:autoscaling:groupName tag (looked up when empty)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        return Agent(args).run()
    except AgentError as exc:
        print(f"node-agent: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED if isinstance(exc, JobFailed) else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
