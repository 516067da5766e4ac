"""One deadline for a whole HTTP exchange: connect, TLS, status line, headers and body.

A read timeout alone bounds nothing: a server that sends one header byte a second never lets
it fire. So every socket operation of an exchange waits at most ``min(read timeout, time
left)`` (:class:`DeadlineSocket`), and past the deadline raises :class:`PastDeadlineError`.
Every byte moved counts towards the minimum rate, checked over each window from the first
byte to the last (:class:`TooSlowError`), and each response head (status line and headers,
those of redirects and 1xx answers too) is bounded in bytes (:class:`HeadTooLargeError`), on
top of http.client's own bounds (100 headers, 64 KiB a line). Name resolution is bounded by
the resolver's own timeouts (resolv.conf), not here.

The HTTP libraries (urllib, http.client, urllib3) pass these errors on unchanged, since they
are not OSErrors, and close the connection; each client words them. Users: urllib's openers
(:func:`handlers`): the downloads (download.py), and the one client of the Kubernetes API and
the registries (http.py), the gate's and the tooling's.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import math
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nvidia_driver.limits import KiB, size

# A real response head is a few hundred bytes to a few KiB (CDNs, registries with tokens).
# The count includes what the reader buffers past the head: at most one HEAD_READ.
HEAD_LIMIT = 64 * KiB
# What one read of the head asks for. Not io.DEFAULT_BUFFER_SIZE: 8 KiB in older Pythons,
# 128 KiB in newer ones (python/cpython#118144), which counted a body's first 128 KiB as head.
# Body reads (read1) go around the buffer, so it costs them nothing.
HEAD_READ = 8 * KiB


class ExchangeError(Exception):
    """An exchange stopped by its budget. Not an OSError: no HTTP library retries or wraps it."""


class PastDeadlineError(ExchangeError):
    def __init__(self) -> None:
        super().__init__("past the deadline")


class TooSlowError(ExchangeError):
    def __init__(self, rate: float, seconds: float) -> None:
        super().__init__(f"{rate / KiB:.1f} KiB/s over the last {round(seconds, 1):g} s")
        self.rate = rate
        self.seconds = seconds


class HeadTooLargeError(ExchangeError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"headers over {size(limit)}")


@dataclass
class Budget:
    """What one exchange may still take: time, and a rate it must keep."""

    ends: float  # on clock: the deadline
    timeout: float  # seconds one operation may wait
    min_rate: int = 0  # bytes per second over each window; 0: no minimum
    window: float = 60.0
    head_limit: int = HEAD_LIMIT
    clock: Callable[[], float] = time.monotonic
    _since: float = field(init=False)
    _moved: int = 0  # bytes in the current window
    _head: int | None = None  # bytes of the response head being read; None outside one

    def __post_init__(self) -> None:
        self._since = self.clock()

    def wait(self, cap: float | None = None) -> float:
        """How long the next operation may wait; PastDeadlineError if no time is left."""
        left = self.ends - self.clock()
        if left <= 0:
            raise PastDeadlineError
        return min(self.timeout, left, math.inf if cap is None else cap)

    def check(self) -> None:
        """After an operation timed out: PastDeadlineError if that was the deadline."""
        if self.clock() >= self.ends:
            raise PastDeadlineError

    def moved(self, count: int, *, received: bool) -> None:
        """Count bytes sent or received: the head's bound, the deadline, the rate."""
        if received and self._head is not None:
            self._head += count
            if self._head > self.head_limit:
                raise HeadTooLargeError(self.head_limit)
        now = self.clock()
        if now > self.ends:
            raise PastDeadlineError
        self._moved += count
        elapsed = now - self._since
        if elapsed < self.window:
            return
        if self._moved / elapsed < self.min_rate:
            raise TooSlowError(self._moved / elapsed, elapsed)
        self._since, self._moved = now, 0

    def reading_head(self) -> None:
        """A response head (status line, headers) is read next: its bytes are counted."""
        self._head = 0

    def head_read(self) -> None:
        """The response's head has been parsed: from here on only the body arrives."""
        self._head = None


