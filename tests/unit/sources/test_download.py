"""Downloads bounded in time and rate, redirects within a policy, aborted by a signal."""

from __future__ import annotations

import email.utils
import gzip
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fetch_server import ReleaseServer

from nvidia_driver.errors import DriverError
from nvidia_driver.sources.download import (
    DEFAULT_DEADLINE,
    DEFAULT_MIN_RATE,
    DEFAULT_REDIRECT_HOSTS,
    Backoff,
    Downloader,
    DownloadLimits,
    abort_downloads,
    content_length,
    redirect_refusal,
)

FILE = "amd64-usr/4593.2.5/flatcar_production_image.vmlinuz.DIGESTS"
CONTENT = b"# SHA512 HASH\n" + b"0" * 128 + b"  flatcar_production_image.vmlinuz\n"
LIMIT = 1 << 20


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    (tmp_path / "release" / FILE).parent.mkdir(parents=True)
    (tmp_path / "release" / FILE).write_bytes(CONTENT)
    with ReleaseServer(tmp_path / "release") as release_server:
        yield release_server


def downloader(sleeps: list[float] | None = None, **limits: float) -> Downloader:
    pauses = [] if sleeps is None else sleeps
    return Downloader(
        DownloadLimits(**limits),  # type: ignore[arg-type]
        Backoff(attempts=2, first_delay=0.01),
        sleep=pauses.append,
    )


def get(fetch: Downloader, url: str) -> bytes:
    return fetch.get_small(url, LIMIT, "a DIGESTS file")


# --- time limits ----------------------------------------------------------------------------


def test_a_server_trickling_bytes_is_stopped_at_the_deadline(server: ReleaseServer) -> None:
    # One byte every 0.2 s: every read returns before the 2 s read timeout, so that timeout
    # alone would take 37 s for this small file (for the 377 MB tarball: forever).
    server.trickled[f"/{FILE}"] = (1, 0.2)
    started = time.monotonic()

    with pytest.raises(DriverError) as raised:
        get(downloader(timeout=2, deadline=1, min_rate=0), server.url(FILE))

    assert time.monotonic() - started < 3
    message = str(raised.value)
    assert message == (
        f"the download of {server.url(FILE)} did not finish within 1 s "
        "(NVIDIA_DRIVER_DOWNLOAD_DEADLINE); use a faster mirror or raise the limit"
    )


def test_a_download_slower_than_the_minimum_rate_is_retried_then_refused(
    server: ReleaseServer,
) -> None:
    server.trickled[f"/{FILE}"] = (4, 0.05)  # 80 bytes/s
    sleeps: list[float] = []

    with pytest.raises(DriverError) as raised:
        get(downloader(sleeps, min_rate=1024, rate_window=0.3), server.url(FILE))

    message = str(raised.value)
    assert f"download of {server.url(FILE)} is too slow: " in message
    assert "KiB/s over the last 0.3 s, under the minimum of 1.0 KiB/s" in message
    assert "(NVIDIA_DRIVER_DOWNLOAD_MIN_RATE) (gave up after 2 attempts)" in message
    assert "\n" not in message
    assert server.requests[f"/{FILE}"] == 2
    assert sleeps == [0.01]


def test_a_slow_but_steady_download_above_the_minimum_rate_completes(
    server: ReleaseServer,
) -> None:
    server.trickled[f"/{FILE}"] = (40, 0.02)  # about 2 KB/s, for about 0.1 s

    assert get(downloader(min_rate=512, rate_window=0.05), server.url(FILE)) == CONTENT


def test_no_retry_starts_past_the_deadline(server: ReleaseServer) -> None:
    server.failures[f"/{FILE}"] = 5
    slow = Downloader(DownloadLimits(deadline=0.5), Backoff(attempts=5, first_delay=1.0))

    with pytest.raises(DriverError, match=r"HTTP 503 .*; the download of .* did not finish"):
        get(slow, server.url(FILE))
    assert server.requests[f"/{FILE}"] == 1


@pytest.mark.parametrize("http_date", [False, True])
def test_a_retry_waits_as_long_as_the_503s_retry_after_asks(
    server: ReleaseServer, *, http_date: bool
) -> None:
    # RFC 9110 10.2.3: seconds or an HTTP date; asking again sooner only meets another 503.
    server.failures[f"/{FILE}"] = 1
    server.retry_after[f"/{FILE}"] = (
        email.utils.formatdate(time.time() + 21, usegmt=True) if http_date else "20"
    )
    sleeps: list[float] = []

    assert get(downloader(sleeps), server.url(FILE)) == CONTENT
    assert len(sleeps) == 1
    assert 19 <= sleeps[0] <= 21


