"""The one place the tooling runs external commands (docker buildx, cosign, syft, git, gh, zstd).

A runner takes an argv and returns the exit status; the command's output goes straight to the
terminal (``output`` keeps its standard output instead; ``run_within`` ends a command that
outlives its seconds, and returns :data:`TIMED_OUT`). Commands are looked up on PATH, so tests
put stubs there.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str]], int]
Capture = Callable[[Sequence[str]], tuple[int, str]]
TIMED_OUT = 124  # what timeout(1) returns


def run(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


def run_within(argv: Sequence[str], seconds: float) -> int:
    """run, but a command still running after seconds is killed: TIMED_OUT."""
    try:
        return subprocess.run(list(argv), check=False, timeout=seconds).returncode
    except subprocess.TimeoutExpired:
        return TIMED_OUT


def output(argv: Sequence[str]) -> tuple[int, str]:
    """The exit status and standard output (its errors still go to the terminal)."""
    result = subprocess.run(list(argv), check=False, stdout=subprocess.PIPE, text=True)
    return result.returncode, result.stdout


def available(name: str) -> bool:
    return shutil.which(name) is not None
