"""The checkpoint protocol against moto: manifest last, newest *complete* checkpoint restored, corrupt, partial and
foreign checkpoints refused with a one-line reason; code archives that escape their directory refused."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from spot_training.agent import checkpoint_download, checkpoint_store, errors
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.code_fetch import safe_extract
from spot_training.agent.errors import AgentError
from spot_training.protocol import MANIFEST
from spot_training.sync_state import COMPLETE
from urllib3.exceptions import ProtocolError

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
    assert_skipped_for_the_previous_one(store, tmp_path, b"twenty", corrupt, reason)


def assert_skipped_for_the_previous_one(store: Any, tmp_path: Path, newest: bytes, corrupt: Any, reason: str) -> None:
    """Checkpoints 10 and 20 (``newest``), then ``corrupt``: the restore takes 10 and says why not 20 in one line."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, newest)
    corrupt(store)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (10, "step")
    assert f"skipping {reason}" in store.lines
    assert not (dest / "20").exists()  # nothing of the bad one is left where the trainer would look


def manifest(store: Any, step: int) -> Any:
    return json.loads(store.s3.get_object(Bucket=store.bucket, Key=f"{store.prefix}{step}/{MANIFEST}")["Body"].read())


@pytest.fixture
def four_byte_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of 4 bytes (16 MiB in production), so a few bytes make a file of several ranged GETs."""
    monkeypatch.setattr(checkpoint_store, "PART_MIN", 4)


@pytest.mark.parametrize(
    "payload",
    [b"", b"01234567", b"0123456789", bytes(range(100))],
    ids=["empty", "exact-multiple", "short-last-part", "capped-at-8-parts"],
)
def test_a_file_of_several_parts_is_checksummed_per_part_and_restored_byte_for_byte(
    store: Any, tmp_path: Path, four_byte_parts: None, payload: bytes
) -> None:
    upload(store, tmp_path, 10, payload)
    entry = manifest(store, 10)["files"]["state.pt"]
    part = max(4, -(-len(payload) // 8))  # 4 bytes, more when 4-byte parts would make more than 8
    assert entry["size"] == len(payload)
    assert entry["sha256"] == hashlib.sha256(payload).hexdigest()
    assert entry["part_size"] == part
    assert entry["part_sha256"] == [
        hashlib.sha256(payload[i : i + part]).hexdigest() for i in range(0, len(payload), part)
    ]
    assert len(entry["part_sha256"]) <= 8
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (10, "step")
    assert (dest / "10" / "state.pt").read_bytes() == payload


def flaky_streams(store: Any, monkeypatch: pytest.MonkeyPatch, failures: int) -> list[str]:
    """The first ``failures`` ranged GETs break after their first byte, as a dropped connection does."""
    ranges: list[str] = []
    get_object = store.s3.get_object

    class Broken:
        def __init__(self, body: Any) -> None:
            self.body = body

        def iter_chunks(self, size: int) -> Any:
            yield self.body.read(1)
            raise ProtocolError("Connection broken: IncompleteRead")

    def flaky(**kwargs: Any) -> Any:
        response = get_object(**kwargs)
        if "Range" in kwargs:
            ranges.append(kwargs["Range"])
            if len(ranges) <= failures:
                response["Body"] = Broken(response["Body"])
        return response

    monkeypatch.setattr(store.s3, "get_object", flaky)
    return ranges


def test_a_part_whose_stream_breaks_is_fetched_again(
    store: Any, tmp_path: Path, four_byte_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(store, tmp_path, 10, b"0123456789")
    ranges = flaky_streams(store, monkeypatch, failures=2)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (10, "step")
    assert (dest / "10" / "state.pt").read_bytes() == b"0123456789"
    assert len(ranges) == 3 + 2  # three parts, two of them fetched twice


def test_a_part_that_keeps_breaking_stops_the_restore_with_one_line_never_skipping_its_checkpoint(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that breaks is the network's fault, not the checkpoint's: 20 is not skipped for 10."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    store.unanswered_pause_s = 0.0
    tries = checkpoint_download.RANGE_ATTEMPTS * checkpoint_store.UNANSWERED_TRIES
    ranges = flaky_streams(store, monkeypatch, failures=tries)  # every attempt at 20's one part
    assert restore_stopped_at_20(store, tmp_path) == (
        f"s3://{store.bucket}/{store.prefix}20/state.pt bytes 0-5: Connection broken: IncompleteRead; "
        "not skipped for an older checkpoint: it may be good"
    )
    assert ranges == ["bytes=0-5"] * tries


def restore_stopped_at_20(store: Any, tmp_path: Path) -> str:
    """A restore of checkpoints 10 and 20 that S3 stops at 20: its one-line reason. 20 is not condemned, and
    nothing of 20 (half-downloaded) or of 10 (skipped to) is on disk."""
    dest = tmp_path / "ckpt"
    dest.mkdir()
    with pytest.raises(errors.S3Unanswered) as err:
        store.restore_newest(str(dest))
    assert 20 not in store.unreadable and list(dest.iterdir()) == []
    return str(err.value)


def test_a_full_local_disk_stops_the_restore_instead_of_falling_back_to_an_older_checkpoint(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This node's disk still holds its own checkpoint 10, and writing 20's download fills it. 20 is not marked
    unreadable: the restore taking the local 10 would resume the job from an older checkpoint than the newest durable
    one, without a word of why."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    dest = tmp_path / "ckpt"
    (dest / "10").mkdir(parents=True)
    (dest / "10" / "state.pt").write_bytes(b"ten")

    def full(path: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if mode == "r+b":  # get_range writing a part into place
            raise OSError(28, "No space left on device")
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint_download, "open", full, raising=False)
    with pytest.raises(errors.LocalDiskError) as err:
        store.restore_newest(str(dest))
    assert str(err.value) == (
        f"this node's disk: s3://{store.bucket}/{store.prefix}20/state.pt bytes 0-5: [Errno 28] No space left on "
        "device; not skipped for an older checkpoint"
    )
    assert 20 not in store.unreadable and sorted(p.name for p in dest.iterdir()) == ["10"]


def test_a_restore_that_cannot_make_its_folder_stops_in_one_line(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OSError of the restore's temporary folder is a one-line ``LocalDiskError``, not a traceback."""
    upload(store, tmp_path, 20, b"twenty")
    dest = tmp_path / "ckpt"
    dest.mkdir()

    def full(**_: Any) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_store.tempfile, "mkdtemp", full)
    with pytest.raises(errors.LocalDiskError) as err:
        store.restore_newest(str(dest))
    assert str(err.value) == (
        f"this node's disk: restoring checkpoint 20 into {dest}: [Errno 28] No space left on device; not skipped for "
        "an older checkpoint"
    )
    assert 20 not in store.unreadable


