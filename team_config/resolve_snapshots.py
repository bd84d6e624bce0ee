"""Resolve warm-pool ``ami_id`` values to their root snapshot and write ``snapshot_id`` into the team file.

Usage: ``python -m team_config.resolve_snapshots teams/<team>.yaml [--region REGION]``

Synth never calls AWS: this one-off helper does (with your credentials, in the region the team
deploys to), and the result is committed with the team file, so reviewers see the snapshot id
in the diff. Comments and layout of the file are kept: a ``snapshot_id:`` line is inserted under
each ``ami_id:`` line that lacks one. Exit 0 when the file is resolved, 2 with a one-line reason
otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

AMI_LINE = re.compile(r"^(?P<indent>\s*)ami_id:\s*(?P<ami>ami-[0-9a-f]+)\s*(#.*)?$")


def root_snapshot(ec2: Any, ami_id: str) -> str:
    images = ec2.describe_images(ImageIds=[ami_id])["Images"]
    if not images:
        raise LookupError(f"AMI {ami_id} not found in this region")
    image = images[0]
    for mapping in image.get("BlockDeviceMappings", []):
        if mapping.get("DeviceName") == image.get("RootDeviceName") and "SnapshotId" in mapping.get("Ebs", {}):
            return str(mapping["Ebs"]["SnapshotId"])
    raise LookupError(f"AMI {ami_id} has no EBS root snapshot (instance-store AMI?)")


def pools_to_resolve(text: str) -> list[str]:
    """AMI ids of warm pools that have an ami_id and no snapshot_id."""
    doc = yaml.safe_load(text) or {}
    amis = []
    for cluster in doc.get("clusters", []) or []:
        pool = (cluster or {}).get("warm_pool") or {}
        if pool.get("ami_id") and not pool.get("snapshot_id"):
            amis.append(pool["ami_id"])
    return amis


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def resolve_text(text: str, snapshots: dict[str, str], when: str) -> str:
    """Insert ``snapshot_id:`` after each ``ami_id:`` line whose mapping has none."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        match = AMI_LINE.match(line.rstrip("\n"))
        if not match or match["ami"] not in snapshots:
            continue
        indent = match["indent"]
        siblings = []
        for following in lines[i + 1 :]:
            if following.strip() and len(_indent(following)) < len(indent):
                break  # the warm_pool mapping ends here
            if _indent(following) == indent:
                siblings.append(following.strip())
        if not any(key.startswith("snapshot_id:") for key in siblings):
            out.append(f"{indent}snapshot_id: {snapshots[match['ami']]}  # root snapshot of {match['ami']}, {when}\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("team_file", type=Path)
    parser.add_argument("--region", help="region the team deploys to (default: your AWS configuration)")
    args = parser.parse_args(argv)
    import boto3  # only this helper talks to AWS; synth never does
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        text = args.team_file.read_text(encoding="utf-8")
        amis = sorted(set(pools_to_resolve(text)))
        if not amis:
            print(f"{args.team_file}: nothing to resolve (every warm pool has a snapshot_id)")
            return 0
        ec2 = boto3.client("ec2", region_name=args.region)
        region = ec2.meta.region_name
        snapshots = {ami: root_snapshot(ec2, ami) for ami in amis}
    except (OSError, yaml.YAMLError, LookupError, BotoCoreError, ClientError) as exc:
        print(f"error: {args.team_file}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    args.team_file.write_text(resolve_text(text, snapshots, f"resolved in {region}"), encoding="utf-8")
    for ami, snap in snapshots.items():
        print(f"{args.team_file}: {ami} -> {snap} ({region})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
