"""A Flatcar-like release server on 127.0.0.1 for the fetch tests, with injectable faults."""

from __future__ import annotations

import hashlib
import threading
import urllib.parse
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from local_server import LocalServer


def flatcar_digests(name: str, content: bytes) -> str:
    """A DIGESTS file exactly as Flatcar's create_digests writes it."""
    return "".join(
        f"# {label} HASH\n{hashlib.new(algorithm, content).hexdigest()}  {name}\n"
        for label, algorithm in (("MD5", "md5"), ("SHA1", "sha1"), ("SHA512", "sha512"))
    )


class ReleaseServer(LocalServer):
    """Serves the files under ``root``; counts requests and injects faults per URL path."""

    thread_name = "release-server"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: Counter[str] = Counter()
        self.truncated: set[str] = set()  # paths answered with half the announced body
        self.failures: Counter[str] = Counter()  # path -> how many 503s to answer first
        self.retry_after: dict[str, str] = {}  # path -> the Retry-After of its 503s
        self.redirects: dict[str, str] = {}  # path -> the Location of a 302
        self.trickled: dict[str, tuple[int, float]] = {}  # path -> (bytes, seconds) per write
        self.stalled: set[str] = set()  # paths that send half their body, then hang
        self.stalling = threading.Event()  # set once a stalled path has sent its half
        self.release = threading.Event()  # ends every stall (set when the server stops)
        self._lock = threading.Lock()
        super().__init__()

    def stopping(self) -> None:
        self.release.set()

    def url(self, path: str) -> str:
        return f"http://{self.host}/{path.lstrip('/')}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.command != "GET":
            handler.send_error(HTTPStatus.NOT_IMPLEMENTED)
            return
        path = urllib.parse.urlsplit(handler.path).path
        with self._lock:
            self.requests[path] += 1
            failing = self.failures[path] > 0
            if failing:
                self.failures[path] -= 1
        file = self.root / path.lstrip("/")
        if failing and path in self.retry_after:
            handler.send_response(HTTPStatus.SERVICE_UNAVAILABLE)
            handler.send_header("Retry-After", self.retry_after[path])
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        elif failing:
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
