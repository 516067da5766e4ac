"""Kernel build trees for the runtime build, from the cheapest provider to the most expensive.

1. ``host_tree``: the node's own ``/usr/lib/modules/<kernel>/build``, read through PID 1's root
   (the Operator gives the pod hostPID). It is copied, because the host's /usr is read-only and
   the copy's host tools must be pointed at the host's glibc (see 4).
2. ``extract_container_tree``: the release's flatcar-container.tar.gz. Since 4230.1.0 it holds a
   complete extmod tree. The 377 MiB archive is read once, as a stream: only the kernel's
   ``build``/``source`` and the shared libraries are written.
3. ``extract_developer_container``: the release's developer container. Its gcc built the kernel;
   the result is a root to chroot into (``developer_container_tree`` describes its tree).
4. ``relocate_host_tools``: kbuild's host tools (fixdep, modpost, objtool, sign-file...) in a
   Flatcar tree are linked against Flatcar's glibc, which is newer than the container's. Their
   PT_INTERP (/lib64/ld-linux-x86-64.so.2) exists in the container too, but it is the
   container's loader with the container's libc, so the tools fail with "GLIBC_2.xx not found".
   So every dynamically linked tool is renamed to ``<tool>.real``, and a shell wrapper runs it
   with the loader and the libraries it was linked against. The wrapper finds them relative to
   its own canonical path, so the tree can be renamed or bind-mounted elsewhere.

Library selection: a tool's libraries are the transitive closure of the DT_NEEDED entries
(read by formats/elf.py), looked up in usr/lib64, lib64, usr/lib, lib and gcc's
versioned runtime directory. The archive stream can be read only once and its members come in
no useful order, so every shared library of those directories is written to a scratch
directory, and only the closure is kept. This costs some scratch space, but no allowlist can
fall behind a new Flatcar dependency.

The developer container is a GPT disk whose partition 9 holds ext4: formats/gpt.py and
formats/ext4.py read it in place, from the sparse image.

Safety: writes never follow a symlink, so nothing is written outside the destination. Archive
members named absolute or with ".." are refused. Symlink targets are checked lexically as they
are written: absolute ones are rewritten relative to the extracted root, and ones that climb out
of it are refused. Once extracted, every link is checked again by where it resolves (links.py):
a chain of links that are each fine as text can still climb out together. A streamed archive is
only written while it streams: its links are checked and its tree walked and rewritten only
after the download's verdict. Tool directories that are links are refused. Each tree is built in
a staging directory beside the destination and renamed into place only when complete.
"""

from __future__ import annotations

import bz2
import errno
import os
import re
import shlex
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output, tar
from nvidia_driver.formats.elf import MACHINES, ElfInfo, read_elf
from nvidia_driver.formats.ext4 import Ext4
from nvidia_driver.formats.gpt import LINUX_FILESYSTEM, Partition, read_gpt
from nvidia_driver.formats.output import TreeWriter, contained_link_target, drop_escaping_links
from nvidia_driver.links import escaping_links, resolve_within, tree_links
from nvidia_driver.log import say, warn
from nvidia_driver.paths import Paths
from nvidia_driver.sources.flatcar import RELEASE_FILE

# Where a tree came from (KernelTree.origin).
HOST = "host"
CONTAINER_TARBALL = "flatcar-container.tar.gz"
DEVELOPER_CONTAINER = "flatcar_developer_container"

