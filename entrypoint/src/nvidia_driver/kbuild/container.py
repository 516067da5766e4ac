"""The kernel build tree of a release's flatcar-container.tar.gz, read once, as a stream.

Since 4230.1.0 the archive holds a complete extmod tree. The 377 MiB archive is read once, by
tarfile in stream mode (formats/tar.py): only the kernel's ``build``/``source`` and the shared
libraries are written. Archive members named absolute or with ".." are refused, and so are
symlinks that climb out. A streamed archive is only written while it streams: its links are
checked by where they resolve and its tree walked and rewritten only after the download's
verdict.
"""

from __future__ import annotations

import tarfile
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from nvidia_driver import limits
from nvidia_driver.atomic import replacing
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import tar
from nvidia_driver.formats.output import TreeWriter
from nvidia_driver.kbuild.hosttools import (
    LIBRARY_DIRS,
    LIBRARY_NAME,
    is_gcc_runtime_dir,
    make_tools_runnable,
)
from nvidia_driver.kbuild.kerneltree import (
    CONTAINER_TARBALL,
    MODULES_DIR,
    NOT_FLATCAR,
    KernelTree,
    one_line,
    scratch_beside,
    single_kernel,
    tree_at,
)
from nvidia_driver.log import say
from nvidia_driver.safetext import shown
from nvidia_driver.sources.flatcar import RELEASE_FILE

_CHUNK = 1 << 20
# What a module build needs of usr/lib/modules/<kernel>: build, and source when it is a tree of
# its own. The rest (kernel/ with the kernel's own modules, most of the directory's bytes, and
# the modules.* indexes) serves loading modules, which the node does from its own /usr; an
# out-of-tree build resolves the kernel's symbols through build/Module.symvers.
_TREE_ENTRIES = ("build", "source")
_MODULES_PREFIX = f"{MODULES_DIR}/"
_MODULES_DEPTH = len(MODULES_DIR.parts)


class _Placement(NamedTuple):
    area: str  # "tree" (the kernel's build/source) or "runtime" (a shared library)
    path: str  # relative, normalized
    kernel: str


def _placement(path: str) -> _Placement | None:
    if path == RELEASE_FILE:  # which release the archive is: checked once it is verified
        return _Placement("release", path, "")
    if path.startswith(_MODULES_PREFIX):
        # usr, lib, modules, <kernel>, <entry>, the rest
        parts = path.split("/", _MODULES_DEPTH + 2)
        if len(parts) > _MODULES_DEPTH + 1 and parts[_MODULES_DEPTH + 1] in _TREE_ENTRIES:
            return _Placement("tree", path, parts[_MODULES_DEPTH])
        return None
    parent, _, name = path.rpartition("/")
    if ".so" not in name or not LIBRARY_NAME.match(name):
        return None
    if parent in LIBRARY_DIRS or is_gcc_runtime_dir(parent):
        return _Placement("runtime", path, "")
    return None


@dataclass
class _ContainerExtraction:
    archive: tar.TarStream
    tree: TreeWriter
    runtime: TreeWriter
    kernel_release: str | None
    kernels: set[str] = field(default_factory=set)

    def writer(self, placement: _Placement) -> TreeWriter:
        return self.runtime if placement.area == "runtime" else self.tree

    def refuse_escaping_links(self) -> None:
        try:
            for writer in (self.tree, self.runtime):
                tar.refuse_escaping_links(writer)
        except tar.UnsafeMemberError as exc:
            raise _unsafe(exc) from exc

    def member(self, member: tarfile.TarInfo) -> None:
        placement = _placement(tar.member_path(member.name))
        if placement is None:
            return
        if placement.area == "tree":
            self.kernels.add(placement.kernel)
            if self.kernel_release not in (None, placement.kernel):
                return
        if member.issparse():
            raise DriverError(
                f"{CONTAINER_TARBALL}: {shown(member.name)} is stored as a sparse file, which the "
                "extraction does not write; report this with the Flatcar version"
            )
        writer, rel, source = self.writer(placement), placement.path, None
        if member.islnk():
            linked = _placement(tar.member_path(member.linkname))
            source = linked.path if linked and linked.area == placement.area else None
        # Directories keep their mode, and the owner may always fill them.
        mode = member.mode & 0o777 | 0o700 if member.isdir() else member.mode
        written = self.archive.write(writer, rel, member, mode, source)
        if not written and member.islnk() and placement.area == "tree":
            raise DriverError(
                f"{CONTAINER_TARBALL}: {shown(member.name)} is a hard link to "
                f"{shown(member.linkname)}, which is not part of the kernel tree; report this "
                "with the Flatcar version"
            )
        # Else not written: a library linked to something not extracted (not needed: the
        # closure decides), a device or a fifo (no place in a build tree).


