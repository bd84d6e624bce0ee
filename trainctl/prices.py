"""Prices ``trainctl cost`` and ``trainctl review`` need: on-demand list prices (a small table), spot prices (EC2).

The on-demand table is data with a source and a date, not a measurement: Linux, us-east-1, USD per instance-hour
as listed on https://aws.amazon.com/ec2/pricing/on-demand/ . Prices change (AWS cut P4/P5 prices by up to 45 % in
June 2025); pass ``--prices FILE`` (YAML or JSON: ``{instance_type: usd_per_hour}``) with your region's current
list prices, e.g. from ``aws pricing get-products --service-code AmazonEC2 --region us-east-1``. Spot prices are
never from this table: they come from EC2's spot price history for the instance's type and AZ.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import yaml

from team_config.instance_types import closest_instance_type, known_instance_types
from team_config.loader import ConfigError, UniqueKeyLoader
from team_config.text import not_utf8

TABLE_REGION = "us-east-1"
SOURCE = f"https://aws.amazon.com/ec2/pricing/on-demand/ (Linux, {TABLE_REGION})"
AS_OF = "2026-11-23"
# instance type: (on-demand USD per hour, GPUs). P-family values are list prices before the June 2025 cut
# (BEFORE_CUT): outputs that use them say so.
ON_DEMAND: dict[str, tuple[float, int]] = {
    "g4dn.xlarge": (0.526, 1),
    "g4dn.2xlarge": (0.752, 1),
    "g5.xlarge": (1.006, 1),
    "g5.2xlarge": (1.212, 1),
    "g5.12xlarge": (5.672, 4),
    "g6.xlarge": (0.8048, 1),
    "g6.2xlarge": (0.9776, 1),
    "p4d.24xlarge": (32.7726, 8),
    "p4de.24xlarge": (40.9657, 8),
    "p5.48xlarge": (98.32, 8),
}
BEFORE_CUT = frozenset({"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"})
# gp3 volumes (warm pools), us-east-1, USD per month: storage per GB, and IOPS and throughput provisioned above the
# 3,000 IOPS and 125 MB/s every volume includes, as listed on https://aws.amazon.com/ebs/pricing/ (read here on
# 2026-11-28 from a page quoting it, saisci.com's "gp2 vs gp3 Cost Comparison": no internet on this machine).
GP3_SOURCE = "https://aws.amazon.com/ebs/pricing/ (gp3, us-east-1)"
GP3_GB_MONTH, GP3_IOPS_MONTH, GP3_MBPS_MONTH = 0.08, 0.005, 0.04
GP3_INCLUDED_IOPS, GP3_INCLUDED_MBPS = 3000, 125


def gp3_monthly(size_gib: float, iops: float = GP3_INCLUDED_IOPS, throughput: float = GP3_INCLUDED_MBPS) -> float:
    """USD per month of one gp3 volume, attached or not (a volume is billed from its creation to its deletion)."""
    return (
        size_gib * GP3_GB_MONTH
        + max(iops - GP3_INCLUDED_IOPS, 0) * GP3_IOPS_MONTH
        + max(throughput - GP3_INCLUDED_MBPS, 0) * GP3_MBPS_MONTH
    )


BEFORE_CUT_NOTE = "list price before the June 2025 cut; pass --prices FILE with current prices"


class PriceError(Exception):
    """A one-line reason (unreadable price file, no price for a type)."""


@dataclass(frozen=True)
class PriceTable:
    on_demand: Mapping[str, float]
    gpus: Mapping[str, int]
    source: str
    from_file: frozenset[str] = frozenset()  # the types whose price a --prices file gave

    def from_table(self, instance_type: str) -> bool:
        """Whether the type's on-demand price is the built-in table's (us-east-1), not the --prices file's."""
        return instance_type not in self.from_file

    def before_cut(self, instance_type: str) -> bool:
        """Whether the type's price is the table's list price from before the June 2025 P-family price cut."""
        return instance_type in BEFORE_CUT and self.from_table(instance_type)

    def on_demand_price(self, instance_type: str) -> float:
        if instance_type not in self.on_demand:
            raise PriceError(
                f"no on-demand price for {instance_type} (source: {self.source}); "
                "pass --prices FILE with a line '<type>: <USD per hour>'"
            )
        return self.on_demand[instance_type]


def read_price_file(path: Path) -> dict[str, float]:
    """A YAML/JSON mapping of instance type to USD per hour, checked."""
    try:
        data: Any = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except ConfigError as exc:  # a type priced twice
        raise PriceError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise PriceError(f"{path}: {not_utf8(exc)}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise PriceError(f"{path}: cannot read prices ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise PriceError(f"{path}: expected a mapping of instance type to USD per hour, e.g. 'g5.xlarge: 1.006'")
    known = known_instance_types()
    for key, value in data.items():
        if str(key) not in known:  # a typo would silently leave the built-in price in use
            guess = closest_instance_type(str(key))
            hint = f"; did you mean {guess}?" if guess else "; use the EC2 name, e.g. g5.xlarge"
            raise PriceError(f"{path}: {key}: not an EC2 instance type{hint}")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise PriceError(f"{path}: {key}: price must be a positive number of USD per hour, got {value!r}")
        if not math.isfinite(value):  # YAML reads .nan and .inf as floats
            raise PriceError(f"{path}: {key}: price must be a finite number of USD per hour, got {value!r}")
    return {str(k): float(v) for k, v in data.items()}


def load_prices(path: Optional[Path] = None) -> PriceTable:
    """The built-in table, with the types in ``path`` (YAML/JSON ``{type: usd_per_hour}``) added or replaced."""
    on_demand = {t: p for t, (p, _) in ON_DEMAND.items()}
    gpus = {t: g for t, (_, g) in ON_DEMAND.items()}
    if path is None:
        return PriceTable(on_demand, gpus, f"{SOURCE}, as of {AS_OF}")
    given = read_price_file(path)
    on_demand.update(given)
    return PriceTable(on_demand, gpus, f"{path} (and {SOURCE}, as of {AS_OF}, for other types)", frozenset(given))


def spot_history(client: Any, instance_type: str, az: str, start: datetime, end: datetime) -> list[tuple[float, float]]:
    """EC2's spot price history for one type in one AZ: (timestamp s, USD/h), oldest first, covering [start, end]."""
    pages = (
        client("ec2")
        .get_paginator("describe_spot_price_history")
        .paginate(
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            AvailabilityZone=az,
            StartTime=start,
            EndTime=end,
        )
    )
    points = {
        (p["Timestamp"].timestamp(), float(p["SpotPrice"]))
        for page in pages
        for p in page["SpotPriceHistory"]
        if p.get("AvailabilityZone", az) == az and p.get("InstanceType", instance_type) == instance_type
    }
    return sorted(points)


def average_price(history: list[tuple[float, float]], start: float, end: float) -> Optional[float]:
    """Time-weighted mean price over [start, end]; a price holds from its timestamp until the next one.

    None when the history has no price in effect at ``start`` or later within the interval.
    """
    if not history:
        return None
    times = [t for t, _ in history]
    i = max(bisect.bisect_right(times, start) - 1, 0)  # the price in effect at start (or the first one after it)
    if end <= start:
        return history[i][1]
    total, covered = 0.0, 0.0
    for j in range(i, len(history)):
        seg_start = max(history[j][0], start)
        seg_end = min(history[j + 1][0] if j + 1 < len(history) else end, end)
        if seg_end > seg_start:
            total += history[j][1] * (seg_end - seg_start)
            covered += seg_end - seg_start
    return total / covered if covered else history[i][1]
