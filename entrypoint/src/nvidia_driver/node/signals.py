"""The signals a driver container is stopped with, turned into an unwinding of the running step.

The kubelet stops a pod with SIGTERM (and the others on a terminal or a hang-up): ``init`` and
the peermem sidecar both wait for one, and whatever runs when it comes unwinds into its
cleanup (errors.CaughtSignalError).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from nvidia_driver.errors import CaughtSignalError
from nvidia_driver.sources.download import abort_downloads

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _raise_caught(signum: int, _frame: FrameType | None) -> None:
    # Another thread may be blocked reading a download: wake it, so that the unwinding does not
    # wait for the network.
    abort_downloads()
    raise CaughtSignalError(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    previous = {sig: signal.signal(sig, _raise_caught) for sig in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_signals() -> None:
    # A second SIGTERM must not cut the cleanup short.
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def wait_for_signal() -> None:
    while True:
        signal.pause()
