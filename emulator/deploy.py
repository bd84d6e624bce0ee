"""Bootstrap and deploy with the real CDK CLI (the pinned ``aws-cdk`` in node_modules) into the emulator.

    with EmulatedCloud() as cloud:
        bootstrap(cloud)
        outputs = deploy(cloud, "TrainingStack")

Both run ``npx --no cdk ...`` from the repository root (so ``cdk.json`` and ``app.py`` are the real
ones) with :meth:`EmulatedCloud.client_env`: ``AWS_ENDPOINT_URL`` (the CLI uses it for every service
and switches S3 to path-style addressing for a loopback host), fake credentials, the run's CA
(``AWS_CA_BUNDLE``/``NODE_EXTRA_CA_CERTS``), and no notices, telemetry or version check (CDK's and npm's), so nothing
leaves the machine. The cloud assembly goes to the run directory, not the shared ``cdk.out``.
Everything the CLI prints goes to ``<run_dir>/cdk.log``.

After a deploy, :func:`deploy` fails if moto skipped any resource type it does not know (moto only
logs a warning and carries on, which would hide a weakened stack).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from emulator.cloud import REPO_ROOT, EmulatedCloud, EmulatorError

UNSUPPORTED_PROPERTY = "EMULATOR-UNSUPPORTED-PROPERTY"  # emulator.cfn_compat logs it (that module needs moto)

# jsii's warnings about this machine's Node.js 20 (the Makefile sets the same), for child processes that run the app
JSII_QUIET = {
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
}
BOOTSTRAP_TIMEOUT_S = 300.0
DEPLOY_TIMEOUT_S = 900.0
_UNSUPPORTED = re.compile(r"No Moto CloudFormation support for (\S+)")
_UNSUPPORTED_PROPERTY = re.compile(UNSUPPORTED_PROPERTY + r" (\S+) is not emulated")


def cdk_env(cloud: EmulatedCloud) -> dict[str, str]:
    env = cloud.client_env()
    venv_bin = str(Path(sys.executable).parent)  # `python3 app.py` must be this interpreter's
    env.update(
        {
            "PATH": os.pathsep.join([venv_bin, str(REPO_ROOT / "node_modules" / ".bin"), env.get("PATH", "")]),
            **JSII_QUIET,
            "CDK_DISABLE_VERSION_CHECK": "1",
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            "NPM_CONFIG_UPDATE_NOTIFIER": "false",  # npx must not ask the npm registry for a newer npm
            "FORCE_COLOR": "0",
        }
    )
    return env


def run_cdk(cloud: EmulatedCloud, args: list[str], *, timeout_s: float, log_path: Optional[Path] = None) -> float:
    """Run ``npx --no cdk <args>`` against the emulator; returns the seconds it took. Raises on failure.

    The CLI runs in its own process group, which is killed on timeout or Ctrl-C (no orphans).
    """
    if shutil.which("npx") is None:
        raise EmulatorError("npx not found: install Node.js and run `npm ci` (see Makefile: deps)")
    if not (REPO_ROOT / "node_modules" / ".bin" / "cdk").exists():
        raise EmulatorError("the pinned CDK CLI is not installed: run `npm ci` (see Makefile: deps)")
    assert cloud.run_dir is not None
    log_path = log_path or cloud.run_dir / "cdk.log"
    cmd = ["npx", "--no", "cdk", *args, "--no-notices", "--ci"]
    started = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(  # noqa: S603 (fixed program, our arguments)
            cmd,
            cwd=REPO_ROOT,
            env=cdk_env(cloud),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise EmulatorError(f"`cdk {args[0]}` did not finish within {timeout_s:.0f} s; see {log_path}") from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # the CLI may leave children (the app's jsii node process) behind
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-25:]
        raise EmulatorError(f"`cdk {args[0]}` failed (exit code {rc}); see {log_path}:\n" + "\n".join(tail))
    return time.monotonic() - started


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


BOOTSTRAP_STACK = "CDKToolkit"


def bootstrap(cloud: EmulatedCloud) -> float:
    """``cdk bootstrap aws://ACCOUNT/REGION``, then the same checks as :func:`deploy`; returns seconds taken."""
    log_offset = _log_size(cloud)
    assert cloud.run_dir is not None
    env = f"aws://{cloud.account_id}/{cloud.region}"
    # its own --output: the CLI locks the assembly directory, so runs side by side must not share cdk.out
    took = run_cdk(cloud, ["bootstrap", env, "--output", str(cloud.run_dir / "cdk.out")], timeout_s=BOOTSTRAP_TIMEOUT_S)
    _check_log(cloud, log_offset)
    verify_stack(cloud, BOOTSTRAP_STACK)
    return took


