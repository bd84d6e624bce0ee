"""Item 3 of ``make bench``: the node agent's checkpoint upload/download (parallel, multipart / ranged GETs, sha256
manifest) vs a single-stream boto3 ``upload_file``/``download_file`` (``use_threads=False``), same moto endpoint on
loopback; and the agent with one connection vs its default, for what parallelism buys here."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig

from benchmarks import BOOTSTRAP, fast_ranges
from benchmarks.report import alternate, ratio

BUCKET = "bench"
SINGLE_STREAM = TransferConfig(use_threads=False)


def checkpoint_store_module() -> Any:
    """The node agent's ``spot_training.agent.checkpoint_store``, imported from ``bootstrap_scripts/``."""
    sys.path.insert(0, str(BOOTSTRAP))
    from spot_training.agent import checkpoint_store

    return checkpoint_store


def one_connection(parallel: TransferConfig) -> TransferConfig:
    """``parallel`` with one connection: the same parts, one at a time."""
    return TransferConfig(
        multipart_threshold=parallel.multipart_threshold, multipart_chunksize=parallel.multipart_chunksize,
        max_concurrency=1,
    )  # fmt: skip


def random_file(path: Path, size_mib: int) -> Path:
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(2**20))
    return path


def upload_sides(
    s3: Any, store_module: Any, store: Any, src: Path, size: int, serial: bool
) -> dict[str, Callable[[], float]]:
    """The agent's upload and single-stream boto3's, timed; with ``serial``, the agent's with one connection too."""
    step = iter(range(1, 10**6))
    parallel = store_module.TRANSFER

    def agent_up() -> float:
        started = time.monotonic()
        store.upload(next(step), {"state.pt": str(src)}, "step")
        return time.monotonic() - started

    def plain_up() -> float:
        started = time.monotonic()
        s3.upload_file(str(src), BUCKET, f"plain/{size}", Config=SINGLE_STREAM)
        return time.monotonic() - started

    def agent_serial_up() -> float:
        store_module.TRANSFER = one_connection(parallel)  # the agent's upload with one connection, all else the same
        try:
            return agent_up()
        finally:
            store_module.TRANSFER = parallel

    sides: dict[str, Callable[[], float]] = {"agent": agent_up, "boto3": plain_up}
    if serial:
        sides["agent, 1 connection"] = agent_serial_up
    return sides


def download_sides(s3: Any, store: Any, work: Path, size: int) -> dict[str, Callable[[], float]]:
    """The agent's verified download of the newest checkpoint and single-stream boto3's of the same bytes, timed."""
    newest = store.complete_steps()[0]
    sizes = store.listing()[newest]

    def agent_down() -> float:
        dest = Path(tempfile.mkdtemp(dir=work))
        started = time.monotonic()
        store.download_verified(newest, sizes, str(dest))
        took = time.monotonic() - started
        shutil.rmtree(dest)
        return took

    def plain_down() -> float:
        dest = work / "plain.bin"
        started = time.monotonic()
        s3.download_file(BUCKET, f"plain/{size}", str(dest), Config=SINGLE_STREAM)
        took = time.monotonic() - started
        dest.unlink()
        return took

    return {"agent": agent_down, "boto3": plain_down}


def transfer_rows(size: int, up: dict[str, list[float]], down: dict[str, list[float]], concurrency: int) -> list[str]:
    mib_s = size / statistics.median(up["agent"])
    rows = [
        f"| transfer {size} MiB upload: single-stream boto3 time / agent time | "
        f"{ratio(up['boto3'], up['agent'])} | goal >= 1.0 | agent {mib_s:.0f} MiB/s incl. sha256 + manifest |",
        f"| transfer {size} MiB download: single-stream boto3 time / agent time | "
        f"{ratio(down['boto3'], down['agent'])} | goal >= 1.0 | agent checks each part's sha256 as it "
        "streams in |",
    ]
    if "agent, 1 connection" in up:
        rows.append(
            f"| transfer {size} MiB upload: agent with 1 connection / agent with {concurrency} "
            f"(time) | {ratio(up['agent, 1 connection'], up['agent'])} | - | what parallelism buys on "
            f"loopback: client, moto and sha256 share 2 cores; on S3 each connection is capped (item 4) |"
        )
    return rows


def bench_size(s3: Any, work: Path, reps: int, size: int, serial: bool) -> list[str]:
    """The rows of one checkpoint size; with ``serial``, the agent with one connection as a third upload side."""
    store_module = checkpoint_store_module()
    src = random_file(work / f"ckpt-{size}.bin", size)
    store = store_module.CheckpointStore(s3, BUCKET, f"job/ckpt-{size}/", "job", lambda _: None)
    up = alternate(upload_sides(s3, store_module, store, src, size, serial), reps)
    down = alternate(download_sides(s3, store, work, size), reps)
    src.unlink()
    rows = transfer_rows(size, up, down, store_module.TRANSFER.max_concurrency)
    s3.delete_object(Bucket=BUCKET, Key=f"plain/{size}")
    store.prune(0)
    return rows


def bench_transfer(work: Path, reps: int, sizes_mib: list[int]) -> list[str]:
    """Item 3's table rows, for each size in ``sizes_mib``; the largest also with the agent on one connection."""
    rows = []
    with fast_ranges.moto_server() as (host, port):  # ranged GETs read only their range (moto: the whole object)
        s3 = boto3.client(
            "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
            aws_access_key_id="bench", aws_secret_access_key="bench",  # noqa: S106 - moto accepts any
        )  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        for size in sizes_mib:
            rows += bench_size(s3, work, reps, size, serial=size == max(sizes_mib))
    return rows
