"""A job setup that builds something worth caching, for the tests and the benchmark of issue 38: a virtual
environment in the setup's cache directory with a small wheel installed from a wheelhouse in the code archive
(written by hand here: no build backend, no network)."""

from __future__ import annotations

import base64
import hashlib
import tempfile
import zipfile
from pathlib import Path

WHEEL_VALUE = "from-the-wheelhouse"  # tinypkg.VALUE
SETUP = """set -euo pipefail
echo "building a venv for ${GREETING:-a job} in $SPOT_TRAINING_SETUP_CACHE_DIR"
python3 -m venv --without-pip "$SPOT_TRAINING_SETUP_CACHE_DIR/venv"
python3 -m pip --python "$SPOT_TRAINING_SETUP_CACHE_DIR/venv/bin/python" install --no-index \\
    --find-links wheelhouse tinypkg
"""
# A trainer's first lines: tinypkg imported from the setup's virtual environment
IMPORT_FROM_SETUP = """import glob, os, site
for _path in glob.glob(os.path.join(os.environ["SPOT_TRAINING_SETUP_CACHE_DIR"], "venv/lib/python*/site-packages")):
    site.addsitedir(_path)
import tinypkg
"""


def tiny_wheel(directory: Path) -> Path:
    """``tinypkg-1.0-py3-none-any.whl`` in ``directory``."""
    files = {
        "tinypkg/__init__.py": f"VALUE = {WHEEL_VALUE!r}\n".encode(),
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b'=').decode()},{len(body)}"
        for name, body in files.items()
    ]
    files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join([*record, "tinypkg-1.0.dist-info/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, body in files.items():
            wheel.writestr(name, body)
    return path


def wheel_files() -> dict[str, bytes]:
    """The wheelhouse and the setup as code-archive files (``wheelhouse/...``, ``setup.sh``)."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = tiny_wheel(Path(tmp))
        return {f"wheelhouse/{wheel.name}": wheel.read_bytes(), "setup.sh": SETUP.encode()}
