"""CheckpointStore: the team's encrypted, versioned S3 bucket for checkpoints and code."""

from __future__ import annotations

import typing
from typing import Optional

from aws_cdk import CfnElement, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from bootstrap_scripts.spot_training import protocol
from compliance.checkov import skip_checkov
from compliance.nag import acknowledge, acknowledge_all
from compliance.spot_training import CHECKPOINT_ROLE_TAG

# How long a replaced or deleted access-log object stays recoverable in the (versioned) access-log bucket.
ACCESS_LOG_NONCURRENT_DAYS = 30


class CheckpointStore(Construct):
    """Checkpoint bucket: SSE-S3, versioned, public access blocked, TLS only, access-logged.

    Layout: ``<cluster>/code/...`` for job code, ``<cluster>/<job>/ckpt/<step>/`` for checkpoints
    (a manifest written last makes a checkpoint exist). Lifecycle: incomplete multipart uploads
    are aborted after 1 day; replaced or deleted object versions expire after
    ``noncurrent_version_expiration_days``, then their delete markers. RETAIN by default: checkpoints outlive the stack.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        noncurrent_version_expiration_days: int = 30,
        access_log_expiration_days: int = 365,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        access_logs_bucket: Optional[s3.IBucket] = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if access_logs_bucket is None:
            access_logs_bucket = self._access_log_bucket(access_log_expiration_days, removal_policy)
        self.access_logs_bucket = access_logs_bucket
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=access_logs_bucket,
            server_access_logs_prefix="checkpoints/",
            removal_policy=removal_policy,
            auto_delete_objects=False,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="AbortIncompleteUploads",
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                s3.LifecycleRule(
                    id="ExpireReplacedVersions",
                    noncurrent_version_expiration=Duration.days(noncurrent_version_expiration_days),
                    expired_object_delete_marker=True,  # a pruned key's marker, once its versions are gone
                ),
            ],
        )
        Tags.of(self.bucket).add(*CHECKPOINT_ROLE_TAG)  # SpotTrainingChecks ST6 holds this bucket to its rules

    def _access_log_bucket(self, expiration_days: int, removal_policy: RemovalPolicy) -> s3.Bucket:
        """The bucket the checkpoint bucket's server access logs go to, kept ``expiration_days``."""
        log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            # Versioned (checkov CKV_AWS_21): an overwritten or deleted access log stays recoverable for
            # ACCESS_LOG_NONCURRENT_DAYS; log objects are written once, so this costs only on tampering.
            versioned=True,
            removal_policy=removal_policy,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireAccessLogs",
                    expiration=Duration.days(expiration_days),
                    noncurrent_version_expiration=Duration.days(ACCESS_LOG_NONCURRENT_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )
        acknowledge(
            log_bucket,
            "AwsSolutions-S1",
            "This is the access-log bucket of the checkpoint bucket; logging it into itself would loop.",
        )
        skip_checkov(
            log_bucket,
            "CKV_AWS_18",
            "This is the access-log bucket of the checkpoint bucket; logging it into itself would loop "
            "(the same finding as cdk-nag AwsSolutions-S1).",
        )
        return log_bucket

    @staticmethod
    def cluster_prefix(cluster: str) -> str:
        """Key prefix (no leading slash, trailing slash) under which one cluster keeps everything."""
        return protocol.cluster_prefix(cluster)

    @classmethod
    def node_write_keys(cls, cluster: str) -> list[str]:
        """Key patterns of what the node agent writes (``bootstrap_scripts/spot_training/agent/``), under a job's
        ``<cluster>/<job>/`` (the ``*``): checkpoints, per-node markers, the job's end markers and its ``NEXT`` (the
        queued job that follows it). None matches a code archive, ``<cluster>/code/<job>.tar.gz`` (a job id has no
        '/', an archive ends in ``.tar.gz``)."""
        job = protocol.job_prefix(cls.cluster_prefix(cluster), "*")
        ends = (job + marker for marker in (*protocol.END_MARKERS, protocol.NEXT))
        return [cls.checkpoint_keys(cluster), protocol.nodes_prefix(job) + "*", *ends]

    @classmethod
    def queue_keys(cls, cluster: str) -> str:
        """The key pattern of the cluster's queued jobs, ``<cluster>/queue/*``: the node that hands a job over to the
        next one deletes its entry, and the budget guard clears the queue."""
        return protocol.queue_prefix(cls.cluster_prefix(cluster)) + "*"

    @classmethod
    def checkpoint_keys(cls, cluster: str) -> str:
        """The key pattern of every job's checkpoints, ``<cluster>/*/ckpt/*``: the node agent writes and prunes them."""
        return protocol.checkpoints_prefix(protocol.job_prefix(cls.cluster_prefix(cluster), "*")) + "*"

    @classmethod
    def stop_keys(cls, cluster: str) -> str:
        """The key pattern of every job's stop request, ``<cluster>/*/STOP``."""
        return protocol.job_prefix(cls.cluster_prefix(cluster), "*") + protocol.STOP

    def cluster_access_policy(self, scope: Construct, construct_id: str, role: iam.IRole, cluster: str) -> iam.Policy:
        """What the node agent (and so the training code, which runs with the same role) does under ``<cluster>/``.

        List and read the whole prefix, no other cluster's objects, not even their names (``bucket.grant_read_write(
        role, "<cluster>/*")`` would also allow ``s3:List*`` on the whole bucket). Write only where the agent writes
        (:meth:`node_write_keys`); delete and abort uploads only of checkpoints (``<cluster>/<job>/ckpt/...``: the
        agent prunes old ones and replaces a manifest); never write or delete the code archives (``<cluster>/code/``),
        which other jobs run.
        """
        prefix = self.cluster_prefix(cluster)
        checkpoints = self.checkpoint_keys(cluster)
        code = protocol.code_prefix(prefix) + "*"
        policy = iam.Policy(
            scope,
            construct_id,
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="ListOwnClusterPrefix",
                    actions=["s3:ListBucket"],
                    resources=[self.bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
                ),
                iam.PolicyStatement(
                    sid="ReadOwnClusterObjects",
                    actions=["s3:GetObject"],  # and HeadObject: code archives, markers, checkpoints
                    resources=[self.bucket.arn_for_objects(f"{prefix}*")],
                ),
                iam.PolicyStatement(
                    sid="WriteJobCheckpointsAndMarkers",
                    actions=["s3:PutObject"],  # and the multipart upload calls
                    resources=[self.bucket.arn_for_objects(k) for k in self.node_write_keys(cluster)],
                ),
                iam.PolicyStatement(
                    sid="PruneJobCheckpoints",
                    actions=["s3:DeleteObject", "s3:AbortMultipartUpload"],
                    resources=[self.bucket.arn_for_objects(checkpoints)],
                ),
                # The Allows above do not name the archives, but their "*" would match a key such as
                # <cluster>/code/x/ckpt/y: the code folder stays read-only to the nodes whatever the key.
                iam.PolicyStatement(
                    sid="DenyCodeArchiveWrites",
                    effect=iam.Effect.DENY,
                    actions=["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                    resources=[self.bucket.arn_for_objects(code)],
                ),
                iam.PolicyStatement(
                    sid="TakeQueuedJobs",
                    actions=["s3:DeleteObject"],
                    resources=[self.bucket.arn_for_objects(self.queue_keys(cluster))],
                ),
            ],
        )
        acknowledge_all(policy, self._cluster_access_findings(cluster))
        return policy

    def _cluster_access_findings(self, cluster: str) -> dict[str, str]:
        """cdk-nag's IAM5 findings on :meth:`cluster_access_policy`'s wildcards, and why each is there."""
        prefix = self.cluster_prefix(cluster)
        checkpoints = self.checkpoint_keys(cluster)
        bucket_id = Stack.of(self).get_logical_id(typing.cast(CfnElement, self.bucket.node.default_child))
        findings = {
            f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{prefix}*]": (
                "Read only: code archives, markers and checkpoints are created at run time under the cluster's own "
                f"prefix '{prefix}'; the wildcard stops at that prefix, and listing is limited to it by an s3:prefix "
                "condition."
            )
        }
        findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.queue_keys(cluster)}]"] = (
            "The '*' is a queued job's id, known only at run time: the node that hands an ended job over to the next "
            "one deletes that job's queue entry (spot_training/job_queue.py)."
        )
        for key in self.node_write_keys(cluster):
            deletes = key == checkpoints
            writes = " (and deletes: it prunes old checkpoints)." if deletes else "; no code archive matches it."
            findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{key}]"] = (
                f"The first '*' is the job id, known only at run time; '{key}' is what the node agent writes there"
                + writes
            )
        return findings