@pytest.mark.parametrize(
    "url", ["https:/mirror.example/stable/x", "http://[fd00::1/stable/x", "https://[fd00::1]:x/y"]
)
def test_a_url_with_no_usable_host_is_refused_at_once_in_one_line(url: str) -> None:
    """A typo in a base URL variable (one slash, an unclosed IPv6 bracket) is no network
    failure to retry for half a minute and blame on DNS, nor a ValueError traceback."""
    sleeps: list[float] = []

    with pytest.raises(DriverError, match=r"^cannot download .*: it names no host .*; check"):
        get(downloader(sleeps), url)
    assert sleeps == []


def test_the_defaults_fit_the_biggest_artifact_at_the_minimum_rate() -> None:
    developer_container = 480_000_000  # flatcar_developer_container.bin.bz2, about 480 MB
    assert developer_container / DEFAULT_MIN_RATE < DEFAULT_DEADLINE


def test_limits_come_from_the_environment() -> None:
    limits = DownloadLimits.from_env(
        {
            "NVIDIA_DRIVER_DOWNLOAD_TIMEOUT": "30",
            "NVIDIA_DRIVER_DOWNLOAD_DEADLINE": "600.5",
            "NVIDIA_DRIVER_DOWNLOAD_MIN_RATE": "2M",
            "NVIDIA_DRIVER_REDIRECT_HOSTS": "Mirror.example.org, *.cdn.example.net",
        }
    )

    assert limits == DownloadLimits(
        30, 600.5, 2 << 20, 60, ("mirror.example.org", "*.cdn.example.net")
    )
    assert DownloadLimits.from_env({}) == DownloadLimits()
    assert DownloadLimits.from_env({"NVIDIA_DRIVER_DOWNLOAD_MIN_RATE": "0"}).min_rate == 0
    assert DownloadLimits.from_env({"NVIDIA_DRIVER_REDIRECT_HOSTS": "none"}).redirect_hosts == ()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NVIDIA_DRIVER_DOWNLOAD_DEADLINE", "soon", "is not a number of seconds above 0"),
        ("NVIDIA_DRIVER_DOWNLOAD_TIMEOUT", "-1", "is not a number of seconds above 0"),
        ("NVIDIA_DRIVER_DOWNLOAD_DEADLINE", "nan", "is not a number of seconds above 0"),
        ("NVIDIA_DRIVER_DOWNLOAD_MIN_RATE", "1.5M", "is not a rate"),
        ("NVIDIA_DRIVER_DOWNLOAD_MIN_RATE", "²", "is not a rate"),
        ("NVIDIA_DRIVER_REDIRECT_HOSTS", "a.example/b", "lists a.example/b: give host names"),
    ],
)
def test_wrong_limits_are_refused_with_one_line(name: str, value: str, message: str) -> None:
    with pytest.raises(DriverError, match=message) as raised:
        DownloadLimits.from_env({name: value})
    assert str(raised.value).startswith(f"{name}")


# --- redirects ------------------------------------------------------------------------------


def test_a_redirect_on_the_same_host_is_followed(server: ReleaseServer) -> None:
    server.redirects["/current/flatcar_production_image.vmlinuz.DIGESTS"] = f"/{FILE}"

    url = server.url("current/flatcar_production_image.vmlinuz.DIGESTS")
    assert get(downloader(), url) == CONTENT


def test_a_redirect_to_another_host_is_refused_with_one_line(server: ReleaseServer) -> None:
    elsewhere = server.url(FILE).replace("127.0.0.1", "localhost")
    server.redirects["/moved"] = elsewhere

    with pytest.raises(DriverError) as raised:
        get(downloader(), server.url("moved"))

    assert str(raised.value) == (
        f"refusing the redirect of {server.url('moved')} to {elsewhere}: localhost is not among "
        "the allowed hosts (127.0.0.1, *.release.flatcar-linux.net, flatcar.org, "
        "*.flatcar.org); NVIDIA_DRIVER_REDIRECT_HOSTS lists the hosts redirects may go to"
    )
    assert server.requests[f"/{FILE}"] == 0


