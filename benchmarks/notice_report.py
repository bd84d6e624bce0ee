"""Items 4-6 of ``make bench``: the spot notice to a durable checkpoint and the replacement's boot, measured by
``benchmarks/notice.py`` and written as RESULTS.md sections, and the cost model (``benchmarks/cost_model.py``) fed
with those measurements."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import BOOTSTRAP, fast_ranges, notice
from benchmarks.cost_model import ADVISOR_BUCKETS, expected_job_cost
from benchmarks.report import spread

NOTICE_S = 120.0  # a spot interruption notice comes two minutes before the instance goes
# S3 throughput per connection: AWS, "Performance design patterns for Amazon S3", horizontal scaling and request
# parallelization: "Make one concurrent request for each 85-90 MB/s of desired network throughput".
PER_CONNECTION_MB_S = 85.0
PER_CONNECTION_SOURCE = (
    "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-design-patterns.html"
    "#optimizing-performance-parallelization"
)
REAL_POLL_S = 5.0  # the agent's metadata poll on a real node (SPOT_TRAINING_POLL_INTERVAL_S default)
SPOT_DISCOUNT = 0.70  # assumed; AWS advertises "up to 90%" off On-Demand (https://aws.amazon.com/ec2/spot/pricing/)

Notices = dict[int, list[notice.NoticeTimes]]
Boots = dict[int, list[notice.BootPhases]]


def agent_transfer() -> Any:
    """The node agent's TransferConfig, imported from ``bootstrap_scripts/``."""
    sys.path.insert(0, str(BOOTSTRAP))
    from spot_training.agent.aws_config import TRANSFER

    return TRANSFER


def measure(work: Path, reps: int, sizes_mib: list[int]) -> tuple[Notices, Boots]:
    """``reps`` runs of each size, the order of the sizes reversed every other repetition."""
    notices: Notices = {s: [] for s in sizes_mib}
    boots: Boots = {s: [] for s in sizes_mib}
    with fast_ranges.moto_server() as (_, port):
        cloud = notice.Emulated(f"http://localhost:{port}", work / "nodes")
        for rep in range(reps):
            for size in sizes_mib if rep % 2 == 0 else reversed(sizes_mib):
                times, phases = notice.run(cloud, size)
                notices[size].append(times)
                boots[size].append(phases)
    return notices, boots


def notice_row(size: int, runs: list[notice.NoticeTimes], part_mib: int, concurrency: int) -> str:
    """One size's row of item 4: measured, and projected to a real instance with the agent's and one connection."""
    save = statistics.median(r.save_s for r in runs)
    projected = REAL_POLL_S + save + notice.projected_upload_s(size, part_mib, concurrency, PER_CONNECTION_MB_S)
    one = REAL_POLL_S + save + notice.projected_upload_s(size, part_mib, 1, PER_CONNECTION_MB_S)
    return (
        f"| {size} MiB | {spread([r.total_s for r in runs])} s | "
        f"{spread([100 * r.total_s / NOTICE_S for r in runs], '{:.1f}%')} | "
        f"{statistics.median(r.detect_s for r in runs):.1f} / {save:.1f} / "
        f"{statistics.median(r.upload_s for r in runs):.1f} s | {projected:.1f} s | "
        f"{100 * projected / NOTICE_S:.1f}% | {one:.1f} s |"
    )


def notice_section(notices: Notices, reps: int) -> list[str]:
    """Item 4: notice -> durable checkpoint, per size."""
    transfer = agent_transfer()
    part_mib = transfer.multipart_chunksize // 2**20
    lines = [
        "## 4. Spot notice to a durable checkpoint",
        "",
        f"The real agent on an emulated node (moto and an IMDSv2 mock on loopback, metadata polled every "
        f"{notice.POLL_S:g} s): notice delivered -> agent SIGTERMs the trainer (detect) -> the checkpoint helper's "
        "emergency checkpoint is on disk (save) -> objects and manifest in S3 (upload). Times from the node's "
        f"CloudWatch Logs events; median (range) of {reps} runs.",
        "",
        "| checkpoint | notice -> manifest in S3 | share of the 120 s notice | detect / save / upload (medians) "
        "| projected on a real instance | projected share | projected with 1 connection |",
        "|---|---|---|---|---|---|---|",
        *(notice_row(size, runs, part_mib, transfer.max_concurrency) for size, runs in notices.items()),
    ]
    return [
        *lines,
        "",
        f"Projection: the agent's real {REAL_POLL_S:g} s metadata poll (worst case) + the save measured here + the "
        f"upload at {PER_CONNECTION_MB_S:g} MB/s per connection, {part_mib} MiB parts, {transfer.max_concurrency} "
        "in flight (the agent's TransferConfig; one request below the multipart threshold). The per-connection "
        f"figure is the low end of AWS's guidance, \"one concurrent request for each 85-90 MB/s of desired network "
        f"throughput\" ({PER_CONNECTION_SOURCE}). Not modelled: the instance's network cap and EBS write speed "
        "(the save here is to local disk), TLS.",
        "",
    ]