MODULES_DIR = PurePosixPath("usr/lib/modules")
RUNTIME_LIB_DIR = PurePosixPath("usr/lib64")  # where a tree's host tools find their glibc
# What a module build needs of usr/lib/modules/<kernel>: build, and source when it is a tree of
# its own. The rest (kernel/ with the kernel's own modules, most of the directory's bytes, and
# the modules.* indexes) serves loading modules, which the node does from its own /usr; an
# out-of-tree build resolves the kernel's symbols through build/Module.symvers.
_TREE_ENTRIES = ("build", "source")
_MODULES_PREFIX = f"{MODULES_DIR}/"
_MODULES_DEPTH = len(MODULES_DIR.parts)
_TOOL_DIRS = ("scripts", "tools")
_LIBRARY_DIRS = ("usr/lib64", "lib64", "usr/lib", "lib")
_GCC_RUNTIME_DIRS = "usr/lib/gcc/*/*"  # Gentoo keeps libgcc_s and libstdc++ there
_GCC_RUNTIME_PREFIX, _GCC_RUNTIME_DEPTH = "usr/lib/gcc/", _GCC_RUNTIME_DIRS.count("/")
_LIBRARY_NAME = re.compile(r"^[^/]+\.so(\.[0-9][^/]*)?$")
_REAL_SUFFIX = ".real"  # a wrapped host tool's own binary
_CHUNK = 1 << 20
# What to do when an archive or image would write through one of its own links.
_NOT_FLATCAR = "the download is not a Flatcar image, fetch it again"


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


# The host tools and the glibc they were linked against.


def _dynamic_executables(build_dir: Path) -> list[tuple[Path, ElfInfo]]:
    """kbuild's dynamically linked ELF host tools in the tree (wrappers are not ELF files)."""
    found = []
    for top in _TOOL_DIRS:
        for directory, _, files in sorted(os.walk(build_dir / top)):
            for name in sorted(files):
                path = Path(directory) / name
                if name.endswith(_REAL_SUFFIX) or path.is_symlink():
                    continue
                if not path.stat().st_mode & 0o111:
                    continue
                info = read_elf(path)
                if info is not None and info.interpreter:
                    found.append((path, info))
    return found


def _library_dirs(root: Path) -> list[Path]:
    candidates = [resolve_within(root, root / name) for name in _LIBRARY_DIRS]
    gcc_dirs = sorted(root.glob(_GCC_RUNTIME_DIRS), reverse=True)
    candidates += [resolve_within(root, directory) for directory in gcc_dirs]
    unique: list[Path] = []
    for directory in candidates:  # resolved inside root: equal paths are the same directory
        if directory.is_dir() and directory not in unique:
            unique.append(directory)
    return unique


def _is_library(path: Path) -> bool:
    return bool(_LIBRARY_NAME.match(path.name))


def _find_library(name: str, directories: list[Path], root: Path) -> Path | None:
    for directory in directories:
        candidate = directory / name
        if candidate.is_symlink() or candidate.exists():
            resolved = resolve_within(root, candidate)
            if resolved.is_file():
                return resolved
    return None


def install_runtime(executables: Iterable[Path], source_root: Path, lib_dir: Path) -> list[str]:
    """Copy to lib_dir the loader and every library the executables need, from source_root.

    Libraries are followed transitively through DT_NEEDED; the names installed are returned.
    """
    directories = _library_dirs(source_root)
    pending: list[tuple[str, Path]] = []
    for executable in executables:
        pending += _dependencies(executable)
    installed: set[str] = set()
    lib_dir.mkdir(parents=True, exist_ok=True)
    while pending:
        name, user = pending.pop()
        if name in installed:
            continue
        found = _find_library(name, directories, source_root)
        if found is None:
            raise DriverError(
                f"{name}, needed by the kernel tree's {user.name}, is not in the libraries of "
                f"{source_root}: the tree's host tools cannot run; report this with the Flatcar "
                "version"
            )
        shutil.copyfile(found, lib_dir / name)
        (lib_dir / name).chmod(0o755)
        installed.add(name)
        pending += _dependencies(found)
    return sorted(installed)


def _dependencies(path: Path) -> list[tuple[str, Path]]:
    info = read_elf(path)
    if info is None:
        return []
    names = [*([info.interpreter] if info.interpreter else []), *info.needed]
    # Only the file name counts: the libraries are installed flat into one directory.
    return [(PurePosixPath(name).name, path) for name in names if PurePosixPath(name).name]


