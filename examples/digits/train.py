"""Example spot training job: a small MLP on the UCI handwritten digits (``digits.npz`` beside this file).

Runs as a plain script (one process) or under torchrun (DistributedDataParallel: gloo on CPU, NCCL on GPU).
Deterministic given --seed: the data order of epoch e is a permutation seeded by (seed, e), every other random
draw (init, dropout) comes from RNGs the checkpoint helper saves and restores. So an interrupted-and-resumed
run ends with the same weights, bit for bit, as an uninterrupted one (same world size).

    python train.py --epochs 5 --output model.pt          # locally
    job spec command: python train.py --epochs 5          # on the cluster (node agent + torchrun)

The checkpoint helper comes from the node's bootstrap directory (the agent puts it on PYTHONPATH); run
locally with PYTHONPATH=bootstrap_scripts.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spot_training.checkpoint import EXIT_INTERRUPTED, Checkpointer
from torch import nn

# 1,797 images of 8x8 pixels (values 0-16) and their labels: the UCI "Optical Recognition of Handwritten Digits"
# test set (CC BY 4.0), as scikit-learn's load_digits returns it, stored as uint8. A node needs only numpy and torch.
DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--output", default="", help="write the final state_dict here (rank 0)")
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="slow each step down (demos and tests)")
    p.add_argument(
        "--log-every",
        type=int,
        default=0,
        help="print a step line every N steps on every rank (tests: the furthest step is known even when the "
        "node of rank 0 vanishes); default: every 10 steps, rank 0 only",
    )
    return p.parse_args()


class Digits:
    """The data: every image and label, the training indices (a fixed split) and the test set on ``device``."""

    def __init__(self, device: torch.device) -> None:
        with np.load(DIGITS) as digits:
            self.x_all = torch.tensor(digits["data"], dtype=torch.float32) / 16.0
            self.y_all = torch.tensor(digits["target"], dtype=torch.int64)
        split = torch.randperm(len(self.y_all), generator=torch.Generator().manual_seed(1234))
        self.train_idx, test_idx = split[:1400], split[1400:]
        self.x_test, self.y_test = self.x_all[test_idx].to(device), self.y_all[test_idx].to(device)


def init_process(seed: int) -> tuple[int, int, torch.device]:
    """(world size, rank, device): the process group under torchrun, deterministic kernels, seeded RNGs."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=120))
    rank = dist.get_rank() if world > 1 else 0
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return world, rank, device


def resume_position(ckpt: Checkpointer, rank: int) -> tuple[int, int, int]:
    """(step, epoch, samples of that epoch's order consumed) of the restored checkpoint; zeros when fresh.

    The data position is the samples of the epoch's order consumed: rank r trains on every world-th sample of what
    is left, so a resume on another number of nodes (an elastic job) neither skips nor repeats samples."""
    restored = ckpt.restore()
    if restored is None:
        if rank == 0:
            print("starting fresh", flush=True)
        return 0, 0, 0
    step, epoch, samples = restored.step, restored.extra["epoch"], restored.extra["samples"]
    if rank == 0:
        print(f"resumed from step {step} (epoch {epoch}, sample {samples})", flush=True)
    return step, epoch, samples


def log_step(args: argparse.Namespace, step: int, first_step: int, epoch: int, loss: torch.Tensor, rank: int) -> None:
    """A step line: every ``--log-every`` steps on every rank, or every 10 steps on rank 0; always the first step
    after a (re)start, so that the time to it can be read off the logs."""
    if args.log_every > 0:
        if step % args.log_every == 0 or step == first_step:
            print(f"step {step} epoch {epoch} loss {loss.item():.4f} rank {rank}", flush=True)
    elif rank == 0 and (step % 10 == 0 or step == first_step):
        print(f"step {step} epoch {epoch} loss {loss.item():.4f}", flush=True)


