"""The tooling's requests session: one deadline per request, from the connect to the last byte."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from raw_server import raw_server

from gdc.transport import Limits, deadline_session

LIMITS = Limits(deadline=1.0, timeout=3.0)


class _SlowKeptAlive(BaseHTTPRequestHandler):
    """Answers each request of a kept-alive connection after 0.4 s."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1

    def do_GET(self) -> None:
        time.sleep(0.4)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (overridden signature)
        pass


@pytest.fixture
def kept_alive() -> Iterator[str]:
    _SlowKeptAlive.connections = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowKeptAlive)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v2/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_each_request_on_a_kept_alive_connection_has_a_deadline_of_its_own(
    kept_alive: str,
) -> None:
    session = deadline_session(LIMITS)

    answers = [session.get(kept_alive, timeout=60).content for _ in range(4)]  # 1.6 s in all

    assert answers == [b"ok"] * 4
    assert _SlowKeptAlive.connections == 1


def test_a_body_trickled_past_the_deadline_is_one_timeout() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    started = time.monotonic()
    with (
        raw_server(head, *[b"x"] * 1000, pause=0.1) as url,
        pytest.raises(requests.Timeout) as raised,
    ):
        deadline_session(LIMITS).get(url, timeout=60)

    assert time.monotonic() - started < 2.5
    assert str(raised.value) == f"GET {url} did not end within the 1 s deadline"


def test_a_tls_handshake_trickled_past_the_deadline_is_one_timeout() -> None:
    started = time.monotonic()
    with (
        raw_server(b"\x16\x03\x03\x40\x00", *[b"\x02"] * 1000, pause=0.2, scheme="https") as url,
        pytest.raises(requests.Timeout) as raised,
    ):
        deadline_session(LIMITS).get(url, timeout=60)

    assert time.monotonic() - started < 2.5
    assert str(raised.value) == f"GET {url} did not end within the 1 s deadline"
