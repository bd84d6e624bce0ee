"""``make bench``: ratios measured side by side in one run, written to ``benchmarks/RESULTS.md``.

The machines are shared and noisy, so no figure is one side's absolute time: items 1 and 3 are ratios of two sides
run alternately (the order flipped each repetition), the median of the per-repetition ratios with their range;
item 2 is the median ratio of 500 interleaved pairs of 0.1 s blocks in one process, with the interquartile range;
items 4 and 5 are times read from the emulated nodes' CloudWatch Logs against a fixed window (median and range of
the runs); item 6 is a model fed with this run's measurements. Never run by ``make test``.

1. synth (``benchmarks/synth.py``): ``npx cdk synth`` of 10 teams x 2 clusters vs a trivial CDK app with one
   bucket; 1 team vs 10 teams; the trivial app with 10 one-bucket stacks vs 1 (what the stacks cost by themselves),
   and with cdk-nag's AwsSolutions pack over them (the floor of a stack per team and the gate); ours as cdk.json runs
   it (``python3 -O``) vs plain ``python3``; ours with aws-cdk-lib's validator in the jsii kernel vs in a worker.
2. checkpoint overhead (``benchmarks/overhead.py``): the example's model's training steps/s with the checkpoint
   helper saving every 1 s vs without it, in 500 pairs of interleaved 0.1 s blocks of one process (the helper's
   snapshot + asynchronous write; the upload is the agent's, in another process).
3. checkpoint transfer (``benchmarks/transfer.py``): the node agent's upload/download (parallel, multipart / ranged
   GETs, sha256 manifest) vs a single-stream boto3 ``upload_file``/``download_file`` (``use_threads=False``), same
   moto endpoint on loopback; and the agent with one connection vs its default, for what parallelism buys here.
4. notice to durable: the real agent on an emulated node, from the spot notice to the checkpoint's manifest in S3,
   for 10 MiB / 100 MiB / 1 GiB checkpoints, as a share of the 120 s notice; projected to a real instance from
   S3's per-connection throughput (``benchmarks/notice.py`` measures, ``benchmarks/notice_report.py`` reports).
5. replacement to first step: the replacement node's boot phases, from its CloudWatch Logs lines (the same run).
6. cost model: a 24-hour job on spot vs on-demand per Spot Instance Advisor interruption bucket, with this run's
   checkpoint cost and restart time (``benchmarks/cost_model.py``, reported by ``benchmarks/notice_report.py``).
7. control plane: the AWS calls one cluster's node agents make while they train, by action, at 4, 16 and 32 nodes
   side by side, and projected to 1,000 nodes (``benchmarks/control_plane.py``). With ``--only control-plane``,
   only RESULTS.md's "Control plane" section is replaced.
8. setup cache: a node booting onto the warm volume, start to first step, with the job's setup cached there vs
   cold (``benchmarks/setup_cache.py``). With ``--only setup-cache``, only RESULTS.md's item 8 section is replaced.

``benchmarks/report.py`` runs sides alternately, formats ratios and writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks import control_plane
from benchmarks.notice_report import SPOT_DISCOUNT, bench_notice, cost_section
from benchmarks.overhead import OVERHEAD_PAIRS, bench_checkpoint_overhead
from benchmarks.report import RESULTS, Clock, replace_section, results_text
from benchmarks.setup_cache import SETUP_CACHE_HEADING, bench_setup_cache
from benchmarks.synth import bench_synth
from benchmarks.transfer import bench_transfer

__all__ = ["main", "replace_section"]
PARTS = ["synth", "overhead", "transfer", "notice", "control-plane", "setup-cache"]
# Parts that, run alone, replace only their own section of RESULTS.md (by its heading)
OWN_SECTIONS = {"control-plane": "## Control plane", "setup-cache": SETUP_CACHE_HEADING}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="runs of items 4-5 (default 3)")
    # item 1's goal sits near its bound on this machine: more repetitions for a steadier median (about 45 s each)
    p.add_argument("--synth-reps", type=int, default=5, help="repetitions of each synth side (default 5)")
    # one 1 GiB download took 0.65-1.38 of single-stream boto3's time within one run: 3 repetitions do not settle it
    p.add_argument("--transfer-reps", type=int, default=5, help="repetitions of each transfer side (default 5)")
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[100, 1024], help="transfer sizes (MiB)")
    p.add_argument(
        "--notice-sizes-mib", type=int, nargs="+", default=[10, 100, 1024], help="checkpoint sizes of items 4-6"
    )
    p.add_argument("--discount", type=float, default=SPOT_DISCOUNT, help="spot discount of the cost model (0-1)")
    p.add_argument("--control-plane-nodes", type=int, nargs="+", default=[4, 16, 32], help="node counts of item 7")
    p.add_argument("--only", choices=PARTS, action="append", help="run only these (notice: items 4-6)")
    return p.parse_args(argv)


def run_parts(args: argparse.Namespace, only: set[str], clock: Clock) -> tuple[list[str], list[str]]:
    """The table rows of items 1-3 and the sections of items 4-7 that ``only`` names, each part's start on
    ``clock``."""
    rows: list[str] = []
    sections: list[str] = []

    def part(name: str) -> bool:
        """Whether to run ``name``; records when it (and so the end of the previous part) starts."""
        clock.mark(name)
        return name in only

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        if part("synth"):
            rows += bench_synth(work, args.synth_reps)
        if part("overhead"):
            rows += bench_checkpoint_overhead(work, OVERHEAD_PAIRS)
        if part("transfer"):
            rows += bench_transfer(work, args.transfer_reps, args.sizes_mib)
        if part("notice"):
            lines, measured = bench_notice(work, args.reps, args.notice_sizes_mib)
            sections += lines + cost_section(measured, args.discount)
        if part("control-plane"):
            control, _ = control_plane.run(work, args.control_plane_nodes)
            sections += control
        if part("setup-cache"):
            sections += bench_setup_cache(work, args.reps)
        part("end")
    return rows, sections


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(args.only or PARTS)
    clock = Clock()
    rows, sections = run_parts(args, only, clock)
    if len(only) == 1 and min(only) in OWN_SECTIONS and RESULTS.exists():
        text = replace_section(RESULTS.read_text(), OWN_SECTIONS[min(only)], "\n".join(sections))
    else:
        reps = (
            f"{args.reps} alternated repetitions ({args.synth_reps} for synth, {args.transfer_reps} for transfers; "
            "a row may say otherwise)"
        )
        took = f"{clock.elapsed():.0f} s ({clock.durations(only)})"
        text = results_text(reps, took, rows, sections)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
