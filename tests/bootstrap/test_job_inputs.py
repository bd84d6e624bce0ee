"""The job's data inputs on a node: fetched in ranges, checked, kept by difference (ETag and size), objects gone from
S3 removed, the job's path a link to the store."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from spot_training.agent import job_inputs
from spot_training.agent.errors import AgentError
from spot_training.agent.job_inputs import InputSync, store_dir, sync_inputs

from .conftest import Clients


def _bucket(aws: Clients, objects: dict[str, bytes]) -> str:
    bucket = f"data-{uuid.uuid4().hex[:8]}"
    aws.s3.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        aws.s3.put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def _never() -> None:
    return None


def test_an_input_is_fetched_then_refreshed_by_difference(aws: Clients, tmp_path: Path) -> None:
    bucket = _bucket(aws, {"ds/a.bin": b"a" * 10, "ds/sub/b.bin": b"b" * 20, "ds/c.bin": b"c", "other/x": b"x"})
    store = str(tmp_path / "store")
    first = InputSync(aws.s3, f"s3://{bucket}/ds", store, _never)
    first.sync()
    assert (first.fetched, first.kept, first.removed) == (3, 0, 0)
    assert (tmp_path / "store" / "sub" / "b.bin").read_bytes() == b"b" * 20
    assert not (tmp_path / "store" / "x").exists()

    aws.s3.put_object(Bucket=bucket, Key="ds/a.bin", Body=b"A" * 11)  # changed
    aws.s3.delete_object(Bucket=bucket, Key="ds/c.bin")  # gone
    aws.s3.put_object(Bucket=bucket, Key="ds/d.bin", Body=b"d")  # new
    again = InputSync(aws.s3, f"s3://{bucket}/ds/", store, _never)
    again.sync()
    assert (again.fetched, again.kept, again.removed) == (2, 1, 1)
    assert (tmp_path / "store" / "a.bin").read_bytes() == b"A" * 11
    assert not (tmp_path / "store" / "c.bin").exists()
    assert sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file()) == ["a.bin", "b.bin", "d.bin"]


def test_a_file_changed_on_the_node_is_fetched_again(aws: Clients, tmp_path: Path) -> None:
    bucket = _bucket(aws, {"ds/a.bin": b"abc"})
    store = tmp_path / "store"
    InputSync(aws.s3, f"s3://{bucket}/ds", str(store), _never).sync()
    (store / "a.bin").write_bytes(b"abcdef")  # not the size S3 lists: not kept
    sync = InputSync(aws.s3, f"s3://{bucket}/ds", str(store), _never)
    sync.sync()
    assert (sync.fetched, sync.kept) == (1, 0) and (store / "a.bin").read_bytes() == b"abc"


def test_a_big_object_comes_in_ranges_and_is_checked(
    aws: Clients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = os.urandom(3000)
    bucket = _bucket(aws, {"ds/big": body})
    monkeypatch.setattr(job_inputs, "TRANSFER", type("T", (), {"multipart_chunksize": 1000, "max_concurrency": 4}))
    ranges: list[tuple[int, int]] = []
    sync = InputSync(aws.s3, f"s3://{bucket}/ds", str(tmp_path / "store"), _never)
    get_range = sync.download.get_range

    def counted(key: str, path: str, start: int, length: int, *rest: Any) -> Any:
        ranges.append((start, length))
        return get_range(key, path, start, length, *rest)

    monkeypatch.setattr(sync.download, "get_range", counted)
    sync.sync()
    assert sorted(ranges) == [(0, 1000), (1000, 1000), (2000, 1000)]
    assert hashlib.sha256((tmp_path / "store" / "big").read_bytes()).digest() == hashlib.sha256(body).digest()


def test_content_that_fails_its_md5_check_is_refused(
    aws: Clients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = _bucket(aws, {"ds/a.bin": b"abc"})
    listing = job_inputs.listing

    def wrong_etag(*args: Any) -> Any:
        return {rel: ('"' + "0" * 32 + '"', size) for rel, (_, size) in listing(*args).items()}

    monkeypatch.setattr(job_inputs, "listing", wrong_etag)
    with pytest.raises(AgentError, match=r"^input s3://.*/ds: a.bin fails its MD5 check against its ETag$"):
        InputSync(aws.s3, f"s3://{bucket}/ds", str(tmp_path / "store"), _never).sync()
    assert not (tmp_path / "store" / "a.bin").exists()


def test_inputs_are_linked_into_place_and_logged(aws: Clients, tmp_path: Path) -> None:
    bucket = _bucket(aws, {"ds/a.bin": b"abc"})
    lines: list[str] = []
    url = f"s3://{bucket}/ds"
    volume, root = tmp_path / "vol", tmp_path / "root"
    for _ in range(2):
        sync_inputs(
            aws.s3, [{"s3": url, "path": "/data/x"}], str(root), str(volume), str(tmp_path), lines.append, _never
        )
    assert (root / "data" / "x" / "a.bin").read_bytes() == b"abc"
    assert os.readlink(root / "data" / "x") == store_dir(url, str(volume), str(tmp_path))
    assert lines == [
        f"input {url} -> /data/x: 1 object(s) fetched, 0 kept on the warm volume, 0 removed",
        f"input {url} -> /data/x: 0 object(s) fetched, 1 kept on the warm volume, 0 removed",
    ]


def _sync_without_volume(aws: Clients, url: str, path: str, tmp_path: Path) -> None:
    """``sync_inputs`` of one input on a node rooted at ``tmp_path/root`` without a warm volume."""
    sync_inputs(aws.s3, [{"s3": url, "path": path}], str(tmp_path / "root"), None, str(tmp_path), print, _never)


def test_a_directory_in_the_way_is_refused(aws: Clients, tmp_path: Path) -> None:
    bucket = _bucket(aws, {"ds/a.bin": b"abc"})
    (tmp_path / "root" / "data" / "x").mkdir(parents=True)
    with pytest.raises(AgentError, match="exists on this node and is no link the agent made"):
        _sync_without_volume(aws, f"s3://{bucket}/ds", "/data/x", tmp_path)


def test_a_link_the_agent_did_not_make_is_left_alone(aws: Clients, tmp_path: Path) -> None:
    """An input path naming a system link (``/usr/bin/python3`` is one on many images) is refused, not replaced."""
    bucket = _bucket(aws, {"ds/a.bin": b"abc"})
    (tmp_path / "root" / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "root" / "usr" / "bin" / "python3").symlink_to("python3.11")
    with pytest.raises(AgentError, match="is a link on this node that the agent did not make"):
        _sync_without_volume(aws, f"s3://{bucket}/ds", "/usr/bin/python3", tmp_path)
    assert os.readlink(tmp_path / "root" / "usr" / "bin" / "python3") == "python3.11"


def test_a_path_given_another_input_links_to_the_new_store(aws: Clients, tmp_path: Path) -> None:
    bucket = _bucket(aws, {"one/a.bin": b"one", "two/a.bin": b"two"})
    root = tmp_path / "root"
    for prefix in ("one", "two"):
        _sync_without_volume(aws, f"s3://{bucket}/{prefix}", "/data/x", tmp_path)
    assert (root / "data" / "x" / "a.bin").read_bytes() == b"two"


def test_a_sync_cut_off_mid_way_fetches_the_files_it_was_changing_again(
    aws: Clients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a sync is about to change leave its record first: if it is cut off (a notice, a failed object),
    the next sync fetches them again even when S3 lists what the old record said."""
    bucket = _bucket(aws, {"ds/a.bin": b"old"})
    store = tmp_path / "store"
    InputSync(aws.s3, f"s3://{bucket}/ds", str(store), _never).sync()
    aws.s3.put_object(Bucket=bucket, Key="ds/a.bin", Body=b"new")
    cut = InputSync(aws.s3, f"s3://{bucket}/ds", str(store), _never)

    def cut_off(rels: list[str], wanted: Any) -> None:
        (store / "a.bin").write_bytes(b"new")  # in place, but the sync never finished
        raise AgentError("spot interruption notice during input download")

    monkeypatch.setattr(cut, "fetch", cut_off)
    with pytest.raises(AgentError):
        cut.sync()
    monkeypatch.undo()
    aws.s3.put_object(Bucket=bucket, Key="ds/a.bin", Body=b"old")  # S3 back to what the first record said
    again = InputSync(aws.s3, f"s3://{bucket}/ds", str(store), _never)
    again.sync()
    assert (again.fetched, again.kept) == (1, 0) and (store / "a.bin").read_bytes() == b"old"