def connect(
    address: tuple[str, int], budget: Budget, source: tuple[str, int] | None = None
) -> socket.socket:
    """A TCP connection to the first address that answers, every attempt within the budget."""
    host, port = address
    failure: OSError | None = None
    for family, kind, protocol, _, target in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        wait = budget.wait()
        connection = socket.socket(family, kind, protocol)
        try:
            connection.settimeout(wait)
            if source is not None:
                connection.bind(source)
            connection.connect(target)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            connection.close()
            budget.check()
            failure = exc
            continue
        except BaseException:
            connection.close()
            raise
        return connection
    raise failure or OSError(f"{host} resolves to no address")


class DeadlineSocket:
    """A connected socket (plain or TLS) whose every send and receive keeps the budget."""

    def __init__(self, connection: Any, budget: Budget) -> None:
        self.budget = budget
        self._socket = connection
        self._cap: float | None = None  # the timeout the HTTP library set
        self._readers = 0
        self._closed = False

    def settimeout(self, value: float | None) -> None:
        self._cap = value

    def gettimeout(self) -> float:
        # What the next operation waits at most. ssl's wrap_socket() takes it for the whole
        # handshake, which so ends within the budget too.
        return self.budget.wait(self._cap)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        count: int = self._waiting(lambda: self._socket.recv_into(buffer, nbytes, flags))
        self.budget.moved(count, received=True)
        return count

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data: bytes = self._waiting(lambda: self._socket.recv(bufsize, flags))
        self.budget.moved(len(data), received=True)
        return data

    def send(self, data: Any, flags: int = 0) -> int:
        count: int = self._waiting(lambda: self._socket.send(data, flags))
        self.budget.moved(count, received=False)
        return count

    def sendall(self, data: Any, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[self.send(view, flags) :]

    def makefile(self, mode: str = "r", *_: Any, **__: Any) -> io.BufferedReader:
        """A buffered reader of this socket: what http.client reads a response from."""
        if mode != "rb":
            raise ValueError(f"a DeadlineSocket makes only 'rb' files, not {mode!r}")
        self._readers += 1
        return io.BufferedReader(_SocketReader(self), HEAD_READ)

    def close(self) -> None:
        # Like socket.socket: the connection ends once its files are closed too (http.client
        # closes the socket of a "Connection: close" answer while its body is being read).
        self._closed = True
        if self._readers <= 0:
            self._socket.close()

    def released(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._socket.close()

    def abort(self) -> None:
        """Close the connection now, whatever readers of it are still open."""
        self._closed = True
        self._socket.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)

    def _waiting(self, operation: Callable[[], Any]) -> Any:
        self._socket.settimeout(self.budget.wait(self._cap))
        try:
            return operation()
        except TimeoutError:
            self.budget.check()
            raise


class _SocketReader(io.RawIOBase):
    def __init__(self, connection: DeadlineSocket) -> None:
        super().__init__()
        self._connection = connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any, /) -> int:
        return self._connection.recv_into(buffer)

    def fileno(self) -> int:
        descriptor: int = self._connection.fileno()
        return descriptor

    def close(self) -> None:
        if not self.closed:
            self._connection.released()
        super().close()


# --- urllib's openers -------------------------------------------------------------------------


class BudgetedHTTPConnection(http.client.HTTPConnection):
    """An http.client connection whose socket keeps ``budget``, from its connect on."""

    def __init__(self, host: str, *, budget: Budget, **options: Any) -> None:
        super().__init__(host, **options)
        self.budget = budget
        # What http.client's connect() opens its socket with: a proxy's CONNECT answer, and
        # everything after it, is read through the budget's socket then.
        self._create_connection = self._connect

    def connect(self) -> None:
        try:
            super().connect()
        except BaseException:
            # A connect that fails hands out no response, but http.client leaves the reader of
            # a proxy's CONNECT answer open: without this, the socket would stay open until the
            # garbage collector found that reader.
            if isinstance(self.sock, DeadlineSocket):
                self.sock.abort()
            raise

    def getresponse(self) -> http.client.HTTPResponse:
        self.budget.reading_head()
        response = super().getresponse()
        self.budget.head_read()
        return response

    def _connect(
        self, address: tuple[str, int], _timeout: object, source: tuple[str, int] | None = None
    ) -> DeadlineSocket:
        return DeadlineSocket(connect(address, self.budget, source), self.budget)