_WRAPPER = """#!/bin/sh
# Written by nvidia-driver: {tool} is linked against Flatcar's glibc, newer than this
# container's, so run it with the loader and the libraries it was linked against.
here=$(readlink -f -- "$0") || exit 127
here=${{here%/*}}
exec "$here"/{loader} --inhibit-cache --library-path {library_path} "$here"/{real} "$@"
"""


class ForeignToolsError(DriverError):
    """The tree's host tools are built for another architecture: no build can use the tree."""


def _check_machine(tool: Path, info: ElfInfo) -> None:
    machine = os.uname().machine
    expected = MACHINES.get(machine)
    if expected is not None and info.machine != expected:
        raise ForeignToolsError(
            f"the kernel tree's {tool.name} is built for ELF machine {info.machine}, not for "
            f"this {machine} machine: the tree's host tools cannot run here"
        )


def _write_wrapper(tool: Path, loader: Path, library_dirs: list[Path]) -> None:
    here = tool.parent.resolve()
    real = tool.with_name(tool.name + _REAL_SUFFIX)
    tool.rename(real)
    library_path = ":".join(
        f'"$here"/{shlex.quote(os.path.relpath(d.resolve(), here))}' for d in library_dirs
    )
    tool.write_text(
        _WRAPPER.format(
            tool=tool.name,
            loader=shlex.quote(os.path.relpath(loader.resolve(), here)),
            library_path=library_path,
            real=shlex.quote(real.name),
        )
    )
    tool.chmod(0o755)
    # kbuild compares timestamps: the wrapper must not look newer than the tool was.
    status = real.stat()
    os.utime(tool, ns=(status.st_atime_ns, status.st_mtime_ns))


def relocate_host_tools(build_dir: Path, runtime_root: Path) -> list[Path]:
    """Make the tree's dynamically linked host tools run with runtime_root's loader and libraries.

    Each tool becomes a shell wrapper beside ``<tool>.real``; the wrapped tools are returned.
    """
    directories = _library_dirs(runtime_root)
    # Only directories that hold libraries go on the tools' library path.
    library_path = [d for d in directories if any(map(_is_library, d.iterdir()))]
    tools = _dynamic_executables(build_dir)
    for tool, info in tools:
        _check_machine(tool, info)
        interpreter = PurePosixPath(info.interpreter or "").name
        loader = _find_library(interpreter, directories, runtime_root)
        if loader is None:
            raise DriverError(
                f"no {interpreter} under {runtime_root} for the kernel tree's {tool.name}: "
                "its host tools cannot run; report this with the Flatcar version"
            )
        _write_wrapper(tool, loader, library_path)
    return [tool for tool, _ in tools]


def _check_tool_dirs(build_dir: Path, root: Path, origin: str) -> None:
    """Refuse tool directories that are links or lead out of the tree: their tools get rewritten."""
    for top in _TOOL_DIRS:
        directory = build_dir / top
        if directory.is_symlink() or resolve_within(root, directory) != directory:
            raise DriverError(
                f"the kernel build tree from {origin} has {top}/ as a symbolic link or out of "
                f"the tree ({directory}): refusing to rewrite its host tools; report it"
            )


def _make_tools_runnable(build_dir: Path, libraries_from: Path, root: Path, origin: str) -> None:
    """Wrap the tree's tools; only ever called on a tree whose links were checked."""
    _check_tool_dirs(build_dir, root, origin)
    executables = _dynamic_executables(build_dir)
    # Before their libraries are looked for: an x86-64 tool's loader is not on an arm64 root.
    for tool, info in executables:
        _check_machine(tool, info)
    tools = [tool for tool, _ in executables]
    if tools:
        install_runtime(tools, libraries_from, root / RUNTIME_LIB_DIR)
        relocate_host_tools(build_dir, root)


# Building a tree beside its destination.


