"""TrainingLogs: one CloudWatch log group per cluster, explicit retention."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from compliance.checkov import skip_checkov

# checkov CKV_AWS_158 (log group not encrypted with a customer-managed KMS key), on every log group of the app.
LOG_GROUP_KMS_SKIP = (
    "CKV_AWS_158",
    "CloudWatch Logs encrypts every log group at rest with AWS-managed keys; a customer-managed KMS key, which "
    "this check asks for, adds a key, its key policy for the logs service and a monthly cost per team, and does "
    "not change who may read the logs: that is IAM on logs:GetLogEvents/FilterLogEvents, which no role here has.",
)


class TrainingLogs(Construct):
    """The cluster's log group. The node agent writes one stream per job and node: ``<job>/<instance-id>``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        retention: logs.RetentionDays,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "LogGroup", retention=retention, removal_policy=removal_policy)
        skip_checkov(self.log_group, *LOG_GROUP_KMS_SKIP)

    def grant_write(self, grantee: iam.IGrantable) -> None:
        self.log_group.grant_write(grantee)
