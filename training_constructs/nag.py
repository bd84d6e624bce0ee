"""Acknowledging a cdk-nag finding: on the narrowest construct, exact finding id, checkable reason."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """``finding`` is the exact id cdk-nag prints, e.g. ``AwsSolutions-IAM5[Resource::*]``."""
    Validations.of(scope).acknowledge(Acknowledgment(id=finding, reason=reason))
