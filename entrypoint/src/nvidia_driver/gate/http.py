"""One bounded HTTP exchange, for the Kubernetes API and the registries the gate asks.

Each exchange keeps the project's one deadline mechanism (:mod:`nvidia_driver.sources.exchange`),
and its body is bounded in bytes. Redirects are not followed here: neither the API server nor a
registry's manifest endpoint sends one that the gate should follow; the registry client follows
a blob's itself (:mod:`.registry`). The answer is returned whatever its status; failures to
exchange at all raise :class:`UnreachableError`, worth another try.
"""

from __future__ import annotations

import http.client
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import retry_after
from nvidia_driver.limits import MiB
from nvidia_driver.safetext import ANNOTATION_SHOWN, shown
from nvidia_driver.sources.download import Backoff
from nvidia_driver.sources.exchange import (
    Budget,
    BudgetedHTTPConnection,
    BudgetedHTTPSConnection,
    ExchangeError,
    PastDeadlineError,
)

USER_AGENT = "nvidia-driver-reboot-gate (Flatcar GPU driver container)"
MAX_RETRY_AFTER = 30.0  # seconds: a server asking for more is waited for this long
OK = range(200, 300)


class UnreachableError(DriverError):
    """The exchange did not complete (connection, timeout, deadline, truncated answer)."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 20.0  # seconds one connect or read may wait
    deadline: float = 60.0  # seconds for the whole exchange
    max_bytes: int = 16 * MiB  # the answer's body


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased
    body: bytes

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class Client:
    """Sends requests within the limits; ``context`` verifies https servers."""

    limits: Limits = field(default_factory=Limits)
    context: ssl.SSLContext | None = None
    clock: Callable[[], float] = time.monotonic

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Response:
        parts = urllib.parse.urlsplit(url)
        where = shown(url, ANNOTATION_SHOWN)  # the URL as the gate's lines show it
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise DriverError(f"cannot send to {where}: only http and https URLs work")
        budget = Budget(self.clock() + self.limits.deadline, self.limits.timeout, clock=self.clock)
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        connection = self._connection(parts, budget)
        try:
            connection.putrequest(method, target, skip_accept_encoding=True)
            for name, value in {"User-Agent": USER_AGENT, **(headers or {})}.items():
                connection.putheader(name, value)
            if body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            answer = connection.getresponse()
            names = {key.lower(): value for key, value in answer.getheaders()}
            content = b"" if method == "HEAD" else self._read(answer, where)
            return Response(answer.status, names, content)
        except PastDeadlineError:
            raise UnreachableError(
                f"{where} did not answer within {self.limits.deadline:g} s"
            ) from None
        except ExchangeError as exc:  # the head over its bound: no server the gate asks
            raise DriverError(
                f"{method} {where} was answered with {exc}: not what the gate asked for"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise UnreachableError(
                f"{method} {where} failed: {shown(str(exc), ANNOTATION_SHOWN)}"
            ) from None
        except ValueError as exc:  # http.client refuses a URL or header it cannot send
            raise DriverError(
                f"cannot send {method} {where}: {shown(str(exc), ANNOTATION_SHOWN)}"
            ) from None
        finally:
            connection.close()

    def _connection(
        self, parts: urllib.parse.SplitResult, budget: Budget
    ) -> http.client.HTTPConnection:
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            context = self.context or ssl.create_default_context()
            return BudgetedHTTPSConnection(host, budget=budget, port=port, context=context)
        return BudgetedHTTPConnection(host, budget=budget, port=port)

    def _read(self, answer: http.client.HTTPResponse, where: str) -> bytes:
        limit = self.limits.max_bytes
        length = answer.getheader("Content-Length")
        if length and length.isdigit() and int(length) > limit:
            raise DriverError(
                f"{where} answered {int(length)} bytes, over the limit of {limit}: not what the "
                "gate asked for"
            )
        body = answer.read(limit + 1)
        if len(body) > limit:
            raise DriverError(
                f"{where} answered more than {limit} bytes: not what the gate asked for"
            )
        return body


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
