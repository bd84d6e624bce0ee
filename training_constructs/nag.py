"""Acknowledging a cdk-nag finding: on the narrowest construct, exact finding id, checkable reason."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """``finding`` is the exact id cdk-nag prints, e.g. ``AwsSolutions-IAM5[Resource::*]``."""
    acknowledge_all(scope, {finding: reason})


def acknowledge_all(scope: IConstruct, findings: Mapping[str, str]) -> None:
    """Several findings on one construct (finding id -> reason), in one jsii call: each call crosses into the jsii
    kernel, and a synth of 10 teams made 230 of them."""
    Validations.of(scope).acknowledge(*(Acknowledgment(id=f, reason=r) for f, r in findings.items()))
