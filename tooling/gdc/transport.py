"""A requests session whose every exchange keeps one deadline, connect to the body's last byte.

requests' ``timeout`` bounds each socket read, not the exchange: a registry that sends one
header byte a second would hold a run forever. The session's adapter gives each request a
:class:`~nvidia_driver.sources.exchange.Budget` and its connections the entrypoint's
:class:`~nvidia_driver.sources.exchange.DeadlineSocket`, so every connect, TLS handshake, read
and write waits at most the time left; the response head is bounded in bytes too. A request
that runs out is one ``requests.Timeout`` (a RequestException) saying so. Connections kept
alive get a new budget with each request.
"""

from __future__ import annotations

import socket
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import requests
import requests.adapters
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError
from urllib3.response import HTTPResponse

from nvidia_driver.sources.exchange import (
    Budget,
    DeadlineSocket,
    ExchangeError,
    PastDeadlineError,
    connect,
)

DEADLINE_SECONDS = 120.0  # one request: a manifest, a config blob, a token
READ_TIMEOUT_SECONDS = 60.0

# The budget of the request being sent on this thread (set by the adapter around it).
_BUDGET: ContextVar[Budget] = ContextVar("gdc_transport_budget")


@dataclass(frozen=True)
class Limits:
    deadline: float = DEADLINE_SECONDS  # seconds for one request, connect to last byte
    timeout: float = READ_TIMEOUT_SECONDS  # seconds one read or write may wait


def deadline_session(limits: Limits = Limits()) -> requests.Session:
    """A requests session whose http and https requests each keep ``limits``."""
    session = requests.Session()
    adapter = _DeadlineAdapter(limits)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _Budgeted(HTTPConnection):
    """urllib3's connection, its socket within the current request's budget."""

    def _new_conn(self) -> socket.socket:
        budget = _BUDGET.get()
        try:
            connection = connect((self.host, self.port), budget, self.source_address)
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc
        # Duck-typed: a proxy's CONNECT answer is read through it, TLS wraps it (its timeout
        # bounds the handshake), http.client reads and writes through it.
        return DeadlineSocket(connection, budget)  # type: ignore[return-value]

    def connect(self) -> None:
        try:
            super().connect()
        except TimeoutError:
            _BUDGET.get().check()  # the TLS handshake timed out at the deadline
            raise
        if not isinstance(self.sock, DeadlineSocket):  # TLS wrapped it: its socket keeps it too
            self.sock = DeadlineSocket(self.sock, _BUDGET.get())

    def request(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(self.sock, DeadlineSocket):  # kept alive: this is a new exchange
            self.sock.budget = _BUDGET.get()
        super().request(*args, **kwargs)

    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # urllib3 does so too
        budget = _BUDGET.get()
        budget.reading_head()
        response = super().getresponse()
        budget.head_read()
        return response


class _HTTPS(_Budgeted, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _Budgeted


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPS


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _DeadlineAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> urllib3.PoolManager:
        manager: urllib3.PoolManager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS proxies bring their own pools
            manager.pool_classes_by_scheme = _POOLS
        return manager

    def send(  # noqa: PLR0917 - requests' signature
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        budget = Budget(time.monotonic() + self.limits.deadline, self.limits.timeout)
        token = _BUDGET.set(budget)
        try:
            response = super().send(request, stream, timeout, verify, cert, proxies)
            if not stream:
                _ = response.content  # the body too, within the budget and these errors
        except PastDeadlineError:
            raise requests.Timeout(
                f"{request.method} {request.url} did not end within the "
                f"{self.limits.deadline:g} s deadline",
                request=request,
            ) from None
        except ExchangeError as exc:
            raise requests.ConnectionError(
                f"{request.method} {request.url} was answered with {exc}", request=request
            ) from None
        finally:
            _BUDGET.reset(token)
        return response