def test_a_redirect_to_an_allowed_host_is_followed(server: ReleaseServer) -> None:
    server.redirects["/moved"] = server.url(FILE).replace("127.0.0.1", "localhost")

    allowing = downloader(redirect_hosts=("localhost",))  # type: ignore[arg-type]
    assert get(allowing, server.url("moved")) == CONTENT


STABLE = "https://stable.release.flatcar-linux.net"
MIRROR = "https://mirror.example.org"


@pytest.mark.parametrize(
    ("origin", "target", "refusal"),
    [
        (f"{STABLE}/a", f"{STABLE}/b", None),
        (f"{MIRROR}/a", "https://bincache.release.flatcar-linux.net/a", None),
        (f"{STABLE}/a", "https://www.flatcar.org/a", None),
        (f"{STABLE}/a", f"{STABLE.replace('https', 'http')}/a", "scheme from https to http"),
        ("https://www.flatcar.org/k.asc", "https://169.254.169.254/x", "169.254.169.254 is not"),
        (f"{MIRROR}/a", f"{MIRROR}:8443/a", "mirror.example.org is not among"),
        (f"{MIRROR}:443/a", f"{MIRROR}/a", None),
        (f"{STABLE}/a", "https://release.flatcar-linux.net.evil.example/a", "is not among"),
    ],
)
def test_the_redirect_policy(origin: str, target: str, refusal: str | None) -> None:
    found = redirect_refusal(origin, target, DEFAULT_REDIRECT_HOSTS)

    assert found is None if refusal is None else refusal in (found or "")


# --- signals --------------------------------------------------------------------------------


def test_aborting_wakes_a_thread_blocked_reading_a_stalled_download(
    server: ReleaseServer,
) -> None:
    server.stalled.add(f"/{FILE}")
    opened = downloader(timeout=30).open(server.url(FILE))
    outcome: list[BaseException | bytes] = []

    def read_all() -> None:
        try:
            while chunk := opened.read(1 << 16):
                outcome.append(chunk)
            outcome.append(b"")
        except BaseException as exc:  # noqa: BLE001 - recorded for the test
            outcome.append(exc)

    reader = threading.Thread(target=read_all)
    reader.start()
    assert server.stalling.wait(5)
    started = time.monotonic()
    abort_downloads()
    reader.join(5)

    assert not reader.is_alive()
    assert time.monotonic() - started < 2  # not the 30 s read timeout
    opened.close()
    assert outcome[-1] == b""  # the read ended: the caller sees the body cut short


# --- small text files (Flatcar's releases feed and lts-info) --------------------------------


def _serve(server: ReleaseServer, body: bytes) -> str:
    (server.root / "feed.json").write_bytes(body)
    return server.url("feed.json")


def test_a_small_file_over_its_bound_is_refused(server: ReleaseServer) -> None:
    url = _serve(server, b"x" * 5000)
    with pytest.raises(DriverError, match=r"feed\.json is over 4096 bytes: not a feed; check"):
        downloader().get_small(url, 4096, "a feed")


def test_a_text_file_is_utf8_and_a_gzip_one_is_inflated_within_its_bound(
    server: ReleaseServer,
) -> None:
    assert downloader().get_text(_serve(server, gzip.compress(b'{"gz": 1}')), 4096, "a feed") == (
        '{"gz": 1}'
    )
    bomb = _serve(server, gzip.compress(b" " * 5000))
    with pytest.raises(DriverError, match=r"feed\.json inflates to more than the 4096 bytes"):
        downloader().get_text(bomb, 4096, "a feed")
    with pytest.raises(DriverError, match=r"is not UTF-8 text \(byte 2 is 0xff\): not a feed"):
        downloader().get_text(_serve(server, b'{"\xff": 1}'), 4096, "a feed")
    with pytest.raises(DriverError, match="the gzip body is cut short"):
        downloader().get_text(_serve(server, gzip.compress(b"{}")[:-6]), 4096, "a feed")


@pytest.mark.parametrize(
    ("header", "length"),
    [
        ("1024", 1024),
        (" 7 ", 7),
        ("0", 0),
        (None, None),
        ("", None),
        ("-1", None),
        ("+5", None),
        ("1_0", None),
        ("\xb2", None),
        ("\u0661\u0662", None),
    ],
)
def test_a_content_length_is_ascii_digits(header: str | None, length: int | None) -> None:
    """RFC 9110's 1*DIGIT: int() would take a sign, underscores and other scripts' digits."""
    assert content_length(header) == length
