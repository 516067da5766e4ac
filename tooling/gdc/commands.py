"""The one place the tooling runs external commands (docker buildx, cosign, syft, git, gh).

A runner takes an argv and returns the exit status; the command's output goes straight to the
terminal (``output`` keeps its standard output instead). Commands are looked up on PATH, so
tests put stubs there.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str]], int]
Capture = Callable[[Sequence[str]], tuple[int, str]]


def run(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


def output(argv: Sequence[str]) -> tuple[int, str]:
    """The exit status and standard output (its errors still go to the terminal)."""
    result = subprocess.run(list(argv), check=False, stdout=subprocess.PIPE, text=True)
    return result.returncode, result.stdout


def available(name: str) -> bool:
    return shutil.which(name) is not None
