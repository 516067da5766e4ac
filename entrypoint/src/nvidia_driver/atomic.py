"""Writing files and replacing directories atomically, safely in directories other programs share
(``/run/nvidia``).

A reader sees the old content or the new one, never a half-written file and never no directory
at all, also after a SIGKILL at any point. What is written is staged beside its destination
under a unique dot name (``tempfile.mkstemp``, ``mkdtemp``: ``O_EXCL``), so a file or symbolic
link someone left at a predictable name is neither followed nor overwritten, and what a killed
writer leaves is a dot name the caches' sweep removes (kbuild/cachedirs.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_MODE = 0o644
DIRECTORY_MODE = 0o755
# renameat2(2): AT_FDCWD and RENAME_EXCHANGE, from <fcntl.h> and <linux/fs.h>.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# Where the exchange is not possible: an old kernel or libc, a filesystem without it (NFS), or
# a directory an overlay cannot move (a lower layer's): the old tree is then moved aside.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV}


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


def remove(path: Path, *, ignore_errors: bool = False) -> None:
    """Remove a file, a link or a directory tree; a link to a directory is not followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=ignore_errors)
    else:
        path.unlink(missing_ok=True)


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def replacing(destination: Path, *, directory: bool = False) -> Iterator[Path]:
    """A path beside destination that replaces it only if the block completes.

    The block makes it: a file, a link or a directory; with ``directory`` it is an empty
    directory (mode 0o755) already. Whatever happens, nothing of it is left behind but the
    result at destination (:func:`replace`).
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        staged = scratch / destination.name
        if directory:
            staged.mkdir()
            staged.chmod(DIRECTORY_MODE)
        yield staged
        replace(staged, destination)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def replace(new: Path, destination: Path) -> None:
    """Put new (on destination's filesystem) at destination, in one step.

    A file or a link is renamed over destination. A directory is exchanged with the one at
    destination (renameat2's RENAME_EXCHANGE): at every instant destination is the old tree or
    the new one. The old tree is left at new's name, for the caller to remove. Where the
    exchange is not possible, it is moved aside to ``<new>.old`` first: then, and only then, a
    kill between the two renames leaves no tree at destination.
    """
    if not new.is_dir() or new.is_symlink() or not os.path.lexists(destination):
        new.replace(destination)
        return
    if _exchange(new, destination):
        return
    try:
        destination.rename(new.with_name(f"{new.name}.old"))
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.rmtree(destination)  # an overlay's lower directory: it cannot be moved
    new.rename(destination)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step; False where this system or filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # a libc before glibc 2.28
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]  # fmt: skip
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                 _RENAME_EXCHANGE) == 0:  # fmt: skip
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(second))
