"""Item 7 of ``make bench``: the AWS calls one cluster's node agents make while they train, at several node counts.

Per node count: one cluster in moto served in a thread with request counting on (``emulator/request_counts.py``),
its nodes running their real user data and node agent (``user_data.sh`` -> ``node_agent.py`` -> ``torchrun``) with
the agent's real 5 s poll, and a light trainer (no model: it prints a step a second and rank 0 writes a small
checkpoint file every 20 s, which the agent makes durable). Once every node's trainer prints steps, the calls the
agents make in a fixed window are counted by action, for the cluster and per node (the agents name their node in
the User-Agent). The harness's own calls are not counted.

The projection to 1,000 nodes takes the per-node rate of each Describe action measured at the largest count and
the cluster-wide rate, against EC2's documented token bucket for non-mutating actions (Auto Scaling publishes no
figures).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.request_counts import OTHER_CALLER, RequestCounts
from tests.bootstrap.conftest import Clients, Cluster, Node, loopback, moto_with_fake_credentials  # the agent harness

POLL_S = 5.0  # the agent's poll on a real node (SPOT_TRAINING_POLL_INTERVAL_S default)
WINDOW_S = 90.0
READY_TIMEOUT_S = 900.0  # every node's trainer printing steps; 32 nodes boot torchrun on 2 cores
PROJECTED_NODES = 1000
# EC2 API throttling: "Non-mutating actions ... bucket maximum capacity 100, bucket refill rate 20" (per second)
EC2_BUCKET, EC2_REFILL_PER_S = 100, 20
EC2_THROTTLING_SOURCE = "https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html"
LIGHT_TRAINER = """
import json, os, sys, time
rank = int(os.environ.get("RANK", "0"))
directory = os.environ["SPOT_TRAINING_CHECKPOINT_DIR"]
for step in range(1, 3600):
    time.sleep(1)
    print(f"light step {step}", flush=True)
    if rank == 0 and step % 20 == 0:
        partial = os.path.join(directory, ".state.json.partial")
        with open(partial, "w") as out:
            json.dump({"step": step}, out)
        os.replace(partial, os.path.join(directory, "state.json"))
