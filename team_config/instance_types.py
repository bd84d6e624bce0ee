"""The EC2 instance types a team file may name, and what the checks need to know of each, kept in a text file.

``ec2_instance_types.txt`` lists botocore's instance types for the pinned version (the names a team file may use),
one per line, with facts from moto's copy of ``DescribeInstanceTypes`` (``moto/ec2/resources/instance_types.json.gz``):
CPU architecture, vCPUs, GPUs (a fractional GPU, as on g6f, counts as the one device it shows), whether the type
launches into a cluster placement group, whether it is sold as spot, and its Elastic Fabric Adapter (EFA) interfaces
(``NetworkInfo.EfaInfo.MaximumEfaInterfaces``, 0 where ``EfaSupported`` is false) and network cards
(``NetworkInfo.MaximumNetworkCards``). A type botocore knows but moto does not has
``-`` in every fact column: its facts are unknown and the checks that need them skip it.

Read from the text file (a few milliseconds) instead of botocore's EC2 model at every synth (a fraction of a second);
moto is a dev dependency only. After upgrading boto3 or moto, regenerate it:
``.venv/bin/python -m team_config.instance_types``; a test fails while the file and botocore or moto disagree.
"""

from __future__ import annotations

import difflib
import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

TYPES_FILE = Path(__file__).resolve().parent / "ec2_instance_types.txt"
REGENERATE = ".venv/bin/python -m team_config.instance_types"
COLUMNS = ("type", "architecture", "vcpus", "gpus", "cluster_placement", "spot", "efa", "network_cards", "gpu")
UNKNOWN = "-"


@dataclass(frozen=True)
class InstanceFacts:
    """What EC2's DescribeInstanceTypes says of one type (as moto records it)."""

    architecture: str  # x86_64, arm64, or arm64_mac / x86_64_mac for EC2 Mac
    vcpus: int
    gpus: int  # 0: no GPU
    gpu: str  # manufacturer and model, e.g. "NVIDIA A10G"; "" without a GPU
    cluster_placement: bool  # launches into a cluster placement group
    spot: bool  # sold as spot
    efa_interfaces: int = 0  # most EFA interfaces an instance takes; 0: no EFA
    network_cards: int = 1

    @property
    def efa_layout(self) -> int:
        """EFA interfaces a node of this type gets: one per network card, as many as the type allows."""
        return min(self.efa_interfaces, self.network_cards)

    def describe_gpus(self) -> str:
        return f"{self.gpus} {self.gpu}" if self.gpus else "no GPU"


def _yes(value: str) -> bool:
    return value == "yes"


@functools.cache
def instance_facts() -> dict[str, Optional[InstanceFacts]]:
    """Every type the pinned botocore knows; None where moto has no facts of it."""
    out: dict[str, Optional[InstanceFacts]] = {}
    for line in TYPES_FILE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, arch, vcpus, gpus, cluster, spot, efa, cards, gpu = line.split(None, len(COLUMNS) - 1)
        out[name] = (
            None
            if arch == UNKNOWN
            else InstanceFacts(
                architecture=arch,
                vcpus=int(vcpus),
                gpus=int(gpus),
                gpu="" if gpu == UNKNOWN else gpu,
                cluster_placement=_yes(cluster),
                spot=_yes(spot),
                efa_interfaces=int(efa),
                network_cards=int(cards),
            )
        )
    return out


@functools.cache
def known_instance_types() -> frozenset[str]:
    return frozenset(instance_facts())


def closest_instance_type(name: str) -> Optional[str]:
    """The known type ``name`` is most likely a typo of (case aside), or None: for a "did you mean"."""
    close = difflib.get_close_matches(name.lower(), known_instance_types(), n=1)
    return close[0] if close else None


def botocore_instance_types() -> tuple[str, list[str]]:
    """(botocore version, its EC2 ``InstanceType`` enum, sorted)."""
    import botocore
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    return botocore.__version__, sorted(model.shape_for("InstanceType").enum)


def facts_of(described: dict[str, Any]) -> InstanceFacts:
    """The facts of one ``DescribeInstanceTypes`` entry."""
    arches = described["ProcessorInfo"]["SupportedArchitectures"]
    gpus = described.get("GpuInfo", {}).get("Gpus", [])
    network = described.get("NetworkInfo", {})
    return InstanceFacts(
        architecture="x86_64" if "x86_64" in arches else arches[0],  # i386 types run x86_64 too
        vcpus=int(described["VCpuInfo"]["DefaultVCpus"]),
        # A fractional GPU (g6f: Count 0, GpuPartitionSize 0.125) is one device to CUDA: LogicalGpuCount 1.
        gpus=sum(max(int(g.get("Count", 0)), int(g.get("LogicalGpuCount", 0))) for g in gpus),
        gpu=", ".join(sorted({f"{g.get('Manufacturer', '')} {g.get('Name', '')}".strip() for g in gpus})),
        cluster_placement="cluster" in described.get("PlacementGroupInfo", {}).get("SupportedStrategies", []),
        spot="spot" in described.get("SupportedUsageClasses", []),
        efa_interfaces=int(network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0))
        if network.get("EfaSupported")
        else 0,
        network_cards=int(network.get("MaximumNetworkCards", 1)),
    )


def moto_instance_facts() -> tuple[str, dict[str, InstanceFacts]]:
    """(moto version, the facts of every type in moto's instance type data); moto is a dev dependency."""
    import moto

    path = Path(moto.__file__).resolve().parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        described = json.load(f)
    return moto.__version__, {name: facts_of(d) for name, d in described.items()}


def render(botocore_version: str, types: list[str], moto_version: str, facts: dict[str, InstanceFacts]) -> str:
    """The text of ``ec2_instance_types.txt``: botocore's ``types`` with moto's ``facts`` (``-`` where unknown)."""
    widths = (max(map(len, types)), 12, 5, 4, 17, 4, 3, 13)
    rows: list[tuple[str, ...]] = [("# " + COLUMNS[0], *COLUMNS[1:])]
    for name in types:
        f = facts.get(name)
        if f is None:
            rows.append((name, *[UNKNOWN] * (len(COLUMNS) - 1)))
        else:
            yes = {True: "yes", False: "no"}
            rows.append(
                (
                    name,
                    f.architecture,
                    str(f.vcpus),
                    str(f.gpus),
                    yes[f.cluster_placement],
                    yes[f.spot],
                    str(f.efa_interfaces),
                    str(f.network_cards),
                    f.gpu or "-",
                )
            )
    lines = [
        f"# EC2 instance types of botocore {botocore_version}, with facts from moto {moto_version}'s instance type "
        f"data ({UNKNOWN}: moto lacks the type)",
        f"# regenerate: {REGENERATE}",
    ]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines) + "\n"


def main() -> None:
    version, types = botocore_instance_types()
    moto_version, facts = moto_instance_facts()
    TYPES_FILE.write_text(render(version, types, moto_version, facts))
    unknown = sum(1 for t in types if t not in facts)
    print(
        f"{TYPES_FILE}: {len(types)} instance types of botocore {version}, facts from moto {moto_version} "
        f"({unknown} unknown to moto)"
    )


if __name__ == "__main__":
    main()
