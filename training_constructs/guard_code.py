"""The Lambda packages of the budget guard and the capacity watcher, bundled by copying their files on the machine
that synthesizes: no Docker, and an asset's hash is that of its files' names and contents, the same on every machine.

The budget guard: ``budget_guard/handler.py`` at its root and the S3 contract it imports,
``bootstrap_scripts/spot_training/protocol.py``, at the same path as in the repository (so ``handler.py`` imports it
by one name in both places). The capacity watcher: ``capacity_watcher/handler.py`` at its root, its decision
(``capacity_watcher/decision.py``) and the S3 contract at the same paths."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import BundlingOptions, Duration, ILocalBundling
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from compliance.checkov import skip_checkov

REPO = Path(__file__).resolve().parent.parent
GUARD_DIR = REPO / "budget_guard"
WATCHER_DIR = REPO / "capacity_watcher"
GUARD_RUNTIME = lambda_.Runtime.PYTHON_3_14
# checkov's Lambda checks both scheduled functions (the budget guard, the capacity watcher) skip, and why
GUARD_CHECKOV_SKIPS = {
    "CKV_AWS_116": "Runs on a schedule: EventBridge retries a failed run twice, the next run repeats the whole check, "
    "and errors are in its log group; a dead-letter queue would only hold copies of the timer event.",
    "CKV_AWS_117": "Calls only AWS APIs (Budgets, SSM, S3, Auto Scaling) and reaches no VPC resource; inside the "
    "VPC it would need a NAT or interface endpoints, for no protection gained.",
    "CKV_AWS_115": "No reserved concurrency: it runs once per schedule period, and reserving even 1 fails the deploy "
    "on accounts at Lambda's minimum concurrency quota (AWS keeps 10 unreserved).",
    "CKV_AWS_173": "The environment holds names and numbers only (budget, team, group, bucket, key, parameter "
    "names, minutes), no secrets; the default AWS-managed key encrypts it at rest.",
}
# {path in the package: the repository's file}
PACKAGE_FILES = {
    "handler.py": GUARD_DIR / "handler.py",
    "bootstrap_scripts/spot_training/protocol.py": REPO / "bootstrap_scripts" / "spot_training" / "protocol.py",
}
WATCHER_FILES = {
    "handler.py": WATCHER_DIR / "handler.py",
    "capacity_watcher/__init__.py": WATCHER_DIR / "__init__.py",
    "capacity_watcher/decision.py": WATCHER_DIR / "decision.py",
    "bootstrap_scripts/spot_training/protocol.py": PACKAGE_FILES["bootstrap_scripts/spot_training/protocol.py"],
}


@jsii.implements(ILocalBundling)
class _CopyFiles:
    """Local bundling that copies ``files`` ({path in the package: file}) into the asset's output directory."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def try_bundle(self, output_dir: str, *options: Any, **named: Any) -> bool:
        """Called by jsii with the bundling options as one positional struct, which the copy does not need."""
        for target, source in self.files.items():
            path = Path(output_dir) / target
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, path)
        return True


def _copied(runtime: lambda_.Runtime, source_dir: Path, files: Mapping[str, Path]) -> lambda_.Code:
    """``runtime``'s build image is named only because bundling options need one: the local copy always succeeds,
    so Docker never runs."""
    bundling = BundlingOptions(image=runtime.bundling_image, local=_CopyFiles(files))
    return lambda_.Code.from_asset(str(source_dir), bundling=bundling)


def guard_code(runtime: lambda_.Runtime) -> lambda_.Code:
    """The budget guard's code asset (:data:`PACKAGE_FILES`)."""
    return _copied(runtime, GUARD_DIR, PACKAGE_FILES)


def watcher_code(runtime: lambda_.Runtime) -> lambda_.Code:
    """The capacity watcher's code asset (:data:`WATCHER_FILES`)."""
    return _copied(runtime, WATCHER_DIR, WATCHER_FILES)


def scheduled_function(
    scope: Construct,
    construct_id: str,
    *,
    code: lambda_.Code,
    role: iam.IRole,
    log_group: logs.ILogGroup,
    timeout: Duration,
    environment: dict[str, str],
    description: str,
) -> lambda_.Function:
    """A scheduled function of this app (:data:`GUARD_RUNTIME`, ``handler.handler``, :data:`GUARD_CHECKOV_SKIPS`).

    It takes its role by ARN: the ARN's GetAtt already creates the role first, and a Function given the Role
    construct adds a DependsOn on it as well (cfn-lint W3005). The caller makes it depend on the role's policies
    instead, which nothing else orders before it."""
    function = lambda_.Function(
        scope,
        construct_id,
        runtime=GUARD_RUNTIME,
        handler="handler.handler",
        code=code,
        timeout=timeout,
        memory_size=256,
        role=iam.Role.from_role_arn(scope, f"{construct_id}RoleByArn", role.role_arn, mutable=False),
        log_group=log_group,
        environment=environment,
        description=description,
    )
    for check, reason in GUARD_CHECKOV_SKIPS.items():
        skip_checkov(function, check, reason)
    return function