class Trainer:
    """The model, its optimizer and scheduler, and the checkpoint helper over them, on one process of the job."""

    def __init__(self, args: argparse.Namespace, world: int, rank: int, device: torch.device) -> None:
        self.args, self.world, self.rank, self.device = args, world, rank, device
        model: nn.Module = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)).to(device)
        self.model = nn.parallel.DistributedDataParallel(model) if world > 1 else model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.ckpt = Checkpointer(self.model, self.optimizer, self.scheduler)

    def epoch(self, data: Digits, epoch: int, done: int, step: int, first_step: int) -> tuple[int, bool]:
        """Train ``epoch`` from ``done`` samples of its order on; (the step reached, whether a notice stopped it
        after its emergency checkpoint)."""
        args, per_step = self.args, self.world * self.args.batch_size
        order = data.train_idx[
            torch.randperm(len(data.train_idx), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        ]
        shard = order[done:][self.rank :: self.world]
        self.model.train()
        for b in range((len(data.train_idx) - done) // per_step):
            idx = shard[b * args.batch_size : (b + 1) * args.batch_size]
            loss = F.cross_entropy(self.model(data.x_all[idx].to(self.device)), data.y_all[idx].to(self.device))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            step += 1
            log_step(args, step, first_step, epoch, loss, self.rank)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
            if self.ckpt.step(step, extra={"epoch": epoch, "samples": done + (b + 1) * per_step}):
                return step, True
        return step, False

    def test_accuracy(self, data: Digits) -> float:
        self.model.eval()
        with torch.no_grad():
            return float((self.model(data.x_test).argmax(1) == data.y_test).float().mean().item())

    def finish(self, step: int) -> None:
        """The final state as a checkpoint too: the node agent makes it durable in S3 (the job's result), and a
        restart after this point resumes past the last epoch and finishes at once."""
        self.ckpt.save(step, extra={"epoch": self.args.epochs, "samples": 0}, block=True)
        self.ckpt.close()
        if self.rank == 0 and self.args.output:
            torch.save(getattr(self.model, "module", self.model).state_dict(), self.args.output)


def main() -> int:
    args = parse_args()
    world, rank, device = init_process(args.seed)
    data = Digits(device)
    trainer = Trainer(args, world, rank, device)
    step, start_epoch, start_samples = resume_position(trainer.ckpt, rank)
    first_step = step + 1  # logged, so that the time to the first step after a (re)start can be read off the logs
    batches = len(data.train_idx) // (world * args.batch_size)
    left = (len(data.train_idx) - start_samples) // (world * args.batch_size) + (
        args.epochs - start_epoch - 1
    ) * batches
    if rank == 0:
        print(f"plan: {step + left} steps", flush=True)  # trainctl status estimates the time left from it
    loop_started, steps_at_start = time.monotonic(), step
    for epoch in range(start_epoch, args.epochs):
        step, interrupted = trainer.epoch(data, epoch, start_samples if epoch == start_epoch else 0, step, first_step)
        if interrupted:
            if rank == 0:
                print(f"interrupted: checkpoint {step} saved, exiting", flush=True)
            return EXIT_INTERRUPTED
        trainer.scheduler.step()
        accuracy = trainer.test_accuracy(data)
        if rank == 0:
            print(f"epoch {epoch} done: step {step} test accuracy {accuracy:.3f} world size {world}", flush=True)
    loop_s = time.monotonic() - loop_started
    trainer.finish(step)
    if rank == 0:
        print(f"training finished at step {step}", flush=True)
        print(f"training loop: {step - steps_at_start} steps in {loop_s:.3f} s", flush=True)
    return 0


def exit_process(code: int) -> None:
    """Exit; with a process group, skip the interpreter's teardown.

    Freeing a DistributedDataParallel model at teardown destroys its gloo process group, whose destructor
    joins gloo's worker thread while holding the GIL; if that thread is still releasing a finished
    collective's Python tensors it waits for the GIL: a deadlock (seen here intermittently with torch 2.13
    on CPU, in the worker that was not rank 0). Every checkpoint is already on disk at this point (the
    helper's writes are waited for), so flushing the output and leaving with os._exit loses nothing.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
