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
        elif not file.is_file():
            handler.send_error(HTTPStatus.NOT_FOUND)
        else:
            body = file.read_bytes()
            handler.send_response(HTTPStatus.OK)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2] if path in self.truncated else body)


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
