"""Servers that try to hold a download past its deadline, on every download path there is.

Each attack runs against every client that downloads: the entrypoint's downloader, its
verified Flatcar fetch, the image build's NVIDIA downloads, the tooling's feed reader and its
registry client, and the reboot gate's Kubernetes API and registry clients. Each must end
within its deadline, with one line in its own error type.

The read timeout (3 s) is longer than the deadline (1 s) and every trickled byte arrives well
within it: only a deadline that covers the status line and headers ends these exchanges.
"""

from __future__ import annotations

import gc
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from raw_server import raw_server

from gdc import releases
from gdc.registry import Registry
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.gate import registry as gate_registry
from nvidia_driver.gate.kubeapi import KubeAPI
from nvidia_driver.image import provision
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits
from nvidia_driver.sources.exchange import HEAD_LIMIT
from nvidia_driver.sources.fetch import Fetcher
from nvidia_driver.sources.http import Client, Limits

DEADLINE = 1.0
TIMEOUT = 3.0
SLACK = 1.5  # seconds past the deadline a loaded two-core machine may take to notice

STATUS = b"HTTP/1.1 200 OK\r\n"
# One header byte every 0.2 s: each read returns long before the 3 s read timeout, so without
# the deadline the 1,000 bytes would take 200 s.
TRICKLED_HEADERS = (STATUS + b"X-Trickle: ", *[b"a"] * 1000)
HEADER_FLOOD = STATUS + b"".join(b"X-Flood-%d: 1\r\n" % i for i in range(100_000)) + b"\r\n"
# 40 headers of 2 KiB: under http.client's 100 headers and 64 KiB a line, over the head's bound.
LARGE_HEAD = STATUS + b"".join(b"X-Large-%d: %s\r\n" % (i, b"b" * 2048) for i in range(40))

Attempt = Callable[[str], object]


def _limits() -> DownloadLimits:
    return DownloadLimits(timeout=TIMEOUT, deadline=DEADLINE, min_rate=0)


def _downloader() -> Downloader:
    return Downloader(_limits(), Backoff(attempts=2, first_delay=0.01))


def _entrypoint(url: str) -> object:
    return _downloader().get_small(url, 1 << 20, "a DIGESTS file")


def _registry(url: str) -> object:
    host = urllib.parse.urlsplit(url).netloc
    return Registry(host, client=_client()).digest("gdc/driver", "610.57.04-flatcar")


def _feed(url: str) -> object:
    return releases.read_text(url, _downloader())


def _client() -> Client:
    """The one client of the Kubernetes API and the registries (sources/http.py)."""
    return Client(Limits(timeout=TIMEOUT, deadline=DEADLINE))


def _gate_api(url: str) -> object:
    # One exchange: the gate's retries (bounded by its Backoff) are tested in gate/test_clients.
    api = KubeAPI(url.rpartition("/")[0], client=_client(), backoff=Backoff(attempts=1))
    return api.get("/api/v1/nodes/gpu-1")


def _gate_registry(url: str) -> object:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc
    if parts.scheme == "https":  # 127.1 is 127.0.0.1, but not a host the gate speaks http to
        host = host.replace("127.0.0.1", "127.1")
    image = gate_registry.ImageRef.parse(f"{host}/o/driver:610.57.04-flatcar4593.2.5")
    client = gate_registry.Registry(client=_client(), backoff=Backoff(attempts=1))
    return client.presence(image, "amd64")


# The clients asked for a URL as they are: (how it is asked, its own error type).
_CLIENTS: dict[str, tuple[Attempt, type[Exception]]] = {
    "download": (_entrypoint, DriverError),
    "feed": (_feed, DriverError),
    "registry": (_registry, DriverError),
    "gate-api": (_gate_api, DriverError),
    "gate-registry": (_gate_registry, DriverError),
}


@pytest.fixture(params=["download", "fetch", "provision", "feed", "registry", "gate-api",
                        "gate-registry"])  # fmt: skip
def client(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Attempt, type[Exception]]:
    """One download path: how it is asked for a URL, and its own error type."""
    if request.param == "fetch":
        fetcher = Fetcher(tmp_path / "cache", Commands(dict(os.environ)), downloader=_downloader())
        return fetcher.fetch, DriverError
    if request.param == "provision":
        # As the image build runs it: its limits from the environment.
        monkeypatch.setenv("NVIDIA_DRIVER_DOWNLOAD_DEADLINE", str(DEADLINE))
        monkeypatch.setenv("NVIDIA_DRIVER_DOWNLOAD_TIMEOUT", str(TIMEOUT))
        monkeypatch.setenv("NVIDIA_DRIVER_DOWNLOAD_MIN_RATE", "0")
        return (lambda url: provision.download(url, tmp_path / "driver.run")), DriverError
    return _CLIENTS[request.param]


