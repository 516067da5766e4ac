"""Kernel build trees: what a provider hands the build, and how a tree is put in place.

The providers, from the cheapest to the most expensive: the node's own tree (hosttree.py), the
release's flatcar-container.tar.gz streamed (container.py), and the release's developer
container (devcontainer.py). Each tree is built in a staging directory beside its destination
and put in its place only when complete (atomic.replacing); an OSError says in one line whether
the disk is full or read-only or the input is bad.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from nvidia_driver.errors import DriverError
from nvidia_driver.links import resolve_within
from nvidia_driver.safetext import shown

# Where a tree came from (KernelTree.origin).
HOST = "host"
CONTAINER_TARBALL = "flatcar-container.tar.gz"
DEVELOPER_CONTAINER = "flatcar_developer_container"

MODULES_DIR = PurePosixPath("usr/lib/modules")
# What to do when an archive or image would write through one of its own links.
NOT_FLATCAR = "the download is not a Flatcar image, fetch it again"


@dataclass(frozen=True)
class KernelTree:
    """A kernel build tree ready for ``make M=``.

    ``toolchain_root`` is set when the tree is to be built from a chroot of that root (the
    developer container, whose gcc built the kernel). Otherwise the tree's host tools already
    run in this container.
    """

    build_dir: Path
    source_dir: Path
    kernel_release: str
    toolchain_root: Path | None
    origin: str


# Building a tree beside its destination.


@contextmanager
def scratch_beside(destination: Path) -> Iterator[Path]:
    """A temporary directory beside destination (same filesystem), removed afterwards."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix=f".{destination.name}.scratch.",
        dir=destination.parent,
        ignore_cleanup_errors=True,
    ) as name:
        yield Path(name)


_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _errno_named(text: str, codes: Iterable[int]) -> int | None:
    """The first of codes whose strerror the text names: tools (gcc, debugfs, shutil's
    collected failures) print the strerror, not the errno."""
    return next((code for code in codes if os.strerror(code) in text), None)


def tells_of_full_disk(text: str) -> bool:
    """Whether a tool's message says a disk is full."""
    return _errno_named(text, (errno.ENOSPC, errno.EDQUOT)) is not None


def _first_failure(exc: OSError) -> tuple[str, int | None]:
    """The failure to report, and its errno.

    shutil.copytree goes on past every file it cannot copy and raises them all at the end as
    one shutil.Error of (source, target, text) (CPython Lib/shutil.py): on a full disk, every
    file of a kernel tree. The first one is reported, its errno read back from its text.
    """
    failures = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else None
    if not isinstance(failures, list) or not failures:
        return str(exc), exc.errno
    text = str(failures[0][-1])
    code = _errno_named(text, _STORAGE_ERRORS)
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"{shown(text, 400)}{more}", code


@contextmanager
def one_line(what: str, directory: Path, otherwise: str) -> Iterator[None]:
    """Report an OSError as one line, telling a full or read-only disk from a bad input."""
    try:
        yield
    except OSError as exc:
        reason, code = _first_failure(exc)
        advice = otherwise
        if code in _STORAGE_ERRORS:
            advice = f"make room in {directory} (or make it writable) and retry"
        raise DriverError(f"cannot {what}: {reason}; {advice}") from exc


def kernels_in(root: Path) -> set[str]:
    modules = root / MODULES_DIR
    if not modules.is_dir():
        return set()
    return {
        entry.name
        for entry in modules.iterdir()
        if (entry / "build").is_symlink() or (entry / "build").exists()
    }


def single_kernel(available: set[str], wanted: str | None, label: str) -> str:
    listed = ", ".join(sorted(available)) or "none"
    if wanted is not None:
        if wanted in available:
            return wanted
        raise DriverError(
            f"{label} has no build tree for kernel {wanted} (it has: {listed}): "
            "is it the release the node runs?"
        )
    if len(available) == 1:
        return next(iter(available))
    if not available:
        raise DriverError(
            f"{label} holds no kernel build tree (usr/lib/modules/<kernel>/build): releases "
            "before 4230.1.0 ship none there; use the developer container"
        )
    raise DriverError(f"{label} holds several kernels ({listed}): name the one to use")


def tree_at(root: Path, release: str, toolchain_root: Path | None, origin: str) -> KernelTree:
    modules = root / MODULES_DIR / release
    build = resolve_within(root, modules / "build")
    if not (build / "Makefile").is_file():
        raise DriverError(
            f"the kernel build tree for {release} from {origin} has no Makefile ({build}): "
            "it is incomplete; report this with the Flatcar version"
        )
    source_link = modules / "source"
    source = build
    if source_link.is_symlink() or source_link.exists():
        source = resolve_within(root, source_link)
    return KernelTree(
        build_dir=build,
        source_dir=source if source.is_dir() else build,
        kernel_release=release,
        toolchain_root=toolchain_root,
        origin=origin,
    )


def missing_symbol_versions(build_dir: Path) -> Path | None:
    """build_dir's Module.symvers if it is missing or empty, else None.

    Modules resolve the kernel's symbols through it: a tree only prepared (``make
    modules_prepare``) has none, and NVIDIA's build then fails deep in make.
    """
    symvers = build_dir / "Module.symvers"
    try:
        if symvers.is_file() and symvers.stat().st_size > 0:
            return None
    except OSError:
        pass
    return symvers
