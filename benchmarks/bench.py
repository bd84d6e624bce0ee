"""``make bench``: ratios measured side by side in one run, written to ``benchmarks/RESULTS.md``.

The machines are shared and noisy, so every figure is a ratio of two sides run alternately (ABAB..., the order
flipped each repetition), reported as the median of the per-repetition ratios with their range. Never run by
``make test``.

1. synth: ``npx cdk synth`` of 10 teams x 2 clusters vs a trivial CDK app with one bucket; 1 team vs 10 teams.
2. checkpoint overhead: the example trainer's training-loop steps/s with the checkpoint helper saving every 1 s
   vs never (the helper's snapshot + asynchronous write; the upload is the agent's, in another process).
3. checkpoint transfer: the node agent's upload/download (parallel, multipart, sha256 manifest) vs a single-stream
   boto3 ``upload_file``/``download_file`` (``use_threads=False``), same moto endpoint on loopback.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
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
from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "bootstrap_scripts"
CDK = REPO / "node_modules" / ".bin" / "cdk"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
TRIVIAL_APP = """
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
app = App()
s3.Bucket(Stack(app, "Trivial"), "Bucket")
app.synth()
"""


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
def bench_synth(work: Path, reps: int) -> list[str]:
    env = dict(os.environ, JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1", CDK_DISABLE_VERSION_CHECK="1")
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    team = yaml.safe_load((REPO / "teams" / "default.yaml").read_text())
    team["clusters"] = [dict(team["clusters"][0], name=n) for n in ("main", "dev")]
    dirs = {}
    for count in (1, 10):
        d = work / f"teams-{count}"
        d.mkdir()
        for i in range(count):
            (d / f"{'default' if i == 0 else f'team{i}'}.yaml").write_text(yaml.safe_dump(team))
        dirs[count] = d
    trivial = work / "trivial"
    trivial.mkdir()
    (trivial / "app.py").write_text(TRIVIAL_APP)
    (trivial / "cdk.json").write_text('{"app": "python3 app.py"}')

    def ours(count: int) -> Callable[[], float]:
        args = [str(CDK), "synth", "--quiet", "--no-notices", "-c", f"teams_dir={dirs[count]}"]
        return lambda: timed([*args, "-o", str(work / f"out-{count}")], REPO, env)

    sides = {
        "trivial": lambda: timed([str(CDK), "synth", "--quiet", "--no-notices", "-o", "out"], trivial, env),
        "1 team": ours(1),
        "10 teams": ours(10),
    }
    t = alternate(sides, reps)
    med = {k: statistics.median(v) for k, v in t.items()}
    return [
        f"| synth: 10 teams x 2 clusters / trivial app (1 bucket) | {ratio(t['10 teams'], t['trivial'])} | "
        f"goal <= 1.5 | medians {med['10 teams']:.1f} s / {med['trivial']:.1f} s |",
        f"| synth: 10 teams / 1 team | {ratio(t['10 teams'], t['1 team'])} | - | "
        f"medians {med['10 teams']:.1f} s / {med['1 team']:.1f} s |",
    ]


# ---------------------------------------------------------------------------------------------------- checkpoints
def _steps_per_s(work: Path, interval_s: str, epochs: int) -> float:
    ckpt = Path(tempfile.mkdtemp(dir=work))
    env = dict(os.environ, PYTHONPATH=str(BOOTSTRAP), SPOT_TRAINING_CHECKPOINT_DIR=str(ckpt))
    env["SPOT_TRAINING_CHECKPOINT_INTERVAL_S"] = interval_s
    out = subprocess.run(  # noqa: S603 - our argv
        [sys.executable, str(REPO / "examples" / "digits" / "train.py"), "--epochs", str(epochs)],
        env=env, cwd=work, capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    shutil.rmtree(ckpt)
    m = re.search(r"training loop: (\d+) steps in ([0-9.]+) s", out)
    assert m, out
    return int(m.group(1)) / float(m.group(2))


def bench_checkpoint_overhead(work: Path, reps: int) -> list[str]:
    epochs = 200
    rates = alternate(
        {"every 1 s": lambda: _steps_per_s(work, "1", epochs), "never": lambda: _steps_per_s(work, "1e9", epochs)},
        reps,
    )
    med = {k: statistics.median(v) for k, v in rates.items()}
    return [
        f"| checkpoint overhead: steps/s saving every 1 s / never (example MLP, {epochs} epochs, 1 process) | "
        f"{ratio(rates['every 1 s'], rates['never'])} | goal >= 0.98 | "
        f"medians {med['every 1 s']:.0f} / {med['never']:.0f} steps/s |"
    ]


def bench_transfer(work: Path, reps: int, sizes_mib: list[int]) -> list[str]:
    sys.path.insert(0, str(BOOTSTRAP))
    from node_agent import CheckpointStore

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    rows = []
    try:
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

            up = alternate({"agent": agent_up, "boto3": plain_up}, reps)
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
                f"{ratio(down['boto3'], down['agent'])} | goal >= 1.0 | agent verifies sha256 after download |"
            )
            s3.delete_object(Bucket="bench", Key=f"plain/{size}")
            store.prune(0)
    finally:
        server.stop()
    return rows


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} cores ({cpu or platform.machine()}), {system}"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="repetitions of each side (default 3)")
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[100, 1024], help="checkpoint sizes (MiB)")
    p.add_argument("--only", choices=["synth", "overhead", "transfer"], action="append", help="run only these")
    args = p.parse_args()
    only = set(args.only or ["synth", "overhead", "transfer"])
    started = time.monotonic()
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        if "synth" in only:
            rows += bench_synth(work, args.reps)
        if "overhead" in only:
            rows += bench_checkpoint_overhead(work, args.reps)
        if "transfer" in only:
            rows += bench_transfer(work, args.reps, args.sizes_mib)
    text = "\n".join(
        [
            "# Benchmark results",
            "",
            f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {machine()}.",
            f"Each ratio is the median of {args.reps} alternated repetitions, with the range in brackets; "
            f"the whole run took {time.monotonic() - started:.0f} s.",
            "",
            "| what | ratio | goal | notes |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
