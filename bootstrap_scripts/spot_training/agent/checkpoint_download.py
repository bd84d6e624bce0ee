"""The verified download of one checkpoint from S3: its manifest checked, every file's parts fetched by ranged GETs in
parallel and each part's sha256 checked as it streams in. A checkpoint S3 does not serve raises ``S3Unanswered``
(it may be good); one whose objects do not verify raises ``AgentError`` (the restore skips it)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from botocore.exceptions import BotoCoreError, ClientError
from urllib3.exceptions import HTTPError

from spot_training.agent.aws_config import TRANSFER
from spot_training.agent.errors import AWS_ERRORS, AgentError, LocalDiskError, S3Unanswered
from spot_training.agent.s3_objects import object_gone
from spot_training.protocol import MANIFEST, checkpoint_prefix, manifest_fault, manifest_key

RANGE_ATTEMPTS = 3  # a ranged GET whose stream breaks is fetched again, as s3transfer does

Part = Tuple[str, Dict[str, Any], int]  # (file, its manifest entry, part index; -1: the whole file)
T = TypeVar("T")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            h.update(chunk)
    return h.hexdigest()


def in_parallel(tasks: Sequence[T], run: Callable[[T, threading.Event], None], interrupt: Callable[[], None]) -> None:
    """``run(task, abandoned)`` for every task, ``TRANSFER.max_concurrency`` at a time (the agent's parallel
    transfers: checkpoint parts, job inputs). ``interrupt`` is called about every second and raises to abandon them;
    the first task that raises abandons the rest too (``abandoned`` is set: tasks in flight stop at their next MiB,
    queued ones never start), and its exception is raised."""
    abandoned = threading.Event()
    with ThreadPoolExecutor(TRANSFER.max_concurrency) as pool:
        futures = [pool.submit(run, task, abandoned) for task in tasks]
        try:
            pending = set(futures)
            while pending:  # a part of a big file takes long: look at the interrupt every second meanwhile
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                interrupt()
        except BaseException:
            abandoned.set()
            for future in futures:
                future.cancel()
            raise


class CheckpointDownload:
    """Downloads of the checkpoints under ``s3://<bucket>/<prefix><step>/`` of job ``job_id`` (``prefix``: the job's
    ``protocol.checkpoints_prefix``)."""

    def __init__(self, s3: Any, bucket: str, prefix: str, job_id: str) -> None:
        self.s3, self.bucket, self.prefix, self.job_id = s3, bucket, prefix, job_id

    def download_verified(
        self, step: int, sizes: Dict[str, int], dest: str, interrupt: Callable[[], None]
    ) -> Dict[str, Any]:
        """Download checkpoint ``step`` (``sizes``: its listing) into ``dest``; its manifest. Raises AgentError
        unless every object verifies; ``interrupt`` is called about every second and raises to abandon it."""
        manifest = self.manifest(step, sizes)
        parts = self.parts(step, manifest["files"], dest)
        in_parallel(parts, lambda part, abandoned: self.get_part(step, part, dest, abandoned), interrupt)
        return manifest

    def manifest(self, step: int, sizes: Dict[str, int]) -> Dict[str, Any]:
        """Checkpoint ``step``'s manifest, once it belongs to this job and lists safe names of the listed sizes."""
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=manifest_key(self.prefix, step))["Body"].read()
            manifest = json.loads(body)
            files = manifest["files"]
            assert isinstance(files, dict) and manifest.get("step") == step
        except (*AWS_ERRORS, ValueError, KeyError, TypeError, AssertionError) as exc:
            if isinstance(exc, AWS_ERRORS):
                self.unanswered(step, MANIFEST, exc)
            raise AgentError(f"checkpoint {step}: unreadable manifest ({type(exc).__name__})") from None
        if manifest.get("job_id") != self.job_id:
            owner = manifest.get("job_id")
            raise AgentError(f"checkpoint {step}: manifest belongs to job {owner!r}, not {self.job_id!r}")
        fault = manifest_fault(files, sizes)
        if fault is not None:
            raise AgentError(f"checkpoint {step}: {fault}")
        return manifest

    def parts(self, step: int, files: Dict[str, Dict[str, Any]], dest: str) -> List[Part]:
        """The parts to fetch of the manifest's ``files``, each file made in ``dest`` at its full size."""
        parts: List[Part] = []
        for rel, meta in files.items():
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if "part_sha256" not in meta:  # a manifest without parts: one download, then one sha256 read
                parts.append((rel, meta, -1))
                continue
            part, digests = meta.get("part_size"), meta["part_sha256"]
            count = -(-meta["size"] // part) if isinstance(part, int) and part > 0 else None
            if not isinstance(digests, list) or len(digests) != count:
                raise AgentError(f"checkpoint {step}: manifest lists bad parts for {rel}")
            with open(path, "wb") as f:
                f.truncate(meta["size"])
            parts += [(rel, meta, i) for i in range(len(digests))]
        return parts

    def get_part(self, step: int, part: Part, dest: str, abandoned: threading.Event) -> None:
        """Fetch one part into place and check it; raises AgentError when it does not verify."""
        rel, meta, i = part
        key, path = checkpoint_prefix(self.prefix, step) + rel, os.path.join(dest, rel)
        if abandoned.is_set():
            return
        try:
            if i < 0:
                self.s3.download_file(self.bucket, key, path, Config=TRANSFER)
                ok = os.path.getsize(path) == meta["size"] and sha256_file(path) == meta.get("sha256")
            else:
                start = i * meta["part_size"]
                length = min(meta["part_size"], meta["size"] - start)
                ok = self.get_range(key, path, start, length, abandoned) == meta["part_sha256"][i]
        except ClientError as exc:
            self.unanswered(step, rel, exc)
            raise AgentError(f"checkpoint {step}: object {rel} is missing or has the wrong size") from None
        if not ok:
            raise AgentError(f"checkpoint {step}: object {rel} fails its sha256 check")

    def unanswered(self, step: int, rel: str, exc: Exception) -> None:
        """Raise ``S3Unanswered`` unless the object is gone (``object_gone``): then the checkpoint is at fault, and
        the restore skips it for the next older one."""
        if not object_gone(self.s3, self.bucket, checkpoint_prefix(self.prefix, step) + rel, exc):
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
            raise S3Unanswered(
                f"checkpoint {step}: S3 did not serve {rel} ({code or type(exc).__name__}); not skipped for an older "
                "checkpoint: it may be good"
            ) from None

    def get_range(
        self, key: str, path: str, start: int, length: int, abandoned: Optional[threading.Event] = None
    ) -> Optional[str]:
        """GET ``length`` bytes of ``key`` from ``start`` into the same bytes of ``path``, hashing them as they
        arrive: their sha256, or None if the object had fewer bytes (or ``abandoned`` was set meanwhile)."""
        for attempt in range(1, RANGE_ATTEMPTS + 1):
            h, got = hashlib.sha256(), 0
            try:
                rng = f"bytes={start}-{start + length - 1}"
                body = self.s3.get_object(Bucket=self.bucket, Key=key, Range=rng)["Body"]
                with open(path, "r+b") as f:
                    f.seek(start)
                    for chunk in body.iter_chunks(2**20):
                        if abandoned is not None and abandoned.is_set():
                            body.close()
                            return None
                        h.update(chunk)
                        f.write(chunk)
                        got += len(chunk)
                return h.hexdigest() if got == length else None
            except (BotoCoreError, HTTPError, OSError) as exc:  # a broken or stalled stream, a local write error
                # (older botocore lets urllib3's errors through); ClientError (e.g. NoSuchKey) is not retried
                if attempt == RANGE_ATTEMPTS:
                    where = f"s3://{self.bucket}/{key} bytes {start}-{start + length - 1}: {exc}"
                    local = isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError))
                    if local:  # this node's disk
                        raise LocalDiskError(
                            f"this node's disk: {where}; not skipped for an older checkpoint"
                        ) from None
                    raise S3Unanswered(f"{where}; not skipped for an older checkpoint: it may be good") from None
        return None
