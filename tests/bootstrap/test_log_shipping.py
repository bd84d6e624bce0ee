"""The node agent's CloudWatch Logs shipping, against moto's logs with PutLogEvents' size limits enforced.

PutLogEvents counts UTF-8 bytes (each message plus 26): at most 262,144 per event and 1,048,576 per batch, and one
event too large rejects the whole batch. moto does not check either, so the client used here answers a request
over them as CloudWatch does (400 InvalidParameterException) before it reaches moto. Sizes are counted in bytes,
not characters: a tqdm bar (redrawn with CR, never a newline) of block characters would otherwise make one event of
600 KB and get its batch rejected. Lines are split at CR as well; a piece too long for one event goes in several,
and every failure is logged.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from spot_training.agent.log_shipping import LogShipper, output_lines

from .conftest import REGION, Clients, Cluster
from .test_agent_notice import NoSync, agent_for, store_of

EVENT_LIMIT, BATCH_LIMIT, OVERHEAD = 262_144, 1_048_576, 26  # CloudWatch Logs quotas, in bytes


class JsonBody:
    def __init__(self, body: dict[str, str]) -> None:
        self.data = json.dumps(body).encode()

    def stream(self, **_: Any) -> Any:
        yield self.data


def strict_logs(aws: Clients) -> tuple[Any, list[int], list[str]]:
    """A logs client on moto whose PutLogEvents are refused as CloudWatch refuses them when over its limits; the
    sizes (bytes, overhead included) of the batches that went through, and the reasons of those refused."""
    client = boto3.session.Session(region_name=REGION).client("logs", endpoint_url=aws.endpoint)
    sizes: list[int] = []
    refused: list[str] = []

    def check(request: Any, **_: Any) -> Optional[AWSResponse]:
        events = json.loads(request.body)["logEvents"]
        each = [len(e["message"].encode("utf-8")) + OVERHEAD for e in events]
        why = ""
        if max(each) > EVENT_LIMIT:
            why = f"Log event too large: {max(each)} bytes exceeds limit of {EVENT_LIMIT}"
        elif sum(each) > BATCH_LIMIT:
            why = f"Upload too large: {sum(each)} bytes exceeds limit of {BATCH_LIMIT}"
        elif len(events) > 10_000:
            why = f"{len(events)} events exceeds limit of 10000"
        if not why:
            sizes.append(sum(each))
            return None  # on to moto
        refused.append(why)
        body = JsonBody({"__type": "InvalidParameterException", "message": why})
        return AWSResponse(request.url, 400, {"x-amzn-ErrorType": "InvalidParameterException"}, body)

    client.meta.events.register("before-send.logs.PutLogEvents", check)
    return client, sizes, refused


def shipped(aws: Clients, group: str, stream: str) -> list[str]:
    messages: list[str] = []
    token: Optional[str] = None
    for _ in range(100):  # bounded: far more pages than the few events here
        kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            kwargs["nextToken"] = token
        page = aws.logs.get_log_events(**kwargs)
        messages.extend(e["message"] for e in page["events"])
        if not page["events"] or page.get("nextForwardToken") == token:
            return messages
        token = page.get("nextForwardToken")
    raise AssertionError("get_log_events never ended")


def test_a_long_progress_bar_line_and_the_lines_around_it_all_arrive(
    aws: Clients, make_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    client, sizes, refused = strict_logs(aws)
    shipper = LogShipper(client, cluster.log_group, "job/i-1", flush_s=3600)  # flushed at close only
    bar = "\u2588" * 200_000  # 600,000 bytes of UTF-8, 200,000 characters
    wide = "\u00e9" * 125_000  # 250,000 bytes: each fits an event, five do not fit one batch (five fit by characters)
    shipper.emit("before")
    shipper.emit(bar)
    shipper.emit("\r 10%|#  |\r 20%|## |\r\n 30%|###|\n\n")
    for _ in range(5):
        shipper.emit(wide)
    shipper.emit("after")
    shipper.close()

    assert refused == []
    assert sizes and all(size <= BATCH_LIMIT for size in sizes)
    got = shipped(aws, cluster.log_group, "job/i-1")
    assert got[0] == "before" and got[-1] == "after", got[:1] + got[-1:]
    parts = got[1:4]  # 600,000 bytes in events of at most 262,118: three, split between whole characters
    assert all(len(part.encode("utf-8")) + OVERHEAD <= EVENT_LIMIT for part in parts)
    assert "".join(parts) == bar  # nothing dropped
    assert got[4:7] == [" 10%|#  |", " 20%|## |", " 30%|###|"]  # CR ends a line too; empty pieces dropped
    assert got[7:12] == [wide] * 5
    assert len(got) == 13
    assert "cannot ship logs" not in capsys.readouterr().err


def test_batches_are_sized_in_bytes(aws: Clients, make_cluster: Any) -> None:
    """Four ASCII lines of 200,000 bytes and one of 64,000 four-byte characters (256,000 bytes, under the event
    limit): 1,056,130 bytes with the overhead, over the batch limit. The old check added the next event's
    *characters* to the bytes so far and sent all five in one batch."""
    cluster: Cluster = make_cluster(nodes=1)
    client, sizes, refused = strict_logs(aws)
    shipper = LogShipper(client, cluster.log_group, "job/i-2", flush_s=3600)
    lines = ["a" * 200_000] * 4 + ["\U0001f600" * 64_000]
    for line in lines:
        shipper.emit(line)
    shipper.close()
    assert refused == []
    assert len(sizes) == 2 and all(size <= BATCH_LIMIT for size in sizes)
    assert shipped(aws, cluster.log_group, "job/i-2") == lines


class FailingLogs:
    """A logs client whose PutLogEvents always fails (CloudWatch unreachable, or a quota)."""

    def __init__(self) -> None:
        self.calls = 0

    def create_log_stream(self, **_: Any) -> None:
        return None

    def put_log_events(self, **_: Any) -> Any:
        self.calls += 1
        raise ClientError({"Error": {"Code": "ServiceUnavailableException", "Message": "down"}}, "PutLogEvents")


def test_repeated_shipping_failures_are_counted_and_reported_periodically(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = FailingLogs()
    shipper = LogShipper(client, "g", "s", flush_s=3600)
    shipper.WARN_EVERY_S = 3600.0
    for round_ in range(5):
        shipper.emit(f"line {round_}a\nline {round_}b")
        shipper.flush()
    err = capsys.readouterr().err.splitlines()
    assert client.calls == 5
    warnings = [line for line in err if "cannot ship logs to g/s" in line]
    assert len(warnings) == 1  # the first failure; the next four fall in the same period
    assert "(1 failed call(s), 2 line(s) not shipped so far)" in warnings[0] and "ServiceUnavailable" in warnings[0]

    shipper.warned_at -= shipper.WARN_EVERY_S  # a period later
    shipper.emit("line 5")
    shipper.flush()
    shipper.emit("line 6")
    shipper.flush()  # the same period again: no line
    later = [line for line in capsys.readouterr().err.splitlines() if "cannot ship logs to g/s" in line]
    assert len(later) == 1 and "(6 failed call(s), 11 line(s) not shipped so far)" in later[0], later

    shipper.close()  # nothing pending: no call; the summary
    summary = capsys.readouterr().err.splitlines()
    assert client.calls == 7
    assert summary == [
        "node-agent: warning: 7 call(s) to ship logs to g/s failed; 12 line(s) not shipped (they are on this console)"
    ]


class Chunks:
    """A pipe that hands out the given byte chunks, one per read."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def read1(self, size: int = -1) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_trainer_output_is_split_at_carriage_returns_and_decoded_across_reads() -> None:
    block = "\u2588".encode()  # 3 bytes
    stream = Chunks(b"epoch 1\r", b"\n 10%|" + block[:1], block[1:] + b"|\r 20%|", block + block + b"|  \r", b"")
    assert list(output_lines(stream)) == ["epoch 1", " 10%|\u2588|", " 20%|\u2588\u2588|"]
    # a line still unbroken after 10 characters goes on in pieces of 10 (bounded memory); the rest ends at the CR
    long = Chunks(b"a" * 25, b"aaa\rb")
    assert list(output_lines(long, longest=10)) == ["a" * 10, "a" * 10, "a" * 8, "b"]


