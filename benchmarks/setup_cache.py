"""Item 8 of ``make bench``: a node booting onto the cluster's warm volume, from its start to its trainer's first
step, with the job's setup cached on the volume (as a replacement finds it) vs the same volume empty (cold).

The real node agent (``user_data.sh`` -> ``node_agent.py`` -> ``torchrun``) against moto on loopback, the bootstrap
tests' harness; a one-node cluster with a warm pool of one volume, which the emulated cloud gives a directory
(``SPOT_TRAINING_WARM_VOLUME_DIRS``). The job's setup (``tests/wheelhouse.py``) builds a virtual environment in its
cache directory and installs a small wheel from the code archive's wheelhouse into it; the trainer imports it and
prints its first step. Per repetition one warm and one cold boot, the order flipped each time (a fresh job each,
the cold one on an empty volume directory); the ratio is warm / cold, the median of the repetitions with their
range. Times are the node's own: from starting its user data to its trainer's first line on its console.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import time
import uuid
from pathlib import Path

from team_config.naming import POOL_TAG
from tests.bootstrap.conftest import Clients, Cluster, Node, address_map, loopback, moto_with_fake_credentials
from tests.wheelhouse import IMPORT_FROM_SETUP, wheel_files

TRAIN = IMPORT_FROM_SETUP + 'print("step 1 epoch 0 loss 0.0 wheel", tinypkg.VALUE, flush=True)\n'
FIRST_STEP = "step 1 epoch 0 loss 0.0 wheel"
SETUP_CACHE_HEADING = "## 8. Replacement boot to first step: setup cached on the warm volume vs cold"


def boot_to_first_step(cluster: Cluster, volumes: Path, host: int) -> tuple[float, str]:
    """Submit a fresh job, boot one node with ``volumes`` standing for the warm volumes; (seconds from its start to
    its trainer's first step, its console)."""
    job_id = f"bench-{uuid.uuid4().hex[:8]}"
    cluster.submit(job_id, {"train.py": TRAIN, **wheel_files()}, "python train.py", setup="setup.sh")
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=1)
    [(instance_id, ip)] = cluster.instances()
    node = Node(cluster, instance_id, ip, loopback(host))
    env = {"SPOT_TRAINING_WARM_VOLUME_MOUNT": "0", "SPOT_TRAINING_WARM_VOLUME_DIRS": str(volumes)}
    started = time.monotonic()
    node.start(address_map([node]), **env)
    took = next((time.monotonic() - started for line in node.lines(total=300) if FIRST_STEP in line), None)
    code = node.wait(timeout=120)
    node.stop()
    if took is None or code != 0:
        raise AssertionError(f"no first step (exit code {code}):\n{node.text}")
    return took, node.text


def measure(root: Path, reps: int) -> list[tuple[float, float]]:
    """(warm s, cold s) per repetition."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with moto_with_fake_credentials() as endpoint:
        aws = Clients(endpoint)
        pool = f"pool-{uuid.uuid4().hex[:8]}"
        tags = [{"ResourceType": "volume", "Tags": [{"Key": POOL_TAG, "Value": pool}]}]
        volume = aws.ec2.create_volume(AvailabilityZone="us-east-1a", Size=8, TagSpecifications=tags)["VolumeId"]
        warm_pool = {"tag_key": POOL_TAG, "pool": pool, "device_name": "/dev/sdf", "volumes": [volume]}
        cluster = Cluster(aws, root / "nodes", 1, warm_pool=warm_pool)
        warm, hosts = root / "warm-volumes", iter(range(20, 250))
        _, console = boot_to_first_step(cluster, warm, next(hosts))  # primes the warm side's cache
        assert "setup: done; cached" in console, console
        pairs = []
        for rep in range(reps):
            cold = root / f"cold-volumes-{rep}"
            sides = {"warm": warm, "cold": cold}
            order = ["warm", "cold"] if rep % 2 == 0 else ["cold", "warm"]
            took = {}
            for side in order:
                took[side], console = boot_to_first_step(cluster, sides[side], next(hosts))
                skipped = "setup: cached on the warm volume" in console
                assert skipped == (side == "warm"), f"{side} boot:\n{console}"
            shutil.rmtree(cold, ignore_errors=True)
            pairs.append((took["warm"], took["cold"]))
    return pairs


def section(pairs: list[tuple[float, float]]) -> list[str]:
    ratios = [w / c for w, c in pairs]
    warm, cold = statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs)
    return [
        SETUP_CACHE_HEADING,
        "",
        "A node booting onto the cluster's one warm volume, from its start to its trainer's first step; the job's",
        "setup builds a virtual environment and installs a wheel from the code archive's wheelhouse into it",
        "(`tests/wheelhouse.py`). Warm: the volume holds that setup's cache (as a replacement finds it), the setup is",
        f"skipped; cold: the volume is empty, the setup runs. {len(pairs)} alternated repetitions "
        "(`benchmarks/setup_cache.py`).",
        "",
        "| warm (median) | cold (median) | warm / cold (median) | range |",
        "|---|---|---|---|",
        f"| {warm:.2f} s | {cold:.2f} s | {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |",
        "",
    ]


def bench_setup_cache(work: Path, reps: int) -> list[str]:
    return section(measure(work / "setup-cache", reps))
