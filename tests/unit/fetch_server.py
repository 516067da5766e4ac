"""A Flatcar-like release server on 127.0.0.1 for the fetch tests, with injectable faults."""

from __future__ import annotations

import hashlib
import threading
import urllib.parse
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self


def flatcar_digests(name: str, content: bytes) -> str:
    """A DIGESTS file exactly as Flatcar's create_digests writes it."""
    return "".join(
        f"# {label} HASH\n{hashlib.new(algorithm, content).hexdigest()}  {name}\n"
        for label, algorithm in (("MD5", "md5"), ("SHA1", "sha1"), ("SHA512", "sha512"))
    )


class ReleaseServer:
    """Serves the files under ``root``; counts requests and injects faults per URL path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: Counter[str] = Counter()
        self.truncated: set[str] = set()  # paths answered with half the announced body
        self.failures: Counter[str] = Counter()  # path -> how many 503s to answer first
        self.redirects: dict[str, str] = {}  # path -> the Location of a 302
        self.trickled: dict[str, tuple[int, float]] = {}  # path -> (bytes, seconds) per write
        self.stalled: set[str] = set()  # paths that send half their body, then hang
        self.stalling = threading.Event()  # set once a stalled path has sent its half
        self.release = threading.Event()  # ends every stall (set when the server stops)
        self._lock = threading.Lock()
        self._httpd = _HTTPServer(self)
        # A short poll interval: shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name="release-server"
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()  # joins the request threads
        self._thread.join()

    def url(self, path: str) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/{path.lstrip('/')}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(handler.path).path
        with self._lock:
            self.requests[path] += 1
            failing = self.failures[path] > 0
            if failing:
                self.failures[path] -= 1
        file = self.root / path.lstrip("/")
        if failing:
            handler.send_error(HTTPStatus.SERVICE_UNAVAILABLE)
        elif path in self.redirects:
            handler.send_response(HTTPStatus.FOUND)
            handler.send_header("Location", self.redirects[path])
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        elif not file.is_file():
            handler.send_error(HTTPStatus.NOT_FOUND)
        else:
            body = file.read_bytes()
            handler.send_response(HTTPStatus.OK)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            self._send(handler, path, body)

    def _send(self, handler: BaseHTTPRequestHandler, path: str, body: bytes) -> None:
        try:
            if path in self.trickled:
                size, pause = self.trickled[path]
                for start in range(0, len(body), size):
                    if self.release.wait(pause):
                        return
                    handler.wfile.write(body[start : start + size])
                    handler.wfile.flush()
            elif path in self.stalled:
                handler.wfile.write(body[: len(body) // 2])
                handler.wfile.flush()
                self.stalling.set()
                self.release.wait(60)
            else:
                handler.wfile.write(body[: len(body) // 2] if path in self.truncated else body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as tests expect it to


class _HTTPServer(ThreadingHTTPServer):
    def __init__(self, release: ReleaseServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = release


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_GET(self) -> None:
        self.server.release.answer(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (overridden signature)
        """Keep the test output quiet."""
