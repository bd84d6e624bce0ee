"""Resolve warm-pool ``ami_id`` values to their root snapshot and write ``snapshot_id`` into the team file.

Usage: ``.venv/bin/python -m team_config.resolve_snapshots teams/<team>.yaml [--region REGION]``

Synth never calls AWS: this one-off helper does (with your credentials, in the region the team
deploys to), and the result is committed with the team file, so reviewers see the snapshot id
in the diff. Comments and layout of the file are kept: a ``snapshot_id:`` line is inserted under
each block-style ``ami_id:`` line (the value quoted or not) that lacks one. A pool written otherwise
(flow style, ``warm_pool: {size: 2, ami_id: ...}``) is not rewritten: one line per such cluster says
how to write it, or which ``snapshot_id`` to add by hand. Exit 0 when the file is resolved, 2 with a
one-line reason per problem otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from team_config.text import not_utf8

AMI_LINE = re.compile(r"""^(?P<indent>\s*)ami_id:\s*(?P<q>["']?)(?P<ami>ami-[0-9a-f]+)(?P=q)\s*(#.*)?$""")


class TeamFileError(Exception):
    """The team file is not shaped like one (a list at the top, ``clusters:`` not a list, ...): one line."""


def root_snapshot(ec2: Any, ami_id: str) -> str:
    images = ec2.describe_images(ImageIds=[ami_id])["Images"]
    if not images:
        raise LookupError(f"AMI {ami_id} not found in this region")
    image = images[0]
    for mapping in image.get("BlockDeviceMappings", []):
        if mapping.get("DeviceName") == image.get("RootDeviceName") and "SnapshotId" in mapping.get("Ebs", {}):
            return str(mapping["Ebs"]["SnapshotId"])
    raise LookupError(f"AMI {ami_id} has no EBS root snapshot (instance-store AMI?)")


def pools_to_resolve(text: str) -> list[tuple[str, str]]:
    """(cluster, AMI id) of every warm pool that has an ami_id and no snapshot_id; cluster: ``clusters[i] (name)``."""
    doc = yaml.safe_load(text) or {}
    if not isinstance(doc, dict):
        raise TeamFileError(f"expected a mapping of keys (clusters:, network:, ...), got {type(doc).__name__}")
    clusters = doc.get("clusters") or []
    if not isinstance(clusters, list):
        raise TeamFileError(f"clusters: expected a list of clusters (- name: ...), got {type(clusters).__name__}")
    found = []
    for i, cluster in enumerate(clusters):
        if not isinstance(cluster, dict):
            raise TeamFileError(f"clusters[{i}]: expected a mapping (name:, instance_types:, ...), got {cluster!r}")
        pool = cluster.get("warm_pool") or {}
        if not isinstance(pool, dict):
            raise TeamFileError(f"clusters[{i}].warm_pool: expected a mapping (size:, ami_id:, ...), got {pool!r}")
        if pool.get("ami_id") and not pool.get("snapshot_id"):
            found.append((f"clusters[{i}] ({cluster.get('name')})", str(pool["ami_id"])))
    return found


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
        pools = pools_to_resolve(text)
        if not pools:
            print(f"{args.team_file}: nothing to resolve (every warm pool has a snapshot_id)")
            return 0
        ec2 = boto3.client("ec2", region_name=args.region)
        region = ec2.meta.region_name
        snapshots = {ami: root_snapshot(ec2, ami) for ami in sorted({ami for _, ami in pools})}
    except UnicodeDecodeError as exc:
        print(f"error: {args.team_file}: {not_utf8(exc)}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError, TeamFileError, LookupError, BotoCoreError, ClientError) as exc:
        print(f"error: {args.team_file}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    resolved = resolve_text(text, snapshots, f"resolved in {region}")
    try:  # what the rewrite reached, read back as YAML: only the block-style lines AMI_LINE knows
        left = pools_to_resolve(resolved)
    except (yaml.YAMLError, TeamFileError):
        resolved, left = text, pools  # never write a file the rewrite broke
    if resolved != text:
        args.team_file.write_text(resolved, encoding="utf-8")
    for cluster, ami in pools:
        if (cluster, ami) not in left:
            print(f"{args.team_file}: {cluster}: {ami} -> {snapshots[ami]} ({region})")
    for cluster, ami in left:
        print(
            f"error: {args.team_file}: {cluster}: warm_pool.ami_id {ami} is not written as a line `ami_id: {ami}` "
            f"under `warm_pool:` (block style), so no snapshot_id was added; write it so and run this again, or add "
            f"`snapshot_id: {snapshots[ami]}` to the warm_pool by hand",
            file=sys.stderr,
        )
    return 2 if left else 0


if __name__ == "__main__":
    sys.exit(main())