@contextmanager
def _staged(destination: Path) -> Iterator[Path]:
    """A new directory that replaces destination only if the block completes."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        staging.chmod(0o755)
        yield staging
        _replace(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace(new: Path, destination: Path) -> None:
    if not destination.exists() and not destination.is_symlink():
        new.rename(destination)
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", dir=destination.parent))
    previous = trash / "previous"
    try:
        destination.rename(previous)
        try:
            new.rename(destination)
        except OSError:
            previous.rename(destination)
            raise
    finally:
        shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def _scratch(destination: Path) -> Iterator[Path]:
    """A temporary directory beside destination (same filesystem), removed afterwards."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix=f".{destination.name}.scratch.",
        dir=destination.parent,
        ignore_cleanup_errors=True,
    ) as name:
        yield Path(name)


_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def _one_line(what: str, directory: Path, otherwise: str) -> Iterator[None]:
    """Report an OSError as one line, telling a full or read-only disk from a bad input."""
    try:
        yield
    except OSError as exc:
        advice = otherwise
        if exc.errno in _STORAGE_ERRORS:
            advice = f"make room in {directory} (or make it writable) and retry"
        raise DriverError(f"cannot {what}: {exc}; {advice}") from exc


def _kernels_in(root: Path) -> set[str]:
    modules = root / MODULES_DIR
    if not modules.is_dir():
        return set()
    return {
        entry.name
        for entry in modules.iterdir()
        if (entry / "build").is_symlink() or (entry / "build").exists()
    }


def _single_kernel(available: set[str], wanted: str | None, label: str) -> str:
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


def _tree_at(root: Path, release: str, toolchain_root: Path | None, origin: str) -> KernelTree:
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


# 1. The host's own tree.


def _resolved_host_dir(host_root: Path, path: Path) -> Path | None:
    if not (path.is_symlink() or path.exists()):
        return None
    resolved = resolve_within(host_root, path)
    return resolved if resolved.is_dir() else None


def _contain_symlinks(root: Path) -> None:
    """Rewrite absolute symlinks relative to root; drop the ones that would leave it."""
    for directory, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(directory) / name
            if not path.is_symlink():
                continue
            rel = PurePosixPath(path.relative_to(root).as_posix())
            target = contained_link_target(rel, str(path.readlink()))
            if target is None:
                warn(f"{rel} points outside the kernel tree ({path.readlink()}); left out")
                path.unlink()
            elif target != str(path.readlink()):
                path.unlink()
                path.symlink_to(target)
    # Each target is inside on its own; through one another (a chain of "..") they may not be.
    drop_escaping_links(root, tree_links(root), "the kernel tree")


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


def _incomplete(build: Path, source: Path | None) -> str | None:
    """What the host's tree lacks for a module build, if anything."""
    if not (build / "Makefile").is_file():
        return "no Makefile in build/"
    if missing_symbol_versions(build) is not None:
        return "no Module.symvers (or an empty one) in build/"
    if source is not None and not (source / "Makefile").is_file():
        return "no Makefile in its separate source/"
    return None


def host_tree(paths: Paths, kernel_release: str, destination: Path) -> KernelTree | None:
    """A copy of the node's own build tree at destination; None when the node has none.

    Both layouts are used: install-extmod-build's (``source -> build``, from 4230.1.0) and the
    older split one of LTS 4081 (a cleaned ``build/`` and a stripped ``source/``), as long as
    the tree is complete. A tree whose host tools are built for another architecture (arm64
    before 4230.1.0) raises ForeignToolsError and leaves nothing behind: the caller decides.
    """
    destination = destination.absolute()  # make runs with -C: relative paths would break
    host_root = paths.host_filesystem
    where = f"/{MODULES_DIR}/{kernel_release}/build"
    build = _resolved_host_dir(host_root, paths.host_kernel_tree(kernel_release))
    if build is None:
        say(f"The host has no usable kernel build tree at {where}")
        return None
    source = _resolved_host_dir(host_root, paths.host_kernel_tree(kernel_release).parent / "source")
    if source is not None and source.resolve() == build.resolve():
        source = None
    lacking = _incomplete(build, source)
    if lacking is not None:
        say(f"The host has no usable kernel build tree at {where}: {lacking}")
        return None
    say(f"Copying the host's kernel build tree for {kernel_release}...")
    what = f"copy the host's kernel build tree to {destination}"
    with (
        _one_line(what, destination.parent, "check the node's /usr/lib/modules"),
        _staged(destination) as staging,
    ):
        modules = staging / MODULES_DIR / kernel_release
        shutil.copytree(build, modules / "build", symlinks=True)
        if source is None:
            (modules / "source").symlink_to("build")
        else:
            shutil.copytree(source, modules / "source", symlinks=True)
        _contain_symlinks(staging)
        _make_tools_runnable(modules / "build", host_root, staging, HOST)
    return _tree_at(destination, kernel_release, None, HOST)


