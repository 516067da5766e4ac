"""HTTP(S) and file downloads with bounded time, bounded retries and a redirect policy.

Every download of a URL is bounded by :class:`DownloadLimits`: a read's timeout, a minimum rate
(a server that trickles bytes keeps a socket timeout from ever firing) and a deadline for all
attempts. The deadline and the rate hold for the whole exchange, headers included
(``exchange.py``).

Redirects are followed only on the same scheme, and only to the URL's own host or to one of
``redirect_hosts``; any other is refused with one line. Failures worth another attempt
(unreachable host, timeouts, HTTP 408/425/429/5xx, a truncated or too slow body) are retried
with exponential backoff.

A signal must end a download at once, even one a helper thread is blocked reading:
:func:`abort_downloads` (called by the entrypoint's signal handler) shuts every open connection
down, which wakes any read of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import re
import socket
import ssl
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import IO, Protocol, TypeVar

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import retry_after
from nvidia_driver.limits import FEED_SECONDS
from nvidia_driver.log import warn
from nvidia_driver.safetext import check, shown
from nvidia_driver.settings import (
    NVIDIA_DRIVER_DOWNLOAD_DEADLINE,
    NVIDIA_DRIVER_DOWNLOAD_MIN_RATE,
    NVIDIA_DRIVER_DOWNLOAD_TIMEOUT,
    NVIDIA_DRIVER_REDIRECT_HOSTS,
)
from nvidia_driver.sources.exchange import (
    Budget,
    ExchangeError,
    PastDeadlineError,
    TooSlowError,
    handlers,
    host_matches,
)

CHUNK = 1 << 20
SCHEMES = frozenset({"http", "https", "file"})
USER_AGENT = "nvidia-driver-entrypoint (Flatcar GPU driver container)"
NOT_FOUND = frozenset({HTTPStatus.NOT_FOUND, HTTPStatus.GONE})
RETRYABLE = frozenset(
    {HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.TOO_EARLY, HTTPStatus.TOO_MANY_REQUESTS}
)

# Sized for the biggest artifact, the ~480 MB developer container: at the minimum rate it
# takes 2 h 2 min, within the deadline; the ~377 MB container tarball takes 1 h 36 min.
DEFAULT_TIMEOUT = 60.0
DEFAULT_DEADLINE = 9000.0
DEFAULT_MIN_RATE = 64 << 10
DEFAULT_RATE_WINDOW = 60.0
# Flatcar's own release servers and website (the signing key): content from them is verified
# like any other, so a redirect between them is harmless.
DEFAULT_REDIRECT_HOSTS = ("*.release.flatcar-linux.net", "flatcar.org", "*.flatcar.org")
MAX_REDIRECTS = 5
# What a missing file (HTTP 404/410, no such file) most likely means, for the one-line error.
FLATCAR_MISSING = "no such Flatcar release or artifact; check the Flatcar version and channel"

_HOST_PATTERN = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
_SIZE = re.compile(r"([0-9]+)([kKmM]?)")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20}

_GZIP_MAGIC = b"\x1f\x8b"
_LOOP = urllib.request.HTTPRedirectHandler.inf_msg
_T = TypeVar("_T")


class TransientError(Exception):
    """A download failure worth another attempt, after ``wait`` seconds at least (a 429's or
    503's Retry-After)."""

    def __init__(self, message: str, wait: float = 0.0) -> None:
        super().__init__(message)
        self.wait = wait


@dataclass(frozen=True)
class Backoff:
    """Bounded retries: ``attempts`` tries with exponentially growing pauses in between."""

    attempts: int = 5
    first_delay: float = 2.0
    multiplier: float = 2.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")

    def delays(self) -> tuple[float, ...]:
        """The pauses between attempts: one fewer than the attempts."""
        return tuple(
            min(self.first_delay * self.multiplier**retry, self.max_delay)
            for retry in range(self.attempts - 1)
        )


@dataclass(frozen=True)
class DownloadLimits:
    """How long a download may take, how slow it may be, and where it may be redirected."""

    timeout: float = DEFAULT_TIMEOUT  # seconds one read may wait
    deadline: float = DEFAULT_DEADLINE  # seconds for one URL, all attempts included
    min_rate: int = DEFAULT_MIN_RATE  # bytes per second over each window (dropped and retried
    # below it); 0: no minimum
    rate_window: float = DEFAULT_RATE_WINDOW
    redirect_hosts: tuple[str, ...] = DEFAULT_REDIRECT_HOSTS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DownloadLimits:
        """The limits, with the ``NVIDIA_DRIVER_DOWNLOAD_*`` and redirect variables applied."""
        return cls(
            timeout=_seconds(env, NVIDIA_DRIVER_DOWNLOAD_TIMEOUT, DEFAULT_TIMEOUT),
            deadline=_seconds(env, NVIDIA_DRIVER_DOWNLOAD_DEADLINE, DEFAULT_DEADLINE),
            min_rate=_rate(env, NVIDIA_DRIVER_DOWNLOAD_MIN_RATE, DEFAULT_MIN_RATE),
            redirect_hosts=_hosts(env, NVIDIA_DRIVER_REDIRECT_HOSTS, DEFAULT_REDIRECT_HOSTS),
        )


def redirect_refusal(origin: str, target: str, allowed: tuple[str, ...]) -> str | None:
    """Why a redirect from ``origin`` to ``target`` is refused; None when it is allowed."""
    source, destination = urllib.parse.urlsplit(origin), urllib.parse.urlsplit(target)
    if destination.scheme != source.scheme:
        return f"it changes the scheme from {source.scheme} to {destination.scheme or 'none'}"
    if _endpoint(source) == _endpoint(destination):
        return None
    host = (destination.hostname or "").lower()
    if any(host_matches(host, pattern) for pattern in allowed):
        return None
    hosts = ", ".join((source.hostname or "", *allowed))
    return f"{host or 'no host'} is not among the allowed hosts ({hosts})"


def abort_downloads() -> None:
    """Shut down every open connection, waking whatever blocks reading one (signal-safe)."""
    for opened in tuple(_IN_FLIGHT):
        opened.abort()


class Digest(Protocol):
    """What save_to feeds: a hashlib object."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class _Body(Protocol):
    def read1(self, size: int, /) -> bytes: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Opened:
    """A response whose body is being read within its budget, and the length it announced."""

    def __init__(
        self, url: str, body: _Body, length: int | None, budget: Budget, limits: DownloadLimits
    ) -> None:
        self.url = url
        self.length = length
        self._body = body
        self._budget = budget
        self._limits = limits
        self._connection = _connection_of(body)
        if self._connection is not None:
            _IN_FLIGHT.add(self)

    def read(self, size: int) -> bytes:
        """At most ``size`` bytes, after at most one read of the connection."""
        try:
            chunk = self._body.read1(size)
            if self._connection is None:  # a file: no socket counts its bytes
                self._budget.moved(len(chunk), received=True)
        except ExchangeError as exc:
            raise _over_budget(self.url, exc, self._limits) from None
        except (OSError, http.client.HTTPException) as exc:
            raise TransientError(f"download of {self.url} broke off: {shown(str(exc))}") from exc
        return chunk

    def check_complete(self, size: int) -> None:
        """Refuse a body that ended before its Content-Length (the server or link dropped)."""
        if self.length is not None and size < self.length:
            raise TransientError(
                f"download of {self.url} was truncated: got {size} of {self.length} bytes"
            )

    def save_to(self, destination: Path, digest: Digest, *, sync: bool = False) -> str:
        """Write the whole body to destination (fsynced if sync), feeding digest; its hex."""
        size = 0
        with destination.open("wb") as file:
            while chunk := self.read(CHUNK):
                digest.update(chunk)
                file.write(chunk)
                size += len(chunk)
            self.check_complete(size)
            if sync:
                file.flush()
                os.fsync(file.fileno())
        return digest.hexdigest()

    def abort(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        _IN_FLIGHT.discard(self)
        if self._connection is not None:
            self._connection.close()
        self._body.close()


@dataclass(frozen=True)
class Downloader:
    """Opens URLs within the limits, retrying what is worth retrying."""

    limits: DownloadLimits = field(default_factory=DownloadLimits)
    backoff: Backoff = field(default_factory=Backoff)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    missing: str = FLATCAR_MISSING

    def open(self, url: str) -> Opened:
        """``url``'s response, its opening retried; the caller reads and closes it."""
        return self.transfer(url, lambda opened: opened, close=False)

    def transfer(self, url: str, use: Callable[[Opened], _T], *, close: bool = True) -> _T:
        """Open ``url`` and hand the response to ``use``; a transient failure starts over."""
        check(url, "the URL", "check the base URL variables")  # it is logged, then requested
        scheme, host = _scheme_and_host(url)
        if scheme not in SCHEMES:
            raise DriverError(f"cannot download {url}: only http, https and file URLs work")
        if not host and scheme != "file":  # urllib would fail each try as if the network did
            raise DriverError(f"cannot download {url}: it names no host and port to connect "
                              "to; check the base URL variables")  # fmt: skip
        ends = self.clock() + self.limits.deadline
        delays = self.backoff.delays()
        for attempt in range(self.backoff.attempts):
            try:
                opened = self._open(url, ends)
                if not close:
                    return use(opened)
                with contextlib.closing(opened):
                    return use(opened)
            except TransientError as exc:
                if attempt == len(delays):
                    raise DriverError(
                        f"{exc} (gave up after {self.backoff.attempts} attempts); "
                        "check the node's network, DNS and proxy settings"
                    ) from exc
                # RFC 9110 10.2.3: sooner, the server only refuses again; up to the longest pause.
                delay = max(delays[attempt], min(exc.wait, self.backoff.max_delay))
                if self.clock() + delay > ends:
                    raise DriverError(f"{exc}; {_past_deadline(url, self.limits)}") from exc
                warn(f"{exc}; retrying in {delay:g} s")
                self.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    def get_small(self, url: str, limit: int, what: str) -> bytes:
        """The whole body of a small file, refused past ``limit`` bytes."""

        def read(opened: Opened) -> bytes:
            content = b""
            while chunk := opened.read(CHUNK):
                content += chunk
                if len(content) > limit:
                    raise DriverError(
                        f"{url} is over {limit} bytes: not {what}; check the URL and any "
                        "proxy in between"
                    )
            opened.check_complete(len(content))
            return content

        return self.transfer(url, read)

    def get_text(self, url: str, limit: int, what: str) -> str:
        """A small UTF-8 file; a gzip body (a mirror may serve one) inflated within ``limit``."""
        body = self.get_small(url, limit, what)
        if body.startswith(_GZIP_MAGIC):
            body = _inflated(url, body, limit)
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DriverError(
                f"{url} is not UTF-8 text (byte {exc.start} is {body[exc.start]:#04x}): not "
                f"{what}; check the URL"
            ) from None

    def _open(self, url: str, ends: float) -> Opened:
        if ends <= self.clock():
            raise DriverError(_past_deadline(url, self.limits))
        limits = self.limits
        budget = Budget(ends, limits.timeout, limits.min_rate, limits.rate_window, clock=self.clock)
        opener = urllib.request.build_opener(
            _RedirectPolicy(url, limits.redirect_hosts), *handlers(budget)
        )
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})  # noqa: S310 - scheme checked
        try:
            response = opener.open(request)
        except ExchangeError as exc:
            raise _over_budget(url, exc, limits) from None
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the error page's connection open
            raise _http_failure(url, exc, self.missing) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, FileNotFoundError):  # file:// URLs
                raise not_found(url, "no such file", self.missing) from None
            if isinstance(exc.reason, ssl.SSLCertVerificationError):  # a retry gets the same
                raise DriverError(
                    f"cannot reach {url}: {shown(str(exc.reason))}; check the node's clock, and "
                    "behind a TLS-inspecting proxy give its CA in SSL_CERT_FILE"
                ) from None
            raise TransientError(f"cannot reach {url}: {shown(str(exc.reason))}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise TransientError(f"cannot reach {url}: {shown(str(exc))}") from exc
        length = content_length(response.headers.get("Content-Length"))
        return Opened(url, response, length, budget, limits)


def feed_downloader(env: Mapping[str, str]) -> Downloader:
    """What reads Flatcar's releases feed and lts-info, for the reboot gate and the tooling: the
    limits from env, every try within :data:`limits.FEED_SECONDS` (read with ``get_text`` and
    :data:`limits.FEED`)."""
    limits = DownloadLimits.from_env(env)
    return Downloader(
        dataclasses.replace(limits, deadline=min(limits.deadline, FEED_SECONDS)),
        missing="no such file; check the feed's URL",
    )


class _RedirectPolicy(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only on the same scheme, to the same host or an allowed one."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, origin: str, allowed: tuple[str, ...]) -> None:
        super().__init__()
        self.origin = origin
        self.allowed = allowed

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        refusal = redirect_refusal(self.origin, newurl, self.allowed)
        if refusal is not None:
            fp.close()
            raise DriverError(
                f"refusing the redirect of {req.full_url} to {shown(newurl)}: {refusal}; "
                f"{NVIDIA_DRIVER_REDIRECT_HOSTS} lists the hosts redirects may go to"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_IN_FLIGHT: set[Opened] = set()


def _inflated(url: str, body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise DriverError(f"{url}: the gzip body is damaged ({exc})") from None
    if len(text) > limit or inflater.unconsumed_tail:
        raise DriverError(f"{url} inflates to more than the {limit} bytes allowed")
    if not inflater.eof:
        raise DriverError(f"{url}: the gzip body is cut short")
    return text


def _connection_of(body: _Body) -> socket.socket | None:
    """A duplicate of the body's socket, to shut it down from elsewhere; None for files."""
    try:
        descriptor = body.fileno()
        if not stat.S_ISSOCK(os.fstat(descriptor).st_mode):
            return None
        return socket.socket(fileno=os.dup(descriptor))
    except (OSError, ValueError, AttributeError):
        return None


def _http_failure(url: str, failure: urllib.error.HTTPError, missing: str) -> Exception:
    code, status = failure.code, failure.reason
    reason = shown(status)  # the server's own words
    if code in NOT_FOUND:
        return not_found(url, f"HTTP {code}", missing)
    if code in RETRYABLE or code >= HTTPStatus.INTERNAL_SERVER_ERROR:
        asked = retry_after(failure.headers.get("Retry-After") or "")
        return TransientError(f"{url} answered HTTP {code} {reason}", asked or 0.0)
    # urllib words a redirect loop on three lines: its inf_msg, then the last reason.
    if " ".join(status.split()).startswith(" ".join(_LOOP.split())):
        return DriverError(
            f"{url} redirects in a loop (HTTP {code}, more than {MAX_REDIRECTS} redirects or the "
            "same URL again): check the URL or the mirror's redirects"
        )
    return DriverError(f"{url} answered HTTP {code} {reason}; check the URL and any proxy")


def not_found(url: str, why: str, missing: str = FLATCAR_MISSING) -> DriverError:
    return DriverError(f"{url} does not exist ({why}): {missing}")


def _over_budget(url: str, exceeded: ExchangeError, limits: DownloadLimits) -> Exception:
    """The download's words for what stopped its exchange: too slow is worth another try."""
    if isinstance(exceeded, PastDeadlineError):
        return DriverError(_past_deadline(url, limits))
    if isinstance(exceeded, TooSlowError):
        return TransientError(
            f"download of {url} is too slow: {exceeded}, under the minimum of "
            f"{limits.min_rate / 1024:.1f} KiB/s ({NVIDIA_DRIVER_DOWNLOAD_MIN_RATE})"
        )
    return DriverError(f"{url} answered with {exceeded}: check the URL and any proxy in between")


def _past_deadline(url: str, limits: DownloadLimits) -> str:
    return (
        f"the download of {url} did not finish within {limits.deadline:g} s "
        f"({NVIDIA_DRIVER_DOWNLOAD_DEADLINE}); use a faster mirror or raise the limit"
    )


def content_length(header: str | None) -> int | None:
    """A Content-Length's value, or None when it is not RFC 9110's ASCII digits (int() would
    take "+5", "1_0" and other scripts' digits)."""
    value = (header or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def _scheme_and_host(url: str) -> tuple[str, str]:
    """url's scheme and host; no host when its authority is unusable (an unclosed IPv6
    bracket, a port that is not 1 to 65535)."""
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.port != 0  # reading the port raises for one that is no number
    except ValueError:
        return url.partition(":")[0].lower(), ""
    return parts.scheme, (parts.hostname or "") if usable else ""


def _endpoint(url: urllib.parse.SplitResult) -> tuple[str, int | None]:
    try:
        port = url.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(url.scheme)
    return (url.hostname or "").lower(), port or default


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise DriverError(f"{name}={text!r} is not a number of seconds above 0")
    return value


def _rate(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    match = _SIZE.fullmatch(text)
    if match is None:
        raise DriverError(
            f"{name}={text!r} is not a rate: give bytes per second, optionally with K or M "
            "(KiB/s, MiB/s), or 0 for no minimum"
        )
    return int(match[1]) * _UNITS[match[2].lower()]


def _hosts(env: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text == "none":
        return ()
    hosts = tuple(host for host in re.split(r"[\s,]+", text) if host)
    wrong = [host for host in hosts if not _HOST_PATTERN.fullmatch(host)]
    if wrong:
        raise DriverError(
            f"{name} lists {', '.join(wrong)}: give host names (or *.domain), comma-separated, "
            "or 'none'"
        )
    return hosts
