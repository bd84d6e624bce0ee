"""The node role's policies the cluster adds: reading what a node boots from, and the calls of peer discovery."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_iam as iam
from constructs import Construct

from compliance.nag import acknowledge
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
