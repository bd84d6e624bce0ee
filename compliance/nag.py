"""Acknowledging a cdk-nag finding: on the narrowest construct, exact finding id, checkable reason."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import (
    Acknowledgment,
    IPolicyValidationContext,
    PolicyValidationPluginReport,
    PolicyViolatingResource,
    PolicyViolation,
    Validations,
)
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """``finding`` is the exact id cdk-nag prints, e.g. ``AwsSolutions-IAM5[Resource::*]``."""
    acknowledge_all(scope, {finding: reason})


def acknowledge_all(scope: IConstruct, findings: Mapping[str, str]) -> None:
    """Several findings on one construct (finding id -> reason), in one jsii call: each call crosses into the jsii
    kernel, and a synth of 10 teams made 230 of them."""
    Validations.of(scope).acknowledge(*(Acknowledgment(id=f, reason=r) for f, r in findings.items()))


def failed_report(
    context: IPolicyValidationContext, rule: str, description: str, fix: str
) -> PolicyValidationPluginReport:
    """A validation plugin's report with one error on every stack of ``context``: what a plugin that could not check
    the templates returns. Not an exception: the CDK CLI reports a plugin that throws in the validation report and
    still calls the synth a success (an in-process synth does fail)."""
    stacks = [
        PolicyViolatingResource(locations=[], construct_path=s.stack_construct_path, template_path=s.template_path)
        for s in context.stack_templates
    ]
    violation = PolicyViolation(
        rule_name=rule, description=description, severity="error", fix=fix, violating_resources=stacks
    )
    return PolicyValidationPluginReport(success=False, violations=[violation])
