"""TrainingLogs: one CloudWatch log group per cluster, explicit retention."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct


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

    def grant_write(self, grantee: iam.IGrantable) -> None:
        self.log_group.grant_write(grantee)
