"""The budget guard's Lambda package: ``budget_guard/handler.py`` at its root and the S3 contract it imports,
``bootstrap_scripts/spot_training/protocol.py``, at the same path as in the repository (so ``handler.py`` imports it
by one name in both places). Bundled by copying the two files, on the machine that synthesizes: no Docker, and the
asset's hash is that of the two files' names and contents, the same on every machine."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import BundlingOptions, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO = Path(__file__).resolve().parent.parent
GUARD_DIR = REPO / "budget_guard"
# {path in the package: the repository's file}
PACKAGE_FILES = {
    "handler.py": GUARD_DIR / "handler.py",
    "bootstrap_scripts/spot_training/protocol.py": REPO / "bootstrap_scripts" / "spot_training" / "protocol.py",
}


@jsii.implements(ILocalBundling)
class _CopyFiles:
    """Local bundling that copies :data:`PACKAGE_FILES` into the asset's output directory."""

    def try_bundle(self, output_dir: str, *options: Any, **named: Any) -> bool:
        """Called by jsii with the bundling options as one positional struct, which the copy does not need."""
        for target, source in PACKAGE_FILES.items():
            path = Path(output_dir) / target
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, path)
        return True


def guard_code(runtime: lambda_.Runtime) -> lambda_.Code:
    """The guard's code asset (:data:`PACKAGE_FILES`); ``runtime``'s build image is named only because bundling
    options need one: the local copy always succeeds, so Docker never runs."""
    bundling = BundlingOptions(image=runtime.bundling_image, local=_CopyFiles())
    return lambda_.Code.from_asset(str(GUARD_DIR), bundling=bundling)
