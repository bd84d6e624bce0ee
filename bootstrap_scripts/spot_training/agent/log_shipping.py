"""Log shipping: the agent's log lines on stderr and, in batches from a background thread, in CloudWatch Logs; the
trainer's output split into lines."""

from __future__ import annotations

import codecs
import re
import sys
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

from botocore.exceptions import ClientError

from spot_training.agent.errors import AWS_ERRORS

LINE_BREAK = re.compile(r"[\r\n]")  # PutLogEvents takes one line per event; a CR ends a line too


class LogShipper:
    """Sends lines to a CloudWatch Logs stream in batches from a background thread; never fails the agent.

    PutLogEvents counts UTF-8 bytes, each event's message plus 26: at most 262,144 per event and 1,048,576 per
    batch; one event too large rejects the whole batch. So a line is split at LF and at CR (a progress bar redraws
    its line with a CR alone: a tqdm run would be one line of megabytes), empty pieces are dropped, and a piece
    longer than one event holds goes in several (split on character boundaries, nothing dropped). A call that fails
    is counted; stderr (the console) says so at the first, then at most every ``WARN_EVERY_S`` with the counts so
    far, and once more at ``close`` if any failed. The lines themselves are on stderr already."""

    MAX_EVENTS, MAX_BATCH_BYTES, MAX_EVENT_BYTES, EVENT_OVERHEAD = 5000, 1_048_576, 262_144, 26
    MAX_MESSAGE_BYTES = MAX_EVENT_BYTES - EVENT_OVERHEAD
    WARN_EVERY_S = 300.0

    def __init__(self, client: Any, group: str, stream: str, flush_s: float = 2.0) -> None:
        self.client, self.group, self.stream, self.flush_s = client, group, stream, flush_s
        self.pending: List[Tuple[int, str, int]] = []  # (timestamp ms, message, its UTF-8 bytes)
        self.lock = threading.Lock()
        # one flush at a time: a caller's flush (before the instance may go) returns only once a batch the
        # background thread is sending has been sent too, and the stream gets its batches in order
        self.sending = threading.Lock()
        self.stopped = threading.Event()
        self.failures = self.lost = 0  # failed calls, and lines they did not ship
        self.warned_at = 0.0
        try:
            client.create_log_stream(logGroupName=group, logStreamName=stream)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceAlreadyExistsException":
                self._failed(0, exc)
        except AWS_ERRORS as exc:  # no answer at all (no route to CloudWatch Logs): lines still reach stderr
            self._failed(0, exc)
        self.thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self.thread.start()

    @classmethod
    def messages(cls, piece: str) -> List[Tuple[str, int]]:
        """``piece`` as events' messages with their sizes in bytes: one, or, above ``MAX_MESSAGE_BYTES`` of UTF-8,
        several, split on character boundaries (nothing is dropped). Characters UTF-8 cannot encode (lone
        surrogates) become "?"."""
        data, found = piece.encode("utf-8", "replace"), []
        while data:
            end = min(len(data), cls.MAX_MESSAGE_BYTES)
            while end < len(data) and data[end] & 0xC0 == 0x80:  # never half a character: back to its first byte
                end -= 1
            found.append((data[:end].decode("utf-8"), end))
            data = data[end:]
        return found

    def emit(self, line: str) -> None:
        now = int(time.time() * 1000)
        events = [(now, *message) for piece in LINE_BREAK.split(line) if piece for message in self.messages(piece)]
        with self.lock:
            self.pending.extend(events)

    def _failed(self, lines: int, why: object) -> None:
        """A call that failed (or an answer that rejected some events): counted, and said on stderr at the first and
        then at most every ``WARN_EVERY_S``."""
        with self.lock:
            self.failures += 1
            self.lost += lines
            now = time.monotonic()
            say = self.failures == 1 or now - self.warned_at >= self.WARN_EVERY_S
            if say:
                self.warned_at = now
            failures, lost = self.failures, self.lost
        if say:
            print(
                f"node-agent: warning: cannot ship logs to {self.group}/{self.stream} "
                f"({failures} failed call(s), {lost} line(s) not shipped so far): {why}",
                file=sys.stderr,
                flush=True,
            )

    def _run(self) -> None:
        while not self.stopped.wait(self.flush_s):
            self.flush()

    def flush(self) -> None:
        with self.sending:
            self._send()

    def _send(self) -> None:
        with self.lock:
            events, self.pending = sorted(self.pending, key=lambda e: e[0]), []
        start = 0
        while start < len(events):
            end, size = start, 0
            while end < len(events) and end - start < self.MAX_EVENTS:
                size += events[end][2] + self.EVENT_OVERHEAD
                if size > self.MAX_BATCH_BYTES and end > start:
                    break
                end += 1
            batch = [{"timestamp": t, "message": m} for t, m, _ in events[start:end]]
            start = end
            try:
                answer = self.client.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=batch)
            except Exception as exc:
                self._failed(len(batch), exc)
                continue
            rejected = answer.get("rejectedLogEventsInfo") if isinstance(answer, dict) else None
            if rejected:  # too old or too new for CloudWatch: the rest of the batch is in
                self._failed(0, f"some of {len(batch)} event(s) rejected: {rejected}")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.flush()
        if self.failures:
            print(
                f"node-agent: warning: {self.failures} call(s) to ship logs to {self.group}/{self.stream} failed; "
                f"{self.lost} line(s) not shipped (they are on this console)",
                file=sys.stderr,
                flush=True,
            )


def output_lines(stream: Any, longest: int = LogShipper.MAX_MESSAGE_BYTES, chunk: int = 65536) -> Iterator[str]:
    """The lines a process writes to ``stream`` (a binary pipe) as they come: split at LF and at CR (a progress bar
    redraws its line with a CR alone), trailing blanks stripped, empty ones left out, decoded as UTF-8 (a
    character split between two reads stays whole; invalid bytes become U+FFFD). A line still without a break after
    ``longest`` characters is passed on in pieces of that many, so memory stays bounded."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    rest = ""
    while True:
        data = stream.read1(chunk)
        *lines, rest = LINE_BREAK.split(rest + decoder.decode(data, final=not data))
        if not data:
            lines.append(rest)
            rest = ""
        while len(rest) > longest:
            lines.append(rest[:longest])
            rest = rest[longest:]
        for line in lines:
            line = line.rstrip()
            if line:
                yield line
        if not data:
            return


class Log:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.shipper: Optional[LogShipper] = None

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} node-agent {self.instance_id} {message}"
        print(line, file=sys.stderr, flush=True)
        if self.shipper is not None:
            self.shipper.emit(line)

    def raw(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        if self.shipper is not None:
            self.shipper.emit(line)


class Timed:
    """``with Timed(log, "restore"):`` logs how long a step took."""

    def __init__(self, log: Callable[[str], None], what: str) -> None:
        self.log, self.what = log, what

    def __enter__(self) -> "Timed":
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.monotonic() - self.start
        self.log(f"step '{self.what}' took {self.seconds:.2f} s{' (failed)' if exc[0] else ''}")
