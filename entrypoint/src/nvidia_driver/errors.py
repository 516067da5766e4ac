"""The one error type the entrypoint reports to operators."""

from __future__ import annotations


class DriverError(Exception):
    """A failure with a one-line message: what failed, why, and what to do."""


class CaughtSignalError(BaseException):
    """Raised from the signal handler so that any step unwinds into the cleanup.

    A BaseException, like KeyboardInterrupt: code that handles a failed step (``except
    Exception``) must not handle a signal, which has to end the step at once.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