# 2. flatcar-container.tar.gz.


class _Placement(NamedTuple):
    area: str  # "tree" (the kernel's build/source) or "runtime" (a shared library)
    path: str  # relative, normalized
    kernel: str


def _member_path(name: str) -> str:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise DriverError(
            f"{CONTAINER_TARBALL} has a member that would land outside the extraction "
            f"directory ({name[:200]!r}): refusing the archive; fetch it again or report it"
        )
    if "\0" in name or len(parts) > limits.PATH_DEPTH:
        raise DriverError(
            f"{CONTAINER_TARBALL} has a member name with a NUL byte or more than "
            f"{limits.PATH_DEPTH} components ({name[:200]!r}): refusing the archive; report it"
        )
    return "/".join(parts)


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
    if ".so" not in name or not _LIBRARY_NAME.match(name):
        return None
    if parent in _LIBRARY_DIRS or _is_gcc_runtime_dir(parent):
        return _Placement("runtime", path, "")
    return None


def _is_gcc_runtime_dir(parent: str) -> bool:
    """Whether parent, a normalized relative path, matches _GCC_RUNTIME_DIRS."""
    return parent.startswith(_GCC_RUNTIME_PREFIX) and parent.count("/") == _GCC_RUNTIME_DEPTH


@dataclass
class _ContainerExtraction:
    data: tar.Inflated
    tree: TreeWriter
    runtime: TreeWriter
    kernel_release: str | None
    kernels: set[str] = field(default_factory=set)
    written: int = 0  # bytes of the files written
    entries: int = 0  # files, links and directories written

    def writer(self, placement: _Placement) -> TreeWriter:
        return self.runtime if placement.area == "runtime" else self.tree

    def refuse_escaping_links(self) -> None:
        """Each link was checked as text when written; here all are, by where they resolve."""
        for writer in (self.tree, self.runtime):
            escaping = escaping_links(writer.root, writer.symlinks())
            if escaping:
                rel = escaping[0]
                raise DriverError(
                    f"{CONTAINER_TARBALL} has a symbolic link that resolves out of the "
                    f"extraction directory ({rel} -> {Path(writer.path(rel)).readlink()}, through "
                    "its other links): refusing the archive; report it"
                )

    def member(self, member: tar.Member) -> None:
        placement = _placement(_member_path(member.name))
        if placement is None:
            return
        if placement.area == "tree":
            self.kernels.add(placement.kernel)
            if self.kernel_release not in (None, placement.kernel):
                return
        writer, rel, kind = self.writer(placement), placement.path, member.kind
        self.count(member)
        if member.sparse:
            raise DriverError(
                f"{CONTAINER_TARBALL}: {member.name} is stored as a sparse file, which the "
                "extraction does not write; report this with the Flatcar version"
            )
        if kind == tar.DIRECTORY:
            os.chmod(writer.directory(rel), member.mode & 0o777 | 0o700)  # noqa: PTH101
        elif kind == tar.SYMLINK:
            self.symlink(writer, rel, member)
        elif kind == tar.HARDLINK:
            self.hardlink(placement, member)
        elif kind in tar.REGULAR:
            # Straight from the inflated chunks: no file object, no copy of the bytes.
            size = member.size
            writer.file(rel, member.mode, member.mtime, lambda fd: self.data.write_to(fd, size))
        # Devices and fifos have no place in a build tree.

    def count(self, member: tar.Member) -> None:
        """Refuse the member before writing it if it would pass a bound."""
        self.entries += 1
        if self.entries > limits.CONTAINER_ENTRIES:
            raise _over_bound(f"more than {limits.CONTAINER_ENTRIES} entries to write")
        if member.kind not in tar.REGULAR:
            return
        if member.size > limits.CONTAINER_MEMBER:
            raise _over_bound(
                f"{member.name[:200]} of {member.size} bytes, more than the "
                f"{limits.size(limits.CONTAINER_MEMBER)} a file may have"
            )
        self.written += member.size
        if self.written > limits.CONTAINER_WRITTEN:
            raise _over_bound(f"more than {limits.size(limits.CONTAINER_WRITTEN)} to write")

    @staticmethod
    def symlink(writer: TreeWriter, rel: str, member: tar.Member) -> None:
        if "\0" in member.linkname or len(member.linkname) > limits.LINK_TARGET:
            raise DriverError(
                f"{CONTAINER_TARBALL}: {member.name[:200]} is a symbolic link with a NUL byte "
                f"or more than {limits.LINK_TARGET} bytes in its target: refusing the archive; "
                "report it"
            )
        target = contained_link_target(PurePosixPath(rel), member.linkname)
        if target is None:
            raise DriverError(
                f"{CONTAINER_TARBALL} has a symbolic link out of the extraction directory "
                f"({member.name} -> {member.linkname}): refusing the archive; report it"
            )
        writer.symlink(rel, target, member.mtime)

    def hardlink(self, placement: _Placement, member: tar.Member) -> None:
        writer = self.writer(placement)
        source = _placement(_member_path(member.linkname))
        if source and source.area == placement.area and writer.made(source.path) == output.FILE:
            writer.hardlink(placement.path, writer.path(source.path))
        elif placement.area == "tree":
            raise DriverError(
                f"{CONTAINER_TARBALL}: {member.name} is a hard link to {member.linkname}, "
                "which is not part of the kernel tree; report this with the Flatcar version"
            )
        # A library linked to something not extracted is not needed: the closure decides.


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
    tree, libraries = TreeWriter(tree_root, _NOT_FLATCAR), TreeWriter(libraries_root, _NOT_FLATCAR)
    # A thread, stopped below whatever happens.
    inflated = tar.Inflated(stream, limits.CONTAINER_INFLATED)
    extraction = _ContainerExtraction(inflated, tree, libraries, kernel_release)
    try:
        for member in tar.members(inflated):
            extraction.member(member)
    except tar.InflatedTooLargeError as exc:
        raise _over_bound(str(exc)) from exc
    except (tar.TarError, EOFError, zlib.error) as exc:
        raise DriverError(
            f"cannot extract {CONTAINER_TARBALL}: {exc}; delete the download and fetch it again"
        ) from exc
    finally:
        inflated.close()
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
        _one_line(what, destination.parent, "delete the download and fetch it again"),
        _staged(destination) as staging,
        _scratch(destination) as libraries,
    ):
        with download as stream:
            extraction = _read_container_archive(stream, staging, libraries, kernel_release)
        # The download verified: from here on the staged tree may be followed and rewritten.
        extraction.refuse_escaping_links()
        release = _single_kernel(extraction.kernels, kernel_release, CONTAINER_TARBALL)
        tree = _tree_at(staging, release, None, CONTAINER_TARBALL)
        _make_tools_runnable(tree.build_dir, libraries, staging, CONTAINER_TARBALL)
    return _tree_at(destination, release, None, CONTAINER_TARBALL)


