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


def main() -> int:
    args = parse_args()
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
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    with np.load(DIGITS) as digits:
        x_all = torch.tensor(digits["data"], dtype=torch.float32) / 16.0
        y_all = torch.tensor(digits["target"], dtype=torch.int64)
    split = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(1234))
    train_idx, test_idx = split[:1400], split[1400:]
    x_test, y_test = x_all[test_idx].to(device), y_all[test_idx].to(device)

    model: nn.Module = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    ckpt = Checkpointer(model, optimizer, scheduler)
    restored = ckpt.restore()
    # The data position is the samples of the epoch's order consumed: rank r trains on every world-th sample of
    # what is left, so a resume on another number of nodes (an elastic job) neither skips nor repeats samples.
    step, start_epoch, start_samples = 0, 0, 0
    if restored is not None:
        step, start_epoch, start_samples = restored.step, restored.extra["epoch"], restored.extra["samples"]
        if rank == 0:
            print(f"resumed from step {step} (epoch {start_epoch}, sample {start_samples})", flush=True)
    elif rank == 0:
        print("starting fresh", flush=True)

    first_step = step + 1  # logged, so that the time to the first step after a (re)start can be read off the logs
    per_step = world * args.batch_size  # samples of the order one step consumes
    batches = len(train_idx) // per_step
    left = (len(train_idx) - start_samples) // per_step + (args.epochs - start_epoch - 1) * batches
    if rank == 0:
        print(f"plan: {step + left} steps", flush=True)  # trainctl status estimates the time left from it
    loop_started, steps_at_start = time.monotonic(), step
    for epoch in range(start_epoch, args.epochs):
        order = train_idx[
            torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        ]
        done = start_samples if epoch == start_epoch else 0
        shard = order[done:][rank::world]
        model.train()
        for b in range((len(train_idx) - done) // per_step):
            idx = shard[b * args.batch_size : (b + 1) * args.batch_size]
            loss = F.cross_entropy(model(x_all[idx].to(device)), y_all[idx].to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if args.log_every > 0:
                if step % args.log_every == 0 or step == first_step:
                    print(f"step {step} epoch {epoch} loss {loss.item():.4f} rank {rank}", flush=True)
            elif rank == 0 and (step % 10 == 0 or step == first_step):
                print(f"step {step} epoch {epoch} loss {loss.item():.4f}", flush=True)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
            if ckpt.step(step, extra={"epoch": epoch, "samples": done + (b + 1) * per_step}):
                if rank == 0:
                    print(f"interrupted: checkpoint {step} saved, exiting", flush=True)
                return EXIT_INTERRUPTED
        scheduler.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch} done: step {step} test accuracy {accuracy:.3f} world size {world}", flush=True)
    loop_s = time.monotonic() - loop_started
    # The final state as a checkpoint too: the node agent makes it durable in S3 (the job's result), and a
    # restart after this point resumes past the last epoch and finishes at once.
    ckpt.save(step, extra={"epoch": args.epochs, "samples": 0}, block=True)
    ckpt.close()
    if rank == 0 and args.output:
        torch.save(getattr(model, "module", model).state_dict(), args.output)
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
