"""The node agent's duties, one module each; ``node_agent.py`` is the entry point and the supervisor over them.

Stdlib + boto3 only, Python 3.8+, as everything on the node. Dependencies point one way: ``node_agent`` imports these
modules; they import ``errors`` (and the few leaves named below) and ``spot_training``'s shared modules, never
``node_agent`` nor each other in circles.

Modules of this package (leaf duties):
  ``errors``            the AWS and metadata errors the agent rides out (``AWS_ERRORS``, ``IMDS_ERRORS``), its
                        one-line reasons (``AgentError``, ``JobFailed``, ``JobRefused``, ``S3Unanswered``,
                        ``LocalDiskError``, ``LeavingBeforeTraining``, ``StopBeforeTraining``), ``one_line``,
                        ``env_float``
  ``settings``          the environment knobs (``SPOT_TRAINING_POLL_INTERVAL_S``, ..._WORK_DIR, ...) as a frozen
                        ``AgentSettings`` read once at start
  ``aws_config``        botocore's retries and the node's id in the User-Agent (``client_config``), S3
                        transfers' parts and concurrency (``TRANSFER``)
  ``s3_objects``        S3 probes: a key exists by listing (``key_listed``), a failed read means the object is gone
                        (``object_gone``), S3's clock of an answer (``answered_at``)
  ``job``               the job spec: the SSM job-spec parameter merged with the submitted job, validated (``Job``,
                        ``load_job``; the schema itself is ``spot_training.job_spec``)
  ``code_fetch``        the code archive: download from S3 and safe unpacking (``download_code``, ``safe_extract``)
  ``log_shipping``      the agent's log (``Log``), CloudWatch Logs batches (``LogShipper``), the trainer's output as
                        lines (``output_lines``), step timing (``Timed``)
  ``instance_signals``  IMDSv2 (``Imds``: spot notice, rebalance recommendation, target lifecycle state) and the
                        instance's lifecycle state in its group (``lifecycle_of``)
  ``peers``             the group's InService, running instances in launch order (``discover_peers``; element 0
                        hosts the rendezvous) and the private-address map (``load_address_map``)
  ``drain``             the drain hook's hold (``DrainHold``): heartbeats while a final checkpoint upload is under way
  ``checkpoint_store``  the checkpoint store (``CheckpointStore``): checkpoints in S3 under ``<job>/ckpt/<step>/`` with
                        the manifest (``MANIFEST``) written last; parallel multipart upload, verified ranged download,
                        restore of the newest complete checkpoint, prune
  ``local_checkpoints`` the node's checkpoint directory: step folders with files (``local_steps``, ``step_files``),
                        the agent's and helper's own entries (``agent_entry``), half-written leftovers
                        (``remove_partial_writes``)
  ``checkpoint_sync``   the checkpoint-directory sync (``Syncer``): snapshots of the trainer's checkpoint directory
                        (step and flat layouts) uploaded with the manifest rule, at the Young/Daly interval
                        (``young_daly_s``) or the job's own
  ``markers``           the names of the node markers the duties share (``progress``, ``ready``, the end-of-training
                        ones) and a marker's writer time (``stamp``)
  ``stall``             the stall watchdog (``StallWatch``): job-wide progress from the trainer's output and checkpoint
                        writes, peers' ``progress`` markers and newly durable checkpoints; it sees the supervisor and
                        the sync through small protocols (``StallHost``, ``WatchedSync``)

Duties that ``node_agent.py`` still holds (each the next to move here):
  S3 markers            ``Agent.put_marker``, ``marker``, ``node_markers``: the job's ``DONE``/``FAILED``/``STOPPED``/
                        ``STOP`` markers and each node's ``nodes/<id>/{done,leaving,synced,save-request,progress,
                        ready,training}`` markers (JSON with the writer's ``time``)
  warm volume           ``Agent.claim_warm_volume``, ``release_warm_volume`` (over ``spot_training.warm_volume``)
  rendezvous            ``Agent.wait_for_peers``, ``wait_for_ready_peers``, ``add_joined_peers``, ``lost_peer``: the
                        peers of each attempt and the host they meet at
  trainer               ``Agent.torchrun_command``, ``run_trainer``: torchrun's command line and environment, its
                        output pumped to the log, SIGTERM with the grace on a notice or a stop
  leaving               ``Agent.notice``, ``leave_group``, ``hand_back``, ``complete_drain``, ``scale_to_zero``: the
                        spot notice and rebalance handling, handing the instance back, the drain hook's completion
  supervisor            ``Agent.run``, ``attempts``, ``attempt``, ``finish``: boot, restore, the attempts loop, the
                        end (DONE / FAILED / STOPPED / leave the group)
"""