# 3. The developer container: bz2 -> sparse disk image -> GPT -> ext4.

_SPARSE_BLOCK = 4096


def _write_nonzero(fd: int, data: bytes, offset: int) -> None:
    """Write the non-zero blocks of data at offset; zero blocks stay holes."""
    zero = bytes(_SPARSE_BLOCK)
    view = memoryview(data)
    run_start: int | None = None
    for position in range(0, len(data), _SPARSE_BLOCK):
        block = data[position : position + _SPARSE_BLOCK]
        is_zero = block == zero[: len(block)]
        if is_zero and run_start is not None:
            output.write_all(fd, view[run_start:position], offset + run_start)
            run_start = None
        elif not is_zero and run_start is None:
            run_start = position
    if run_start is not None:
        output.write_all(fd, view[run_start:], offset + run_start)


def decompress_sparse(source: Path, target: Path) -> int:
    """Decompress a .bz2 file into target, leaving zero blocks as holes; return its size."""
    size = 0
    zero_chunk = bytes(_CHUNK)
    what = f"decompress {source.name}"
    with _one_line(what, target.parent, "delete it and fetch it again"):
        try:
            with bz2.open(source, "rb") as compressed, target.open("wb") as out:
                while chunk := compressed.read(_CHUNK):
                    if chunk != zero_chunk[: len(chunk)]:
                        _write_nonzero(out.fileno(), chunk, size)
                    size += len(chunk)
                    if size > limits.DISK_IMAGE:
                        raise DriverError(
                            f"{source.name} decompresses to more than "
                            f"{limits.size(limits.DISK_IMAGE)}, beyond any Flatcar developer "
                            "container (6 GiB): refusing it; report it"
                        )
                out.truncate(size)
        except EOFError as exc:
            raise DriverError(f"cannot {what}: {exc}; delete it and fetch it again") from exc
    return size


