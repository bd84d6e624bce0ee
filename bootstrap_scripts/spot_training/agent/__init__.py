"""The node agent's duties, one module each, and the supervisor over them; ``node_agent.py`` is the entry point
(arguments, ``main``).

Stdlib + boto3 only, Python 3.8+, as everything on the node. Dependencies point one way: ``node_agent`` imports
``supervisor``; the supervisor imports the duties; a duty imports leaves and the duties listed before it here, never
the supervisor nor ``node_agent``, and no two modules import each other in a circle.

Leaf modules:
  ``errors``            the AWS and metadata errors the agent rides out (``AWS_ERRORS``, ``IMDS_ERRORS``), its
                        one-line reasons (``AgentError``, ``JobFailed``, ``JobRefused``, ``S3Unanswered``,
                        ``LocalDiskError``, ``LeavingBeforeTraining``, ``StopBeforeTraining``), ``one_line``,
                        ``env_float``
  ``lifecycle``         the node's named states and the one table of the transitions between them
                        (``STATES``, ``TRANSITIONS``), and ``Lifecycle``, which makes a transition (logged as
                        ``state A -> B: reason``, published to ``nodes/<id>/state``) and refuses one not in the table
  ``settings``          the environment knobs (``SPOT_TRAINING_POLL_INTERVAL_S``, ..._WORK_DIR, ...) as a frozen
                        ``AgentSettings`` read once at start
  ``aws_config``        botocore's retries and the node's id in the User-Agent (``client_config``), S3
                        transfers' parts and concurrency (``TRANSFER``)
  ``s3_objects``        S3 probes: a failed read means the object is gone (``object_gone``), S3's clock of an answer
                        (``answered_at``)
  ``job``               the job spec: the SSM job-spec parameter merged with the submitted job, validated (``Job``,
                        ``load_job``; the schema itself is ``spot_training.job_spec``), and the trainer's
                        ``SPOT_TRAINING_*`` environment (``trainer_env``)
  ``code_fetch``        the code archive: download from S3 and safe unpacking (``download_code``, ``safe_extract``)
  ``log_shipping``      the agent's log (``Log``), CloudWatch Logs batches (``LogShipper``), the trainer's output as
                        lines (``output_lines``), step timing (``Timed``)
  ``instance_signals``  IMDSv2 (``Imds``: spot notice, rebalance recommendation, target lifecycle state) and the
                        instance's lifecycle state in its group (``lifecycle_of``)
  ``peers``             the group's InService, running instances in launch order (``discover_peers``; element 0
                        hosts the rendezvous), a group's instances (``group_instances``) and the private-address map
                        (``load_address_map``)
  ``leftovers``         a trainer a dead agent left running: tagged in its environment (``tag_trainer``) and ended
                        by the next agent before anything else (``end_leftover_trainer``)
  ``drain``             the drain hook's hold (``DrainHold``): heartbeats while a final checkpoint upload is under way
  ``checkpoint_download`` one checkpoint's verified download (``CheckpointDownload``): the manifest checked
                        (``protocol.manifest_fault``), ranged GETs in parallel, each part's sha256 checked as it
                        streams in
  ``checkpoint_store``  the checkpoint store (``CheckpointStore``): checkpoints in S3 under ``<job>/ckpt/<step>/`` with
                        the manifest written last; parallel multipart upload, restore of the newest complete
                        checkpoint (over ``checkpoint_download``), prune
  ``local_checkpoints`` the node's checkpoint directory: step folders with files (``local_steps``, ``step_files``),
                        the agent's and helper's own entries (``agent_entry``), half-written leftovers
                        (``remove_partial_writes``)
  ``checkpoint_sync``   the checkpoint-directory sync (``Syncer``): snapshots of the trainer's checkpoint directory
                        (step and flat layouts) uploaded with the manifest rule, at the Young/Daly interval
                        (``young_daly_s``) or the job's own

Duties over one node's shared context (``node``), each an object the supervisor makes once per boot, or once per job
for those that hold a job's state (``rendezvous``, ``final_syncs``, ``trainer``, ``leaving`` and the lifecycle):
  ``node``              ``Node``: the instance's identity, AWS clients, IMDS, log, settings, group, the agent's SIGTERM
  ``markers``           ``Markers``: the job's ``DONE``/``FAILED``/``STOPPED``/``STOP`` markers and each node's
                        ``nodes/<id>/{boot,done,leaving,synced,save-request,progress,ready,training}`` markers (JSON
                        with the writer's ``time``; their names and keys are ``spot_training.protocol``'s) and
                        ``stamp``
  ``stall``             the stall watchdog (``StallWatch``): job-wide progress from the trainer's output and checkpoint
                        writes, peers' ``progress`` markers and newly durable checkpoints; it sees the sync through a
                        small protocol (``WatchedSync``)
  ``notices``           ``Notices``: the agent's SIGTERM, the spot notice, the group ending the instance
  ``efa``               ``EfaEnvironment``: NCCL's EFA variables (libfabric provider, GPUDirect RDMA) in the
                        trainer's environment on an EFA cluster, below what the environment holds; logged once
  ``warm_claim``        ``WarmClaim``: claim (attach, mount) and release a warm volume of the pool
  ``warm_cache_pruning`` ``prune``: the claimed warm volume's setup caches and input stores that the job does not
                        use, removed least recently used first while the volume is short of free space
  ``group_exit``        ``GroupExit``: leave the group, hand the instance back, scale to 0, complete the drain hook
  ``handover``          ``Handover``: at a job's end, the cluster's next queued job (``spot_training.job_queue``) or
                        the group to 0; whether this node goes on to the next job or leaves as surplus
  ``membership``        ``Membership``: the group's instances while the trainers run, asked of Auto Scaling by the
                        rendezvous host alone and published to ``nodes/<host>/membership`` for the others
  ``rendezvous``        ``Rendezvous``: the peers of each attempt and the host they meet at, peers that join or are
                        lost while the trainer runs, torchrun's command line and environment
  ``final_syncs``       ``FinalSyncs``: an attempt's final checkpoint syncs, this node's (reported in ``synced``) and
                        the peers' (waited for before a restart, a leave, a stop, the done barrier)
  ``trainer``           ``Trainer``, ``TrainerRun``: one torchrun per attempt, its output to the log, the sync while it
                        runs, SIGTERM with the grace on a notice, a stop, a lost peer or a stall
  ``leaving``           ``Endings``: the done barrier and ``DONE``, ``FAILED``, ``STOPPED``, a refused job, an error
                        this node cannot go on after, a leave before this node's trainer started; each moves the
                        node's lifecycle to its final state
  ``supervisor``        ``Agent``: boot, then a loop over the jobs of the boot (the current job, then each one the
                        queue hands this node): the training attempts (restore, peers, trainer, final sync) and the
                        end; it moves the node's lifecycle through them and writes each state to ``nodes/<id>/state``
"""
