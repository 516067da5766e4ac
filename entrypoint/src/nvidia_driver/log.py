"""Operator-facing log lines.

Operators and tools grep these lines verbatim ("Done, now waiting for signal"), so they are
printed as they are, without prefixes, and flushed at once so that `kubectl logs` sees them.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    print(message, flush=True)


def warn(message: str) -> None:
    print(f"WARNING: {message}", flush=True)


def error(message: str) -> None:
    print(f"ERROR: {message}", file=sys.stderr, flush=True)
