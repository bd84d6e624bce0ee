"""``make bench``: ratios measured side by side in one run, written to ``benchmarks/RESULTS.md``.

The machines are shared and noisy, so no figure is one side's absolute time: items 1 and 3 are ratios of two sides
run alternately (the order flipped each repetition), the median of the per-repetition ratios with their range;
item 2 is the median ratio of 500 interleaved pairs of 0.1 s blocks in one process, with the interquartile range;
items 4 and 5 are times read from the emulated nodes' CloudWatch Logs against a fixed window (median and range of
the runs); item 6 is a model fed with this run's measurements. Never run by ``make test``.

1. synth: ``npx cdk synth`` of 10 teams x 2 clusters vs a trivial CDK app with one bucket; 1 team vs 10 teams;
   the trivial app with 10 one-bucket stacks vs 1 (what the stacks cost by themselves), and with cdk-nag's
   AwsSolutions pack over them (the floor of a stack per team and the gate); ours as cdk.json runs it
   (``python3 -O``) vs plain ``python3``; ours with aws-cdk-lib's validator in the jsii kernel vs in a worker.
2. checkpoint overhead: the example's model's training steps/s with the checkpoint helper saving every 1 s vs
   without it, in 500 pairs of interleaved 0.1 s blocks of one process (the helper's snapshot + asynchronous
   write; the upload is the agent's, in another process).
3. checkpoint transfer: the node agent's upload/download (parallel, multipart / ranged GETs, sha256 manifest) vs a
   single-stream boto3 ``upload_file``/``download_file`` (``use_threads=False``), same moto endpoint on loopback;
   and the agent with one connection vs its default, for what parallelism buys here.
4. notice to durable: the real agent on an emulated node, from the spot notice to the checkpoint's manifest in S3,
   for 10 MiB / 100 MiB / 1 GiB checkpoints, as a share of the 120 s notice; projected to a real instance from
   S3's per-connection throughput (``benchmarks/notice.py``).
5. replacement to first step: the replacement node's boot phases, from its CloudWatch Logs lines.
6. cost model: a 24-hour job on spot vs on-demand per Spot Instance Advisor interruption bucket, with this run's
   checkpoint cost and restart time (``benchmarks/cost_model.py``).
7. control plane: the AWS calls one cluster's node agents make while they train, by action, at 4, 16 and 32 nodes
   side by side, and projected to 1,000 nodes (``benchmarks/control_plane.py``). With ``--only control-plane``,
   only RESULTS.md's "Control plane" section is replaced.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import yaml
from boto3.s3.transfer import TransferConfig

import cfn_validate
from benchmarks import control_plane, fast_ranges, notice
from benchmarks.cost_model import ADVISOR_BUCKETS, expected_job_cost
from emulator.deploy import JSII_QUIET

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "bootstrap_scripts"
CDK = REPO / "node_modules" / ".bin" / "cdk"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
NOTICE_S = 120.0  # a spot interruption notice comes two minutes before the instance goes
# S3 throughput per connection: AWS, "Performance design patterns for Amazon S3", horizontal scaling and request
# parallelization: "Make one concurrent request for each 85-90 MB/s of desired network throughput".
PER_CONNECTION_MB_S = 85.0
PER_CONNECTION_SOURCE = (
    "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-design-patterns.html"
    "#optimizing-performance-parallelization"
)
REAL_POLL_S = 5.0  # the agent's metadata poll on a real node (SPOT_TRAINING_POLL_INTERVAL_S default)
OVERHEAD_PAIRS = 500  # item 2: its two sides differ by a fraction of a percent, so many short interleaved blocks
SPOT_DISCOUNT = 0.70  # assumed; AWS advertises "up to 90%" off On-Demand (https://aws.amazon.com/ec2/spot/pricing/)
TRIVIAL_APP = """
import sys
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
app = App(context={"aws:cdk:disable-creation-stack-traces": True})  # as app.py sets it
for i in range(int(sys.argv[1])):
    s3.Bucket(Stack(app, f"Trivial{i or ''}"), "Bucket")
