"""The emulated node's own bounds (conftest.Node.lines): a test waiting for a line that never comes fails, with
the node's output, instead of waiting without end."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from .conftest import Node


def chatty(lines: list[str], then: str) -> Node:
    """A node (no process, no IMDS) that prints ``lines``, then exits (``"exit"``), falls silent (``"silence"``),
    or goes on printing the first line numbered, every 0.02 s from a thread (``"repeat"``, at most 400 lines)."""
    node = Node.__new__(Node)
    node.instance_id, node.output, node._lines = "i-chatty", [], queue.Queue()

    def say(line: str) -> None:
        node.output.append(line)
        node._lines.put(line + "\n")

    for line in lines:
        say(line)
    if then == "exit":
        node._lines.put(None)
    elif then == "repeat":

        def pump() -> None:
            for i in range(400):
                say(f"{lines[0]} {i}")
                time.sleep(0.02)

        threading.Thread(target=pump, daemon=True).start()
    return node


def test_the_lines_until_the_node_exits() -> None:
    node = chatty(["booting", "training"], then="exit")
    assert list(node.lines()) == ["booting\n", "training\n"]
    assert list(node.lines()) == []  # exited: a second reader ends at once too


def test_a_node_that_keeps_talking_without_the_awaited_line_fails_after_the_total_time() -> None:
    node = chatty(["still polling"], then="repeat")
    with pytest.raises(AssertionError, match=r"^i-chatty still running after 0\.5 s without the line awaited:\nstill"):
        for line in node.lines(timeout=5, total=0.5):
            assert "durable in s3://" not in line


def test_a_node_that_prints_too_many_lines_without_the_awaited_one_fails() -> None:
    node = chatty([f"step {i}" for i in range(20)], then="exit")
    with pytest.raises(AssertionError, match=r"^i-chatty printed 10 lines without the line awaited:\nstep 0\n"):
        for line in node.lines(most=10):
            assert "durable in s3://" not in line


def test_a_silent_node_fails_after_the_timeout() -> None:
    node = chatty(["booting"], then="silence")
    with pytest.raises(AssertionError, match=r"^no output from i-chatty for 0\.3 s:\nbooting$"):
        for line in node.lines(timeout=0.3):
            assert "durable in s3://" not in line
