"""Item 2 of ``make bench``: the example's model's training steps/s with the checkpoint helper saving every 1 s vs
without it, in interleaved 0.1 s blocks of one process (the helper's snapshot + asynchronous write; the upload is
the agent's, in another process)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import BOOTSTRAP

OVERHEAD_PAIRS = 500  # its two sides differ by a fraction of a percent, so many short interleaved blocks
# The example's model and settings (examples/digits/train.py: MLP 64-64-10, SGD with momentum, batches of 32, one
# torch thread) in one process, in blocks of BLOCK_S seconds, ABBA: the helper saving every 1 s, then no helper at
# all. Short interleaved blocks in one process cancel most of the shared machine's drift, which separate runs of a
# few seconds each do not (2 s blocks give pair ratios of 0.7-1.3 here).
OVERHEAD_LOOP = """
import json, sys, tempfile, time
import torch
import torch.nn.functional as F
from spot_training.checkpoint import Checkpointer

pairs, block_s = int(sys.argv[1]), float(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.rand(32, 64), torch.randint(0, 10, (32,))
ckpt = Checkpointer(model, optimizer, directory=tempfile.mkdtemp(), interval_s=1.0, handle_sigterm=False)
rates = {"every 1 s": [], "never": []}
step = 0
for block in range(2 * pairs):
    saving = (block + block // 2) % 2 == 0  # on, off, off, on, on, off, ...
    started, steps = time.monotonic(), 0
    while time.monotonic() - started < block_s:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        steps += 1
        if saving:
            ckpt.step(step, extra={"batch": step})
    ckpt.wait()  # the block's last write is part of its cost
    rates["every 1 s" if saving else "never"].append(steps / (time.monotonic() - started))
ckpt.close()
print(json.dumps({"rates": rates, "checkpoints": len(ckpt.local_steps())}))
"""
OVERHEAD_BLOCK_S = 0.1


def bench_checkpoint_overhead(work: Path, pairs: int) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(BOOTSTRAP))
    script = work / "overhead.py"
    script.write_text(OVERHEAD_LOOP)
    out = subprocess.run(  # noqa: S603 - our argv
        [sys.executable, str(script), str(pairs), str(OVERHEAD_BLOCK_S)],
        env=env, cwd=work, capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    result = json.loads(out)
    rates = result["rates"]
    med = {k: statistics.median(v) for k, v in rates.items()}
    pair = [a / b for a, b in zip(rates["every 1 s"], rates["never"], strict=True)]
    q1, _, q3 = statistics.quantiles(pair, n=4)
    return [
        f"| checkpoint overhead: training steps/s with the helper saving every 1 s / without it (the example's "
        f"model, one process, {pairs} pairs of {OVERHEAD_BLOCK_S:g} s blocks interleaved; interquartile range of "
        f"the pairs in brackets) | {statistics.median(pair):.3f} ({q1:.2f}-{q3:.2f}) | goal >= 0.98 | "
        f"medians {med['every 1 s']:.0f} / {med['never']:.0f} steps/s; {result['checkpoints']} checkpoints written |"
    ]
