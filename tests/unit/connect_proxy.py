"""An HTTP proxy on 127.0.0.1 that opens CONNECT tunnels, as squid or any forward proxy does for
https URLs (RFC 9110, section 9.3.6): ``CONNECT host:port``, ``200`` once the target is
reached, then the bytes relayed both ways. It tunnels only to 127.0.0.1 and records each target.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from raw_server import accepting


@dataclass(frozen=True)
class Proxy:
    url: str  # http://127.0.0.1:<port>, for https_proxy
    tunnels: list[str]  # each CONNECT's host:port, in order


@contextmanager
def connect_proxy() -> Iterator[Proxy]:
    tunnels: list[str] = []

    def tunnel(client: socket.socket, stop: threading.Event) -> None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target = head.split(b" ", 2)[:2]
        host, _, port = target.decode().rpartition(":")
        tunnels.append(target.decode())
        if method != b"CONNECT" or host != "127.0.0.1":
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        with socket.create_connection((host, int(port))) as server:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            _relay(client, server, stop)

    with accepting(tunnel) as port:
        yield Proxy(f"http://127.0.0.1:{port}", tunnels)


def _relay(one: socket.socket, other: socket.socket, stop: threading.Event) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(one, selectors.EVENT_READ, other)
        selector.register(other, selectors.EVENT_READ, one)
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.05):
                source = one if key.fileobj is one else other
                with contextlib.suppress(OSError):
                    data = source.recv(65536)
                    if data:
                        key.data.sendall(data)
                        continue
                return  # one side closed (or failed): the tunnel ends
