"""An HTTPS server on 127.0.0.1 with a throw-away certificate, made by openssl at test time."""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tools import require


@dataclass(frozen=True)
class TLSServer:
    url: str  # of the one file it serves
    certificate: Path  # PEM: what a client must trust to reach it
    headers: list[dict[str, str]] = field(default_factory=list)  # of each request, in order


@contextmanager
def tls_server(directory: Path, body: bytes) -> Iterator[TLSServer]:
    """Serves body at /file, keeping connections alive, over TLS for the name 127.0.0.1."""
    require("openssl")
    key, certificate = directory / "key.pem", directory / "certificate.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", certificate, "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    headers: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            headers.append(dict(self.headers.items()))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (overridden signature)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/file"
        yield TLSServer(url, certificate, headers)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
