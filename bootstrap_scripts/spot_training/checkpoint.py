"""Checkpoint helper for training scripts on spot nodes (importable as ``spot_training.checkpoint``).

    ckpt = Checkpointer(model, optimizer, scheduler)       # directory from SPOT_TRAINING_CHECKPOINT_DIR
    restored = ckpt.restore()                              # None, or .step and .extra (your data position)
    for ...:
        train one step
        if ckpt.step(step, extra={"epoch": e, "batch": b + 1}):   # saves when due; True after SIGTERM
            sys.exit(EXIT_INTERRUPTED)                     # the emergency checkpoint is on disk
    ckpt.close()

What is saved: model, optimizer and scheduler state dicts, the RNG states (python, numpy, torch CPU and CUDA)
of *every* rank, and ``extra`` (data position; must be the same on every rank). With the same world size, a
run resumed from a checkpoint continues bit for bit like the uninterrupted run.

Protocol with the node agent: a checkpoint is the directory ``<dir>/<step>/`` (file ``state.pt``); it is written
as ``<dir>/.tmp-<step>-<pid>/`` and renamed when complete, with the marker ``sync_state.COMPLETE`` in it, so the
agent uploads it as soon as it sees it. Rank 0 writes; the agent uploads it to S3 (objects, then a manifest)
and prunes old ones. Saving is asynchronous: ``step()`` copies the state to CPU memory (training waits only for
that) and a background thread serialises it to disk; the agent's upload is a separate process, so S3 never blocks
training.

When to save (collective: every rank must call ``step()`` at every step): after SIGTERM (emergency checkpoint,
then ``step()`` returns True), when the agent asks (``<dir>/.spot-training/save-request``, on a rebalance
recommendation), and every interval: ``interval_s`` / SPOT_TRAINING_CHECKPOINT_INTERVAL_S, or Young/Daly
``sqrt(2 * cost * MTBI)`` with the measured cost of the last checkpoint (copy + write + the agent's last upload)
and MTBI from SPOT_TRAINING_MTBI_S (default 3600 s). Rank 0 decides about every 0.1 s of training and the
decision is all-reduced; the steps in between cost one comparison (no collective, no GPU sync, no file check).

What a hard kill (no notice) can lose: everything after the newest checkpoint that is durable in S3. By default
training goes on while a checkpoint is written and uploaded, so that is up to one interval plus the write and
upload time. With ``wait_for_upload`` / SPOT_TRAINING_CHECKPOINT_WAIT_FOR_UPLOAD=1 (the job's
``checkpoint_wait_for_upload``) ``step()`` returns after a periodic or requested checkpoint only once the agent
reports it durable (``<dir>/.spot-training/sync-state.json``): at most one interval is lost, and every
checkpoint costs its write and upload time in training. All ranks wait together, polling every CHECK_S, so a
long upload is no process-group timeout and a notice on any rank ends the wait.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import random
import shutil
import signal
import threading
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .sync_state import COMPLETE, STATE_DIR, read_sync_state, step_number

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with torch wheels in practice
    np = None  # type: ignore[assignment]

STATE_FILE = "state.pt"
EXIT_INTERRUPTED = 143  # 128 + SIGTERM: "stopped by the signal, state saved"
# How often, in training time, the ranks agree whether to save or stop (one all-reduce; rank 0 looks at the clock,
# the interval and the agent's save-request). Between two agreements step() costs one comparison: no collective
# (and no GPU sync) per step. Rank 0 picks the next agreement's call number from the measured step time.
CHECK_S = 0.1
# With wait_for_upload: give up waiting for the agent after this long (no agent running, S3 unreachable), say so
# and train on; the next checkpoint waits again.
UPLOAD_WAIT_TIMEOUT_S = float(os.environ.get("SPOT_TRAINING_UPLOAD_WAIT_TIMEOUT_S") or 600)
_SAVE, _STOP = 1, 2
_WAITING, _DURABLE, _GAVE_UP = 0, 1, 2  # wait_uploaded: rank 0's view of the agent's report, all-reduced by MAX


class Restored:
    def __init__(self, step: int, extra: Dict[str, Any]) -> None:
        self.step, self.extra = step, extra

    def __repr__(self) -> str:
        return f"Restored(step={self.step}, extra={self.extra!r})"


def _sharded(model: Any) -> Optional[str]:
    """What makes ``model``'s state sharded across ranks (FSDP, FSDP2's ``fully_shard``, tensor parallelism), said
    for the error; None for a replicated one."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - a torch built without distributed
        return None
    if not isinstance(model, torch.nn.Module):  # any object with state_dict(): nothing to look into
        return None
    for name, module in model.named_modules():  # the root, a wrapped submodule, torch.compile's original module
        if isinstance(module, FullyShardedDataParallel):
            return f"{name or 'the model'} is wrapped in FullyShardedDataParallel"
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch before 2.4 (no DTensor in torch.distributed.tensor)
        return None
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if isinstance(tensor, DTensor):
            return f"its parameter {name} is a DTensor (fully_shard, tensor parallelism)"
    return None


