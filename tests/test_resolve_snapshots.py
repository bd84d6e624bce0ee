"""AMI id -> root snapshot, written into the team file by a helper (never at synth)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from emulator import http_serving
from team_config import ConfigError, load_team
from team_config.resolve_snapshots import main, resolve_text, stale_snapshot_ids

TEAM = """\
# research team
clusters:
  - name: main          # the big one
    instance_types: [g5.xlarge, g5.2xlarge]
    max_nodes: 2
    warm_pool:
      size: 2
      ami_id: {ami}     # our training AMI
      volume_size_gib: 100
  - name: other
    instance_types: [g5.xlarge, g5.2xlarge]
    max_nodes: 1
"""


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    saved = dict(os.environ)
    with http_serving.moto_in_thread() as endpoint:
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
        )
        os.environ.pop("AWS_PROFILE", None)
        try:
            yield endpoint
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_unresolved_ami_is_a_config_error_that_names_the_helper(tmp_path: Path) -> None:
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami="ami-0123456789abcdef0"))
    with pytest.raises(
        Exception,
        match=r"ami_id ami-0123456789abcdef0 is not resolved to its root snapshot yet; "
        r"run `.venv/bin/python -m team_config.resolve_snapshots <team file>`",
    ):
        load_team(path)


def test_helper_writes_the_root_snapshot_and_keeps_comments(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ec2 = boto3.client("ec2")
    base = ec2.describe_images()["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ami = ec2.create_image(InstanceId=instance, Name="training-ami")["ImageId"]
    [image] = ec2.describe_images(ImageIds=[ami])["Images"]
    expected = next(
        m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"] if m["DeviceName"] == image["RootDeviceName"]
    )

    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami=ami))
    assert main([str(path)]) == 0
    text = path.read_text()
    assert (
        f"      ami_id: {ami}     # our training AMI\n      snapshot_id: {expected}  # root snapshot of {ami}" in text
    )
    assert text.startswith("# research team\n") and "# the big one" in text
    assert load_team(path).config.clusters[0].warm_pool.snapshot_id == expected  # type: ignore[union-attr]
    assert f"{ami} -> {expected} (us-east-1)" in capsys.readouterr().out

    assert main([str(path)]) == 0, "second run: nothing left to resolve"
    assert path.read_text() == text


def test_unknown_ami_is_one_line_and_the_file_is_untouched(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami="ami-00000000000000000"))
    before = path.read_text()
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: ") and "\n" not in err and "ami-00000000000000000" in err
    assert path.read_text() == before


def _ami_and_root_snapshot() -> tuple[str, str]:
    ec2 = boto3.client("ec2")
    base = ec2.describe_images()["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ami = ec2.create_image(InstanceId=instance, Name=f"training-ami-{instance}")["ImageId"]
    [image] = ec2.describe_images(ImageIds=[ami])["Images"]
    return ami, next(
        m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"] if m["DeviceName"] == image["RootDeviceName"]
    )


@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_quoted_ami_id_is_resolved_too(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], quote: str
) -> None:
    ami, snapshot = _ami_and_root_snapshot()
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami=f"{quote}{ami}{quote}"))
    assert main([str(path)]) == 0
    assert load_team(path).config.clusters[0].warm_pool.snapshot_id == snapshot  # type: ignore[union-attr]
    assert capsys.readouterr().out == f"{path}: clusters[0] (main): {ami} -> {snapshot} (us-east-1)\n"


def test_a_pool_the_helper_cannot_rewrite_is_an_error_naming_the_cluster_and_the_snapshot(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flow-style pool was reported resolved (exit 0) and left as it was: synth kept asking for the helper."""
    ami, snapshot = _ami_and_root_snapshot()
    path = tmp_path / "research.yaml"
    flow = TEAM.format(ami=ami).replace(
        f"    warm_pool:\n      size: 2\n      ami_id: {ami}     # our training AMI\n      volume_size_gib: 100\n",
        f"    warm_pool: {{size: 2, ami_id: {ami}}}\n",
    )
    path.write_text(flow)
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert (out, path.read_text()) == ("", flow)  # no success line, nothing written
    assert err == (
        f"error: {path}: clusters[0] (main): warm_pool.ami_id {ami} is not written as a line `ami_id: {ami}` under "
        f"`warm_pool:` (block style), so its snapshot_id was not written; write it so and run this again, or "
        f"set `snapshot_id: {snapshot}` in the warm_pool by hand\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"- name: main\n", "expected a mapping of keys (clusters:, network:, ...), got list"),
        (b"clusters: main\n", "clusters: expected a list of clusters (- name: ...), got str"),
        (b"clusters:\n  - main\n", "clusters[0]: expected a mapping (name:, instance_types:, ...), got 'main'"),
        (b"# caf\xe9\nclusters: []\n", "not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8"),
    ],
)
def test_a_file_not_shaped_like_a_team_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "research.yaml"
    path.write_bytes(content)
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: {message}\n"
    assert path.read_bytes() == content


