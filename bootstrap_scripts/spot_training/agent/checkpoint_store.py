"""The checkpoint store: checkpoints in S3 under ``<job>/ckpt/<step>/`` with the manifest written last; parallel
multipart upload, verified ranged download (``checkpoint_download``), restore of the newest complete checkpoint,
prune."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from botocore.exceptions import ClientError

from spot_training.agent.aws_config import TRANSFER
from spot_training.agent.checkpoint_download import CheckpointDownload
from spot_training.agent.errors import AgentError, LocalDiskError, S3Unanswered, env_float
from spot_training.agent.local_checkpoints import step_files
from spot_training.agent.s3_objects import object_gone
from spot_training.protocol import MANIFEST, checkpoint_object, checkpoint_prefix, manifest_key, new_manifest
from spot_training.sync_state import step_number

PART_MIN, PARTS_MAX = 16 * 2**20, 8
# A checkpoint S3 does not serve (after botocore's own retries) is tried again after a pause, at most this often,
# before the restore gives up with S3's answer: never skipped for an older one, which would lose progress.
UNANSWERED_TRIES, UNANSWERED_PAUSE_S = 3, 30.0
RESTORE_LISTINGS = 3  # a restore that finds nothing readable lists again: newer checkpoints may have replaced them


def part_size(size: int) -> int:
    """Bytes per checksummed part of a checkpoint file, which is also one ranged GET on restore: 16 MiB, larger
    for large files so that no file has more than 8 (the same 8 connections on S3, and few ranged GETs where each
    one costs a whole-object read: moto)."""
    return max(PART_MIN, -(-size // PARTS_MAX))


PARALLEL_FILES = 8


def file_digests(path: str) -> Dict[str, Any]:
    """A manifest entry, in one read of the file: size, sha256, and the sha256 of every ``part_size`` bytes (so a
    restore verifies each ranged GET as it streams in, instead of reading the whole file again)."""
    size = os.path.getsize(path)
    part = part_size(size)
    whole, parts = hashlib.sha256(), []
    with open(path, "rb") as f:
        for start in range(0, size, part):
            h, left = hashlib.sha256(), min(part, size - start)
            while left > 0:
                chunk = f.read(min(2**20, left))
                if not chunk:  # OSError: the sync round fails, says so, and the next round tries again
                    raise OSError(f"{path} shrank while it was being uploaded")
                whole.update(chunk)
                h.update(chunk)
                left -= len(chunk)
            parts.append(h.hexdigest())
    return {"size": size, "sha256": whole.hexdigest(), "part_size": part, "part_sha256": parts}


class CheckpointStore:
    """Checkpoints in S3 under ``<job>/ckpt/<step>/``; the manifest is written last and verified on restore."""

    def __init__(self, s3: Any, bucket: str, prefix: str, job_id: str, log: Callable[[str], None]) -> None:
        self.s3, self.bucket, self.prefix, self.job_id, self.log = s3, bucket, prefix, job_id, log
        self.test_upload_delay_s = env_float("SPOT_TRAINING_TEST_UPLOAD_DELAY_S", 0.0)
        self.test_restore_delay_s = env_float("SPOT_TRAINING_TEST_RESTORE_DELAY_S", 0.0)
        # Called between the parts of a restore (and through its test hold-back): raises to abandon it, as the
        # agent's spot-notice check does. A restore of many GB can outlast the two-minute notice.
        self.interrupt: Callable[[], None] = lambda: None
        # Steps whose restore failed here (manifest present, objects do not verify): not complete for this agent,
        # so they neither count as durable nor hold a place among the checkpoints pruning keeps.
        self.unreadable: Set[int] = set()
        self.sent_bytes = 0  # checkpoint bytes uploaded so far: the drain hold's sign of an upload under way
        self.sent_lock = threading.Lock()
        self.download = CheckpointDownload(s3, bucket, prefix, job_id)
        self.unanswered_pause_s = UNANSWERED_PAUSE_S  # between the tries of a checkpoint S3 does not serve

    def count_sent(self, amount: int) -> None:
        """s3transfer's progress callback (from its worker threads; a retry reports a negative amount)."""
        if amount > 0:
            with self.sent_lock:
                self.sent_bytes += amount

    def listing(self) -> Dict[int, Dict[str, int]]:
        """{step: {relative key: size}} of everything under ckpt/, complete or not."""
        out: Dict[int, Dict[str, int]] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for obj in page.get("Contents", []):
                name, rel = checkpoint_object(self.prefix, obj["Key"])
                step = step_number(name)
                if step is not None and rel:
                    out.setdefault(step, {})[rel] = obj["Size"]
        return out

    def complete_steps(self, listing: Optional[Dict[int, Dict[str, int]]] = None) -> List[int]:
        """Steps with a manifest, newest first, but those this agent found unreadable (whether the objects of the
        others verify is checked on restore)."""
        listing = self.listing() if listing is None else listing
        return sorted((s for s, objs in listing.items() if MANIFEST in objs and s not in self.unreadable), reverse=True)

    def newest_complete(self) -> Optional[int]:
        steps = self.complete_steps()
        return steps[0] if steps else None

    def layout(self, step: int) -> Optional[str]:
        """The layout (``step`` or ``flat``) checkpoint ``step``'s manifest names; None if it has none (any more)."""
        key = manifest_key(self.prefix, step)
        try:
            manifest = json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if object_gone(self.s3, self.bucket, key, exc):
                return None
            raise
        except ValueError:
            return None
        return str(manifest.get("layout", "step")) if isinstance(manifest, dict) else None

    def drop(self, step: int, objects: Dict[str, int]) -> None:
        """Delete checkpoint ``step`` (``objects``: its listing), its manifest first."""
        for rel in sorted(objects, key=lambda rel: rel != MANIFEST):
            self.s3.delete_object(Bucket=self.bucket, Key=checkpoint_prefix(self.prefix, step) + rel)

    def upload(
        self,
        step: int,
        files: Dict[str, str],
        layout: str,
        unchanged: Callable[[], bool] = lambda: True,
        replace: bool = False,
    ) -> float:
        """Upload ``files`` ({relative name: local path}) in parallel (multipart when large), then the manifest.

        ``unchanged`` is asked after the objects are in and before the manifest: False (the trainer rewrote a file
        while it was read, so the objects and hashes may mix two versions) raises OSError and writes no manifest.
        ``replace``: the step is in S3 already, with other content; its manifest goes first."""
        start = time.monotonic()
        base = checkpoint_prefix(self.prefix, step)
        if replace or step in self.unreadable:  # saved again: no manifest until all the new objects are in
            self.s3.delete_object(Bucket=self.bucket, Key=base + MANIFEST)

        def put(item: Tuple[str, str]) -> Tuple[str, Dict[str, Any]]:
            rel, path = item
            digests = hasher.submit(file_digests, path)  # hashed while the parts upload (hashlib releases the GIL)
            self.s3.upload_file(path, self.bucket, base + rel, Config=TRANSFER, Callback=self.count_sent)
            return rel, digests.result()

        with ThreadPoolExecutor(PARALLEL_FILES) as pool, ThreadPoolExecutor(PARALLEL_FILES) as hasher:
            entries = dict(pool.map(put, sorted(files.items())))
        if self.test_upload_delay_s > 0:
            self.log(
                f"checkpoint {step}: objects in S3, manifest held back {self.test_upload_delay_s:g} s "
                "(SPOT_TRAINING_TEST_UPLOAD_DELAY_S)"
            )
            time.sleep(self.test_upload_delay_s)
        if not unchanged():
            raise OSError(
                f"checkpoint {step} changed on disk while it was uploaded; no manifest, the next round retries"
            )
        manifest = new_manifest(self.job_id, step, layout, time.time(), entries)
        self.s3.put_object(Bucket=self.bucket, Key=base + MANIFEST, Body=json.dumps(manifest, indent=1).encode())
        self.unreadable.discard(step)
        return time.monotonic() - start

    def download_verified(self, step: int, sizes: Dict[str, int], dest: str) -> Dict[str, Any]:
        """Download checkpoint ``step`` into ``dest``; raises AgentError unless every object verifies
        (``CheckpointDownload``; the interrupt is looked at about every second)."""
        return self.download.download_verified(step, sizes, dest, self.interrupt)

    def pause(self, seconds: float) -> None:
        """Sleep, looking at the interrupt (a spot notice) every half second, like the download itself."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(min(0.5, max(0.0, until - time.monotonic())))
            self.interrupt()

    def download_patiently(self, step: int, sizes: Dict[str, int], dest: str) -> Dict[str, Any]:
        """``download_verified``, tried again after a pause while S3 does not serve the checkpoint."""
        for tries in range(1, UNANSWERED_TRIES + 1):
            try:
                return self.download_verified(step, sizes, dest)
            except S3Unanswered as exc:
                if tries == UNANSWERED_TRIES:
                    raise
                self.log(f"{exc}; trying again in {self.unanswered_pause_s:g} s ({tries}/{UNANSWERED_TRIES})")
                self.pause(self.unanswered_pause_s)
        raise AssertionError("unreachable")  # the last try returns or raises

    def restore_newest(self, checkpoint_dir: str) -> Optional[Tuple[int, str]]:
        """Put the newest checkpoint whose objects all verify into the checkpoint dir; (step, layout) or None.

        Checkpoints without a manifest are ignored; a corrupt or partial one is skipped for the next older one.
        If checkpoints exist but none verifies, that is an error: never silently start over. Before giving up, S3
        is listed again (up to ``RESTORE_LISTINGS`` times): while this node downloads, rank 0's agent elsewhere
        may complete newer checkpoints and prune the ones listed here.
        """
        tried: Set[int] = set()
        reasons: List[str] = []
        for _ in range(RESTORE_LISTINGS):
            listing = self.listing()
            steps = [s for s in self.complete_steps(listing) if s not in tried]
            if not steps:
                break
            restored = self._restore_first(steps, listing, checkpoint_dir, reasons)
            if restored is not None:
                return restored
            tried.update(steps)
        if tried:
            raise AgentError(f"no readable checkpoint among {len(tried)} in S3; newest: {reasons[0]}")
        return None

    def _restore_first(
        self, steps: List[int], listing: Dict[int, Dict[str, int]], checkpoint_dir: str, reasons: List[str]
    ) -> Optional[Tuple[int, str]]:
        """The first of ``steps`` (newest first) that verifies, put in place; each failure's reason appended."""
        for step in steps:
            try:
                restored = self._restore_one(step, listing, checkpoint_dir, reasons)
            except OSError as exc:
                if isinstance(exc, (ConnectionError, TimeoutError)):
                    raise
                where = f"restoring checkpoint {step} into {checkpoint_dir}: {exc}"
                raise LocalDiskError(f"this node's disk: {where}; not skipped for an older checkpoint") from None
            if restored is not None:
                return restored
        return None

    def _restore_one(
        self, step: int, listing: Dict[int, Dict[str, int]], checkpoint_dir: str, reasons: List[str]
    ) -> Optional[Tuple[int, str]]:
        """``_restore_first`` of one step: (step, layout), or None when it does not verify."""
        local = os.path.join(checkpoint_dir, str(step))
        if step_files(local):  # a step folder with a file in it (``local_steps``' rule), without listing the others
            self.log(f"checkpoint {step} already present locally; not downloading")
            return step, "step"
        self.log(f"restoring checkpoint {step} from s3://{self.bucket}/{checkpoint_prefix(self.prefix, step)}")
        if self.test_restore_delay_s > 0:
            self.log(f"restore held back {self.test_restore_delay_s:g} s (SPOT_TRAINING_TEST_RESTORE_DELAY_S)")
            self.pause(self.test_restore_delay_s)
        tmp = tempfile.mkdtemp(prefix=f".restore-{step}-", dir=checkpoint_dir)
        try:
            manifest = self.download_patiently(step, listing[step], tmp)
        except (S3Unanswered, LocalDiskError):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except AgentError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self.unreadable.add(step)
            reasons.append(str(exc))
            self.log(f"skipping {exc}")
            return None
        except BaseException:  # abandoned (a notice): nothing half-downloaded stays behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        layout = manifest.get("layout", "step")
        if layout == "flat":
            for rel in manifest["files"]:
                target = os.path.join(checkpoint_dir, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(os.path.join(tmp, rel), target)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, local)
        return step, layout

    def prune(self, keep: int) -> None:
        """Delete all but the ``keep`` newest complete checkpoints, and leftovers older than the newest complete one.

        The newest complete checkpoint is never deleted; of an old checkpoint the manifest goes first.
        """
        listing = self.listing()
        complete = self.complete_steps(listing)
        if not complete:
            return
        keep_steps = set(complete[: max(keep, 1)])
        for step in sorted(listing):
            if step in keep_steps or step >= complete[0]:
                continue
            self.drop(step, listing[step])
