"""What the unit tests' fake servers share.

:class:`Threaded` runs a server on a thread of its own while it is entered, and stops it on
exit: the one start and stop of every fake server (the system bus of fake_dbus.py too).
:class:`LocalServer` is an HTTP server on 127.0.0.1, on a free port, that hands each request
to ``answer``: fetch_server.py (a Flatcar release server), oci_registry.py (an OCI registry)
and fake_apiserver.py (a Kubernetes API server, for fault injection) are built on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class Threaded:
    """``serve`` runs on a thread of its own from ``__enter__``; ``__exit__`` calls ``stop``
    (which makes ``serve`` return), waits for the thread, then calls ``close``."""

    thread_name = "server"

    def serve(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """What is left to release once ``serve`` has returned."""

    def __enter__(self) -> Self:
        self._serving = threading.Thread(target=self.serve, name=self.thread_name)
        self._serving.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        self._serving.join()
        self.close()


class LocalServer(Threaded):
    thread_name = "local-server"
    keep_alive = False  # HTTP/1.1, connections kept open, as registries answer
    methods: tuple[str, ...] = ("GET", "HEAD", "PUT")  # what answer() is given; others: 501

    def __init__(self) -> None:
        self._httpd = _HTTPServer(self)

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

    def serve(self) -> None:
        # A short poll interval: shutdown() waits for the next poll.
        self._httpd.serve_forever(poll_interval=0.01)

    def stop(self) -> None:
        self.stopping()
        self._httpd.shutdown()

    def close(self) -> None:
        self._httpd.server_close()  # joins the request threads


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

    def __getattr__(self, name: str) -> Callable[[], None]:
        """``do_<METHOD>`` for the methods the server answers: BaseHTTPRequestHandler answers
        the others 501 itself."""
        if name.startswith("do_") and name.removeprefix("do_") in self.server.local.methods:
            return lambda: self.server.local.answer(self)
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (overridden signature)
        """Keep the test output quiet."""
