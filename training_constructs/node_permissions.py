"""The node role's policies the cluster adds: reading what a node boots from, the calls of peer discovery, and what
a job's secrets and inputs come from."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from bootstrap_scripts.spot_training.job_parts import secret_prefix
from compliance.nag import acknowledge, acknowledge_all
from training_constructs.node_bootstrap import NodeBootstrap


class NodeBootPolicy(iam.Policy):
    """Read the bootstrap scripts' archive and the cluster's own job parameters (``parameter_arns``: the job spec's,
    then the current job's), no others; write the current-job parameter, which a node hands over to the cluster's
    next queued job (spot_training/job_queue.py)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        role: iam.IRole,
        bootstrap: NodeBootstrap,
        parameter_arns: Sequence[str],
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            roles=[role],
            statements=[
                bootstrap.read_statement(),
                iam.PolicyStatement(
                    sid="ReadOwnJobParameters", actions=["ssm:GetParameter"], resources=list(parameter_arns)
                ),
                iam.PolicyStatement(
                    sid="HandOverToQueuedJob", actions=["ssm:PutParameter"], resources=[parameter_arns[-1]]
                ),
            ],
        )


class PeerDiscoveryPolicy(iam.Policy):
    """The read-only Describe calls a node finds its peers (the group's instances and their addresses) with."""

    def __init__(self, scope: Construct, construct_id: str, *, role: iam.IRole) -> None:
        super().__init__(
            scope,
            construct_id,
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="DescribeForPeerDiscovery",
                    actions=[
                        "autoscaling:DescribeAutoScalingGroups",
                        "autoscaling:DescribeAutoScalingInstances",
                        "ec2:DescribeInstances",
                    ],
                    resources=["*"],
                )
            ],
        )
        acknowledge(
            self,
            "AwsSolutions-IAM5[Resource::*]",
            "Read-only Describe* calls for peer discovery; these actions support no resource-level permissions, so "
            "IAM requires Resource '*'.",
        )


class JobInputsPolicy(iam.Policy):
    """What a job's secrets and inputs (bootstrap_scripts/spot_training/job_parts.py) are read from, and no more:
    the team's own secrets (SSM parameters under ``/<secret_prefix>``, Secrets Manager secrets named
    ``<secret_prefix>...``), and the objects of the team file's ``data_buckets``.

    No ``kms:Decrypt``: SecureString parameters and secrets are encrypted with the AWS-managed keys aws/ssm and
    aws/secretsmanager by default, whose key policies let every principal of the account decrypt through that
    service (``kms:ViaService``, ``kms:CallerAccount``); an IAM grant would add nothing but a wildcard over every key
    of the account (key ids are not known at synth). A secret under a customer-managed key needs that key's policy
    to name the node role.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, role: iam.IRole, team: str, data_buckets: Sequence[str]
    ) -> None:
        stack = Stack.of(scope)
        prefix = secret_prefix(team)
        parameters = stack.format_arn(service="ssm", resource="parameter", resource_name=f"{prefix}*")
        secrets = stack.format_arn(
            service="secretsmanager",
            resource="secret",
            resource_name=f"{prefix}*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        statements = [
            iam.PolicyStatement(
                sid="ReadTeamSecretParameters",
                actions=["ssm:GetParameter", "ssm:GetParameters"],
                resources=[parameters],
            ),
            iam.PolicyStatement(sid="ReadTeamSecrets", actions=["secretsmanager:GetSecretValue"], resources=[secrets]),
            *self._data_buckets(stack, data_buckets),
        ]
        super().__init__(scope, construct_id, roles=[role], statements=statements)
        arn = "arn:<AWS::Partition>:{}:<AWS::Region>:<AWS::AccountId>:{}"
        findings = {
            arn.format("ssm", f"parameter/{prefix}*"): f"The team's job secrets are every parameter under /{prefix} (a "
            "job names them at submit); no other team's and no cluster's parameters are under it.",
            arn.format("secretsmanager", f"secret:{prefix}*"): f"The team's job secrets are every secret named "
            f"{prefix}... (a job names them at submit; Secrets Manager appends a random suffix to each ARN).",
            **{
                f"arn:<AWS::Partition>:s3:::{bucket}/*": f"Reading every object of data bucket {bucket}, which the "
                "team file lists (data_buckets) for its jobs' inputs."
                for bucket in data_buckets
            },
        }
        acknowledge_all(self, {f"AwsSolutions-IAM5[Resource::{r}]": reason for r, reason in findings.items()})

    @staticmethod
    def _data_buckets(stack: Stack, buckets: Sequence[str]) -> list[iam.PolicyStatement]:
        """Get and list the objects of ``buckets``; nothing without any."""
        if not buckets:
            return []
        arns = [stack.format_arn(service="s3", region="", account="", resource=b) for b in buckets]
        return [
            iam.PolicyStatement(sid="ListDataBuckets", actions=["s3:ListBucket"], resources=arns),
            iam.PolicyStatement(sid="ReadDataBuckets", actions=["s3:GetObject"], resources=[f"{a}/*" for a in arns]),
        ]
