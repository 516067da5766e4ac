"""Behind a real forward proxy (squid, fixtures/squid.py) that asks for credentials.

A node behind a corporate proxy gives the driver container and the reboot gate
``https_proxy=http://user:password@proxy:3128``. Both reach https servers through a CONNECT
tunnel with those credentials: the downloads (Flatcar's release server, NVIDIA's) and the one
client of the registries (sources/http.py). Credentials squid refuses end in one line that says
so, and an address inside a ``no_proxy`` CIDR range is reached directly, as containerd reaches
it. The unit tests' CONNECT relay (tests/unit/connect_proxy.py) speaks the protocol; squid is
what users run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.squid import USER, Squid, squid_proxy
from tls_server import TLSServer, tls_server

from nvidia_driver.errors import DriverError
from nvidia_driver.sources.download import Backoff, Downloader
from nvidia_driver.sources.http import Client

pytestmark = pytest.mark.integration

BODY = b"# SHA512 HASH\n" + b"0" * 128 + b"  flatcar_production_image.vmlinuz\n"


@pytest.fixture(scope="module")
def squid() -> Iterator[Squid]:
    with squid_proxy() as proxy:
        yield proxy


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TLSServer]:
    for variable in ("HTTPS_PROXY", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(variable, raising=False)
    with tls_server(tmp_path, BODY) as serving:
        monkeypatch.setenv("SSL_CERT_FILE", str(serving.certificate))
        yield serving


def _download(url: str) -> bytes:
    return Downloader(backoff=Backoff(attempts=1)).get_small(url, 1 << 20, "a DIGESTS file")


def test_the_downloads_and_the_registry_client_tunnel_through_squid_with_credentials(
    squid: Squid, server: TLSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", squid.url())
    before = len(squid.tunnels())

    assert _download(server.url) == BODY
    assert Client().send("GET", server.url).body == BODY

    target = server.url.removeprefix("https://").removesuffix("/file")
    assert squid.tunnels(at_least=before + 2)[before:] == [f"{target} {USER}"] * 2


def test_credentials_squid_refuses_are_one_line_naming_its_407(
    squid: Squid, server: TLSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", squid.url("wrong"))
    with pytest.raises(DriverError) as download:
        _download(server.url)
    with pytest.raises(DriverError) as client:
        Client().send("GET", server.url)
    for caught in (download, client):
        message = str(caught.value)
        assert "407 Proxy Authentication Required" in message
        assert message.splitlines() == [message]
        assert "wrong" not in message  # the proxy's credentials are not shown
    assert "check the node's network, DNS and proxy settings" in str(download.value)


def test_an_address_in_a_no_proxy_range_is_reached_directly(
    squid: Squid, server: TLSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", squid.url())
    monkeypatch.setenv("no_proxy", "10.96.0.0/12,127.0.0.0/8")
    before = len(squid.tunnels())

    assert _download(server.url) == BODY
    assert Client().send("GET", server.url).body == BODY

    # One request through squid after them: once it is logged, theirs would have been too.
    monkeypatch.setenv("no_proxy", "10.96.0.0/12")
    assert Client().send("GET", server.url).body == BODY
    target = server.url.removeprefix("https://").removesuffix("/file")
    assert squid.tunnels(at_least=before + 1)[before:] == [f"{target} {USER}"]
