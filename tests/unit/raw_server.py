"""A raw socket server on 127.0.0.1 that answers exactly the bytes a test gives.

What an HTTP server would never send (a short body, a broken status line, headers trickled a
byte at a time, 100,000 headers) is what the download tests need, so this one is no HTTP server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Handler = Callable[[socket.socket, threading.Event], None]


@contextmanager
def accepting(handle: Handler) -> Iterator[int]:
    """A listener on 127.0.0.1 that hands each connection to handle, in a thread of its own,
    with the event set when the server stops; closes the connection after; yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def handled(connection: socket.socket) -> None:
        with connection:
            handle(connection, stop)

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=handled, args=(connection,), daemon=True)
            thread.start()
            threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(5)
        for thread in threads:
            thread.join(5)
        listener.close()


@contextmanager
def raw_server(
    *chunks: bytes, pause: float = 0.0, path: str = "releases.json", scheme: str = "http"
) -> Iterator[str]:
    """Answers every connection with chunks, pause seconds apart, then closes it; yields a URL."""

    def answer(connection: socket.socket, stop: threading.Event) -> None:
        connection.recv(65536)
        for chunk in chunks:
            if stop.is_set():
                break
            try:
                connection.sendall(chunk)
            except OSError:
                break
            time.sleep(pause)

    with accepting(answer) as port:
        yield f"{scheme}://127.0.0.1:{port}/{path}"
