"""Writing what a reader extracts: never through a symbolic link, never out of the root.

Writes never follow a symlink, so nothing is written outside the destination. Symlink targets
are checked lexically as they are written (:func:`contained_link_target`): absolute ones are
rewritten relative to the extracted root, and ones that climb out of it are refused. A chain of
links that are each fine as text can still climb out together: once extracted, links are judged
again by where they resolve (links.py, :func:`drop_escaping_links`).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from nvidia_driver.errors import DriverError
from nvidia_driver.links import escaping_links
from nvidia_driver.log import warn
from nvidia_driver.safetext import shown


def _normalized(base: PurePosixPath, target: str, clamp: bool) -> list[str] | None:
    """target's components resolved lexically from base; None if it climbs out (clamp: stay)."""
    parts = list(base.parts)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        elif not clamp:
            return None
    return parts


def contained_link_target(link: PurePosixPath, target: str) -> str | None:
    """A symlink target that stays under the root; absolute ones become relative to the link."""
    if not target:
        return None
    if target.startswith("/"):
        parts = _normalized(PurePosixPath(), target, clamp=True) or []
        return posixpath.relpath("/" + "/".join(parts), "/" + str(link.parent))
    return target if _normalized(link.parent, target, clamp=False) is not None else None


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


DIRECTORY, FILE, SYMLINK = 0, 1, 2  # what a TreeWriter made at a path
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _umask() -> int:
    """The process umask, read without changing it (Linux shows it in /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:  # noqa: PTH123 - one read
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class TreeWriter:
    """Fills root, a new directory nothing else writes to, never through a symlink.

    Paths are relative strings ("" is root). The writer remembers the kind of everything it
    made, so it needs no look-ups: a path it did not make does not exist, and a directory it
    made is never a symlink. This keeps a member's cost to the calls that create it, which
    matters for the ~15,000 members of a kernel tree.
    """

    def __init__(self, root: Path, refusal: str) -> None:
        self.root = root
        self._refusal = refusal  # what to do when the input would write through a link
        self._prefix = os.fspath(root) + "/"
        self._made: dict[str, int] = {"": DIRECTORY}
        self._umask = _umask()

    def path(self, rel: str) -> str:
        return self._prefix + rel if rel else self._prefix[:-1]

    def made(self, rel: str) -> int | None:
        """What the writer made at rel (DIRECTORY, FILE or SYMLINK), None if nothing."""
        return self._made.get(rel)

    def directory(self, rel: str) -> str:
        kind = self._made.get(rel)
        if kind == DIRECTORY:
            return self.path(rel)
        # The missing parents, made from the top down; a loop, not a recursion: deep paths.
        missing, parent = [], rel.rpartition("/")[0]
        while self._made.get(parent) != DIRECTORY:
            missing.append(parent)
            parent = parent.rpartition("/")[0]
        for ancestor in reversed(missing):
            self.directory(ancestor)
        path = self.path(rel)
        if kind == SYMLINK:
            raise DriverError(
                f"{rel} is a symbolic link in the extracted tree: refusing to write "
                f"through it; {self._refusal}"
            )
        if kind == FILE:
            os.unlink(path)  # noqa: PTH108 - string paths: no Path object per member
        os.mkdir(path, 0o755)  # noqa: PTH102
        self._made[rel] = DIRECTORY
        return path

    def _vacate(self, rel: str) -> str:
        parent = rel.rpartition("/")[0]
        if self._made.get(parent) != DIRECTORY:
            self.directory(parent)
        path = self._prefix + rel
        kind = self._made.get(rel)
        if kind == DIRECTORY:
            raise DriverError(f"{rel} is both a directory and a file in the download")
        if kind is not None:
            os.unlink(path)  # noqa: PTH108
        return path

    def file(self, rel: str, mode: int, mtime: float, fill: Callable[[int], None]) -> str:
        path = self._vacate(rel)
        mode &= 0o777
        # Created with its final mode: the descriptor may write whatever the mode says.
        fd = os.open(path, _CREATE, mode)
        self._made[rel] = FILE
        try:
            fill(fd)
            if mode & self._umask:
                os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
        return path

    def symlink(self, rel: str, target: str, mtime: float) -> None:
        path = self._vacate(rel)
        os.symlink(target, path)  # noqa: PTH211
        self._made[rel] = SYMLINK
        os.utime(path, (mtime, mtime), follow_symlinks=False)

    def hardlink(self, rel: str, existing: str) -> None:
        """Link rel to existing, a regular file this writer made (the caller checks)."""
        os.link(existing, self._vacate(rel), follow_symlinks=False)
        self._made[rel] = FILE

    def symlinks(self) -> list[str]:
        """The symbolic links the writer made, relative to root."""
        return [rel for rel, kind in self._made.items() if kind == SYMLINK]


def drop_escaping_links(root: Path, links: list[str], what: str) -> None:
    """Remove the links that resolve outside root (all judged before any is removed)."""
    for rel in escaping_links(root, links):
        target = str((root / rel).readlink())
        warn(f"{shown(rel)} resolves outside {what} ({shown(target)}); left out")
        (root / rel).unlink()
