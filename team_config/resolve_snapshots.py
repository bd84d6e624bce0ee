"""Resolve warm-pool ``ami_id`` values to their root snapshot and write ``snapshot_id`` into the team file.

Usage: ``.venv/bin/python -m team_config.resolve_snapshots teams/<team>.yaml [--region REGION]``

Synth never calls AWS: this one-off helper does (with your credentials, in the region the team
deploys to), and the result is committed with the team file, so reviewers see the snapshot id
in the diff. Run it again after changing an ``ami_id``: a ``snapshot_id`` that is not the root snapshot of
its pool's ``ami_id`` (an AMI upgraded by editing only that line) is replaced. Comments and layout of the file
are kept: a ``snapshot_id:`` line is written next to each block-style ``ami_id:`` line (the value quoted or not).
A pool written otherwise (flow style, ``warm_pool: {size: 2, ami_id: ...}``) is not rewritten: one line per such
cluster says how to write it, or which ``snapshot_id`` to set by hand. Refused too: a root snapshot this account
cannot create volumes from (a shared or public AMI whose snapshot is not shared), and a ``volume_size_gib``
below the snapshot's size (EBS would refuse both at deploy). Exit 0 when the file is resolved, 2 with a one-line
reason per problem otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from team_config.model import WarmPoolConfig
from team_config.text import not_utf8

AMI_LINE = re.compile(r"""^(?P<indent>\s*)ami_id:\s*(?P<q>["']?)(?P<ami>ami-[0-9a-f]+)(?P=q)\s*(#.*)?$""")
# What the helper writes after a snapshot_id: the loader reads it back to catch an ami_id changed without running
# the helper again.
RESOLVED_COMMENT = re.compile(r"#\s*root snapshot of (?P<ami>ami-[0-9a-f]+)(, resolved in (?P<region>[a-z0-9-]+))?")
SNAPSHOT_VALUE = re.compile(r"""snapshot_id:\s*["']?(?P<snap>snap-[0-9a-f]+)""")
DEFAULT_VOLUME_GIB: int = WarmPoolConfig.model_fields["volume_size_gib"].default


class TeamFileError(Exception):
    """The team file is not shaped like one (a list at the top, ``clusters:`` not a list, ...): one line."""


@dataclass(frozen=True)
class Root:
    snapshot_id: str
    size_gib: int


@dataclass(frozen=True)
class Pool:
    cluster: str  # clusters[i] (name)
    ami: str
    snapshot_id: Optional[str]
    volume_size_gib: int


def root_snapshot(ec2: Any, ami_id: str) -> Root:
    """The AMI's root snapshot, if this account can create volumes from it (else a one-line LookupError)."""
    images = ec2.describe_images(ImageIds=[ami_id])["Images"]
    if not images:
        raise LookupError(f"AMI {ami_id} not found in this region")
    image = images[0]
    for mapping in image.get("BlockDeviceMappings", []):
        if mapping.get("DeviceName") == image.get("RootDeviceName") and "SnapshotId" in mapping.get("Ebs", {}):
            snapshot_id = str(mapping["Ebs"]["SnapshotId"])
            break
    else:
        raise LookupError(f"AMI {ami_id} has no EBS root snapshot (instance-store AMI?)")
    # DescribeSnapshots leaves out a snapshot the account has no access to: an AMI shared or made public launches,
    # but its snapshot need not be shared, and CreateVolume needs it to be.
    try:
        found = ec2.describe_snapshots(SnapshotIds=[snapshot_id])["Snapshots"]
    except ec2.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "InvalidSnapshot.NotFound":
            raise
        found = []
    if not found:
        raise LookupError(
            f"AMI {ami_id}'s root snapshot {snapshot_id} is not shared with this account, so no volume can be created "
            f"from it (a shared or public AMI); copy the AMI into this account (aws ec2 copy-image --source-image-id "
            f"{ami_id} --source-region <region> --name <name>) and use the copy's id as ami_id"
        )
    return Root(snapshot_id, int(found[0].get("VolumeSize") or 0))


def pools_with_ami(text: str) -> list[Pool]:
    """Every warm pool that has an ami_id, with its snapshot_id (None: none yet) and volume size."""
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
        if pool.get("ami_id"):
            snapshot, size = pool.get("snapshot_id"), pool.get("volume_size_gib", DEFAULT_VOLUME_GIB)
            found.append(
                Pool(
                    f"clusters[{i}] ({cluster.get('name')})",
                    str(pool["ami_id"]),
                    str(snapshot) if snapshot else None,
                    size if isinstance(size, int) else DEFAULT_VOLUME_GIB,  # a bad size is the loader's to report
                )
            )
    return found


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _sibling_keys(lines: list[str], i: int) -> dict[str, int]:
    """The keys of the block mapping that holds line ``i`` (a key at its indent), by name, with their line index."""
    indent = _indent(lines[i])

    def inside(line: str) -> bool:
        text = line.strip()
        return not text or text.startswith("#") or len(_indent(line)) >= len(indent)

    start = i
    while start > 0 and inside(lines[start - 1]):
        start -= 1
    end = i + 1
    while end < len(lines) and inside(lines[end]):
        end += 1
    keys: dict[str, int] = {}
    for j in range(start, end):
        text = lines[j].strip()
        if _indent(lines[j]) == indent and text and not text.startswith("#") and ":" in text:
            keys.setdefault(text.split(":", 1)[0].strip("\"' "), j)
    return keys


def _names_another(line: str, snapshot: str, ami: str) -> bool:
    """Whether a ``snapshot_id:`` line names another snapshot, or this helper's comment on it another AMI (one
    registered again from the same snapshot: the comment is what synth checks)."""
    value, comment = SNAPSHOT_VALUE.search(line), RESOLVED_COMMENT.search(line)
    return value is None or value["snap"] != snapshot or (comment is not None and comment["ami"] != ami)


def resolve_text(text: str, snapshots: dict[str, str], when: str) -> str:
    """Write ``snapshot_id:`` next to each ``ami_id:`` line: after it when its mapping has none, in place of the
    mapping's ``snapshot_id:`` line when that names another snapshot."""
    lines = text.splitlines(keepends=True)
    after: dict[int, str] = {}
    for i, line in enumerate(lines):
        match = AMI_LINE.match(line.rstrip("\n"))
        if not match or match["ami"] not in snapshots:
            continue
        snapshot = snapshots[match["ami"]]
        written = f"{match['indent']}snapshot_id: {snapshot}  # root snapshot of {match['ami']}, {when}\n"
        at = _sibling_keys(lines, i).get("snapshot_id")
        if at is None:
            after[i] = written
        elif _names_another(lines[at], snapshot, match["ami"]):
            lines[at] = written
    return "".join(line + after.get(i, "") for i, line in enumerate(lines))


def _lookup(node: Optional[yaml.Node], key: str) -> Optional[yaml.Node]:
    """``key``'s value in a composed mapping, through its merge keys (``<<: *base``) as YAML merges them: a key
    written in the mapping wins, then the merged mappings in order."""
    if not isinstance(node, yaml.MappingNode):
        return None
    merged: list[yaml.Node] = []
    for k, v in node.value:
        if k.tag == "tag:yaml.org,2002:merge":
            merged.extend(v.value if isinstance(v, yaml.SequenceNode) else [v])
        elif isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return next((found for base in merged if (found := _lookup(base, key)) is not None), None)


def _warm_pool_nodes(root: Optional[yaml.Node]) -> list[tuple[int, yaml.Node]]:
    """(index, node) of each cluster's ``warm_pool`` block, as the YAML composer sees the file."""
    clusters = _lookup(root, "clusters")
    if not isinstance(clusters, yaml.SequenceNode):
        return []
    pools = [(i, _lookup(cluster, "warm_pool")) for i, cluster in enumerate(clusters.value)]
    return [(i, pool) for i, pool in pools if pool is not None]


def _resolved_comments(text: str) -> list[tuple[int, str, str, re.Match[str]]]:
    """(cluster index, ami_id, snapshot_id, this helper's comment on it) of each warm pool that has the comment."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    lines = text.splitlines()
    found = []
    for i, pool in _warm_pool_nodes(root):
        ami, snapshot = _lookup(pool, "ami_id"), _lookup(pool, "snapshot_id")  # a merged one's line has its comment
        if not (isinstance(ami, yaml.ScalarNode) and isinstance(snapshot, yaml.ScalarNode)):
            continue
        end = snapshot.end_mark
        resolved = RESOLVED_COMMENT.search(lines[end.line][end.column :]) if end.line < len(lines) else None
        if resolved:
            found.append((i, ami.value, snapshot.value, resolved))
    return found


def stale_snapshot_ids(text: str, path: Path) -> list[str]:
    """One line per warm pool whose ``snapshot_id`` carries this helper's comment naming another AMI than the
    pool's ``ami_id``: someone edited that line alone to change the AMI, and the volumes would still copy the old
    AMI's root under nodes that boot the new one (synth cannot ask AWS; the comment says what was resolved)."""
    return [
        f"clusters[{i}].warm_pool.snapshot_id {snapshot} is the root snapshot of {resolved['ami']} (its "
        f"comment says so), but ami_id is {ami}: the volumes would copy the old AMI under nodes booting "
        f"the new one; run `.venv/bin/python -m team_config.resolve_snapshots {path}` to replace it"
        for i, ami, snapshot, resolved in _resolved_comments(text)
        if resolved["ami"] != ami
    ]


def snapshots_out_of_region(text: str, path: Path, zones: dict[int, list[str]]) -> list[str]:
    """One line per warm pool of a cluster with ``capacity.zones`` (``zones``: cluster index -> its zones) whose
    ``snapshot_id`` this helper resolved in another region than the zones': EBS creates a volume only from a snapshot
    of its own region, so the deploy would fail on every zone's volumes."""
    problems = []
    for i, ami, snapshot, resolved in _resolved_comments(text):
        region = zones[i][0][:-1] if i in zones else None
        if region is not None and resolved["region"] not in (None, region):
            problems.append(
                f"clusters[{i}].warm_pool.snapshot_id {snapshot} is in {resolved['region']} (its comment says so), "
                f"but capacity.zones are in {region}: a zone's warm volumes need a snapshot in its region; copy "
                f"{ami} to {region} (aws ec2 copy-image), set ami_id to the copy and run "
                f"`.venv/bin/python -m team_config.resolve_snapshots {path} --region {region}`"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("team_file", type=Path)
    parser.add_argument("--region", help="region the team deploys to (default: your AWS configuration)")
    args = parser.parse_args(argv)
    import boto3  # only this helper talks to AWS; synth never does
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        text = args.team_file.read_text(encoding="utf-8")
        pools = pools_with_ami(text)
        if not pools:
            print(f"{args.team_file}: nothing to resolve (no warm pool has an ami_id)")
            return 0
        ec2 = boto3.client("ec2", region_name=args.region)
        region = ec2.meta.region_name
        roots = {ami: root_snapshot(ec2, ami) for ami in sorted({pool.ami for pool in pools})}
    except UnicodeDecodeError as exc:
        print(f"error: {args.team_file}: {not_utf8(exc)}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError, TeamFileError, LookupError, BotoCoreError, ClientError) as exc:
        print(f"error: {args.team_file}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    resolved = resolve_text(text, {ami: root.snapshot_id for ami, root in roots.items()}, f"resolved in {region}")
    try:  # what the rewrite reached, read back as YAML: only the block-style lines AMI_LINE knows
        after = pools_with_ami(resolved)
    except (yaml.YAMLError, TeamFileError):
        resolved, after = text, pools  # never write a file the rewrite broke
    if resolved != text:
        args.team_file.write_text(resolved, encoding="utf-8")
    problems = 0
    for before, now in zip(pools, after, strict=True):
        root = roots[before.ami]
        if now.snapshot_id != root.snapshot_id:
            problems += 1
            print(
                f"error: {args.team_file}: {before.cluster}: warm_pool.ami_id {before.ami} is not written as a line "
                f"`ami_id: {before.ami}` under `warm_pool:` (block style), so its snapshot_id was not written; write "
                f"it so and run this again, or set `snapshot_id: {root.snapshot_id}` in the warm_pool by hand",
                file=sys.stderr,
            )
            continue
        if before.snapshot_id != now.snapshot_id:
            replaced = f", replacing {before.snapshot_id}" if before.snapshot_id else ""
            print(f"{args.team_file}: {before.cluster}: {before.ami} -> {root.snapshot_id} ({region}{replaced})")
        if now.volume_size_gib < root.size_gib:
            problems += 1
            print(
                f"error: {args.team_file}: {before.cluster}: warm_pool.volume_size_gib {now.volume_size_gib} is "
                f"smaller than {before.ami}'s root snapshot ({root.size_gib} GiB), and EBS cannot create a volume "
                f"smaller than its snapshot; set volume_size_gib: {root.size_gib} or more",
                file=sys.stderr,
            )
    if not problems and resolved == text:
        print(f"{args.team_file}: nothing to change (every warm pool's snapshot_id is its ami_id's root snapshot)")
    elif not problems and all(b.snapshot_id == a.snapshot_id for b, a in zip(pools, after, strict=True)):
        print(f"{args.team_file}: the snapshots were right; their comments now name each pool's ami_id")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