if sys.argv[2:] == ["nag"]:  # the gate every synth of ours passes, over the same buckets
    from aws_cdk import Acknowledgment, Validations
    from cdk_nag import AwsSolutionsChecks
    for rule in ("S1", "S10"):  # a bare bucket logs nothing and allows plain HTTP; the app must still synthesize
        Validations.of(app).acknowledge(Acknowledgment(id=f"AwsSolutions-{rule}", reason="a benchmark's bucket"))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
"""


def app_interpreter() -> list[str]:
    """cdk.json's app command without its script: the interpreter and the flags it runs app.py with."""
    *interpreter, script = json.loads((REPO / "cdk.json").read_text())["app"].split()
    if script != "app.py":
        raise SystemExit(f"cdk.json: app: the command should end in app.py, not {script!r}")
    return interpreter


def alternate(sides: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Run every side once per repetition, the order reversed every other repetition; the seconds of each run."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            out[name].append(sides[name]())
    return out


def ratio(a: list[float], b: list[float]) -> str:
    """median (min-max) of the per-repetition ratios a/b."""
    rs = [x / y for x, y in zip(a, b, strict=True)]
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    out = subprocess.DEVNULL
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=out, stderr=out, timeout=600)  # noqa: S603 - our argv
    return time.monotonic() - started


# ---------------------------------------------------------------------------------------------------- synth
def write_teams(directory: Path, count: int) -> Path:
    """``count`` team files in a new ``directory``, each the shipped default team with two clusters (main, dev)."""
    team = yaml.safe_load((REPO / "teams" / "default.yaml").read_text())
    team["clusters"] = [dict(team["clusters"][0], name=n) for n in ("main", "dev")]
    directory.mkdir()
    for i in range(count):
        (directory / f"{'default' if i == 0 else f'team{i}'}.yaml").write_text(yaml.safe_dump(team))
    return directory


