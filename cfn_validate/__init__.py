"""aws-cdk-lib's built-in CloudFormation validation, its engine started in a process of its own.

Every synth runs aws-cdk-lib's CloudFormation validator (``CloudFormationValidatePlugin``: resource schema checks
and lint rules in a WASM engine; cdk.json's ``@aws-cdk/core:validateAgainstDefaultRules`` makes its findings
errors). Its engine takes about 2 s of CPU to start, in the jsii kernel, on the one thread that also builds every
construct, and a synth waits for it after the stacks are built. ``app.py`` instead starts the same engine in a
node process of its own as the app starts (:func:`start_engine`, stdlib only, before aws-cdk-lib loads), on the
machine's other core, and turns aws-cdk-lib's copy off; once the templates are written,
:class:`cfn_validate.plugin.CloudFormationValidateWorker` has the worker check them with aws-cdk-lib's options and
mapping (``worker.js``). The plugin has aws-cdk-lib's name, so acknowledgements such as
``CloudFormation-Validate::W3010`` apply to it as to aws-cdk-lib's, and ``CDK_VALIDATION=false``
(``cdk synth --no-validation``) turns it off as it turns off aws-cdk-lib's.

The engine is the one aws-cdk-lib bundles (the npm registry does not carry that version): ``make run-deps`` copies
it, with aws-cdk-lib's default rules, out of aws-cdk-lib's jsii bundle into the venv (``python -m cfn_validate``).
Without that copy (a venv made by hand) the app runs aws-cdk-lib's own validator: the same checks, in the kernel.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

WORKER = Path(__file__).with_name("worker.js")
# in aws-cdk-lib's jsii bundle: the engine package, and the default rules CloudFormationValidatePlugin loads
BUNDLED_ENGINE = "package/node_modules/@aws/cloudformation-validate/"
BUNDLED_RULES = "package/core/lib/validation/rules/"
COMPLETE = ".complete"  # written last: a copy cut short is never used
# The engine's WASM code compiled by V8's baseline compiler only (no optimizing tier-up on background threads), and
# V8 without helper threads: the same checks on about a third of the CPU (`make bench` measures both). The worker
# shares the machine's two cores with the app and the jsii kernel, so the CPU it saves is the synth's.
V8_FLAGS = ("--liftoff-only", "--single-threaded")


def jsii_bundle() -> Path:
    """aws-cdk-lib's jsii bundle (the tarball the kernel loads), found without importing aws_cdk (which starts the
    kernel and loads aws-cdk-lib: what the engine's start should not wait for)."""
    spec = importlib.util.find_spec("aws_cdk")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("aws-cdk-lib is not installed")
    folder = Path(next(iter(spec.submodule_search_locations))) / "_jsii"
    found = sorted(folder.glob("aws-cdk-lib@*.jsii.tgz"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one aws-cdk-lib jsii bundle in {folder}, found {len(found)}")
    return found[0]


def engine_dir(prefix: Path = Path(sys.prefix)) -> Path:
    """Where :func:`extract` puts this aws-cdk-lib's engine and rules: in the venv, named after the bundle."""
    return prefix / "share" / "spot-training" / jsii_bundle().name.removesuffix(".jsii.tgz")


def extract(target: Optional[Path] = None) -> Path:
    """Copy the engine package and the default rules out of aws-cdk-lib's bundle (once per aws-cdk-lib version)."""
    source_bundle = jsii_bundle()
    target = target or engine_dir()
    if (target / COMPLETE).is_file():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    copied = 0
    with tarfile.open(source_bundle) as bundle:
        for member in bundle:  # one pass over the stream (the bundle unpacks to about 160 MB)
            if member.name.startswith(BUNDLED_ENGINE):
                relative = Path("cloudformation-validate", member.name[len(BUNDLED_ENGINE) :])
            elif member.name.startswith(BUNDLED_RULES) and member.name.endswith(".rego"):
                relative = Path("rules", member.name[len(BUNDLED_RULES) :])
            else:
                continue
            source = bundle.extractfile(member) if member.isfile() and ".." not in relative.parts else None
            if source is None:
                continue
            (partial / relative).parent.mkdir(parents=True, exist_ok=True)
            (partial / relative).write_bytes(source.read())
            copied += 1
    if not (partial / "cloudformation-validate" / "package.json").is_file():
        raise FileNotFoundError(f"{source_bundle.name} has no {BUNDLED_ENGINE} (has aws-cdk-lib moved its engine?)")
    (partial / "rules").mkdir(exist_ok=True)  # a release without default rules: none loaded, as aws-cdk-lib does
    (partial / COMPLETE).write_text(f"{copied} files from {source_bundle.name}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def request(stacks: Iterable[tuple[str, str, Optional[str], Optional[str]]]) -> str:
    """One request line for the worker: per stack, its construct path, template path, account and region."""
    keys = ("stackConstructPath", "templatePath", "accountId", "region")
    return json.dumps({"stackTemplates": [dict(zip(keys, stack, strict=True)) for stack in stacks]})


def start_engine(
    node: str = "node", directory: Optional[Path] = None, v8_flags: tuple[str, ...] = V8_FLAGS
) -> Optional[subprocess.Popen[str]]:
    """The worker, its engine starting now; None without the engine copy or ``node`` (the app then runs
    aws-cdk-lib's)."""
    directory = directory or engine_dir()
    if not (directory / COMPLETE).is_file():
        return None
    command = [node, *v8_flags, str(WORKER), str(directory)]  # our script and folder; node as the jsii kernel runs it
    try:
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # noqa: S603
    except OSError:  # no such node: aws-cdk-lib's copy runs, and the jsii kernel's own start says what is wrong
        return None
