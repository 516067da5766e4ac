"""Small text downloads for the tooling (the releases feed, lts-info): bounded, one-line errors.

A read has an overall deadline, from the connect to the body's last byte (a server that
trickles its headers or its body a byte at a time cannot hold a run: the entrypoint's
``sources/exchange.py`` keeps it on every socket operation), a size cap, and every way it can
fail ends in one :class:`DownloadError` line: an unreachable host, an HTTP error, a bad status
line, a short read, a body that is neither UTF-8 nor gzip of UTF-8. A gzip body
(``Content-Encoding: gzip``, or a mirror serving the file compressed) is inflated within the
same cap.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass

from nvidia_driver.safetext import shown
from nvidia_driver.sources.exchange import Budget, ExchangeError, PastDeadlineError, handlers

DEADLINE_SECONDS = 120.0
MAX_BYTES = 64 << 20  # releases.json is 3.6 MB today (flatcar-website static/releases-json/)
_READ_TIMEOUT_SECONDS = 30.0
_CHUNK = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"
_SCHEMES = ("https://", "http://", "file://")


class DownloadError(OSError):
    """A download that did not give a complete, readable text; the message says which and why."""


@dataclass(frozen=True)
class Limits:
    deadline: float = DEADLINE_SECONDS  # seconds for the whole transfer
    max_bytes: int = MAX_BYTES  # on the wire and once inflated


def read_text(url: str, limits: Limits = Limits()) -> str:
    """The UTF-8 text at url (https, or http/file for mirrors and tests)."""
    if not url.startswith(_SCHEMES):
        raise DownloadError(f"{url!r} is not an http(s) or file URL")
    started = time.monotonic()
    try:
        body = _read(url, limits, started)
    except DownloadError:
        raise
    except ExchangeError as exc:
        raise DownloadError(_over_budget(url, exc, limits, started)) from None
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the answer's connection open
        raise DownloadError(_http_error(url, exc)) from None
    except urllib.error.URLError as exc:
        raise DownloadError(
            f"cannot reach {url}: {shown(' '.join(str(exc.reason).split()))}"
        ) from None
    except http.client.IncompleteRead as exc:
        raise DownloadError(f"{url}: the connection closed after {len(exc.partial)} bytes, "
                            "before the whole body arrived") from None  # fmt: skip
    except (http.client.HTTPException, OSError) as exc:
        detail = shown(str(exc)) or type(exc).__name__  # the server's words, on one line
        raise DownloadError(f"reading {url} failed: {type(exc).__name__}: {detail}") from None
    if body.startswith(_GZIP_MAGIC):
        body = _inflate(url, body, limits.max_bytes)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DownloadError(f"{url} is not UTF-8 text (byte {exc.start} is "
                            f"{body[exc.start]:#04x})") from None  # fmt: skip


def _http_error(url: str, error: urllib.error.HTTPError) -> str:
    """One line: urllib words a redirect loop on three lines (its inf_msg, then the reason)."""
    reason = shown(" ".join(str(error.reason).split()))
    if reason.startswith(" ".join(urllib.request.HTTPRedirectHandler.inf_msg.split())):
        return (f"{url} redirects in a loop (HTTP {error.code}, more than "
                f"{urllib.request.HTTPRedirectHandler.max_redirections} redirects or the same "
                "URL again): check the URL or the mirror's redirects")  # fmt: skip
    return f"{url} answered HTTP {error.code} {reason}"


def _read(url: str, limits: Limits, started: float) -> bytes:
    budget = Budget(started + limits.deadline, _READ_TIMEOUT_SECONDS)
    opener = urllib.request.build_opener(*handlers(budget))
    with opener.open(url) as response:
        length = response.headers.get("Content-Length") if hasattr(response, "headers") else None
        if length and length.isascii() and length.isdigit() and int(length) > limits.max_bytes:
            raise DownloadError(f"{url} is {int(length)} bytes, more than the "
                                f"{limits.max_bytes} allowed")  # fmt: skip
        # read1 returns what one socket read brought: the deadline is checked between reads,
        # where read(n) would wait for n bytes however slowly they come.
        read = getattr(response, "read1", response.read)
        chunks: list[bytes] = []
        size = 0
        while chunk := read(_CHUNK):
            size += len(chunk)
            if size > limits.max_bytes:
                raise DownloadError(f"{url} is larger than the {limits.max_bytes} bytes allowed")
            chunks.append(chunk)
            if time.monotonic() - started > limits.deadline:  # a file: no socket keeps it
                raise DownloadError(_too_slow(url, limits, started))
        missing = getattr(response, "length", None)  # what Content-Length still promised
        if isinstance(missing, int) and missing > 0:
            raise http.client.IncompleteRead(b"".join(chunks), missing)
        return b"".join(chunks)


def _too_slow(url: str, limits: Limits, started: float) -> str:
    elapsed = time.monotonic() - started
    return (f"{url}: no whole answer in {elapsed:.0f} s, past the {limits.deadline:g} s "
            "deadline; the server is too slow")  # fmt: skip


def _over_budget(url: str, exceeded: ExchangeError, limits: Limits, started: float) -> str:
    if isinstance(exceeded, PastDeadlineError):
        return _too_slow(url, limits, started)
    return f"{url} answered with {exceeded}: check the URL and any proxy"


def _inflate(url: str, body: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise DownloadError(f"{url}: the gzip body is damaged ({exc})") from None
    if len(text) > max_bytes or inflater.unconsumed_tail:
        raise DownloadError(f"{url} inflates to more than the {max_bytes} bytes allowed")
    if not inflater.eof:
        raise DownloadError(f"{url}: the gzip body is cut short")
    return text
