"""The checkpoint-directory sync: uploads what the trainer writes into its checkpoint directory (step folders, or the
"flat" files of an unmodified script) with the manifest rule, at the Young/Daly interval or the job's own."""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.errors import AWS_ERRORS
from spot_training.agent.job import Job
from spot_training.agent.local_checkpoints import agent_entry, local_steps, step_files
from spot_training.sync_state import COMPLETE, STATE_DIR, SYNC_STATE, read_sync_state, step_number, write_sync_state


def young_daly_s(cost_s: float, mtbi_s: float) -> float:
    """Checkpoint interval minimising expected lost work: sqrt(2 * checkpoint cost * MTBI)."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * mtbi_s)


class Syncer:
    """Uploads what the trainer writes into the checkpoint directory, with the manifest rule."""

    def __init__(self, store: CheckpointStore, job: Job, log: Callable[[str], None], keep: int) -> None:
        self.store, self.job, self.log, self.keep = store, job, log, keep
        self.dir = job.checkpoint_dir
        self.lock = threading.Lock()
        self.uploaded = set(store.complete_steps())  # without the ones the restore found unreadable
        upload_s = read_sync_state(self.dir).get("last_upload_s")  # the Young/Daly interval's input survives a restart
        self.last_upload_s = float(upload_s) if isinstance(upload_s, (int, float)) else 0.0
        self.flat_seen: Optional[List[Tuple[str, int, int, int]]] = None
        self.flat_uploaded: Optional[List[Tuple[str, int, int, int]]] = None
        self.flat_due = 0.0
        # step -> its files when this agent uploaded it
        self.step_uploaded: Dict[int, List[Tuple[str, int, int, int]]] = {}
        self.layouts: Dict[int, str] = {}  # step -> layout, of the checkpoints in S3 this syncer wrote or read
        # Set when the trainer may have been cut off mid-write: the agent SIGKILLed it, or it failed without the
        # agent asking it to stop (a crash, torchrun tearing its workers down after a peer failed). The final sync
        # then uploads only what was already unchanged at the poll before; a step folder that was not is deleted.
        self.trainer_cut_off = False
        self.flat_refused: Optional[List[Tuple[str, int, int, int]]] = None
        self.step_seen: Optional[Tuple[int, List[Tuple[str, int, int, int]]]] = None  # the last round's step folder
        self.failures = 0
        # The stall watchdog's view of the directory, from the scans above (no walker of its own): what the last
        # round saw, when a round last saw it change, and when the round in progress (if any) started.
        self.scanned: Optional[Tuple[Any, ...]] = None
        self.changed_at = 0.0
        self.round_started: Optional[float] = None
        # What an earlier attempt reported durable may since have failed its restore: report anew.
        try:
            self._write_state()
        except OSError as exc:
            self.log(f"could not write {STATE_DIR}/{SYNC_STATE} ({exc}); the next upload writes it")

    @property
    def newest(self) -> Optional[int]:
        return max(self.uploaded) if self.uploaded else None

    def local_steps(self) -> List[int]:
        return local_steps(self.dir)

    def _write_state(self) -> None:
        # the newest the script numbered: a checkpoint helper waiting for its step must not take a flat one for it
        write_sync_state(self.dir, self.newest_numbered(self.uploaded), self.last_upload_s)

    def _flat_files(self) -> Dict[str, str]:
        """{relative name: path} of the flat checkpoint: every file under the directory but the helper's and the
        agent's own top-level entries and step folders. Other dot files are the checkpoint's (DCP's ``.metadata``)."""
        files = {}
        for root, dirs, names in os.walk(self.dir):
            rel_root = os.path.relpath(root, self.dir)
            if rel_root == ".":
                dirs[:] = [d for d in dirs if not agent_entry(d) and step_number(d) is None]
                names = [n for n in names if not agent_entry(n)]
            for name in names:
                path = os.path.join(root, name)
                if os.path.exists(path):  # not a dangling link (last.pt -> rotated)
                    files[os.path.normpath(os.path.join(rel_root, name)).replace(os.sep, "/")] = path
        return files

    def layout_of(self, step: int) -> Optional[str]:
        """Checkpoint ``step``'s layout in S3 (read once), or None if it has no manifest or S3 does not say now (read
        again next time): an unknown one counts as the script's, as every checkpoint did before flat ones."""
        if step not in self.layouts:
            try:
                self.layouts[step] = self.store.layout(step) or ""  # "": no manifest (pruned): asked no more
            except AWS_ERRORS:
                return None
        return self.layouts[step] or None

    def newest_numbered(self, steps: Iterable[int]) -> Optional[int]:
        """The newest of ``steps`` (durable checkpoints) that the script numbered: no flat one. A script that writes
        step folders numbers its checkpoints itself; the flat ones the agent numbered 1, 2, 3 ... before its first
        step folder (other files it keeps in the directory) are not of that numbering, and must not hide a step."""
        return max((s for s in steps if self.layout_of(s) != "flat"), default=None)

    def pending(self) -> Optional[str]:
        """What this node's checkpoint directory holds that is not durable in S3 yet (described), or None."""
        steps = self.local_steps()
        if steps:
            newest = self.newest_numbered(self.store.complete_steps())
            return f"checkpoint {steps[-1]}" if newest is None or steps[-1] > newest else None
        files = self._flat_files()
        fingerprint = self.flat_fingerprint(files) if files else None
        new = fingerprint is not None and fingerprint not in (self.flat_uploaded, self.flat_refused)
        return "the checkpoint directory" if new else None

    def flat_fingerprint(self, files: Optional[Dict[str, str]] = None) -> List[Tuple[str, int, int, int]]:
        """(name, size, mtime, inode) of the flat checkpoint files (or of ``files``): what tells a changed checkpoint
        from the last one, or a file rewritten while or after it uploaded."""
        files = self._flat_files() if files is None else files
        found = []
        for rel, path in files.items():
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # a dangling link, or a file the trainer removed since the listing
                continue
            found.append((rel, stat.st_size, stat.st_mtime_ns, stat.st_ino))  # a file renamed over it: a new inode
        return sorted(found)

    def restored_flat(self) -> None:
        """The flat files in the directory are the checkpoint just restored from S3: not a new one to upload (a
        crash-looping trainer would otherwise "make progress" every attempt, and every node would upload its copy
        as the next step)."""
        self.flat_uploaded = self.flat_seen = self.flat_fingerprint()

    def sync(self, final: bool = False) -> Optional[int]:
        """One sync round; ``final`` when the trainer has exited (no stability wait). Returns the newest step."""
        with self.lock:
            self.round_started = time.monotonic()
            try:
                self._sync(final)
                self.failures = 0
            except (OSError, *AWS_ERRORS) as exc:  # a file vanished mid-upload, or S3 hiccup: next round
                self.failures += 1
                self.log(f"checkpoint sync failed ({type(exc).__name__}: {exc}); will retry")
            finally:
                self.round_started = None
            return self.newest

    def _scanned(self, seen: Tuple[Any, ...]) -> None:
        """What a round found in the directory: a change from the round before is the trainer's progress (the
        first round of an attempt only takes note of what is there)."""
        if self.scanned is not None and seen != self.scanned:
            self.changed_at = time.monotonic()
        self.scanned = seen

    def last_write(self) -> float:
        """When (monotonic) a round last saw a file created or modified under the directory (0.0: not yet). While a
        round runs, now: an upload can take minutes, and nothing scans the directory meanwhile."""
        started = self.round_started
        return time.monotonic() if started is not None else self.changed_at

    def _record(self, step: int, seconds: float) -> None:
        self.uploaded.add(step)
        self.last_upload_s = seconds
        self.log(f"checkpoint {step} durable in s3://{self.store.bucket}/{self.store.prefix}{step}/ ({seconds:.2f} s)")
        self._write_state()
        self.store.prune(self.keep)

    def _drop_flat_above(self, step: int) -> None:
        """Delete the flat checkpoints numbered above ``step``, just uploaded as the script numbers it: a restore
        takes the highest number, and would take them (files the script kept in the directory before its first
        step folder) over the script's checkpoint; pruning would delete that checkpoint to keep them. Only those
        still in S3 (one listing): the ones pruned long ago are just forgotten."""
        above = [s for s in self.uploaded if s > step and self.layout_of(s) == "flat"]
        if not above:
            return
        listing = self.store.listing()
        for flat in sorted(above):
            if flat in listing:
                self.store.drop(flat, listing[flat])
                self.log(f"flat checkpoint {flat} deleted: the script numbers its checkpoints (step folder {step})")
            self.uploaded.discard(flat)

    def _sync(self, final: bool) -> None:
        steps = self.local_steps()
        if steps:
            self._sync_steps(steps, final)
        else:
            self._sync_flat(final)

    def _sync_steps(self, steps: List[int], final: bool) -> None:
        """A round over step folders: upload the newest once it is complete and new, delete the older ones."""
        newest = steps[-1]
        root = os.path.join(self.dir, str(newest))
        files = step_files(root)
        # The helper rewrites a step it saves twice (the final save on the last periodic one's step), while
        # it uploads or after: the objects must be of one version, and S3 must get the last one.
        seen = self.flat_fingerprint(files)
        self._scanned(("step", newest, seen))  # older steps the agent deletes below are no progress
        # The helper renames a complete folder into place (COMPLETE in it). One a script writes in place (e.g.
        # torch.distributed.checkpoint to <dir>/<step>) is complete, as a flat checkpoint is, once a round sees
        # it as the round before did, or when its trainer has exited and was not killed.
        stable = (
            os.path.exists(os.path.join(root, COMPLETE))
            or (final and not self.trainer_cut_off)
            or self.step_seen == (newest, seen)
        )
        self.step_seen = (newest, seen)
        saved_again = self.step_uploaded.get(newest, seen) != seen
        # its number taken by a flat checkpoint (the script's other files, before its first step folder)
        over_flat = newest in self.uploaded and self.layout_of(newest) == "flat"
        numbered = self.newest_numbered(self.uploaded)
        new = saved_again or over_flat or (newest not in self.uploaded and (numbered is None or newest > numbered))
        if new and final and self.trainer_cut_off and not (stable and files):
            # Maybe cut off mid-write: not a checkpoint, not even this node's own resume point.
            self.log(
                f"deleting checkpoint folder {newest} unuploaded: "
                "the trainer, killed or failed, may have been writing it"
            )
            shutil.rmtree(root, ignore_errors=True)
            return
        if new and stable and files:
            self._upload_step(newest, files, seen, saved_again, over_flat)
        for old in steps[:-1]:  # the newest local one stays for a restart on this node
            if self.newest is not None and old < self.newest:
                shutil.rmtree(os.path.join(self.dir, str(old)), ignore_errors=True)

    def _upload_step(
        self,
        step: int,
        files: Dict[str, str],
        seen: List[Tuple[str, int, int, int]],
        saved_again: bool,
        over_flat: bool,
    ) -> None:
        """Upload step folder ``step`` (its ``files``, as ``seen``); ``saved_again``: it is in S3 with other content,
        ``over_flat``: a flat checkpoint has its number."""
        again = " again: saved anew since its upload" if saved_again else ""
        again = f" (flat checkpoint {step} had its number)" if over_flat and not saved_again else again
        self.log(f"uploading checkpoint {step} ({len(files)} file(s)){again}")
        replace = saved_again or over_flat
        seconds = self.store.upload(step, files, "step", lambda: self.flat_fingerprint(files) == seen, replace=replace)
        self.step_uploaded[step] = seen
        self.layouts[step] = "step"
        self._drop_flat_above(step)
        self._record(step, seconds)

    def _sync_flat(self, final: bool) -> None:
        """A round over a flat directory: snapshot it once unchanged for a round, when the interval is due."""
        files = self._flat_files()
        fingerprint = self.flat_fingerprint(files)
        self._scanned(("flat", fingerprint))
        if not files:
            return
        stable = (final and not self.trainer_cut_off) or fingerprint == self.flat_seen
        if final and self.trainer_cut_off and not stable:  # maybe cut off mid-write: never upload, nothing pending
            self.flat_refused = fingerprint
            self.log("not uploading the checkpoint directory: the trainer, killed or failed, may have been writing it")
            return
        self.flat_seen = fingerprint
        due = final or time.monotonic() >= self.flat_due
        if stable and due and fingerprint != self.flat_uploaded:
            # Numbered from S3, not from what this agent knows: the writer (rank 0) may have moved to this node in
            # the attempt, after another node's uploads; a step without a manifest may be another's upload under way.
            step = max([*self.store.listing(), self.newest or 0]) + 1
            # The trainer may rewrite a file while it uploads (s3transfer and the hashing each read it by name).
            seconds = self.store.upload(step, files, "flat", lambda: self.flat_fingerprint(files) == fingerprint)
            self.layouts[step] = "flat"
            self._record(step, seconds)
            self.flat_uploaded = fingerprint
            interval = self.job.checkpoint_interval_s or young_daly_s(self.last_upload_s, self.job.mtbi_s)
            self.flat_due = time.monotonic() + interval
