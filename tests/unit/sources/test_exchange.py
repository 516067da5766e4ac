"""The deadline socket itself: what it counts as a response's head."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from nvidia_driver.limits import KiB
from nvidia_driver.sources.exchange import HEAD_READ, Budget, DeadlineSocket, handlers

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


@pytest.mark.parametrize(
    ("url", "direct"),
    [
        ("https://mirror.corp.example/f", True),
        ("https://a.b.corp.example:8443/f", True),
        ("https://MIRROR.Corp.Example/f", True),
        ("https://notcorp.example/f", False),
        ("https://download.nvidia.com/f", False),
    ],
)
def test_no_proxy_s_wildcard_domains_are_reached_directly(
    monkeypatch: pytest.MonkeyPatch, url: str, *, direct: bool
) -> None:
    """Go's proxy rules (containerd's, the kubelet's; golang.org/x/net/http/httpproxy) read
    "*.corp.example" as every name under corp.example; urllib reads it as a literal name."""
    for variable in ("NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", "localhost, *.corp.example")
    request = urllib.request.Request(url)  # noqa: S310 - never opened
    proxies = handlers(Budget(time.monotonic() + 10, timeout=5))[0]

    proxies.https_open(request)  # type: ignore[attr-defined] - ProxyHandler's, per scheme

    assert (request.host != "proxy.invalid:3128") is direct