class BudgetedHTTPSConnection(BudgetedHTTPConnection, http.client.HTTPSConnection):
    def connect(self) -> None:
        try:
            super().connect()  # TLS over the budget's socket: the handshake within its timeout
        except TimeoutError:
            self.budget.check()  # the handshake timed out at the deadline
            raise
        self.sock = DeadlineSocket(self.sock, self.budget)


class _BudgetedHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Opens http and https URLs (in place of urllib's two handlers) within one budget."""

    def __init__(self, budget: Budget, context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._budget = budget
        self._tls = context

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connections(BudgetedHTTPConnection), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        # Without a context, http.client makes its default (certificates verified, ALPN
        # http/1.1).
        return self.do_open(self._connections(BudgetedHTTPSConnection), req, context=self._tls)

    def _connections(
        self, kind: type[BudgetedHTTPConnection]
    ) -> Callable[..., http.client.HTTPConnection]:
        def connection(host: str, **options: Any) -> http.client.HTTPConnection:
            return kind(host, budget=self._budget, **options)

        return connection


class _ProxyHandler(urllib.request.ProxyHandler):
    """The environment's proxies, as urllib reads them, and no_proxy's CIDR ranges and
    "*.domain" entries too, as Go's proxy rules read them (golang.org/x/net/http/httpproxy: an
    IP address host inside a range goes direct; names are not resolved). Clusters list their
    networks there for containerd and the kubelet; a registry or mirror addressed by IP in one
    is reached as they reach it."""

    proxies: dict[str, str]  # urllib's getproxies(): "no" holds no_proxy

    def proxy_open(
        self,
        req: urllib.request.Request,
        proxy: str,
        type: str,  # noqa: A002 - urllib's name
    ) -> Any:
        no_proxy = self.proxies.get("no", "")
        if _in_range(req.host, no_proxy) or _under_wildcard(req.host, no_proxy):
            return None  # direct: the next handler opens it
        return super().proxy_open(req, proxy, type)


def _in_range(host: str, no_proxy: str) -> bool:
    try:
        address = ipaddress.ip_address(urllib.parse.urlsplit(f"//{host}").hostname or "")
    except ValueError:
        return False  # a name, or no host
    for entry in no_proxy.split(","):
        try:
            if address in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue  # a name, "*", or nothing: urllib's own rules read those
    return False


def _under_wildcard(host: str, no_proxy: str) -> bool:
    """Whether a "*.domain" entry covers host, as Go reads it (the names under domain); urllib
    takes it for a literal name that matches nothing."""
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""  # lower-cased, no port
    entries = (entry.strip().lower() for entry in no_proxy.split(","))
    return any(host_matches(name, entry) for entry in entries if entry.startswith("*."))


def host_matches(host: str, pattern: str) -> bool:
    """Whether host (lower-cased) is pattern, or a name under domain for a "*.domain" pattern:
    the redirect hosts' rule, and Go's for no_proxy's "*." entries."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def handlers(
    budget: Budget, context: ssl.SSLContext | None = None, *, proxy: bool = True
) -> tuple[urllib.request.BaseHandler, ...]:
    """urllib handlers (for ``build_opener``) whose connections all keep ``budget``; https
    servers verified with ``context`` (the default one if None); through the environment's
    proxy (:class:`_ProxyHandler`), or directly when ``proxy`` is False."""
    proxies = _ProxyHandler() if proxy else urllib.request.ProxyHandler({})
    return (proxies, _BudgetedHandler(budget, context))
