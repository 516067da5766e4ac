"""Symbolic links followed inside a root, one component at a time, never out of it.

Two readings of the same walk:

- ``resolve_within``: as if the root were ``/`` (a chroot): an absolute target starts again at
  the root and ``..`` at the root stays there. This is how the host's files are read through
  ``/proc/1/root``; Flatcar's /etc/os-release is a relative link (../usr/lib/os-release).
- ``resolves_inside``: as the kernel resolves a link in an extracted tree that is *not* a chroot
  (kbuild, the tool relocation and the build read it from outside): an absolute target, or a
  ``..`` above the root, leaves the tree.

Every component is looked at (``os.readlink``), not only the last one, so a link in the middle
of a path is followed here, inside the root, and never by the kernel. Components that do not
exist are taken lexically, which never lets a later ``..`` climb further than the text says.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvidia_driver.errors import DriverError

MAX_SYMLINKS = 40  # the kernel's limit (MAXSYMLINKS)


class _UnresolvableError(Exception):
    """The walk leaves the root (never in a chroot), or loops."""


def _walk(root: str, parts: list[str], *, chroot: bool) -> list[str]:
    """parts resolved under root, every link followed; the resolved components."""
    pending = parts[::-1]  # a stack: the next component last
    resolved: list[str] = []
    followed = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            elif not chroot:
                raise _UnresolvableError
            continue
        try:
            # String paths: a lookup per component, no Path object built for each.
            target = os.readlink(os.path.join(root, *resolved, part))  # noqa: PTH115, PTH118
        except (OSError, ValueError):  # not a link, nothing there, or a NUL in the name
            resolved.append(part)
            continue
        followed += 1
        if followed > MAX_SYMLINKS:
            raise _UnresolvableError
        if target.startswith("/"):
            if not chroot:
                raise _UnresolvableError
            resolved = []
        pending.extend(reversed(target.split("/")))
    return resolved


def resolve_within(root: Path, path: Path) -> Path:
    """``path`` (under ``root``) with every link resolved as if ``root`` were ``/``.

    The result has no link in it below ``root``: opening it never leaves the root.
    """
    try:
        # Not os.path.relpath: that would fold "link/.." lexically, before the link is read.
        relative = path.relative_to(root)
    except ValueError:
        raise DriverError(f"{path} is not under {root}") from None
    try:
        resolved = _walk(os.fspath(root), list(relative.parts), chroot=True)
    except _UnresolvableError:
        raise DriverError(f"too many levels of symbolic links at {path}") from None
    return root.joinpath(*resolved)


def resolves_inside(root: Path, relative: str) -> bool:
    """Whether ``relative`` (a path in the tree at ``root``) resolves to a place in it."""
    try:
        _walk(os.fspath(root), relative.split("/"), chroot=False)
    except _UnresolvableError:
        return False
    return True


def tree_links(root: Path) -> list[str]:
    """The symbolic links in the tree at root, relative to it; no link is followed."""
    found: list[str] = []
    pending = [""]
    while pending:
        directory = pending.pop()
        with os.scandir(os.path.join(root, directory)) as entries:  # noqa: PTH118
            for entry in entries:
                relative = f"{directory}/{entry.name}" if directory else entry.name
                if entry.is_symlink():
                    found.append(relative)
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(relative)
    return sorted(found)


def escaping_links(root: Path, links: list[str]) -> list[str]:
    """Those of ``links`` (relative to root) that resolve outside the tree or loop."""
    return [link for link in links if not resolves_inside(root, link)]