def _unsafe(exc: tar.UnsafeMemberError) -> DriverError:
    return DriverError(
        f"{CONTAINER_TARBALL} has {exc}: refusing the archive; fetch it again or report it"
    )


def _over_bound(what: str) -> DriverError:
    return DriverError(
        f"{CONTAINER_TARBALL} has {what}, beyond any Flatcar release: refusing the archive "
        "(a decompression bomb or not a Flatcar image); report it"
    )


def _drain(stream: BinaryIO) -> None:
    # Read to the end so that a verifying stream has seen every byte of the download.
    while stream.read(_CHUNK):
        pass


def _read_container_archive(
    stream: BinaryIO, tree_root: Path, libraries_root: Path, kernel_release: str | None
) -> _ContainerExtraction:
    """Write the wanted members, following nothing; the extraction tells what it wrote."""
    tree, libraries = TreeWriter(tree_root, NOT_FLATCAR), TreeWriter(libraries_root, NOT_FLATCAR)
    budget = tar.Budget(limits.CONTAINER_ENTRIES, limits.CONTAINER_WRITTEN, limits.CONTAINER_MEMBER)
    try:
        with tar.TarStream.open(stream, limits.CONTAINER_INFLATED, budget, "gzip") as archive:
            extraction = _ContainerExtraction(archive, tree, libraries, kernel_release)
            for member in archive.members():
                extraction.member(member)
    except tar.OverBoundError as exc:
        raise _over_bound(str(exc)) from exc
    except tar.UnsafeMemberError as exc:
        raise _unsafe(exc) from exc
    except tar.TarError as exc:
        raise DriverError(
            f"cannot extract {CONTAINER_TARBALL}: {exc}; delete the download and fetch it again"
        ) from exc
    _drain(stream)
    return extraction


def extract_container_tree(
    download: AbstractContextManager[BinaryIO], destination: Path, kernel_release: str | None
) -> KernelTree:
    """Extract the kernel build tree of a flatcar-container.tar.gz read once, as a stream.

    ``download`` is the archive's verifying stream (``Fetcher.stream``), entered here. While it
    is open the members are only written into a private staging directory, never followed.
    Only once it has closed cleanly (the verdict: DIGESTS and signature) are the links checked
    by where they resolve, and the tree walked and its tools rewritten.

    destination becomes a small root: usr/lib/modules/<kernel>/{build,source}, in usr/lib64
    the loader and libraries the tree's host tools need (the tools are wrapped to use them),
    and usr/share/flatcar/release, which names the release. kernel_release None takes the only
    kernel in the archive.
    """
    say(f"Extracting the kernel build tree from {CONTAINER_TARBALL}...")
    destination = destination.absolute()  # make runs with -C: relative paths would break
    what = f"extract {CONTAINER_TARBALL} to {destination}"
    with (
        one_line(what, destination.parent, "delete the download and fetch it again"),
        replacing(destination, directory=True) as staging,
        scratch_beside(destination) as libraries,
    ):
        with download as stream:
            extraction = _read_container_archive(stream, staging, libraries, kernel_release)
        # The download verified: from here on the staged tree may be followed and rewritten.
        extraction.refuse_escaping_links()
        release = single_kernel(extraction.kernels, kernel_release, CONTAINER_TARBALL)
        tree = tree_at(staging, release, None, CONTAINER_TARBALL)
        make_tools_runnable(tree.build_dir, libraries, staging, CONTAINER_TARBALL)
    return tree_at(destination, release, None, CONTAINER_TARBALL)