def test_a_file_that_shrinks_while_it_is_hashed_is_an_os_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OSError is what the sync loop logs and retries next round (the upload then never writes a manifest)."""
    path = tmp_path / "state.pt"
    path.write_bytes(b"ten")
    getsize = checkpoint_store.os.path.getsize
    monkeypatch.setattr(
        checkpoint_store.os.path, "getsize", lambda p: getsize(p) + 4
    )  # it had 4 more bytes a moment ago
    with pytest.raises(OSError, match=f"^{path} shrank while it was being uploaded$"):
        checkpoint_store.file_digests(str(path))


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (lambda s: put(s, "20/state.pt", b"01234X6789"), "checkpoint 20: object state.pt fails its sha256 check"),
        (lambda s: put(s, f"20/{MANIFEST}", json.dumps(dict(manifest(s, 20), files={"state.pt": dict(
            manifest(s, 20)["files"]["state.pt"], part_sha256=[])})).encode()),
         "checkpoint 20: manifest lists bad parts for state.pt"),
    ],
    ids=["one-byte-in-the-middle-part", "parts-missing-from-manifest"],
)  # fmt: skip
def test_a_bad_part_is_caught_while_it_streams_in(
    store: Any, tmp_path: Path, four_byte_parts: None, corrupt: Any, reason: str
) -> None:
    assert_skipped_for_the_previous_one(store, tmp_path, b"0123456789", corrupt, reason)


@pytest.mark.parametrize(("body", "restored"), [(b"twenty", 20), (b"TWENTY", 10)], ids=["sound", "corrupt"])
def test_a_manifest_without_parts_from_an_older_agent_is_verified_by_its_whole_sha256(
    store: Any, tmp_path: Path, body: bytes, restored: int
) -> None:
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    old = manifest(store, 20)
    old["files"] = {rel: {"size": m["size"], "sha256": m["sha256"]} for rel, m in old["files"].items()}
    put(store, f"20/{MANIFEST}", json.dumps(old).encode())
    put(store, "20/state.pt", body)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (restored, "step")
    assert (dest / str(restored) / "state.pt").read_bytes() == (b"twenty" if restored == 20 else b"ten")
    if restored == 10:
        assert "skipping checkpoint 20: object state.pt fails its sha256 check" in store.lines


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


def test_checkpoints_pruned_during_a_restore_make_it_list_again_not_fail(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While this node downloads, rank 0's agent on another node completes two newer checkpoints and prunes to the
    newest two: every checkpoint listed here is gone. The restore lists S3 again and takes the newest one."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    download = store.download_verified
    calls: list[int] = []

    def meanwhile_elsewhere(step: int, sizes: Any, dest: str) -> Any:
        calls.append(step)
        if len(calls) == 1:
            for newer in (30, 40):
                upload(store, tmp_path, newer, str(newer).encode())
                store.prune(2)
        return download(step, sizes, dest)

    monkeypatch.setattr(store, "download_verified", meanwhile_elsewhere)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (40, "step")
    assert (dest / "40" / "state.pt").read_bytes() == b"40"
    assert calls == [20, 10, 40]  # both listed ones had been pruned; the second listing found 40 (and 30)
    assert store.complete_steps() == [40, 30]


def test_a_checkpoint_the_restore_found_bad_is_neither_durable_nor_kept_in_place_of_good_ones(
    store: Any, tmp_path: Path
) -> None:
    """Checkpoint 20 in S3 is corrupt and an earlier attempt on this node had reported it durable; one checkpoint
    is kept. The restore takes 10, so the agent reports 10 (a checkpoint helper waiting for its upload must not
    take the stale 20 for its next checkpoint); the next checkpoint, 15, is uploaded and pruning keeps it (not
    only the bad 20); step 20 saved again goes up over the bad one, reported and restorable."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    put(store, "20/state.pt", b"TWENTY")
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spot-training").mkdir(parents=True)
    state = ckpt / ".spot-training" / "sync-state.json"
    state.write_text(json.dumps({"last_uploaded_step": 20, "last_upload_s": 1.5}))
    assert store.restore_newest(str(ckpt)) == (10, "step")
    job = SimpleNamespace(checkpoint_dir=str(ckpt), checkpoint_interval_s=None, mtbi_s=3600.0)
    syncer = Syncer(store, job, store.lines.append, 1)
    assert json.loads(state.read_text()) == {"last_uploaded_step": 10, "last_upload_s": 1.5}
    for step, payload in ((15, b"fifteen"), (20, b"twenty, trained again")):
        (ckpt / str(step)).mkdir()
        (ckpt / str(step) / "state.pt").write_bytes(payload)
        (ckpt / str(step) / COMPLETE).touch()  # as the checkpoint helper renames it into place
        assert syncer.sync() == step
        assert json.loads(state.read_text())["last_uploaded_step"] == step
        again = tmp_path / f"restored-{step}"
        again.mkdir()
        fresh = CheckpointStore(store.s3, store.bucket, store.prefix, JOB, store.lines.append)  # another node
        assert fresh.restore_newest(str(again)) == (step, "step")
        assert (again / str(step) / "state.pt").read_bytes() == payload
    assert sorted(store.listing()) == [20]  # 10 and 15 pruned once 20 was sound again


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