def test_a_trainers_progress_bar_reaches_the_log_as_one_line_per_update(make_cluster: Any, tmp_path: Path) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("bar-run", {"train.py": ""}, "python train.py")
    agent, job, lines = agent_for(cluster)
    script = "import sys\nfor i in range(3):\n    sys.stdout.write('\\r%d%%|' % (i * 50) + '\\u2588' * i)\nprint()\n"
    cmd = [sys.executable, "-c", script]
    rc, interrupted = agent.trainer.run(
        job, str(tmp_path), cmd, {"PYTHONIOENCODING": "utf-8"}, NoSync(store_of(agent, job))
    )
    assert (rc, interrupted) == (0, False)
    trainer = [line for line in lines if line.startswith(f"[trainer {agent.node.instance_id}]")]
    prefix = f"[trainer {agent.node.instance_id}] "
    assert trainer == [prefix + "0%|", prefix + "50%|\u2588", prefix + "100%|\u2588\u2588"], trainer


class HeldLogs:
    """A logs client whose first PutLogEvents is held until ``release`` (the background thread mid-send)."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.sent: list[list[str]] = []

    def create_log_stream(self, **_: Any) -> None:
        return None

    def put_log_events(self, **kwargs: Any) -> dict[str, Any]:
        if not self.inside.is_set():
            self.inside.set()
            assert self.release.wait(10)
        self.sent.append([e["message"] for e in kwargs["logEvents"]])
        return {}


def test_a_flush_returns_only_once_the_batch_the_shipper_is_sending_is_sent() -> None:
    """The agent flushes before the instance may go (hand-back, drain hook): a batch the background thread was still
    sending could be cut off by the termination. The flush waits for that batch, and the stream gets the lines in
    order."""
    logs = HeldLogs()
    shipper = LogShipper(logs, "group", "job/i-a", flush_s=0.05)
    try:
        shipper.emit("older")
        assert logs.inside.wait(10), "the background thread never sent"
        shipper.emit("newer")
        flushed = threading.Event()

        def flush() -> None:
            shipper.flush()
            flushed.set()

        caller = threading.Thread(target=flush)
        caller.start()
        assert not flushed.wait(0.5), "the flush returned while the older batch was still being sent"
        logs.release.set()
        caller.join(10)
        assert flushed.is_set()
        assert logs.sent == [["older"], ["newer"]]
    finally:
        logs.release.set()
        shipper.close()