def _log_size(cloud: EmulatedCloud) -> int:
    return cloud.server_log.stat().st_size if cloud.server_log.exists() else 0


def _check_log(cloud: EmulatedCloud, offset: int) -> None:
    skipped = unsupported(cloud.server_log, offset)
    if skipped:
        raise EmulatorError(
            f"moto dropped parts of the template it does not support: {', '.join(sorted(skipped))}; "
            "add them to emulator/cfn_compat/"
        )


def deploy(cloud: EmulatedCloud, *stacks: str, context: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``cdk deploy <stacks> --require-approval never``; returns the stack outputs (all stacks merged).

    Raises if moto skipped a resource type it does not support.
    """
    assert cloud.run_dir is not None
    args = ["deploy", *stacks, "--require-approval", "never", "--output", str(cloud.run_dir / "cdk.out")]
    args += ["--progress", "events"]
    for key, value in (context or {}).items():
        args += ["--context", f"{key}={value}"]
    log_offset = _log_size(cloud)
    run_cdk(cloud, args, timeout_s=DEPLOY_TIMEOUT_S)
    _check_log(cloud, log_offset)
    outputs: dict[str, str] = {}
    for name in stacks:
        outputs.update(verify_stack(cloud, name))
    return outputs


def verify_stack(cloud: EmulatedCloud, stack_name: str) -> dict[str, str]:
    """Check the stack is complete and holds every unconditional resource of its template; return its outputs.

    moto can answer a failed ExecuteChangeSet with a server error that the CLI retries into a
    "successful" empty update, so the CLI's exit code alone proves nothing.
    """
    cfn = cloud.client("cloudformation")
    stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    if stack["StackStatus"] not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        raise EmulatorError(f"stack {stack_name} is {stack['StackStatus']}")
    body = cfn.get_template(StackName=stack_name)["TemplateBody"]
    template = body if isinstance(body, dict) else _parse_template(body)
    expected = {k for k, v in template.get("Resources", {}).items() if "Condition" not in v}
    present: set[str] = set()
    for page in cfn.get_paginator("list_stack_resources").paginate(StackName=stack_name):
        present |= {r["LogicalResourceId"] for r in page["StackResourceSummaries"]}
    missing = expected - present
    if missing:
        raise EmulatorError(f"stack {stack_name} lacks resources {sorted(missing)}; see {cloud.server_log}")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


class _CfnYamlLoader(yaml.SafeLoader):
    """YAML loader that accepts CloudFormation's short-form tags (``!Ref``, ``!If``, ...) as plain values."""


_CfnYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _parse_template(body: str) -> dict[str, Any]:
    try:
        return dict(json.loads(body))
    except json.JSONDecodeError:
        return dict(yaml.load(body, Loader=_CfnYamlLoader))  # noqa: S506 (a SafeLoader subclass)


def unsupported(server_log: Path, offset: int = 0) -> set[str]:
    """Resource types and properties reported as not emulated in the server log since ``offset``."""
    if not server_log.exists():
        return set()
    with open(server_log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return set(_UNSUPPORTED.findall(text)) | set(_UNSUPPORTED_PROPERTY.findall(text))
