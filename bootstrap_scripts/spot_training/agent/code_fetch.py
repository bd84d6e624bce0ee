"""Code fetch: download the job's code archive from S3 and unpack it safely (no absolute paths, '..', links or
device files)."""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from typing import Any

from botocore.exceptions import ClientError

from spot_training.agent.aws_config import TRANSFER
from spot_training.agent.errors import AgentError
from spot_training.agent.job import Job
from spot_training.agent.s3_objects import object_gone


def safe_extract(archive: str, dest: str) -> None:
    """Unpack a tar archive, refusing absolute paths, '..', links and device files."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for m in members:
                parts = m.name.replace("\\", "/").split("/")
                if m.name.startswith("/") or ".." in parts or re.match(r"^[A-Za-z]:", m.name):
                    raise AgentError(f"code archive member {m.name!r} escapes the code directory")
                if not (m.isfile() or m.isdir()):
                    raise AgentError(f"code archive member {m.name!r} is a link or special file; only files and dirs")
            for m in members:
                target = os.path.join(dest, m.name)
                if m.isdir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target) or dest, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
    except tarfile.TarError as exc:
        raise AgentError(f"code archive is not a readable tar file: {exc}") from None


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or under it (links resolved)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def download_code(s3: Any, job: Job, work_dir: str) -> str:
    code_dir = os.path.join(work_dir, job.job_id, "code")
    shutil.rmtree(code_dir, ignore_errors=True)
    os.makedirs(code_dir)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        archive = os.path.join(tmp, "code.tar")
        try:
            s3.download_file(job.bucket, job.code_key, archive, Config=TRANSFER)
        except ClientError as exc:
            if object_gone(s3, job.bucket, job.code_key, exc):
                raise AgentError(f"code object s3://{job.bucket}/{job.code_key} does not exist") from None
            code = exc.response.get("Error", {}).get("Code")
            raise AgentError(f"cannot download s3://{job.bucket}/{job.code_key}: {code}") from None
        safe_extract(archive, code_dir)
    target = job.argv[0] if job.argv[0] != "-m" else None
    if target is not None and not os.path.isfile(os.path.join(code_dir, target)):
        raise AgentError(f"command script {target!r} is not in the code archive s3://{job.bucket}/{job.code_key}")
    return code_dir
