"""HTTPS through the deadline socket: the body arrives whole, and certificates are still checked.

The entrypoint's downloads (the tooling's feed reader among them) and the one client of the
registries and the Kubernetes API (sources/http.py) wrap their TLS connections in
sources/exchange.py's socket; a server whose certificate the client does not trust must be
refused as before, and a tunnel through the environment's proxy carries the same TLS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from connect_proxy import connect_proxy
from tls_server import TLSServer, tls_server

from nvidia_driver.errors import DriverError
from nvidia_driver.sources.download import Backoff, Downloader
from nvidia_driver.sources.http import Client

BODY = b"# SHA512 HASH\n" + b"0" * 128 + b"  flatcar_production_image.vmlinuz\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TLSServer]:
    with tls_server(tmp_path, BODY) as serving:
        yield serving


def _entrypoint(url: str) -> bytes:
    return Downloader(backoff=Backoff(attempts=1)).get_small(url, 1 << 20, "a DIGESTS file")


def test_a_trusted_server_s_file_arrives_whole(
    server: TLSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(server.certificate))  # urllib's default context

    assert _entrypoint(server.url) == BODY
    assert Client().send("GET", server.url).body == BODY


def test_a_server_with_a_certificate_nobody_trusts_is_refused(
    server: TLSServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "no-authorities.pem"
    empty.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))

    with pytest.raises(DriverError, match="CERTIFICATE_VERIFY_FAILED"):
        _entrypoint(server.url)
    with pytest.raises(DriverError, match="CERTIFICATE_VERIFY_FAILED"):
        Client().send("GET", server.url)


def test_a_certificate_that_fails_verification_is_not_retried_and_names_the_clock(
    server: TLSServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A retry gets the same certificate: a node whose clock is off ("certificate is not yet
    valid") or behind a TLS-inspecting proxy is told so at once, not after 5 attempts that
    blame its network and DNS."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "none.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    pauses: list[float] = []

    with pytest.raises(DriverError) as raised:
        Downloader(backoff=Backoff(attempts=3), sleep=pauses.append).get_small(
            server.url, 1 << 20, "a DIGESTS file"
        )

    assert pauses == []
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)
    assert "check the node's clock" in str(raised.value)


def test_a_server_behind_a_proxy_is_reached_through_its_tunnel_and_still_verified(
    server: TLSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """https_proxy as a node behind a forward proxy sets it: the downloads and the registry
    clients open a CONNECT tunnel, and TLS inside it checks the server's certificate."""
    monkeypatch.setenv("SSL_CERT_FILE", str(server.certificate))
    for variable in ("no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    target = server.url.removeprefix("https://").removesuffix("/file")
    with connect_proxy() as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)

        assert _entrypoint(server.url) == BODY
        assert Client().send("GET", server.url).body == BODY
        assert proxy.tunnels == [target, target]
        assert Client(proxy=False).send("GET", server.url).body == BODY  # the API server's way
        assert proxy.tunnels == [target, target]


@pytest.mark.parametrize(
    ("no_proxy", "tunnelled"),
    [("127.0.0.0/8", False), ("10.0.0.0/8, ::1/128,127.0.0.1/32", False), ("10.0.0.0/8", True)],
)
def test_no_proxy_s_cidr_ranges_are_reached_directly(
    server: TLSServer, monkeypatch: pytest.MonkeyPatch, no_proxy: str, tunnelled: bool
) -> None:
    """Clusters list their networks in no_proxy as CIDR ranges, which Go's proxy rules read
    (containerd's, the kubelet's) and urllib's do not: an address inside one is reached
    directly by the downloads and the registry clients alike, one outside through the proxy."""
    monkeypatch.setenv("SSL_CERT_FILE", str(server.certificate))
    for variable in ("NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("no_proxy", no_proxy)
    target = server.url.removeprefix("https://").removesuffix("/file")
    with connect_proxy() as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)

        assert _entrypoint(server.url) == BODY
        assert Client().send("GET", server.url).body == BODY
        assert proxy.tunnels == ([target, target] if tunnelled else [])
