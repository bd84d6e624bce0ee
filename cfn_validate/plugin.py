"""The validation plugin that has the worker (``cfn_validate.start_engine``) check the synthesized templates."""

from __future__ import annotations

import builtins
import contextlib
import json
import subprocess
from typing import IO, Any, Optional

import jsii
from aws_cdk import (
    IPolicyValidationContext,
    IPolicyValidationPlugin,
    PolicyValidationPluginReport,
    PolicyViolatingResource,
    PolicyViolation,
)

import cfn_validate
from compliance.nag import failed_report

PLUGIN_NAME = "CloudFormation Validate"  # aws-cdk-lib's CloudFormationValidatePlugin.PLUGIN_NAME
UNCHECKED = "ValidatorWorkerFailed"  # the finding of a synth whose templates the worker did not check


@jsii.implements(IPolicyValidationPlugin)
class CloudFormationValidateWorker:
    """aws-cdk-lib's CloudFormation validation plugin, its engine in the worker process ``process``."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        if process.stdin is None or process.stdout is None:
            raise ValueError("the validator worker needs pipes for its input and output")
        self._process = process
        self._stdin: IO[str] = process.stdin
        self._stdout: IO[str] = process.stdout
        self._version: Optional[str] = None
        self._sent: Optional[str] = None  # the request the worker is answering, not read yet

    @builtins.property
    def name(self) -> str:
        return PLUGIN_NAME

    @builtins.property
    def version(self) -> Optional[str]:
        return self._version  # the engine's, as aws-cdk-lib reports it; known once the worker has answered

    @builtins.property
    def rule_ids(self) -> Optional[list[str]]:
        return None

    def validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        request = self._request(context)
        if self._sent != request:  # no sender ran before, or it sent other templates: ask now
            if self._sent is not None:
                self._answer()  # the worker answers what it was sent first
            self._send(request)
        self._sent = None
        try:
            answer = self._answer()
        except RuntimeError as exc:  # fails the synth: the templates were not checked
            return failed_report(
                context,
                UNCHECKED,
                f"{exc}; the templates were not checked, so the synth fails",
                "run the synth again; if it fails the same way, the worker's own error is above (a venv without the "
                "engine copy, .venv/share/spot-training, runs aws-cdk-lib's validator instead)",
            )
        self._version = answer.get("version")
        report = answer["report"]
        violations = [
            PolicyViolation(
                rule_name=v["ruleName"],
                description=v["description"],
                severity=v["severity"],
                fix=v.get("fix"),
                rule_metadata=v.get("ruleMetadata"),
                violating_resources=[
                    PolicyViolatingResource(
                        locations=r["locations"],
                        construct_path=r.get("constructPath"),
                        resource_logical_id=r.get("resourceLogicalId"),
                        template_path=r.get("templatePath"),
                    )
                    for r in v["violatingResources"]
                ],
            )
            for v in report["violations"]
        ]
        return PolicyValidationPluginReport(success=report["success"], violations=violations)

    @property
    def sender(self) -> IPolicyValidationPlugin:
        """A plugin to register before the others: it hands the templates to the worker, which checks them while
        the other plugins run, and reports nothing itself; this plugin, registered last, reads the answer."""
        return _SendTemplates(self)

    @staticmethod
    def _request(context: IPolicyValidationContext) -> str:
        return cfn_validate.request(
            (s.stack_construct_path, s.template_path, s.account_id, s.region) for s in context.stack_templates
        )

    def _send(self, request: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # a dead worker: reading its answer says so, with its exit code
            self._stdin.write(request + "\n")
            self._stdin.flush()
        self._sent = request

    def _answer(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            raise RuntimeError(f"{PLUGIN_NAME}: the validator worker ended (exit code {self._process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{PLUGIN_NAME}: {answer['error']}")
        return answer

    def close(self) -> None:
        """End the worker: it exits when its input closes (not waited for: a synth need not wait for its exit)."""
        with contextlib.suppress(BrokenPipeError):  # it died: its answer's read said so, or nothing asked it
            self._stdin.close()


@jsii.implements(IPolicyValidationPlugin)
class _SendTemplates:
    """:attr:`CloudFormationValidateWorker.sender`."""

    def __init__(self, worker: CloudFormationValidateWorker) -> None:
        self._worker = worker

    @builtins.property
    def name(self) -> str:
        return f"{PLUGIN_NAME} (sending the templates)"

    @builtins.property
    def version(self) -> Optional[str]:
        return None

    @builtins.property
    def rule_ids(self) -> Optional[list[str]]:
        return None

    def validate(self, context: IPolicyValidationContext) -> PolicyValidationPluginReport:
        self._worker._send(self._worker._request(context))
        return PolicyValidationPluginReport(success=True, violations=[])
