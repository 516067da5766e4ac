"""The one error type the entrypoint reports to operators."""

from __future__ import annotations


class DriverError(Exception):
    """A failure with a one-line message: what failed, why, and what to do."""


class CaughtSignalError(Exception):
    """Raised from the signal handler so that any step unwinds into the cleanup."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
