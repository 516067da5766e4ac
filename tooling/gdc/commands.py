"""The one place the tooling runs external commands (docker buildx, cosign, syft).

A runner takes an argv and returns the exit status; the command's output goes straight to the
terminal. Commands are looked up on PATH, so tests put stubs there.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str]], int]


def run(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


def available(name: str) -> bool:
    return shutil.which(name) is not None