def _refused(attempt: Attempt, error: type[Exception], url: str) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(error) as raised:
        attempt(url)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "\n" not in message
    assert "\r" not in message
    return message, elapsed


DEADLINE_WORDS = (
    "did not finish within 1 s (NVIDIA_DRIVER_DOWNLOAD_DEADLINE)",  # the entrypoint
    "past the 1 s deadline; the server is too slow",  # the feed
    "did not answer within 1 s",  # the registry and Kubernetes API client
)


def test_a_server_trickling_its_headers_cannot_hold_a_download_past_its_deadline(
    client: tuple[Attempt, type[Exception]],
) -> None:
    with raw_server(*TRICKLED_HEADERS, pause=0.2) as url:
        message, elapsed = _refused(*client, url)

    assert elapsed < DEADLINE + SLACK
    assert any(words in message for words in DEADLINE_WORDS), message


def test_a_server_flooding_headers_is_cut_off_within_the_deadline(
    client: tuple[Attempt, type[Exception]],
) -> None:
    with raw_server(HEADER_FLOOD) as url:
        message, elapsed = _refused(*client, url)

    assert elapsed < DEADLINE + SLACK
    assert "got more than 100 headers" in message


def test_a_response_head_over_its_bound_is_refused(
    client: tuple[Attempt, type[Exception]],
) -> None:
    assert len(LARGE_HEAD) > HEAD_LIMIT
    with raw_server(LARGE_HEAD + b"\r\n") as url:
        message, elapsed = _refused(*client, url)

    assert elapsed < DEADLINE + SLACK
    assert "headers over 64 KiB" in message


@pytest.mark.parametrize("name", ["download", "feed", "registry", "gate-api", "gate-registry"])
def test_a_server_trickling_its_tls_handshake_cannot_hold_a_download_past_its_deadline(
    name: str,
) -> None:
    # The start of a TLS record, then a byte at a time: the handshake waits for the rest.
    with raw_server(b"\x16\x03\x03\x40\x00", *[b"\x02"] * 1000, pause=0.2, scheme="https") as url:
        message, elapsed = _refused(*_CLIENTS[name], url)

    assert elapsed < DEADLINE + SLACK
    assert any(words in message for words in DEADLINE_WORDS), message


def test_a_server_trickling_its_headers_is_held_to_the_minimum_rate() -> None:
    limits = DownloadLimits(timeout=TIMEOUT, deadline=30, min_rate=1024, rate_window=0.3)
    downloader = Downloader(limits, Backoff(attempts=2, first_delay=0.01))
    with raw_server(*TRICKLED_HEADERS, pause=0.05) as url:
        message, elapsed = _refused(
            lambda url: downloader.get_small(url, 1 << 20, "a DIGESTS file"), DriverError, url
        )

    assert elapsed < 2 * (0.3 + 0.05) + SLACK  # two attempts of one window each
    assert f"download of {url} is too slow: " in message
    assert "under the minimum of 1.0 KiB/s (NVIDIA_DRIVER_DOWNLOAD_MIN_RATE)" in message
    assert message.endswith("(gave up after 2 attempts); check the node's network, DNS and "
                            "proxy settings")  # fmt: skip


@pytest.mark.parametrize("name", ["download", "feed", "registry", "gate-registry"])
def test_a_proxy_trickling_its_connect_answer_cannot_hold_a_download_past_its_deadline(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through an https_proxy, the tunnel's answer comes before TLS: it is read within the budget.
    trickle = (b"HTTP/1.1 200 Connection established\r\nX-Trickle: ", *[b"a"] * 1000)
    with raw_server(*trickle, pause=0.2) as proxy:
        monkeypatch.setenv("https_proxy", proxy.removesuffix("/releases.json"))
        for variable in ("no_proxy", "NO_PROXY", "HTTPS_PROXY"):
            monkeypatch.delenv(variable, raising=False)
        message, elapsed = _refused(*_CLIENTS[name], "https://mirror.example.org/releases.json")
    # A socket the failed tunnel left open would be reported here, not in whichever later test
    # the garbage collector happened to run in.
    gc.collect()

    assert elapsed < DEADLINE + SLACK
    assert any(words in message for words in DEADLINE_WORDS), message
