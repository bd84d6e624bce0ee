"""SpotTrainingChecks: the rules as an aws-cdk-lib validation plugin that reports like a cdk-nag pack."""

from __future__ import annotations

import builtins
import json
import re
from pathlib import Path
from typing import Optional

import jsii
from aws_cdk import (
    CfnResource,
    IPolicyValidationContext,
    IPolicyValidationPlugin,
    PolicyValidationPluginReport,
    PolicyViolatingResource,
    PolicyViolation,
    Stack,
    Validations,
)
from constructs import IConstruct

from compliance.nag import failed_report
from compliance.spot_training.rule import Rule
from compliance.spot_training.rules import RULES
from compliance.spot_training.template import Resource, Template

PACK = "SpotTraining"


def _acknowledged(construct: IConstruct, rule_id: str) -> bool:
    """Whether ``rule_id`` is acknowledged on the construct or a scope above it (cdk-nag's rule, same metadata)."""
    key = Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    current: Optional[IConstruct] = construct
    while current is not None:
        for entry in current.node.metadata:
            if entry.type == key and isinstance(entry.data, dict):
                if rule_id in (re.sub(r"^annotation::", "", k, flags=re.IGNORECASE) for k in entry.data):
                    return True
        current = current.node.scope
    return False


def _find_resource(app: IConstruct, stack_path: str, logical_id: str, resource: Resource) -> Optional[IConstruct]:
    """The construct of a template resource: by its ``aws:cdk:path`` metadata, else by walking the stack."""
    cdk_path = (resource.get("Metadata") or {}).get("aws:cdk:path")
    if isinstance(cdk_path, str):
        found: Optional[IConstruct] = app
        for part in cdk_path.split("/"):
            found = found.node.try_find_child(part) if found is not None else None
        if found is not None:
            return found
    stack: Optional[IConstruct] = app
    for part in stack_path.split("/"):
        stack = stack.node.try_find_child(part) if stack is not None else None
    if stack is None:
        return None
    for child in stack.node.find_all():
        if isinstance(child, CfnResource) and Stack.of(child).resolve(child.logical_id) == logical_id:
            return child
    return None


@jsii.implements(IPolicyValidationPlugin)
class SpotTrainingChecks:
    """The rules above as a validation plugin that reports like a cdk-nag pack: findings are ``SpotTraining-ST<n>``,
    acknowledged like any cdk-nag finding.

    It reads each synthesized template once, in Python, and crosses into jsii only for the construct of a finding
    (to honour an acknowledgement and name its path): a cdk-nag ``NagPack`` calls back into Python for every
    ``CfnResource`` of every stack, about 20 jsii round trips each, which made it most of a 10-team synth.
    """

    def __init__(self, scope: Optional[IConstruct] = None, *, verbose: Optional[bool] = None) -> None:
        del scope  # the same signature as a NagPack; the app comes with the validation context
        self._verbose = bool(verbose)

    @builtins.property
    def name(self) -> str:
        return PACK

    @builtins.property
    def version(self) -> Optional[str]:
        return None  # as a cdk-nag pack: no version, no rule list

    @builtins.property
    def rule_ids(self) -> Optional[list[str]]:
        return None

    def findings(self, template: Template) -> list[tuple[str, Rule, str]]:
        """(logical id, rule, description) of every non-compliant resource of one template."""
        out = []
        for logical_id, resource in (template.get("Resources") or {}).items():
            for rule in RULES:
                if resource.get("Type") not in rule.types:
                    continue
                try:
                    result = rule.check(logical_id, resource, template)
                except Exception as exc:  # reported as cdk-nag reports a rule that throws
                    reason = (
                        str(exc)
                        if self._verbose
                        else "This is generally caused by a parameter referencing an intrinsic function."
                    )
                    out.append((logical_id, rule, f"Rule threw an error during validation. {reason}"))
                    continue
                if result:
                    why = f" {rule.why} Found: {'; '.join(result)}." if self._verbose else ""
                    out.append((logical_id, rule, rule.message + why))
        return out

    def validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        try:
            return self._validate(context)
        except Exception as exc:  # a template it cannot read, a bug: fail the synth, never pass it unchecked
            return failed_report(
                context,
                f"{PACK}-Error",
                f"SpotTrainingChecks could not check the templates: {type(exc).__name__}: {exc}",
                "a bug in compliance/spot_training/ unless the error names a file the synth did not write",
            )

    def _validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        described: dict[str, str] = {}  # rule id -> description of its first finding (cdk-nag groups by rule)
        severity: dict[str, str] = {}
        violating: dict[str, list[PolicyViolatingResource]] = {}
        app: Optional[IConstruct] = None
        for stack in context.stack_templates:
            template = json.loads(Path(stack.template_path).read_text())
            for logical_id, rule, description in self.findings(template):
                rule_id = f"{PACK}-{rule.id}"
                app = app or context.app_construct
                resource = template["Resources"][logical_id]
                construct = _find_resource(app, stack.stack_construct_path, logical_id, resource)
                if construct is not None and _acknowledged(construct, rule_id):
                    continue
                if construct is not None:
                    where = PolicyViolatingResource(locations=["Properties"], construct_path=construct.node.path)
                else:
                    where = PolicyViolatingResource(
                        locations=["Properties"], resource_logical_id=logical_id, template_path=stack.template_path
                    )
                described.setdefault(rule_id, description)
                severity[rule_id] = rule.severity
                violating.setdefault(rule_id, []).append(where)
        violations = [
            PolicyViolation(rule_name=k, description=d, severity=severity[k], violating_resources=violating[k])
            for k, d in described.items()
        ]
        errors = [v for v in violations if v.severity == "error"]
        return PolicyValidationPluginReport(success=not errors, violations=violations)
