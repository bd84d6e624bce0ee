"""The benchmarks' moto patch: ranged GETs return exactly the bytes moto itself would, plain GETs are untouched."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from moto.s3 import models, responses

from benchmarks import fast_ranges


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """The patched moto server, for this module only: what ``install`` patches in this process's moto (and the
    werkzeug log level ``moto_server`` sets) is put back afterwards, so other tests' in-process moto is moto's own."""
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    with pytest.MonkeyPatch.context() as patch:
        # what undo puts back (FakeKey._fast_ranges does not exist before install: undo deletes it)
        patch.setattr(models.FakeKey, "value", models.FakeKey.__dict__["value"])
        patch.setattr(responses.S3Response, "key_response", responses.S3Response.key_response)
        patch.setattr(models.FakeKey, "_fast_ranges", False, raising=False)
        fast_ranges.install()  # moto_server installs it again: idempotent
        try:
            with fast_ranges.moto_server() as (host, port):
                client = boto3.client(
                    "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                    aws_access_key_id="test", aws_secret_access_key="test",
                )  # fmt: skip
                client.create_bucket(Bucket="ranges")
                yield client
        finally:
            werkzeug.setLevel(level)


def test_ranged_gets_return_the_requested_bytes_and_plain_gets_the_object(
    s3: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[slice] = []
    view_slice = fast_ranges._RangeView.__getitem__

    def spy(self: Any, part: slice) -> bytes:
        reads.append(part)
        return view_slice(self, part)

    monkeypatch.setattr(fast_ranges._RangeView, "__getitem__", spy)
    body = os.urandom(12 * 2**20 + 5)  # above moto's in-memory buffer: the object lives in a temporary file
    s3.put_object(Bucket="ranges", Key="k", Body=body)
    for spec, expected in [("0-0", body[:1]), ("10-19", body[10:20]), (f"{len(body) - 3}-", body[-3:])]:
        got = s3.get_object(Bucket="ranges", Key="k", Range=f"bytes={spec}")
        assert got["Body"].read() == expected
        assert got["ContentRange"].endswith(f"/{len(body)}")
    assert reads == [slice(0, 1), slice(10, 20), slice(len(body) - 3, len(body))]  # only the ranges were read
    assert s3.get_object(Bucket="ranges", Key="k")["Body"].read() == body
    assert len(reads) == 3  # a plain GET goes moto's own way
    with pytest.raises(s3.exceptions.ClientError, match="InvalidRange"):
        s3.get_object(Bucket="ranges", Key="k", Range=f"bytes={len(body) + 1}-")
    dest = tmp_path / "k"
    s3.download_file("ranges", "k", str(dest), Config=TransferConfig(multipart_chunksize=2**20, use_threads=False))
    assert dest.read_bytes() == body
