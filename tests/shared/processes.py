"""Whether a process has ended, for the checks of both suites that a daemon was stopped."""

from __future__ import annotations

import os
from pathlib import Path


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
