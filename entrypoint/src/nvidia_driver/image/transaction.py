"""All-or-nothing installation: files written beside their destinations, then renamed into place.

A failure before or during the renames, or after them while the transaction is open, removes
what was written and puts back what was replaced.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nvidia_driver.atomic import remove
from nvidia_driver.log import warn

STAGED_SUFFIX = ".nvidia-staged"
REPLACED_SUFFIX = ".nvidia-replaced"


@dataclass
class Transaction:
    """Files written beside their destinations under temporary names, then renamed into place.

    Renames within a directory are atomic, so a reader sees the old file or the new one. What a
    commit replaces is kept (a hard link, or the renamed directory) until the transaction
    ends, so a rollback after the commit restores it.
    """

    staged: list[tuple[Path, Path]] = field(default_factory=list)  # (temporary, final)
    committed: list[tuple[Path, Path | None]] = field(default_factory=list)  # (final, backup)
    created_dirs: list[Path] = field(default_factory=list)

    def directory(self, path: Path) -> None:
        missing: list[Path] = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for directory in reversed(missing):
            directory.mkdir()
            self.created_dirs.append(directory)

    def stage_file(self, source: Path, final: Path, mode: int) -> None:
        self.directory(final.parent)
        handle, temporary = tempfile.mkstemp(
            prefix=f".{final.name}.", suffix=STAGED_SUFFIX, dir=final.parent
        )
        self.staged.append((Path(temporary), final))
        with os.fdopen(handle, "wb") as out, source.open("rb") as data:
            shutil.copyfileobj(data, out, 1 << 20)
        # After writing: a write clears setuid, and nvidia-modprobe keeps its 04755.
        Path(temporary).chmod(mode)
        stat = source.stat()
        os.utime(temporary, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    def stage_symlink(self, target: str, final: Path) -> None:
        self.directory(final.parent)
        temporary = final.with_name(f".{final.name}.{secrets.token_hex(4)}{STAGED_SUFFIX}")
        temporary.symlink_to(target)
        self.staged.append((temporary, final))

    def stage_directory(self, final: Path) -> Path:
        self.directory(final.parent)
        temporary = Path(
            tempfile.mkdtemp(prefix=f".{final.name}.", suffix=STAGED_SUFFIX, dir=final.parent)
        )
        self.staged.append((temporary, final))
        temporary.chmod(0o755)
        return temporary

    def commit(self) -> None:
        for temporary, final in self.staged:
            self.committed.append((final, _set_aside(final)))
            temporary.replace(final)

    def rollback(self) -> None:
        for final, backup in reversed(self.committed):
            _quietly(final, partial(remove, final))
            if backup is not None:
                _quietly(final, partial(backup.replace, final))
        for temporary, _ in self.staged:
            _quietly(temporary, partial(remove, temporary))
        for directory in reversed(self.created_dirs):
            _quietly(directory, directory.rmdir)

    def discard_backups(self) -> None:
        for _, backup in self.committed:
            if backup is not None:
                _quietly(backup, partial(remove, backup))


def _set_aside(final: Path) -> Path | None:
    """Keep what ``final`` holds under another name; None if there is nothing."""
    if not os.path.lexists(final):
        return None
    backup = final.with_name(f".{final.name}.{secrets.token_hex(4)}{REPLACED_SUFFIX}")
    if final.is_dir() and not final.is_symlink():
        final.rename(backup)  # a directory cannot be linked: rename it out of the way
    else:
        os.link(final, backup, follow_symlinks=False)  # final stays until replaced atomically
    return backup


def _quietly(path: Path, action: Callable[[], object]) -> None:
    """Cleanup keeps going: one path it cannot restore must not hide the original error."""
    try:
        action()
    except OSError as exc:
        warn(f"could not clean up {path}: {exc.strerror}")


@contextmanager
def all_or_nothing() -> Iterator[Transaction]:
    transaction = Transaction()
    try:
        yield transaction
    except BaseException:
        transaction.rollback()
        raise
    transaction.discard_backups()