def bench_synth(work: Path, reps: int) -> list[str]:
    env = dict(os.environ, **JSII_QUIET, CDK_DISABLE_VERSION_CHECK="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    dirs = {count: write_teams(work / f"teams-{count}", count) for count in (1, 10)}
    trivial = work / "trivial"
    trivial.mkdir()
    (trivial / "app.py").write_text(TRIVIAL_APP)
    # Like for like: the trivial app runs with our cdk.json's context and interpreter flags (`python3 -O`) and, like
    # app.py, without creation stack traces, so the ratio measures what our constructs cost, not settings the trivial
    # app could use as well.
    interpreter = " ".join(app_interpreter())
    (trivial / "cdk.json").write_text(json.dumps({"context": json.loads((REPO / "cdk.json").read_text())["context"]}))

    # CDK_VALIDATION=false turns off aws-cdk-lib's built-in CloudFormation validation (a WASM rule engine that
    # every app, the trivial one too, loads at synth): the sides without it show what our constructs cost.
    quiet = dict(env, CDK_VALIDATION="false")

    def ours(count: int, env: dict[str, str] = env, app: tuple[str, ...] = ()) -> Callable[[], float]:
        args = [str(CDK), "synth", "--quiet", "--no-notices", "-c", f"teams_dir={dirs[count]}", *app]
        return lambda: timed([*args, "-o", str(work / f"out-{count}")], REPO, env)

    def trivial_app(env: dict[str, str] = env, stacks: int = 1, nag: bool = False) -> Callable[[], float]:
        app = f"{interpreter} app.py {stacks}{' nag' if nag else ''}"
        args = [str(CDK), "synth", "--quiet", "--no-notices", "-a", app]
        return lambda: timed([*args, "-o", f"out-{stacks}{'-nag' if nag else ''}"], trivial, env)

    sides = {
        "trivial": trivial_app(),
        "10 trivial stacks": trivial_app(stacks=10),
        # The floor the brief sets before any resource of ours: ten stacks (one per team) and cdk-nag on every synth.
        "10 trivial stacks, cdk-nag": trivial_app(stacks=10, nag=True),
        "1 team": ours(1),
        "10 teams": ours(10),
        "trivial, no validation": trivial_app(quiet),
        "10 teams, no validation": ours(10, quiet),
        # What cdk.json's `python3 -O` buys: the same app with jsii's Python-side type checks on.
        "10 teams, plain python3": ours(10, app=("-a", "python3 app.py")),
        # What cfn_validate/ buys: training_app.wiring.main() called from an import starts no worker, and its App keeps
        # aws-cdk-lib's own validator, in the jsii kernel (the app before cfn_validate/).
        "10 teams, validator in the kernel": ours(
            10, app=("-a", f'{interpreter} -c "from training_app import wiring; wiring.main()"')
        ),
    }
    t = alternate(sides, reps)
    med = {k: statistics.median(v) for k, v in t.items()}
    templates = sorted((work / "out-10").glob("*.template.json"))
    reports: dict[str, Any] = {}

    def worker(side: str, v8_flags: tuple[str, ...]) -> Callable[[], float]:
        def run() -> float:
            seconds, reports[side] = worker_cpu(templates, v8_flags)
            return seconds

        return run

    cpu = alternate({"default": worker("default", ()), "flags": worker("flags", cfn_validate.V8_FLAGS)}, reps)
    if reports["default"] != reports["flags"]:
        raise SystemExit(f"the validator worker's report differs with {cfn_validate.V8_FLAGS}: {reports}")
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    return [
        f"| synth: 10 teams x 2 clusters / trivial app (1 bucket) | {ratio(t['10 teams'], t['trivial'])} | "
        f"goal <= 1.5 | medians {med['10 teams']:.1f} s / {med['trivial']:.1f} s |",
        f"| synth: 10 teams / 1 team | {ratio(t['10 teams'], t['1 team'])} | - | "
        f"medians {med['10 teams']:.1f} s / {med['1 team']:.1f} s |",
        f"| synth: 1 team / trivial app (how much of item 1's budget the first team spends) | "
        f"{ratio(t['1 team'], t['trivial'])} | - | medians {med['1 team']:.1f} s / {med['trivial']:.1f} s |",
        "| synth: the trivial app with 10 one-bucket stacks / with 1 (what 10 stacks cost by themselves) | "
        f"{ratio(t['10 trivial stacks'], t['trivial'])} | - | "
        f"medians {med['10 trivial stacks']:.1f} s / {med['trivial']:.1f} s |",
        "| synth: the trivial app with 10 one-bucket stacks and cdk-nag's AwsSolutions pack / the trivial app (the "
        "floor the brief sets before any resource of ours: a stack per team, cdk-nag on every synth) | "
        f"{ratio(t['10 trivial stacks, cdk-nag'], t['trivial'])} | - | "
        f"medians {med['10 trivial stacks, cdk-nag']:.1f} s / {med['trivial']:.1f} s |",
        "| synth: 10 teams / that floor (what our constructs, templates and SpotTraining pack add) | "
        f"{ratio(t['10 teams'], t['10 trivial stacks, cdk-nag'])} | - | "
        f"medians {med['10 teams']:.1f} s / {med['10 trivial stacks, cdk-nag']:.1f} s |",
        "| synth without aws-cdk-lib's built-in CloudFormation validation (`CDK_VALIDATION=false`): 10 teams / "
        f"trivial | {ratio(t['10 teams, no validation'], t['trivial, no validation'])} | - | medians "
        f"{med['10 teams, no validation']:.1f} s / {med['trivial, no validation']:.1f} s; the validation costs "
        f"{med['trivial'] - med['trivial, no validation']:.1f} s in the trivial app, "
        f"{med['10 teams'] - med['10 teams, no validation']:.1f} s in ours |",
        "| synth: 10 teams with aws-cdk-lib's CloudFormation validator in the jsii kernel (the app before "
        "`cfn_validate/`) / with its engine in a worker process (what cdk.json runs) | "
        f"{ratio(t['10 teams, validator in the kernel'], t['10 teams'])} | - | "
        f"medians {med['10 teams, validator in the kernel']:.1f} s / {med['10 teams']:.1f} s |",
        f"| synth: 10 teams as cdk.json runs the app (`python3 -O`) / with plain `python3` | "
        f"{ratio(t['10 teams'], t['10 teams, plain python3'])} | - | "
        f"medians {med['10 teams']:.1f} s / {med['10 teams, plain python3']:.1f} s |",
        "| CPU time of the validator worker (`cfn_validate/`) starting and checking the 10 teams' "
        f"{len(templates)} templates: node's default V8 flags / `{' '.join(cfn_validate.V8_FLAGS)}` (what the app "
        f"runs) | {ratio(cpu['default'], cpu['flags'])} | - | medians {cpu_med['default']:.1f} s / "
        f"{cpu_med['flags']:.1f} s of CPU (user + system), the same report on both sides; the worker shares the 2 "
        "cores with the app and the jsii kernel |",
    ]


def worker_cpu(templates: list[Path], v8_flags: tuple[str, ...]) -> tuple[float, Any]:
    """CPU seconds (user + system) of a validator worker that starts and checks ``templates`` once, as a synth's,
    and its report."""
    process = cfn_validate.start_engine(v8_flags=v8_flags)
    if process is None or process.stdin is None or process.stdout is None:
        raise SystemExit("the validator's engine is not in the venv: run `make run-deps`")
    stacks = [(t.name.removesuffix(".template.json"), str(t), None, None) for t in templates]
    process.stdin.write(cfn_validate.request(stacks) + "\n")
    process.stdin.flush()
    answer = json.loads(process.stdout.readline() or "{}")
    process.stdin.close()
    process.stdout.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if "report" not in answer or process.returncode != 0:
        raise SystemExit(f"the validator worker failed (exit {process.returncode}): {answer.get('error', answer)}")
    return usage.ru_utime + usage.ru_stime, answer["report"]


# ---------------------------------------------------------------------------------------------------- checkpoints
# The example's model and settings (examples/digits/train.py: MLP 64-64-10, SGD with momentum, batches of 32, one
# torch thread) in one process, in blocks of BLOCK_S seconds, ABBA: the helper saving every 1 s, then no helper at
# all. Short interleaved blocks in one process cancel most of the shared machine's drift, which separate runs of a
# few seconds each do not (2 s blocks still gave pair ratios of 0.7-1.3 here).
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


def bench_transfer(work: Path, reps: int, sizes_mib: list[int]) -> list[str]:
    sys.path.insert(0, str(BOOTSTRAP))
    from spot_training.agent import checkpoint_store
    from spot_training.agent.checkpoint_store import CheckpointStore

    parallel = checkpoint_store.TRANSFER
    serial = TransferConfig(
        multipart_threshold=parallel.multipart_threshold, multipart_chunksize=parallel.multipart_chunksize,
        max_concurrency=1,
    )  # fmt: skip

    rows = []
    with fast_ranges.moto_server() as (host, port):  # ranged GETs read only their range (moto: the whole object)
        s3 = boto3.client(
            "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
            aws_access_key_id="bench", aws_secret_access_key="bench",  # noqa: S106 - moto accepts any
        )  # fmt: skip
        s3.create_bucket(Bucket="bench")
        single = TransferConfig(use_threads=False)
        for size in sizes_mib:
            src = work / f"ckpt-{size}.bin"
            with open(src, "wb") as f:
                for _ in range(size):
                    f.write(os.urandom(2**20))
            store = CheckpointStore(s3, "bench", f"job/ckpt-{size}/", "job", lambda _: None)
            step = iter(range(1, 10**6))

            def agent_up(store: Any = store, src: Path = src, step: Any = step) -> float:
                started = time.monotonic()
                store.upload(next(step), {"state.pt": str(src)}, "step")
                return time.monotonic() - started

            def plain_up(src: Path = src, size: int = size) -> float:
                started = time.monotonic()
                s3.upload_file(str(src), "bench", f"plain/{size}", Config=single)
                return time.monotonic() - started

            def agent_serial_up(agent_up: Callable[[], float] = agent_up) -> float:
                checkpoint_store.TRANSFER = serial  # the agent's upload with one connection, everything else the same
                try:
                    return agent_up()
                finally:
                    checkpoint_store.TRANSFER = parallel

            sides: dict[str, Callable[[], float]] = {"agent": agent_up, "boto3": plain_up}
            if size == max(sizes_mib):
                sides["agent, 1 connection"] = agent_serial_up
            up = alternate(sides, reps)
            newest = store.complete_steps()[0]
            sizes = store.listing()[newest]

            def agent_down(store: Any = store, newest: int = newest, sizes: Any = sizes) -> float:
                dest = Path(tempfile.mkdtemp(dir=work))
                started = time.monotonic()
                store.download_verified(newest, sizes, str(dest))
                took = time.monotonic() - started
                shutil.rmtree(dest)
                return took

            def plain_down(size: int = size) -> float:
                dest = work / "plain.bin"
                started = time.monotonic()
                s3.download_file("bench", f"plain/{size}", str(dest), Config=single)
                took = time.monotonic() - started
                dest.unlink()
                return took

            down = alternate({"agent": agent_down, "boto3": plain_down}, reps)
            src.unlink()
            mib_s = size / statistics.median(up["agent"])
            rows.append(
                f"| transfer {size} MiB upload: single-stream boto3 time / agent time | "
                f"{ratio(up['boto3'], up['agent'])} | goal >= 1.0 | agent {mib_s:.0f} MiB/s incl. sha256 + manifest |"
            )
            rows.append(
                f"| transfer {size} MiB download: single-stream boto3 time / agent time | "
                f"{ratio(down['boto3'], down['agent'])} | goal >= 1.0 | agent checks each part's sha256 as it "
                "streams in |"
            )
            if "agent, 1 connection" in up:
                rows.append(
                    f"| transfer {size} MiB upload: agent with 1 connection / agent with {parallel.max_concurrency} "
                    f"(time) | {ratio(up['agent, 1 connection'], up['agent'])} | - | what parallelism buys on "
                    f"loopback: client, moto and sha256 share 2 cores; on S3 each connection is capped (item 4) |"
                )
            s3.delete_object(Bucket="bench", Key=f"plain/{size}")
            store.prune(0)
    return rows


# ---------------------------------------------------------------------------------------------------- notice, boot
def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """median (min-max)."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def bench_notice(work: Path, reps: int, sizes_mib: list[int]) -> tuple[list[str], dict[str, float]]:
    """Items 4 and 5: markdown sections, and this run's medians for the cost model (largest size)."""
    sys.path.insert(0, str(BOOTSTRAP))
    from spot_training.agent.aws_config import TRANSFER

    transfer = TRANSFER
    notices: dict[int, list[notice.NoticeTimes]] = {s: [] for s in sizes_mib}
    boots: dict[int, list[notice.BootPhases]] = {s: [] for s in sizes_mib}
    with fast_ranges.moto_server() as (_, port):
        cloud = notice.Emulated(f"http://localhost:{port}", work / "nodes")
        for rep in range(reps):
            for size in sizes_mib if rep % 2 == 0 else reversed(sizes_mib):
                times, phases = notice.run(cloud, size)
                notices[size].append(times)
                boots[size].append(phases)

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
    ]
    for size in sizes_mib:
        runs = notices[size]
        save = statistics.median(r.save_s for r in runs)
        projected = (
            REAL_POLL_S
            + save
            + notice.projected_upload_s(size, part_mib, transfer.max_concurrency, PER_CONNECTION_MB_S)
        )
        one = REAL_POLL_S + save + notice.projected_upload_s(size, part_mib, 1, PER_CONNECTION_MB_S)
        lines.append(
            f"| {size} MiB | {spread([r.total_s for r in runs])} s | "
            f"{spread([100 * r.total_s / NOTICE_S for r in runs], '{:.1f}%')} | "
            f"{statistics.median(r.detect_s for r in runs):.1f} / {save:.1f} / "
            f"{statistics.median(r.upload_s for r in runs):.1f} s | {projected:.1f} s | "
            f"{100 * projected / NOTICE_S:.1f}% | {one:.1f} s |"
        )
    lines += [
        "",
        f"Projection: the agent's real {REAL_POLL_S:g} s metadata poll (worst case) + the save measured here + the "
        f"upload at {PER_CONNECTION_MB_S:g} MB/s per connection, {part_mib} MiB parts, {transfer.max_concurrency} "
        "in flight (the agent's TransferConfig; one request below the multipart threshold). The per-connection "
        f"figure is the low end of AWS's guidance, \"one concurrent request for each 85-90 MB/s of desired network "
        f"throughput\" ({PER_CONNECTION_SOURCE}). Not modelled: the instance's network cap and EBS write speed "
        "(the save here is to local disk), TLS.",
        "",
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
    for size in sizes_mib:
        booted = boots[size]
        shares = [statistics.median(100 * b.phases[p] / b.total_s for b in booted) for p in notice.PHASES]
        lines.append(
            f"| {size} MiB | {spread([b.total_s for b in booted])} s | "
            + " | ".join(f"{x:.0f}%" for x in shares)
            + " |"
        )
    big = max(sizes_mib)
    measured = {
        "size_mib": float(big),
        "checkpoint_cost_s": statistics.median(r.save_s + r.upload_s for r in notices[big]),
        "emergency_s": statistics.median(r.total_s for r in notices[big]),
        "restart_s": statistics.median(r.total_s for r in boots[big]),
    }
    return [*lines, ""], measured


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


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} cores ({cpu or platform.machine()}), {system}"