def boot_section(boots: Boots, reps: int) -> list[str]:
    """Item 5: the replacement's boot phases as shares of boot -> first step, per size."""
    lines = [
        "## 5. Replacement node: boot to first training step",
        "",
        "The replacement the group launches after item 4's run, from starting its user data to the trainer's first "
        "step: metadata (user data's IMDSv2 reads, agent start, job spec), volume claim (warm pool, attach only), "
        "code fetch, checkpoint restore (the agent's download + sha256 check), rendezvous (peer discovery, torchrun's "
        "c10d rendezvous, trainer start: imports and loading the state), first step. Share of the total, medians of "
        f"{reps} runs.",
        "",
        "| checkpoint | boot -> first step | " + " | ".join(notice.PHASES) + " |",
        "|---|---|" + "---|" * len(notice.PHASES),
    ]
    for size, booted in boots.items():
        shares = [statistics.median(100 * b.phases[p] / b.total_s for b in booted) for p in notice.PHASES]
        lines.append(
            f"| {size} MiB | {spread([b.total_s for b in booted])} s | "
            + " | ".join(f"{x:.0f}%" for x in shares)
            + " |"
        )
    return [*lines, ""]


def bench_notice(work: Path, reps: int, sizes_mib: list[int]) -> tuple[list[str], dict[str, float]]:
    """Items 4 and 5: markdown sections, and this run's medians for the cost model (largest size)."""
    notices, boots = measure(work, reps, sizes_mib)
    big = max(sizes_mib)
    measured = {
        "size_mib": float(big),
        "checkpoint_cost_s": statistics.median(r.save_s + r.upload_s for r in notices[big]),
        "emergency_s": statistics.median(r.total_s for r in notices[big]),
        "restart_s": statistics.median(r.total_s for r in boots[big]),
    }
    return [*notice_section(notices, reps), *boot_section(boots, reps)], measured


def cost_section(measured: dict[str, float], discount: float) -> list[str]:
    c, r, e = measured["checkpoint_cost_s"], measured["restart_s"], measured["emergency_s"]
    lines = [
        "## 6. Cost of a 24-hour job on spot vs on-demand",
        "",
        "`benchmarks/cost_model.py` (unit-tested in `tests/test_cost_model.py`). Interruptions are a Poisson "
        "process; the Spot Instance Advisor's monthly interruption frequency `p` (bucket midpoint, 25% for >20%) "
        "gives `M = 720 h / -ln(1 - p)`. A checkpoint costs `C` and is taken every `tau = sqrt(2 C M)` (Young/Daly); "
        "each interruption loses `L` (`tau / 2` if the notice is missed; the emergency checkpoint `E` if it is "
        "honoured) plus the restart `R`. Paid hours `T = W (1 + C / tau) / (1 - (L + R) / M)` for `W = 24 h` of "
        "work; spot / on-demand cost = `(1 - discount) T / W`; break-even discount `1 - W / T`.",
        "",
        f"Inputs from this run ({measured['size_mib']:.0f} MiB checkpoint, medians): C = {c:.1f} s (save + upload, "
        f"the helper's Young/Daly input, counted as if training stalled for all of it), E = {e:.1f} s (item 4), "
        f"R = {r:.1f} s (item 5; an emulated boot: a real replacement also waits for EC2 to launch and boot the "
        f"instance). Discount {100 * discount:.0f}%: an assumption, not a measurement (AWS advertises up to 90% off "
        "On-Demand, https://aws.amazon.com/ec2/spot/pricing/; the Spot Instance Advisor lists each pool's savings "
        "over the last 30 days). The break-even column does not depend on it.",
        "",
        "| interruptions / month | MTBI | Young/Daly interval | interruptions in the job | extra instance time, "
        f"notice missed | extra instance time, notice honoured | spot / on-demand at {100 * discount:.0f}% off "
        "(honoured) | break-even discount |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, rate in ADVISOR_BUCKETS:
        missed = expected_job_cost(monthly_rate=rate, discount=discount, checkpoint_cost_s=c, restart_s=r)
        honoured = expected_job_cost(
            monthly_rate=rate, discount=discount, checkpoint_cost_s=c, restart_s=r, emergency_checkpoint_s=e
        )
        lines.append(
            f"| {label} | {missed.mtbi_h:.0f} h | {missed.interval_s / 60:.0f} min | {honoured.interruptions:.3f} | "
            f"{100 * (missed.paid_h / 24 - 1):.3f}% | {100 * (honoured.paid_h / 24 - 1):.3f}% | "
            f"{honoured.cost_vs_on_demand:.4f} | {100 * honoured.break_even_discount:.3f}% |"
        )
    lines += [
        "",
        "One instance; a job on N nodes that restarts when any node is interrupted sees about N times the rate. "
        "At these rates a 24-hour job expects well under one interruption, so its spot cost is the discounted price "
        "plus a fraction of a percent.",
    ]
    return [*lines, ""]