ROOT_PARTITION = 9
ROOT_LABEL = "ROOT"


class DeveloperContainerRoot(Ext4):
    """The developer container's root filesystem, with messages in its terms."""

    WHERE = f"partition {ROOT_PARTITION}"
    WHAT = "the developer container"
    UNSUPPORTED = "report this with the Flatcar version"
    THROUGH_LINK = _NOT_FLATCAR


def root_partition(partitions: list[Partition], disk_size: int, label: str) -> Partition:
    """Partition 9, "ROOT", the developer container's single filesystem."""
    for partition in partitions:
        is_root = partition.type_guid == LINUX_FILESYSTEM or partition.name == ROOT_LABEL
        if partition.number == ROOT_PARTITION and is_root:
            if partition.size <= 0 or partition.offset + partition.size > disk_size:
                raise DriverError(f"{label}: partition 9 lies beyond the image; fetch it again")
            return partition
    raise DriverError(
        f"{label} has no partition 9 ({ROOT_LABEL}, a Linux filesystem): it is not a Flatcar "
        "developer container; delete it and fetch it again"
    )


def extract_developer_container(image_bz2: Path, destination: Path, wanted: list[str]) -> Path:
    """Extract the wanted paths of a flatcar_developer_container.bin.bz2 into destination.

    The image is decompressed sparse beside destination (about 6 GiB apparent, only its data
    on disk) and removed afterwards; no loop device is needed. Absolute symlinks are rewritten
    relative, which means the same inside a chroot of destination. Returns destination.
    """
    label = image_bz2.name
    destination = destination.absolute()
    with (
        _one_line(f"extract {label} to {destination}", destination.parent, "retry"),
        _staged(destination) as staging,
        _scratch(destination) as scratch,
    ):
        disk = scratch / "disk.bin"
        say(f"Decompressing {label} (about 6 GiB, written sparse)...")
        size = decompress_sparse(image_bz2, disk)
        with disk.open("rb") as image:
            partition = root_partition(read_gpt(image.fileno(), label), size, label)
            filesystem = DeveloperContainerRoot(
                image.fileno(), partition.offset, partition.size, label
            )
            extracted = filesystem.extract(wanted, staging)
        if not extracted:
            raise DriverError(
                f"none of {', '.join(wanted)} is in {label}: is it a developer container?"
            )
    return destination


def developer_container_tree(root: Path, kernel_release: str | None) -> KernelTree:
    """The kernel build tree inside an extracted developer container, built from a chroot."""
    root = root.absolute()
    release = _single_kernel(_kernels_in(root), kernel_release, DEVELOPER_CONTAINER)
    return _tree_at(root, release, root, DEVELOPER_CONTAINER)