def replace_section(text: str, heading: str, section: str) -> str:
    """``text`` with its ``heading`` section (up to the next ``## `` heading) replaced by ``section``, or with
    ``section`` appended when it has none."""
    lines = text.splitlines()
    if heading not in lines:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), "", *lines[end:]]).rstrip("\n") + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="runs of items 4-5 (default 3)")
    # item 1's goal sits near its bound on this machine: more repetitions for a steadier median (about 45 s each)
    p.add_argument("--synth-reps", type=int, default=5, help="repetitions of each synth side (default 5)")
    # one 1 GiB download took 0.65-1.38 of single-stream boto3's time within one run: 3 repetitions did not settle it
    p.add_argument("--transfer-reps", type=int, default=5, help="repetitions of each transfer side (default 5)")
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[100, 1024], help="transfer sizes (MiB)")
    p.add_argument(
        "--notice-sizes-mib", type=int, nargs="+", default=[10, 100, 1024], help="checkpoint sizes of items 4-6"
    )
    p.add_argument("--discount", type=float, default=SPOT_DISCOUNT, help="spot discount of the cost model (0-1)")
    p.add_argument("--control-plane-nodes", type=int, nargs="+", default=[4, 16, 32], help="node counts of item 7")
    parts = ["synth", "overhead", "transfer", "notice", "control-plane"]
    p.add_argument("--only", choices=parts, action="append", help="run only these (notice: items 4-6)")
    args = p.parse_args()
    only = set(args.only or parts)
    started = time.monotonic()
    rows: list[str] = []
    sections: list[str] = []
    took: dict[str, float] = {}

    def part(name: str) -> bool:
        """Whether to run ``name``; records how long the previous part took."""
        took[name] = time.monotonic()
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
        part("end")
    if only == {"control-plane"} and RESULTS.exists():
        text = replace_section(RESULTS.read_text(), "## Control plane", "\n".join(control))
        RESULTS.write_text(text)
        print(text)
        return 0
    marks = list(took.items())
    durations = ", ".join(
        f"{name} {end - begin:.0f} s" for (name, begin), (_, end) in itertools.pairwise(marks) if name in only
    )
    table = ["| what | ratio | goal | notes |", "|---|---|---|---|", *rows, ""] if rows else []
    text = "\n".join(
        [
            "# Benchmark results",
            "",
            f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {machine()}.",
            f"Each ratio is the median of {args.reps} alternated repetitions ({args.synth_reps} for synth, "
            f"{args.transfer_reps} for transfers; a row "
            "may say otherwise), with "
            f"the range in brackets; the whole run took {time.monotonic() - started:.0f} s ({durations}). The "
            "machine is shared (other jobs run on the same cores), so absolute times are noisy; the ratios compare "
            "sides run alternately in this run.",
            "",
            *table,
            *sections,
        ]
    )
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
