"""The deadline socket itself: what it counts as a response's head."""

from __future__ import annotations

import socket
import time

from nvidia_driver.limits import KiB
from nvidia_driver.sources.exchange import HEAD_READ, Budget, DeadlineSocket

STATUS = b"HTTP/1.1 200 OK\r\n"


def test_a_head_counts_only_what_reading_it_read_not_the_body_behind_it() -> None:
    # The head and 200 KiB of body in one segment, as a fast server sends them. Python's own
    # buffer size (128 KiB in newer versions) would have counted the body's start as head.
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(STATUS + b"x" * (200 * KiB))
        budget = Budget(time.monotonic() + 10, timeout=5, head_limit=2 * HEAD_READ)
        reader = DeadlineSocket(ours, budget).makefile("rb")

        budget.reading_head()
        assert reader.readline() == STATUS
        budget.head_read()
        body = b""
        while len(body) < 200 * KiB:
            body += reader.read1(1 << 20)

    assert body == b"x" * (200 * KiB)