def test_a_ranged_get_stops_when_the_restore_is_abandoned(store: Any, tmp_path: Path) -> None:
    """A part of a big checkpoint is large (size / 8): when a notice abandons the restore, a part in flight stops
    at its next MiB instead of running to its end."""
    put(store, "big", b"abcdefgh")
    path = tmp_path / "big"
    path.write_bytes(b"\0" * 8)
    abandoned = threading.Event()
    abandoned.set()
    assert store.download.get_range(store.prefix + "big", str(path), 0, 8, abandoned) is None
    assert path.read_bytes() == b"\0" * 8  # nothing written
    assert store.download.get_range(store.prefix + "big", str(path), 0, 8) == hashlib.sha256(b"abcdefgh").hexdigest()


def refusing(store: Any, monkeypatch: pytest.MonkeyPatch, step: int, times: int) -> list[str]:
    """S3 answers SlowDown (after botocore's retries) to the first ``times`` reads of checkpoint ``step``'s objects;
    the keys of those reads."""
    get = store.s3.get_object
    refused: list[str] = []

    def get_object(**kwargs: Any) -> Any:
        if kwargs["Key"].startswith(f"{store.prefix}{step}/") and len(refused) < times:
            refused.append(kwargs["Key"])
            raise ClientError(
                {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, "GetObject"
            )
        return get(**kwargs)

    monkeypatch.setattr(store.s3, "get_object", get_object)
    store.unanswered_pause_s = 0.0
    return refused


def test_a_checkpoint_s3_does_not_serve_is_never_skipped_for_an_older_one(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SlowDown is not an "unreadable manifest": resuming from 10 would lose the steps up to 20."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    refused = refusing(store, monkeypatch, 20, times=100)
    assert restore_stopped_at_20(store, tmp_path) == (
        f"checkpoint 20: S3 did not serve {MANIFEST} (SlowDown); not skipped for an older checkpoint: it may be good"
    )
    assert len(refused) == checkpoint_store.UNANSWERED_TRIES


def test_a_checkpoint_s3_serves_again_after_a_pause_is_restored(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    refusing(store, monkeypatch, 20, times=checkpoint_store.UNANSWERED_TRIES - 1)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (20, "step")
    assert (dest / "20" / "state.pt").read_bytes() == b"twenty"
    assert any(line.endswith(f"trying again in 0 s (1/{checkpoint_store.UNANSWERED_TRIES})") for line in store.lines)


def test_a_403_for_an_object_no_longer_listed_counts_as_gone(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 may answer a read of a missing key with 403 to a role whose ListBucket has an s3:prefix condition: an
    object pruned since the listing is then the checkpoint's fault, skipped for the older one, not an outage."""
    upload(store, tmp_path, 10, b"ten")
    upload(store, tmp_path, 20, b"twenty")
    listed = store.listing()  # as listed before rank 0's agent pruned 20's object
    store.s3.delete_object(Bucket=store.bucket, Key=f"{store.prefix}20/state.pt")
    get = store.s3.get_object

    def get_object(**kwargs: Any) -> Any:
        if kwargs["Key"] == f"{store.prefix}20/state.pt":
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")
        return get(**kwargs)

    monkeypatch.setattr(store.s3, "get_object", get_object)
    monkeypatch.setattr(store, "listing", lambda: listed)
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert store.restore_newest(str(dest)) == (10, "step")
    assert "skipping checkpoint 20: object state.pt is missing or has the wrong size" in store.lines
