"""A raw socket server on 127.0.0.1 that answers exactly the bytes a test gives.

What an HTTP server would never send (a short body, a broken status line, headers trickled a
byte at a time, 100,000 headers) is what the download tests need, so this one is no HTTP server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def raw_server(
    *chunks: bytes, pause: float = 0.0, path: str = "releases.json", scheme: str = "http"
) -> Iterator[str]:
    """Answers every connection with chunks, pause seconds apart, then closes it; yields a URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.recv(65536)
                for chunk in chunks:
                    if stop.is_set():
                        break
                    try:
                        connection.sendall(chunk)
                    except OSError:
                        break
                    time.sleep(pause)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{listener.getsockname()[1]}/{path}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
