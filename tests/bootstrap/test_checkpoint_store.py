"""The checkpoint protocol against moto: manifest last, newest *complete* checkpoint restored, corrupt, partial and
foreign checkpoints refused with a one-line reason; code archives that escape their directory refused."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from node_agent import MANIFEST, AgentError, CheckpointStore, safe_extract

from .conftest import Clients

JOB = "job-a"


@pytest.fixture
def store(aws: Clients) -> Any:
    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    aws.s3.create_bucket(Bucket=bucket)
    lines: list[str] = []
    s = CheckpointStore(aws.s3, bucket, f"c/{JOB}/ckpt/", JOB, lines.append)
    s.lines = lines
    return s


def upload(store: Any, tmp_path: Path, step: int, payload: bytes) -> None:
    src = tmp_path / f"src-{step}"
    src.mkdir()
    (src / "state.pt").write_bytes(payload)
    store.upload(step, {"state.pt": str(src / "state.pt")}, "step")


def put(store: Any, key: str, body: bytes) -> None:
    store.s3.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=body)


def test_restore_takes_the_newest_complete_checkpoint_and_ignores_one_without_manifest(
    store: Any, tmp_path: Path
) -> None:
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    put(store, "30/state.pt", b"thirty, still uploading")  # no manifest: does not exist
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (20, "step")
    assert (dest / "20" / "state.pt").read_bytes() == b"twenty"
    assert not (dest / "30").exists()


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (lambda s: put(s, "20/state.pt", b"TWENTY"), "checkpoint 20: object state.pt fails its sha256 check"),
        (lambda s: put(s, "20/state.pt", b"twen"), "checkpoint 20: object state.pt is missing or has the wrong size"),
        (lambda s: s.s3.delete_object(Bucket=s.bucket, Key=s.prefix + "20/state.pt"),
         "checkpoint 20: object state.pt is missing or has the wrong size"),
        (lambda s: put(s, f"20/{MANIFEST}", json.dumps({"version": 1, "job_id": "job-b", "step": 20, "files": {}})
                       .encode()), "checkpoint 20: manifest belongs to job 'job-b', not 'job-a'"),
        (lambda s: put(s, f"20/{MANIFEST}", b"{not json"), "checkpoint 20: unreadable manifest (JSONDecodeError)"),
    ],
    ids=["wrong-checksum", "truncated", "missing-object", "other-job", "broken-manifest"],
)  # fmt: skip
def test_a_bad_newest_checkpoint_is_skipped_for_the_previous_one(
    store: Any, tmp_path: Path, corrupt: Any, reason: str
) -> None:
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    corrupt(store)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (10, "step")
    assert f"skipping {reason}" in store.lines
    assert not (dest / "20").exists()  # nothing of the bad one is left where the trainer would look


def test_no_readable_checkpoint_is_an_error_never_a_fresh_start(store: Any, tmp_path: Path) -> None:
    upload(store, tmp_path, 10, b"ten")
    put(store, "10/state.pt", b"TEN")
    dest = tmp_path / "ckpt"
    dest.mkdir()
    with pytest.raises(AgentError) as err:
        store.restore_newest(str(dest))
    assert (
        str(err.value)
        == "no readable checkpoint among 1 in S3; newest: checkpoint 10: object state.pt fails its sha256 check"
    )
    assert list(dest.iterdir()) == []


def test_prune_keeps_the_newest_complete_checkpoints(store: Any, tmp_path: Path) -> None:
    for step in (10, 20, 30):
        upload(store, tmp_path, step, str(step).encode())
    put(store, "40/state.pt", b"partial")  # newer than every complete one: an upload in progress, kept
    store.prune(1)
    assert store.complete_steps() == [30]
    assert sorted(store.listing()) == [30, 40]


def _tar(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> str:
    path = tmp_path / "code.tar"
    with tarfile.open(path, "w") as tar:
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return str(path)


@pytest.mark.parametrize(
    ("name", "kind", "reason"),
    [
        ("../evil.py", tarfile.REGTYPE, "code archive member '../evil.py' escapes the code directory"),
        ("/etc/evil.py", tarfile.REGTYPE, "code archive member '/etc/evil.py' escapes the code directory"),
        ("a/../../evil.py", tarfile.REGTYPE, "code archive member 'a/../../evil.py' escapes the code directory"),
        ("link", tarfile.SYMTYPE, "code archive member 'link' is a link or special file; only files and dirs"),
    ],
)
def test_code_archive_that_escapes_is_refused_and_nothing_is_written(
    tmp_path: Path, name: str, kind: bytes, reason: str
) -> None:
    member = tarfile.TarInfo(name)
    member.type = kind
    if kind == tarfile.SYMTYPE:
        member.linkname = "/etc/passwd"
    archive = _tar(tmp_path, member)
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(AgentError) as err:
        safe_extract(archive, str(dest))
    assert str(err.value) == reason
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "evil.py").exists()