def _to_cpu(obj: Any) -> Any:
    """A deep copy with every tensor cloned to CPU, so later in-place updates cannot leak into a pending save."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _torch_load(data: bytes) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except TypeError:  # torch < 1.13 has no weights_only
        return torch.load(io.BytesIO(data), map_location="cpu")


def rng_state() -> Dict[str, Any]:
    state: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        *,
        directory: Optional[str] = None,
        interval_s: Optional[float] = None,
        wait_for_upload: Optional[bool] = None,
        handle_sigterm: bool = True,
    ) -> None:
        sharded = _sharded(model)
        if sharded is not None:
            raise ValueError(
                f"Checkpointer saves rank 0's copy of the state and loads it on every rank; {sharded}, so each rank "
                "holds a shard and the others' would be lost. It supports one process and DistributedDataParallel; "
                "save a sharded model with torch.distributed.checkpoint "
                "(docs/concepts/checkpoint-protocol.md)"
            )
        self.model = getattr(model, "module", model)  # unwrap DistributedDataParallel
        self.optimizer, self.scheduler = optimizer, scheduler
        self.directory = directory or os.environ.get("SPOT_TRAINING_CHECKPOINT_DIR") or "checkpoints"
        self._save_request = os.path.join(self.directory, STATE_DIR, "save-request")  # the agent's, on a rebalance
        env_interval = os.environ.get("SPOT_TRAINING_CHECKPOINT_INTERVAL_S", "")
        self.interval_s = interval_s if interval_s is not None else (float(env_interval) if env_interval else None)
        self.mtbi_s = float(os.environ.get("SPOT_TRAINING_MTBI_S") or 3600)
        if wait_for_upload is None:
            wait_for_upload = os.environ.get("SPOT_TRAINING_CHECKPOINT_WAIT_FOR_UPLOAD") == "1"
        self.wait_for_upload = wait_for_upload
        self.stop_requested = threading.Event()
        self.last_cost_s = 0.0
        self.last_save = self._checked_at = time.monotonic()
        self._calls = self._checked_call = self._next_check = 0  # step() calls; the next agreement is at _next_check
        self.saved_step: Optional[int] = None
        self._writer: Optional[threading.Thread] = None
        self._write_error: Optional[BaseException] = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_requested.set())

    # -- distributed helpers (all no-ops without an initialised process group)
    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.distributed else 0

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _all_max(self, values: List[int]) -> List[int]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.int64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def _gather(self, obj: Any) -> List[Any]:
        if not self.distributed:
            return [obj]
        out: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    # -- local checkpoints
    def local_steps(self) -> List[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        steps = ((step_number(n), n) for n in names)
        return sorted(
            s for s, n in steps if s is not None and os.path.isfile(os.path.join(self.directory, n, STATE_FILE))
        )

    def restore(self) -> Optional[Restored]:
        """Load the newest checkpoint any rank has (collective); None on a fresh start."""
        started = time.monotonic()
        steps = self.local_steps()
        mine = steps[-1] if steps else -1
        found = self._gather(mine)
        target = max(found)
        if target < 0:
            return None
        source = found.index(target)
        data: Optional[bytes] = None
        if mine == target:
            with open(os.path.join(self.directory, str(target), STATE_FILE), "rb") as f:
                data = f.read()
        # Each rank loads its own copy when every rank holds the same bytes (the agent restores S3's newest
        # checkpoint on every node before the trainer starts); only otherwise is it sent, as one object, from the
        # first rank that has it (through a device buffer of its size on NCCL): a rank without it, or with other
        # bytes under that step number, must not train from a different state.
        digests = self._gather(hashlib.sha256(data).hexdigest() if data is not None else None)
        if len(set(digests)) > 1:
            box = [data if self.rank == source else None]
            dist.broadcast_object_list(box, src=source)
            data = box[0]
        assert data is not None
        state = _torch_load(data)
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        rngs = state["rng"]
        if self.rank < len(rngs):
            set_rng_state(rngs[self.rank])
        self.saved_step = target
        self.last_save = time.monotonic()
        # Young/Daly's first cost: loading the state, until a save is measured. With none (0 s), the first save
        # came at the first step, a write and upload of the state just restored, which is durable already.
        self.last_cost_s = self.last_cost_s or self.last_save - started
        return Restored(state["step"], state.get("extra") or {})

    # -- saving
    def _interval(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        upload_s = 0.0
        try:
            upload_s = float(read_sync_state(self.directory).get("last_upload_s", 0.0))
        except (TypeError, ValueError):
            pass
        return math.sqrt(2.0 * (self.last_cost_s + upload_s) * self.mtbi_s)

    def wait_uploaded(self, step: int, timeout_s: float = UPLOAD_WAIT_TIMEOUT_S) -> bool:
        """Collective: every rank waits until the agent reports checkpoint ``step`` (or a newer one) durable in S3;
        True if it did. The ranks poll together every CHECK_S (rank 0 reads the agent's report), so no collective
        blocks for the length of an upload (a rank waiting alone would leave the others in their next collective
        until the process group's timeout) and a notice on any rank ends the wait at once (``stop_requested`` is
        then set on every rank). Rank 0's local write is part of the wait; ``timeout_s`` counts from its end."""
        deadline: Optional[float] = None
        while True:
            state = _WAITING
            if self.rank == 0 and not (self._writer is not None and self._writer.is_alive()):
                self.wait()  # the write is on disk (or its error is raised)
                deadline = time.monotonic() + timeout_s if deadline is None else deadline
                uploaded = read_sync_state(self.directory).get("last_uploaded_step")
                if isinstance(uploaded, int) and uploaded >= step:
                    state = _DURABLE
                elif time.monotonic() >= deadline:
                    state = _GAVE_UP
            stop = 1 if self.stop_requested.is_set() else 0
            state, stop = self._all_max([state, stop])
            if stop:  # a notice: the emergency checkpoint comes next, do not hold it up
                self.stop_requested.set()
                return state == _DURABLE
            if state == _DURABLE:
                return True
            if state == _GAVE_UP:
                if self.rank == 0:
                    print(
                        f"spot_training: checkpoint {step} not reported durable in S3 within {timeout_s:g} s; "
                        "training goes on (is the node agent running?)",
                        flush=True,
                    )
                return False
            time.sleep(CHECK_S)

    def step(self, step: int, extra: Optional[Dict[str, Any]] = None) -> bool:
        """Call after every optimizer step on every rank. Saves when due; True when the trainer must stop.

        The ranks decide together about every CHECK_S of training (the same call on every rank: rank 0 sends the
        call number of the next decision along with this one); the calls in between return at once."""
        self._calls += 1
        if self._calls < self._next_check:
            return False
        flag = _STOP if self.stop_requested.is_set() else 0
        request, proposal = self._save_request, 0
        if self.rank == 0:
            now = time.monotonic()
            if not flag and (now - self.last_save >= self._interval() or os.path.exists(request)):
                flag = _SAVE
            gap = max(self._calls - self._checked_call, 1)
            per_call = max(now - self._checked_at, 1e-6) / gap
            # At most double the gap per agreement: one window of fast steps (prefetched data, unsynced GPU work)
            # must not push the next decision, and so a notice's emergency checkpoint, far out.
            proposal = self._calls + max(1, min(int(CHECK_S / per_call), 2 * gap))
            self._checked_at, self._checked_call = now, self._calls
        flag, self._next_check = self._all_max([flag, proposal])
        if flag:
            self.save(step, extra, block=flag == _STOP)
            if flag == _STOP:
                # Every rank leaves once rank 0's emergency checkpoint is on disk: a local rank that exits first
                # (non-zero) makes torchrun close its node's other ranks within 30 s, rank 0 mid-write included.
                self._all_max([0, 0])
            if self.rank == 0 and os.path.exists(request):
                os.remove(request)
            if flag == _SAVE and self.wait_for_upload:
                self.wait_uploaded(step)
                self.last_save = time.monotonic()  # the interval counts training time, not the wait
                if self.stop_requested.is_set():  # a notice during the wait: this step's checkpoint is on disk
                    flag = _STOP
            self._checked_at = time.monotonic()  # the next step time measured is a training step's
        if flag == _STOP:
            self.stop_requested.set()
        return flag == _STOP

    def save(self, step: int, extra: Optional[Dict[str, Any]] = None, block: bool = False) -> None:
        """Collective: snapshot the state now, write ``<dir>/<step>/`` in the background (or before returning)."""
        start = time.monotonic()
        rngs = self._gather(rng_state())
        if self.rank == 0:
            self.wait()
            snapshot = {
                "step": step,
                "model": _to_cpu(self.model.state_dict()),
                "optimizer": _to_cpu(self.optimizer.state_dict()) if self.optimizer is not None else None,
                "scheduler": _to_cpu(self.scheduler.state_dict()) if self.scheduler is not None else None,
                "rng": rngs,
                "extra": _to_cpu(extra or {}),
                "world_size": len(rngs),
            }
            copy_s = time.monotonic() - start
            self.last_cost_s = max(self.last_cost_s, copy_s)  # until the write has been measured
            self._writer = threading.Thread(target=self._write, args=(step, snapshot, copy_s), daemon=False)
            self._writer.start()
            if block:
                self.wait()
        self.last_save = time.monotonic()

    def _write(self, step: int, snapshot: Dict[str, Any], copy_s: float) -> None:
        start = time.monotonic()
        tmp = os.path.join(self.directory, f".tmp-{step}-{os.getpid()}")
        try:
            os.makedirs(self.directory, exist_ok=True)
            final = os.path.join(self.directory, str(step))
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            path = os.path.join(tmp, STATE_FILE)
            with open(path, "wb") as f:
                torch.save(snapshot, f)
                f.flush()
                os.fsync(f.fileno())
            with open(os.path.join(tmp, COMPLETE), "wb"):  # the agent uploads it at once, not after two polls
                pass
            if os.path.isdir(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
            self.saved_step = step
            self.last_cost_s = copy_s + time.monotonic() - start
        except BaseException as exc:  # surfaced by wait()
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk must not stay full of this half checkpoint
            self._write_error = exc

    def wait(self) -> None:
        """Block until the pending write is on disk; re-raises a failed write."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._write_error is not None:
            error, self._write_error = self._write_error, None
            raise RuntimeError(f"writing the checkpoint failed: {error}") from error

    def close(self) -> None:
        self.wait()
