"""One bounded HTTP exchange: the Kubernetes API and the registries, for the gate and the tooling.

Each exchange keeps the project's one deadline mechanism (:mod:`.exchange`), and goes through
the proxy the environment names (``https_proxy``, ``no_proxy``), as the downloads do, unless
the client is told to go direct (the in-cluster API server, never behind the node's proxy).
A body read whole (:meth:`Client.send`) is bounded in bytes; a large one is read as it arrives
(:meth:`Client.open`). Redirects are not followed here: neither the API server nor a
registry's manifest endpoint sends one to follow; the registry clients follow a blob's
themselves. The answer is returned whatever its status; failures to exchange at all raise
:class:`UnreachableError`, worth another try.
"""

from __future__ import annotations

import http.client
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import BinaryIO, Self

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import retry_after
from nvidia_driver.limits import MiB
from nvidia_driver.safetext import ANNOTATION_SHOWN, shown
from nvidia_driver.sources.download import Backoff, content_length
from nvidia_driver.sources.exchange import Budget, ExchangeError, PastDeadlineError, handlers

USER_AGENT = "nvidia-driver-reboot-gate (Flatcar GPU driver container)"
MAX_RETRY_AFTER = 30.0  # seconds: a server asking for more is waited for this long
OK = range(200, 300)


class UnreachableError(DriverError):
    """The exchange did not complete (connection, timeout, deadline, truncated answer)."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 20.0  # seconds one connect or read may wait
    deadline: float = 60.0  # seconds for the whole exchange
    max_bytes: int = 16 * MiB  # the answer's body, when read whole


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased
    body: bytes
    reason: str = ""  # the status line's words: the server's

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


class Answer:
    """An answer whose body is read as it arrives, within its exchange's deadline."""

    def __init__(self, response: http.client.HTTPResponse, method: str, where: str,
                 limits: Limits) -> None:  # fmt: skip
        self.status = response.status
        self.reason = response.reason
        self.headers = {key.lower(): value for key, value in response.getheaders()}
        self._response = response
        self._method = method
        self._where = where
        self._limits = limits

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._response.close()

    def read(self, size: int) -> bytes:
        """At most ``size`` bytes of the body, b"" at its end."""
        with _failures(self._method, self._where, self._limits):
            chunk = self._response.read1(size)
        if not chunk and size:
            self._check_whole()
        return chunk

    def read_all(self, limit: int) -> bytes:
        """The whole body, refused past ``limit`` bytes."""
        length = content_length(self.header("Content-Length"))
        if length is not None and length > limit:
            raise DriverError(f"{self._where} answered {length} bytes, over the limit of "
                              f"{limit}: not what was asked for")  # fmt: skip
        with _failures(self._method, self._where, self._limits):
            body = self._response.read(limit + 1)
        if len(body) > limit:
            raise DriverError(
                f"{self._where} answered more than {limit} bytes: not what was asked for"
            )
        self._check_whole()
        return body

    def _check_whole(self) -> None:
        """At the body's end: one cut short of its Content-Length broke off (http.client's
        read1 and read(amt) return what came and raise no IncompleteRead)."""
        missing = self._response.length  # what the Content-Length still announces
        if missing:
            raise UnreachableError(f"{self._method} {self._where} was truncated: {missing} "
                                   "bytes short of its Content-Length")  # fmt: skip


@dataclass(frozen=True)
class Client:
    """Sends requests within the limits; ``context`` verifies https servers; ``proxy``: through
    the environment's proxy, else directly."""

    limits: Limits = field(default_factory=Limits)
    context: ssl.SSLContext | None = None
    clock: Callable[[], float] = time.monotonic
    user_agent: str = USER_AGENT
    proxy: bool = True

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Response:
        """The whole answer, its body within the limits' bytes."""
        with self.open(method, url, headers, body) as answer:
            content = b"" if method == "HEAD" else answer.read_all(self.limits.max_bytes)
            return Response(answer.status, answer.headers, content, answer.reason)

    def open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | BinaryIO | None = None,
    ) -> Answer:
        """The answer, its body still to read: the caller closes it. A file ``body`` needs its
        Content-Length among the headers."""
        where = shown(url, ANNOTATION_SHOWN)  # the URL as the gate's lines show it
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise DriverError(f"cannot send to {where}: only http and https URLs work")
        budget = Budget(self.clock() + self.limits.deadline, self.limits.timeout, clock=self.clock)
        # No redirect followed, no status raised: the caller reads every answer.
        opener = urllib.request.build_opener(
            _EveryAnswer(), *handlers(budget, self.context, proxy=self.proxy)
        )
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
            url, body, {"User-Agent": self.user_agent, **(headers or {})}, method=method
        )
        with _failures(method, where, self.limits):
            response = opener.open(request)
        return Answer(response, method, where, self.limits)


class _EveryAnswer(urllib.request.HTTPErrorProcessor):
    def http_response(
        self,
        request: urllib.request.Request,  # noqa: ARG002 - urllib's signature
        response: http.client.HTTPResponse,
    ) -> http.client.HTTPResponse:
        return response

    https_response = http_response


@contextmanager
def _failures(method: str, where: str, limits: Limits) -> Iterator[None]:
    """An exchange that fails, worded once: UnreachableError when another try may do."""
    try:
        yield
    except PastDeadlineError:
        raise UnreachableError(f"{where} did not answer within {limits.deadline:g} s") from None
    except ExchangeError as exc:  # the head over its bound: no server a client here asks
        raise DriverError(
            f"{method} {where} was answered with {exc}: not what was asked for"
        ) from None
    except urllib.error.URLError as exc:  # urllib's wrapper of a connection's OSError
        raise UnreachableError(
            f"{method} {where} failed: {shown(str(exc.reason), ANNOTATION_SHOWN)}"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise UnreachableError(
            f"{method} {where} failed: {shown(str(exc), ANNOTATION_SHOWN)}"
        ) from None
    except ValueError as exc:  # http.client refuses a URL or header it cannot send
        raise DriverError(
            f"cannot send {method} {where}: {shown(str(exc), ANNOTATION_SHOWN)}"
        ) from None


def retryable(response: Response) -> bool:
    status = response.status
    return status == HTTPStatus.TOO_MANY_REQUESTS or status >= HTTPStatus.INTERNAL_SERVER_ERROR


def jittered(delay: float) -> float:
    """A pause between half ``delay`` and ``delay``, at random: gates that met the same 429
    at the same moment do not all ask again at the same moment."""
    return random.uniform(delay / 2, delay)  # noqa: S311 - spreading pauses, not a secret


def send_retried(
    send: Callable[[], Response],
    backoff: Backoff,
    sleep: Callable[[float], None],
    jitter: Callable[[float], float] = float,
) -> Response:
    """``send()`` until it answers other than 429 or 5xx or fails to exchange, within
    ``backoff`` (pauses passed through ``jitter``); the last answer or failure. A Retry-After
    is waited for in full (up to :data:`MAX_RETRY_AFTER`)."""
    delays = backoff.delays()
    for delay in delays:
        try:
            response = send()
        except UnreachableError:
            sleep(jitter(delay))
            continue
        if not retryable(response):
            return response
        asked = retry_after(response.header("Retry-After")) or 0.0
        sleep(max(jitter(delay), min(asked, MAX_RETRY_AFTER)))
    return send()