def test_a_changed_ami_is_refused_until_the_helper_replaces_its_snapshot(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Editing only the ami_id line kept the old AMI's snapshot: synth passed, and the helper said there was nothing
    to resolve, so the nodes booted the new AMI with the old one's environment mounted over it."""
    old, old_snapshot = _ami_and_root_snapshot()
    new, new_snapshot = _ami_and_root_snapshot()
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami=old))
    assert main([str(path)]) == 0
    path.write_text(path.read_text().replace(f"ami_id: {old}", f"ami_id: {new}"))
    capsys.readouterr()

    with pytest.raises(ConfigError) as refused:
        load_team(path)
    assert str(refused.value) == (
        f"{path}: clusters[0].warm_pool.snapshot_id {old_snapshot} is the root snapshot of {old} (its comment says "
        f"so), but ami_id is {new}: the volumes would copy the old AMI under nodes booting the new one; run "
        f"`.venv/bin/python -m team_config.resolve_snapshots {path}` to replace it"
    )

    assert main([str(path)]) == 0
    assert capsys.readouterr().out == (
        f"{path}: clusters[0] (main): {new} -> {new_snapshot} (us-east-1, replacing {old_snapshot})\n"
    )
    text = path.read_text()
    assert text.count("snapshot_id:") == 1 and old_snapshot not in text
    assert load_team(path).config.clusters[0].warm_pool.snapshot_id == new_snapshot  # type: ignore[union-attr]


def test_a_snapshot_line_above_the_ami_line_is_replaced_not_written_twice(aws: str, tmp_path: Path) -> None:
    ami, snapshot = _ami_and_root_snapshot()
    path = tmp_path / "research.yaml"
    path.write_text(
        TEAM.format(ami=ami).replace("      size: 2\n", "      size: 2\n      snapshot_id: snap-0123456789abcdef0\n")
    )
    assert main([str(path)]) == 0
    text = path.read_text()
    assert text.count("snapshot_id:") == 1 and "snap-0123456789abcdef0" not in text
    assert load_team(path).config.clusters[0].warm_pool.snapshot_id == snapshot  # type: ignore[union-attr]


def test_a_volume_smaller_than_the_snapshot_is_refused_with_the_size_to_set(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ami, snapshot = _ami_and_root_snapshot()
    [found] = boto3.client("ec2").describe_snapshots(SnapshotIds=[snapshot])["Snapshots"]
    size = found["VolumeSize"]
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami=ami).replace("volume_size_gib: 100", f"volume_size_gib: {size - 1}"))
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: clusters[0] (main): warm_pool.volume_size_gib {size - 1} is smaller than {ami}'s root "
        f"snapshot ({size} GiB), and EBS cannot create a volume smaller than its snapshot; set volume_size_gib: "
        f"{size} or more\n"
    )


def test_a_root_snapshot_the_account_cannot_see_is_refused_naming_copy_image(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A public or shared AMI launches, but its snapshot need not be shared: DescribeSnapshots leaves it out, and
    every CreateVolume of the pool would fail at deploy."""
    ami, snapshot = _ami_and_root_snapshot()
    make_client = boto3.client

    def client(*args: Any, **kwargs: Any) -> Any:
        made = make_client(*args, **kwargs)
        made.meta.events.register(
            "before-call.ec2.DescribeSnapshots", lambda **_: (SimpleNamespace(status_code=200), {"Snapshots": []})
        )  # what EC2 answers for a snapshot the account has no access to
        return made

    monkeypatch.setattr(boto3, "client", client)
    path = tmp_path / "research.yaml"
    path.write_text(TEAM.format(ami=ami))
    before = path.read_text()
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: AMI {ami}'s root snapshot {snapshot} is not shared with this account, so no volume can be "
        f"created from it (a shared or public AMI); copy the AMI into this account (aws ec2 copy-image "
        f"--source-image-id {ami} --source-region <region> --name <name>) and use the copy's id as ami_id\n"
    )
    assert path.read_text() == before


def test_an_ami_registered_again_from_the_same_snapshot_gets_its_comment_rewritten(tmp_path: Path) -> None:
    """An AMI registered again from the same snapshot (another boot mode, IMDS setting): synth refused the file
    (the comment named the old AMI) and the helper, seeing the right snapshot, left it as it was."""
    path = tmp_path / "research.yaml"
    text = TEAM.format(ami="ami-0000000000000000b").replace(
        "      volume_size_gib: 100\n",
        "      snapshot_id: snap-0000000000000000a  # root snapshot of ami-0000000000000000a, resolved in us-east-1\n"
        "      volume_size_gib: 100\n",
    )
    assert stale_snapshot_ids(text, path)  # refused at load
    resolved = resolve_text(text, {"ami-0000000000000000b": "snap-0000000000000000a"}, "resolved in us-east-1")
    assert stale_snapshot_ids(resolved, path) == []
    assert resolved.count("snapshot_id: snap-0000000000000000a  # root snapshot of ami-0000000000000000b") == 1


def test_a_pool_that_merges_a_resolved_snapshot_under_a_new_ami_is_refused(tmp_path: Path) -> None:
    """A second cluster's pool written ``<<: *pool`` with its own ami_id took the first one's snapshot and comment
    through the merge key: the check, reading only the keys written in each pool, let it through."""
    path = tmp_path / "research.yaml"
    path.write_text(
        "clusters:\n"
        "  - name: main\n"
        "    instance_types: [g5.xlarge, g5.2xlarge]\n"
        "    max_nodes: 2\n"
        "    warm_pool: &pool\n"
        "      size: 2\n"
        "      ami_id: ami-0000000000000000a\n"
        "      snapshot_id: snap-0000000000000000a  # root snapshot of ami-0000000000000000a, resolved in us-east-1\n"
        "  - name: other\n"
        "    instance_types: [g5.xlarge, g5.2xlarge]\n"
        "    max_nodes: 2\n"
        "    warm_pool:\n"
        "      <<: *pool\n"
        "      ami_id: ami-0000000000000000b\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_team(path)
    assert str(refused.value).startswith(
        f"{path}: clusters[1].warm_pool.snapshot_id snap-0000000000000000a is the root snapshot of "
        "ami-0000000000000000a (its comment says so), but ami_id is ami-0000000000000000b"
    )
