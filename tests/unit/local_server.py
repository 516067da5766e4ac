"""What the unit tests' fake servers share: an HTTP server on 127.0.0.1, on a free port, that
runs on a thread of its own while it is entered and hands each request to ``answer``.

fetch_server.py (a Flatcar release server) and oci_registry.py (an OCI registry) are built on
it.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class LocalServer:
    thread_name = "local-server"
    keep_alive = False  # HTTP/1.1, connections kept open, as registries answer

    def __init__(self) -> None:
        self._httpd = _HTTPServer(self)
        # A short poll interval: shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name=self.thread_name
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
        self.stopping()
        self._httpd.shutdown()
        self._httpd.server_close()  # joins the request threads
        self._thread.join()

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``."""
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        """Answer one request (``handler.command`` is its method)."""
        raise NotImplementedError

    def stopping(self) -> None:
        """Called as the server stops, before it waits for the request threads."""


class _HTTPServer(ThreadingHTTPServer):
    def __init__(self, local: LocalServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.local = local


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        if self.server.local.keep_alive:
            self.protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.local.answer(self)

    def do_HEAD(self) -> None:
        self.server.local.answer(self)

    def do_PUT(self) -> None:
        self.server.local.answer(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (overridden signature)
        """Keep the test output quiet."""
