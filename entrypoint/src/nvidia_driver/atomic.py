"""Writing small files atomically, safely in directories other programs share (``/run/nvidia``).

A reader sees the old content or the new one, never a half-written file. The temporary file has
a unique name made with ``O_EXCL`` (``tempfile.mkstemp``), so a file or symbolic link someone
left at a predictable name is neither followed nor overwritten.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

DEFAULT_MODE = 0o644


def write_atomically(path: Path, data: str | bytes, mode: int = DEFAULT_MODE) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8), synced to disk before the rename."""
    content = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