"""


@dataclass
class CallRates:
    nodes: int
    window_s: float
    by_action: dict[str, int]  # calls of all the cluster's nodes in the window, by service:action
    booted_s: float  # from starting the nodes until every trainer printed a step

    def per_minute(self, action: str) -> float:
        return self.by_action.get(action, 0) * 60.0 / self.window_s

    def describe_per_minute(self) -> float:
        return sum(self.per_minute(a) for a in self.by_action if ":Describe" in a)


def node_calls(counts: RequestCounts) -> Counter[str]:
    """Calls of every caller that is a node (not the harness), by action."""
    total: Counter[str] = Counter()
    for caller, actions in counts.snapshot()["by_caller"].items():
        if caller != OTHER_CALLER:
            total.update(actions)
    return total


def measure(nodes: int, root: Path, window_s: float = WINDOW_S) -> CallRates:
    """One cluster of ``nodes`` nodes training; the calls its agents make in ``window_s`` seconds."""
    counts = RequestCounts(root / f"requests-{nodes}.json")
    started: list[Node] = []
    with moto_with_fake_credentials(counts) as endpoint:
        try:
            cluster = Cluster(Clients(endpoint), root / f"nodes-{nodes}", nodes, checkpoint_dir="/opt/ml/checkpoints")
            cluster.submit("bench", {"train.py": LIGHT_TRAINER}, "python train.py")
            started = [Node(cluster, i, ip, loopback(20 + n)) for n, (i, ip) in enumerate(cluster.instances())]
            mapping = {node.private_ip: node.host for node in started}
            begin = time.monotonic()
            for node in started:
                node.start(mapping, SPOT_TRAINING_POLL_INTERVAL_S=str(POLL_S), SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S="600")
            wait_until_training(started, begin + READY_TIMEOUT_S)
            booted_s = time.monotonic() - begin
            before = node_calls(counts)
            time.sleep(window_s)
            after = node_calls(counts)
            still = [n.instance_id for n in started if n.proc is not None and n.proc.poll() is not None]
            if still:
                raise RuntimeError(f"{nodes} nodes: {still} ended during the window:\n{started[0].text[-3000:]}")
            return CallRates(nodes, window_s, dict(after - before), booted_s)
        finally:
            for node in started:
                node.stop()


def wait_until_training(nodes: list[Node], deadline: float) -> None:
    """Until every node's trainer printed a step (bounded by ``deadline``); fails with the laggards' output."""
    while time.monotonic() < deadline:
        waiting = [n for n in nodes if "light step" not in n.text]
        if not waiting:
            return
        ended = [n for n in waiting if n.proc is not None and n.proc.poll() is not None]
        if ended:
            raise RuntimeError(f"{ended[0].instance_id} ended before training:\n{ended[0].text[-3000:]}")
        time.sleep(2)
    raise RuntimeError(f"{len(waiting)} node(s) not training after {READY_TIMEOUT_S:.0f} s:\n{waiting[0].text[-3000:]}")


def section(rates: list[CallRates], note: str = "") -> list[str]:
    """RESULTS.md's "Control plane" section: calls per minute by action, cluster-wide and per node, side by side."""
    actions = sorted({a for r in rates for a in r.by_action})
    head = " | ".join(f"{r.nodes} nodes: cluster / per node" for r in rates)
    rows = [
        f"| `{a}` | " + " | ".join(f"{r.per_minute(a):.1f} / {r.per_minute(a) / r.nodes:.2f}" for r in rates) + " |"
        for a in actions
    ]
    smallest, largest = rates[0], rates[-1]
    ratio = largest.describe_per_minute() / max(smallest.describe_per_minute(), 1e-9)
    projected = projection(smallest, largest)
    return [
        "## Control plane",
        "",
        f"Written by `make bench` (`--only control-plane`) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        "One cluster's real node agents (user data, agent, torchrun, a light trainer: a step a second, a small "
        f"checkpoint every 20 s) with the agent's real {POLL_S:g} s poll, against moto with request counting "
        f"(`benchmarks/control_plane.py`); the calls the agents made in {rates[0].window_s:.0f} s once every "
        "trainer printed steps, per minute. Boot to every trainer training: "
        + ", ".join(f"{r.nodes} nodes {r.booted_s:.0f} s" for r in rates)
        + (f". {note}" if note else "."),
        "",
        f"| action (calls per minute) | {head} |",
        "|---|" + "---|" * len(rates),
        *rows,
        "| **all Describe actions** | "
        + " | ".join(f"**{r.describe_per_minute():.1f}** / {r.describe_per_minute() / r.nodes:.2f}" for r in rates)
        + " |",
        "",
        f"Cluster-wide Describe calls per minute at {largest.nodes} nodes / at {smallest.nodes} nodes: "
        f"**{ratio:.2f}** (goal <= 1.5).",
        "",
        *projected,
        "",
    ]


def projection(smallest: CallRates, largest: CallRates) -> list[str]:
    """The cluster-wide Describe rate of a 1,000-node cluster, by a straight line through the smallest and the
    largest measured counts, against EC2's token bucket for non-mutating actions."""
    low, high = smallest.describe_per_minute() / 60.0, largest.describe_per_minute() / 60.0
    slope = (high - low) / max(largest.nodes - smallest.nodes, 1)
    projected = max(0.0, low + slope * (PROJECTED_NODES - smallest.nodes))
    return [
        f"Projected to {PROJECTED_NODES:,} nodes (a straight line through {smallest.nodes} and {largest.nodes} "
        f"nodes): **{projected:.1f}** Describe calls a second for the cluster. EC2 documents its API throttling as "
        f"a token bucket per account and Region; for non-mutating actions, {EC2_BUCKET} tokens refilled at "
        f"{EC2_REFILL_PER_S} a second ({EC2_THROTTLING_SOURCE}); Auto Scaling publishes no figures. Not measured on "
        "AWS.",
    ]


def run(root: Path, counts: list[int], window_s: float = WINDOW_S) -> tuple[list[str], list[Any]]:
    """Measure every node count in turn (smallest first); the section and the rates."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    rates = [measure(n, root, window_s) for n in sorted(counts)]
    return section(rates), rates
