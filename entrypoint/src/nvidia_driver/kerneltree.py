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
(read by a small ELF parser below), looked up in usr/lib64, lib64, usr/lib, lib and gcc's
versioned runtime directory. The archive stream can be read only once and its members come in
no useful order, so every shared library of those directories is written to a scratch
directory, and only the closure is kept. This costs some scratch space, but no allowlist can
fall behind a new Flatcar dependency.

ext4 reader: the developer container is a GPT disk whose partition 9 holds ext4. It is read by
the small read-only ext4 reader below, not by ``debugfs -R rdump``. debugfs exits 0 when a
command fails (a missing path shows only on stderr), rdump copies hard links as separate files
and writes holes as zeros, and the image would need e2fsprogs. Reading needs only the
superblock, the group descriptors (32/64-bit, meta_bg), inodes, extent trees and the older block
maps, inline data, directories (htree directories are read linearly, which the format allows)
and symlinks. The partition is read in place from the sparse image. Checksums (metadata_csum)
are not verified: the download as a whole was verified before (SHA512 and GPG). orphan_file is a
compat feature that changes nothing for a reader.

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
import posixpath
import queue
import re
import shlex
import shutil
import stat
import struct
import tempfile
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, NamedTuple

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.flatcar import RELEASE_FILE
from nvidia_driver.links import escaping_links, resolve_within, tree_links
from nvidia_driver.log import say, warn
from nvidia_driver.paths import Paths

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
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate data
_INFLATED_CHUNKS = 32  # inflated ahead of the archive parser, at most _CHUNK bytes each
_STOP_POLL_SECONDS = 0.05
_MAX_SYMLINKS = 40


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


# ELF: just enough to read PT_INTERP and DT_NEEDED.

_ELF_MAGIC = b"\x7fELF"
_ELF_IDENT_SIZE = 16
_ELFCLASS64 = 2
_ELFDATA2MSB = 2
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5
_MAX_PROGRAM_HEADERS = 512
_MAX_NAME = 4096
# The ELF machine this container runs, for `uname -m` values we know.
_MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183}


@dataclass(frozen=True)
class ElfInfo:
    machine: int
    interpreter: str | None  # PT_INTERP: set for dynamically linked executables
    needed: tuple[str, ...]  # DT_NEEDED


class _Segment(NamedTuple):
    kind: int
    offset: int
    vaddr: int
    filesz: int


def _read_at(file: IO[bytes], offset: int, size: int) -> bytes:
    file.seek(offset)
    data = file.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def _segments(file: IO[bytes], ident: bytes) -> tuple[int, list[_Segment]]:
    endian = ">" if ident[5] == _ELFDATA2MSB else "<"
    is64 = ident[4] == _ELFCLASS64
    header = endian + ("HHIQQQIHHH" if is64 else "HHIIIIIHHH")
    fields = struct.unpack(header, _read_at(file, _ELF_IDENT_SIZE, struct.calcsize(header)))
    machine, phoff, phentsize, phnum = fields[1], fields[4], fields[8], fields[9]
    if phnum > _MAX_PROGRAM_HEADERS:
        raise ValueError("too many program headers")
    entry = endian + ("IIQQQQQQ" if is64 else "IIIIIIII")
    segments = []
    for index in range(phnum):
        raw = struct.unpack_from(entry, _read_at(file, phoff + index * phentsize, phentsize))
        # ELF64 puts p_flags second; ELF32 puts it seventh.
        kind, offset, vaddr, filesz = (
            (raw[0], raw[2], raw[3], raw[5]) if is64 else (raw[0], raw[1], raw[2], raw[4])
        )
        segments.append(_Segment(kind, offset, vaddr, filesz))
    return machine, segments


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    for segment in segments:
        if segment.kind == _PT_LOAD and segment.vaddr <= vaddr < segment.vaddr + segment.filesz:
            return vaddr - segment.vaddr + segment.offset
    raise ValueError("address outside the loaded segments")


def _needed(file: IO[bytes], ident: bytes, segments: list[_Segment]) -> tuple[str, ...]:
    dynamic = next((s for s in segments if s.kind == _PT_DYNAMIC), None)
    if dynamic is None:
        return ()
    endian = ">" if ident[5] == _ELFDATA2MSB else "<"
    entry = endian + ("qQ" if ident[4] == _ELFCLASS64 else "iI")
    table = _read_at(file, dynamic.offset, dynamic.filesz)
    table = table[: len(table) - len(table) % struct.calcsize(entry)]
    names: list[int] = []
    strtab = None
    for tag, value in struct.iter_unpack(entry, table):
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            names.append(value)
        elif tag == _DT_STRTAB:
            strtab = _file_offset(segments, value)
    if strtab is None:
        return ()
    return tuple(_string_at(file, strtab + offset) for offset in names)


def _string_at(file: IO[bytes], offset: int) -> str:
    file.seek(offset)
    return file.read(_MAX_NAME).split(b"\0", 1)[0].decode(errors="surrogateescape")


def read_elf(path: Path) -> ElfInfo | None:
    """The dynamic-linking facts of an ELF file; None if it is not a readable ELF file."""
    try:
        with path.open("rb") as file:
            ident = file.read(_ELF_IDENT_SIZE)
            if len(ident) < _ELF_IDENT_SIZE or not ident.startswith(_ELF_MAGIC):
                return None
            machine, segments = _segments(file, ident)
            interp = next((s for s in segments if s.kind == _PT_INTERP), None)
            interpreter = None
            if interp is not None:
                raw = _read_at(file, interp.offset, min(interp.filesz, _MAX_NAME))
                interpreter = raw.split(b"\0", 1)[0].decode(errors="surrogateescape")
            return ElfInfo(machine, interpreter, _needed(file, ident, segments))
    except (OSError, ValueError, struct.error):
        return None


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
    expected = _MACHINES.get(machine)
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


def _contained_link_target(link: PurePosixPath, target: str) -> str | None:
    """A symlink target that stays under the root; absolute ones become relative to the link."""
    if not target:
        return None
    if target.startswith("/"):
        parts = _normalized(PurePosixPath(), target, clamp=True) or []
        return posixpath.relpath("/" + "/".join(parts), "/" + str(link.parent))
    return target if _normalized(link.parent, target, clamp=False) is not None else None


def _write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


_DIRECTORY, _FILE, _SYMLINK = 0, 1, 2  # what a _Writer made at a path
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


def _rel(path: PurePosixPath) -> str:
    """A relative path as _Writer takes it: "" for the root itself."""
    return "" if path == PurePosixPath() else path.as_posix()


class _Writer:
    """Fills root, a new directory nothing else writes to, never through a symlink.

    Paths are relative strings ("" is root). The writer remembers the kind of everything it
    made, so it needs no look-ups: a path it did not make does not exist, and a directory it
    made is never a symlink. This keeps a member's cost to the calls that create it, which
    matters for the ~15,000 members of a kernel tree.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prefix = os.fspath(root) + "/"
        self._made: dict[str, int] = {"": _DIRECTORY}
        self._umask = _umask()

    def path(self, rel: str) -> str:
        return self._prefix + rel if rel else self._prefix[:-1]

    def made(self, rel: str) -> int | None:
        """What the writer made at rel (_DIRECTORY, _FILE or _SYMLINK), None if nothing."""
        return self._made.get(rel)

    def directory(self, rel: str) -> str:
        kind = self._made.get(rel)
        if kind == _DIRECTORY:
            return self.path(rel)
        # The missing parents, made from the top down; a loop, not a recursion: deep paths.
        missing, parent = [], rel.rpartition("/")[0]
        while self._made.get(parent) != _DIRECTORY:
            missing.append(parent)
            parent = parent.rpartition("/")[0]
        for ancestor in reversed(missing):
            self.directory(ancestor)
        path = self.path(rel)
        if kind == _SYMLINK:
            raise DriverError(
                f"{rel} is a symbolic link in the extracted tree: refusing to write "
                "through it; the download is not a Flatcar image, fetch it again"
            )
        if kind == _FILE:
            os.unlink(path)  # noqa: PTH108 - string paths: no Path object per member
        os.mkdir(path, 0o755)  # noqa: PTH102
        self._made[rel] = _DIRECTORY
        return path

    def _vacate(self, rel: str) -> str:
        parent = rel.rpartition("/")[0]
        if self._made.get(parent) != _DIRECTORY:
            self.directory(parent)
        path = self._prefix + rel
        kind = self._made.get(rel)
        if kind == _DIRECTORY:
            raise DriverError(f"{rel} is both a directory and a file in the download")
        if kind is not None:
            os.unlink(path)  # noqa: PTH108
        return path

    def file(self, rel: str, mode: int, mtime: float, fill: Callable[[int], None]) -> str:
        path = self._vacate(rel)
        mode &= 0o777
        # Created with its final mode: the descriptor may write whatever the mode says.
        fd = os.open(path, _CREATE, mode)
        self._made[rel] = _FILE
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
        self._made[rel] = _SYMLINK
        os.utime(path, (mtime, mtime), follow_symlinks=False)

    def hardlink(self, rel: str, existing: str) -> None:
        """Link rel to existing, a regular file this writer made (the caller checks)."""
        os.link(existing, self._vacate(rel), follow_symlinks=False)
        self._made[rel] = _FILE

    def symlinks(self) -> list[str]:
        """The symbolic links the writer made, relative to root."""
        return [rel for rel, kind in self._made.items() if kind == _SYMLINK]


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
            target = _contained_link_target(rel, str(path.readlink()))
            if target is None:
                warn(f"{rel} points outside the kernel tree ({path.readlink()}); left out")
                path.unlink()
            elif target != str(path.readlink()):
                path.unlink()
                path.symlink_to(target)
    # Each target is inside on its own; through one another (a chain of "..") they may not be.
    _drop_escaping_links(root, tree_links(root), "the kernel tree")


def _drop_escaping_links(root: Path, links: list[str], what: str) -> None:
    """Remove the links that resolve outside root (all judged before any is removed)."""
    for rel in escaping_links(root, links):
        warn(f"{rel} resolves outside {what} ({(root / rel).readlink()}); left out")
        (root / rel).unlink()


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


# A streaming tar reader. tarfile spends most of its time per member building a TarInfo (every
# field decoded, two checksums summed) and, in stream mode, copying its buffers; a root file
# system has tens of thousands of members and most are skipped. This reads what the extraction
# uses, in the formats GNU tar and Python write: ustar and its prefix, GNU long names, pax
# headers (path, linkpath, size, mtime; others ignored), GNU sparse headers (skipped), octal and
# base-256 numbers. Like tarfile's default reading, a zero block or, after the first member, an
# invalid header ends the archive; the caller reads the stream to its end, so a corrupt download
# is then refused by its checksum.

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
# name, mode, mtime, typeflag, linkname and ustar's prefix (uid, gid, size, checksum, magic,
# owner names and device numbers are skipped)
_HEADER = struct.Struct("100s8s16x12x12s8xc100s88x155s")
_SIZE, _CHECKSUM, _TYPEFLAG = slice(124, 136), slice(148, 156), slice(156, 157)
_REGULAR = frozenset((b"0", b"\0", b"7"))  # file, old-style file, contiguous file
_TAR_HARDLINK, _TAR_SYMLINK, _TAR_DIRECTORY = b"1", b"2", b"5"
_NO_DATA = frozenset((_TAR_HARDLINK, _TAR_SYMLINK, b"3", b"4", _TAR_DIRECTORY, b"6"))
_GNU_LONG_NAME, _GNU_LONG_LINK, _GNU_SPARSE = b"L", b"K", b"S"
_PAX, _PAX_GLOBAL, _SOLARIS_PAX = b"x", b"g", b"X"
_METADATA = frozenset((_GNU_LONG_NAME, _GNU_LONG_LINK, _PAX, _PAX_GLOBAL, _SOLARIS_PAX))
_GNU_SPARSE_EXTENDED = 482  # in a sparse header: more sparse headers follow
_GNU_SPARSE_MORE = 504  # in those
_BASE256, _BASE256_NEGATIVE = 0x80, 0xFF  # GNU's first byte of a binary number field
_HIGH_BIT = 0x80
_PAX_NUMBER = re.compile(r"[0-9]+")
_PAX_TIME = re.compile(r"-?[0-9]{1,12}(\.[0-9]{0,9})?")  # seconds, as pax writes them
_MAX_MTIME = 1 << 40  # beyond that, os.utime overflows; no real file is that old or new
_MAX_PAX_DIGITS = 20


class _TarError(Exception):
    pass


class _Member(NamedTuple):
    name: str
    kind: bytes  # the header's typeflag
    size: int  # of the data that follows the header
    mode: int
    mtime: float
    linkname: str
    sparse: bool


@dataclass
class _Extended:
    """What GNU long-name and pax headers say about the member that follows them."""

    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = field(default_factory=dict)
    size: int = 0  # of the extended headers read so far

    def add(self, kind: bytes, content: bytes) -> None:
        self.size += len(content)
        if self.size > limits.TAR_METADATA:
            raise _TarError(f"more than {limits.TAR_METADATA} bytes of extended headers")
        if kind == _GNU_LONG_NAME:
            self.long_name = _text(content)
        elif kind == _GNU_LONG_LINK:
            self.long_link = _text(content)
        elif kind != _PAX_GLOBAL:  # a global header holds nothing the extraction uses
            self.pax.update(_pax_records(content))


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    if field[0] in (_BASE256, _BASE256_NEGATIVE):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == _BASE256_NEGATIVE else value
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise _TarError(f"a header field is not a number: {field!r}") from None


def _checksum_matches(header: bytes) -> bool:
    unsigned = sum(header) - sum(header[_CHECKSUM]) + 8 * 0x20  # the field counts as spaces
    try:
        expected = _number(header[_CHECKSUM])
    except _TarError:
        return False
    if expected == unsigned:
        return True
    # Some old tars summed signed bytes.
    high = sum(1 for byte in header[:148] + header[156:] if byte >= _HIGH_BIT)
    return expected == unsigned - 256 * high


def _pax_records(data: bytes) -> dict[str, str]:
    """The "<length> <key>=<value>\\n" records of a pax header."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position)
        try:
            length = int(data[position:space])
        except ValueError:
            raise _TarError("a malformed pax header") from None
        record = data[space + 1 : position + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise _TarError("a malformed pax header")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _next_header(data: _Inflated, first: bool) -> bytes | None:
    """The next member's header block; None at the end of the archive."""
    header = data.read(_BLOCK)
    if header == _ZERO_BLOCK:
        return None
    if len(header) == _BLOCK and _checksum_matches(header):
        return header
    if first:
        raise _TarError("not a tar archive")
    return None  # as tarfile: what follows the last valid header is not read


def _read_metadata(data: _Inflated, size: int) -> bytes:
    if size > limits.TAR_METADATA:
        raise _TarError(f"a {size}-byte extended header")
    content = data.read(size)
    if len(content) < size:
        raise _TarError("unexpected end of data")
    data.seek(data.tell() + -size % _BLOCK)
    return content


def _skip_sparse_headers(data: _Inflated, header: bytes) -> None:
    extended = header[_GNU_SPARSE_EXTENDED]
    while extended:
        more = data.read(_BLOCK)
        if len(more) < _BLOCK:
            raise _TarError("unexpected end of data")
        extended = more[_GNU_SPARSE_MORE]


def _member(header: bytes, size: int, extended: _Extended) -> _Member:
    name, mode, mtime, kind, link, prefix = _HEADER.unpack_from(header)
    pax = extended.pax
    path = extended.long_name or pax.get("path")
    if path is None:
        path = _text(name)
        if kind != _GNU_SPARSE and prefix[0]:  # ustar keeps long names' directories apart
            path = f"{_text(prefix)}/{path}"
    if kind == b"\0" and path.endswith("/"):
        kind = _TAR_DIRECTORY  # how pre-POSIX tars mark a directory
    return _Member(
        name=path,
        kind=kind,
        size=0 if kind in _NO_DATA else size,
        mode=_number(mode),
        mtime=_pax_time(pax["mtime"]) if "mtime" in pax else _mtime(_number(mtime)),
        linkname=extended.long_link or pax.get("linkpath") or _text(link),
        sparse=kind == _GNU_SPARSE or any(key.startswith("GNU.sparse.") for key in pax),
    )


def _mtime(seconds: float) -> float:
    if not -_MAX_MTIME < seconds < _MAX_MTIME:
        raise _TarError(f"an implausible modification time ({seconds:.0f})")
    return seconds


def _pax_time(text: str) -> float:
    if not _PAX_TIME.fullmatch(text):
        raise _TarError(f"a pax mtime that is not a time: {text[:40]!r}")
    return _mtime(float(text))


def _pax_size(text: str) -> int:
    if not _PAX_NUMBER.fullmatch(text) or len(text) > _MAX_PAX_DIGITS:
        raise _TarError(f"a pax size that is not a size: {text[:40]!r}")
    return int(text)


def _tar_members(data: _Inflated) -> Iterator[_Member]:
    """The members of the tar archive in data; each is yielded with data at its contents."""
    extended = _Extended()
    first = True
    while (header := _next_header(data, first)) is not None:
        first = False
        pax_size = extended.pax.get("size")
        size = _pax_size(pax_size) if pax_size is not None else _number(header[_SIZE])
        if size < 0:
            raise _TarError(f"a member of negative size at byte {data.tell() - _BLOCK}")
        kind = header[_TYPEFLAG]
        if kind in _METADATA:
            extended.add(kind, _read_metadata(data, size))
            continue
        if kind == _GNU_SPARSE:
            _skip_sparse_headers(data, header)
        member = _member(header, size, extended)
        start = data.tell()
        yield member
        data.seek(start + member.size + -member.size % _BLOCK)
        extended = _Extended()


@dataclass
class _ContainerExtraction:
    data: _Inflated
    tree: _Writer
    runtime: _Writer
    kernel_release: str | None
    kernels: set[str] = field(default_factory=set)
    written: int = 0  # bytes of the files written
    entries: int = 0  # files, links and directories written

    def writer(self, placement: _Placement) -> _Writer:
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

    def member(self, member: _Member) -> None:
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
        if kind == _TAR_DIRECTORY:
            os.chmod(writer.directory(rel), member.mode & 0o777 | 0o700)  # noqa: PTH101
        elif kind == _TAR_SYMLINK:
            self.symlink(writer, rel, member)
        elif kind == _TAR_HARDLINK:
            self.hardlink(placement, member)
        elif kind in _REGULAR:
            # Straight from the inflated chunks: no file object, no copy of the bytes.
            size = member.size
            writer.file(rel, member.mode, member.mtime, lambda fd: self.data.write_to(fd, size))
        # Devices and fifos have no place in a build tree.

    def count(self, member: _Member) -> None:
        """Refuse the member before writing it if it would pass a bound."""
        self.entries += 1
        if self.entries > limits.CONTAINER_ENTRIES:
            raise _over_bound(f"more than {limits.CONTAINER_ENTRIES} entries to write")
        if member.kind not in _REGULAR:
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
    def symlink(writer: _Writer, rel: str, member: _Member) -> None:
        if "\0" in member.linkname or len(member.linkname) > limits.LINK_TARGET:
            raise DriverError(
                f"{CONTAINER_TARBALL}: {member.name[:200]} is a symbolic link with a NUL byte "
                f"or more than {limits.LINK_TARGET} bytes in its target: refusing the archive; "
                "report it"
            )
        target = _contained_link_target(PurePosixPath(rel), member.linkname)
        if target is None:
            raise DriverError(
                f"{CONTAINER_TARBALL} has a symbolic link out of the extraction directory "
                f"({member.name} -> {member.linkname}): refusing the archive; report it"
            )
        writer.symlink(rel, target, member.mtime)

    def hardlink(self, placement: _Placement, member: _Member) -> None:
        writer = self.writer(placement)
        source = _placement(_member_path(member.linkname))
        if source and source.area == placement.area and writer.made(source.path) == _FILE:
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


class _Inflated:
    """The decompressed bytes of a gzip stream, inflated ahead by a thread of its own.

    Reading the download (which hashes it and feeds gpgv) and inflating it release the GIL, so
    they run on a second core while this thread parses the archive and writes the tree: at a
    mirror's bandwidth the extraction then keeps pace with the download. Reading only goes
    forward; skipping drops whole inflated chunks without copying them, and most of a root file
    system's bytes are skipped. Like tarfile's "r|gz", only the first gzip member is read;
    whatever follows it is left to the caller.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._queue: queue.Queue[bytes | Exception | None] = queue.Queue(_INFLATED_CHUNKS)
        self._stop = threading.Event()
        self._chunk = b""
        self._offset = 0  # in _chunk
        self._position = 0  # in the inflated stream
        self._ended = False
        self._thread = threading.Thread(target=self._inflate, name="inflate", daemon=True)
        self._thread.start()

    def tell(self) -> int:
        return self._position

    def seek(self, position: int) -> None:
        """Skip forward to position (or to the end, if it comes first)."""
        while self._position < position and self._available():
            step = min(position - self._position, len(self._chunk) - self._offset)
            self._offset += step
            self._position += step

    def read(self, size: int) -> bytes:
        """The next size bytes; fewer only at the end."""
        pieces = []
        while size > 0 and self._available():
            start = self._offset
            self._offset = min(start + size, len(self._chunk))
            whole = start == 0 and self._offset == len(self._chunk)
            pieces.append(self._chunk if whole else self._chunk[start : self._offset])
            size -= self._offset - start
            self._position += self._offset - start
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def write_to(self, fd: int, size: int) -> None:
        """Write the next size bytes to fd."""
        while size > 0:
            if not self._available():
                raise _TarError("unexpected end of data")
            start = self._offset
            self._offset = min(start + size, len(self._chunk))
            _write_all(fd, memoryview(self._chunk)[start : self._offset])
            size -= self._offset - start
            self._position += self._offset - start

    def _available(self) -> bool:
        """Whether there are inflated bytes at the current position (waits for them)."""
        while self._offset >= len(self._chunk):
            if self._ended:
                return False
            item = self._queue.get()
            if item is None or isinstance(item, Exception):
                self._ended = True
                if item is None:
                    return False
                raise item
            self._chunk, self._offset = item, 0
        return True

    def close(self) -> None:
        """Stop inflating; afterwards the stream is the caller's again."""
        self._stop.set()
        self._thread.join()

    def _inflate(self) -> None:
        try:
            inflater = zlib.decompressobj(_GZIP_WBITS)
            total = 0
            while not inflater.eof:
                pending = self._stream.read(_CHUNK)
                if not pending:
                    self._put(EOFError("the gzip stream ends before its end-of-stream marker"))
                    return
                while pending and not inflater.eof:
                    # Bounded output: a small chunk may hold a long run of zeros.
                    inflated = inflater.decompress(pending, _CHUNK)
                    total += len(inflated)
                    if total > limits.CONTAINER_INFLATED:
                        bound = limits.size(limits.CONTAINER_INFLATED)
                        self._put(_over_bound(f"more than {bound} of data once inflated"))
                        return
                    if inflated and not self._put(inflated):
                        return
                    pending = inflater.unconsumed_tail
            self._put(None)
        except Exception as exc:  # noqa: BLE001 - handed over, raised in the reading thread
            self._put(exc)

    def _put(self, item: bytes | Exception | None) -> bool:
        """Queue item unless told to stop; whether to go on."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_STOP_POLL_SECONDS)
            except queue.Full:
                continue
            return True
        return False


def _read_container_archive(
    stream: BinaryIO, tree_root: Path, libraries_root: Path, kernel_release: str | None
) -> _ContainerExtraction:
    """Write the wanted members, following nothing; the extraction tells what it wrote."""
    tree, libraries = _Writer(tree_root), _Writer(libraries_root)
    inflated = _Inflated(stream)  # a thread, stopped below whatever happens
    extraction = _ContainerExtraction(inflated, tree, libraries, kernel_release)
    try:
        for member in _tar_members(inflated):
            extraction.member(member)
    except (_TarError, EOFError, zlib.error) as exc:
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
            _write_all(fd, view[run_start:position], offset + run_start)
            run_start = None
        elif not is_zero and run_start is None:
            run_start = position
    if run_start is not None:
        _write_all(fd, view[run_start:], offset + run_start)


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


_SECTOR = 512
_GPT_SIGNATURE = b"EFI PART"
_GPT_HEADER_MIN, _GPT_ENTRY_MIN = 92, 128
LINUX_FILESYSTEM = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
ROOT_PARTITION = 9
ROOT_LABEL = "ROOT"


@dataclass(frozen=True)
class Partition:
    number: int
    name: str
    type_guid: uuid.UUID
    offset: int  # bytes from the start of the disk
    size: int  # bytes


def _pread_exact(fd: int, size: int, offset: int, label: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise DriverError(f"{label} is truncated at byte {offset}: delete it and fetch it again")
    return data


def _gpt_table(fd: int, label: str) -> tuple[bytes, int, int]:
    """The partition entry array, the number of entries and their size, CRCs checked."""
    header = _pread_exact(fd, _SECTOR, _SECTOR, label)
    if not header.startswith(_GPT_SIGNATURE):
        raise DriverError(
            f"{label} has no GPT (no 'EFI PART' at LBA 1): delete it and fetch it again"
        )
    (header_size, header_crc) = struct.unpack_from("<II", header, 12)
    entries_lba, count, entry_size, entries_crc = struct.unpack_from("<QIII", header, 72)
    if not _GPT_HEADER_MIN <= header_size <= _SECTOR or entry_size < _GPT_ENTRY_MIN:
        raise DriverError(f"{label} has a malformed GPT header: delete it and fetch it again")
    if zlib.crc32(header[:16] + bytes(4) + header[20:header_size]) != header_crc:
        raise DriverError(f"{label}: the GPT header's CRC does not match; fetch it again")
    if count * entry_size > limits.GPT_TABLE:
        raise DriverError(
            f"{label} has an implausible GPT ({count} entries of {entry_size} bytes, more than "
            f"{limits.size(limits.GPT_TABLE)}): fetch it again"
        )
    if entries_lba * _SECTOR + count * entry_size > os.fstat(fd).st_size:
        raise DriverError(
            f"{label}: its GPT partition table lies beyond the image (LBA {entries_lba}); "
            "fetch it again"
        )
    table = _pread_exact(fd, count * entry_size, entries_lba * _SECTOR, label)
    if zlib.crc32(table) != entries_crc:
        raise DriverError(f"{label}: the GPT partition table's CRC does not match; fetch it again")
    return table, count, entry_size


def read_gpt(fd: int, label: str) -> list[Partition]:
    """The partitions of the GPT disk image open as fd (512-byte sectors)."""
    table, count, entry_size = _gpt_table(fd, label)
    partitions = []
    for index in range(count):
        entry = table[index * entry_size : (index + 1) * entry_size]
        type_guid = uuid.UUID(bytes_le=entry[:16])
        if type_guid.int == 0:
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le", errors="replace").split("\0", 1)[0]
        size = (last - first + 1) * _SECTOR
        partitions.append(Partition(index + 1, name, type_guid, first * _SECTOR, size))
    return partitions


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


# The read-only ext4 reader.

_EXT4_SUPERBLOCK = 1024
_EXT4_MAGIC = 0xEF53
_EXT4_ROOT_INODE = 2
_EXT4_GOOD_OLD_INODE_SIZE = 128
_EXT4_MIN_BLOCK, _EXT4_MAX_BLOCK = 1024, 65536
_EXT4_MIN_DESC, _EXT4_MAX_DESC = 32, 1024
_EXT4_DESC_64BIT = 0x2C  # a descriptor long enough for bg_inode_table_hi
_COMPAT_SPARSE_SUPER2 = 0x200
_RO_COMPAT_SPARSE_SUPER = 0x1
_INCOMPAT_FILETYPE = 0x2
_INCOMPAT_RECOVER = 0x4
_INCOMPAT_META_BG = 0x10
_INCOMPAT_64BIT = 0x80
_INCOMPAT_UNSUPPORTED = {0x1: "compression", 0x8: "journal_dev", 0x1000: "dirdata"}
_ENCRYPT_FL = 0x800
_EXTENTS_FL = 0x80000
_INLINE_DATA_FL = 0x10000000
_EXTENT_MAGIC = 0xF30A
_EXTENT_INIT_MAX = 32768
_EXTENT_MAX_DEPTH = 5
_BLOCK_POINTERS = 15  # i_block: 12 direct, then single, double and triple indirect
_DIRECT_POINTERS = 12
_INLINE_SIZE = 60  # bytes of i_block, where fast symlinks and inline data live
_XATTR_MAGIC = 0xEA020000
_XATTR_SYSTEM = 7
_DIRENT_HEADER = 8
_MAP_SLACK = 64  # extent entries beyond a file's blocks: index nodes, preallocated extents


class _Run(NamedTuple):
    logical: int  # first block in the file
    physical: int  # first block on the filesystem
    length: int  # blocks


@dataclass(frozen=True)
class _Inode:
    number: int
    mode: int
    size: int
    mtime: int
    links: int
    flags: int
    block: bytes  # i_block
    xattrs: bytes  # the in-inode extended attribute area

    @property
    def kind(self) -> int:
        return stat.S_IFMT(self.mode)


@dataclass
class _Extraction:
    writer: _Writer
    hardlinks: dict[int, str] = field(default_factory=dict)
    directories: set[int] = field(default_factory=set)
    entries: int = 0


@dataclass(frozen=True)
class _Superblock:
    inodes_count: int
    blocks_count: int
    first_data_block: int
    block_size: int
    blocks_per_group: int
    inodes_per_group: int
    inode_size: int
    desc_size: int
    first_meta_bg: int
    backup_groups: tuple[int, ...]  # sparse_super2's two backup groups
    compat: int
    incompat: int
    ro_compat: int


def _parse_superblock(raw: bytes) -> _Superblock:
    def field_at(offset: int, kind: str = "I") -> int:
        return int(struct.unpack_from("<" + kind, raw, offset)[0])

    incompat = field_at(0x60)
    is64 = bool(incompat & _INCOMPAT_64BIT)
    return _Superblock(
        inodes_count=field_at(0x0),
        blocks_count=field_at(0x4) | (field_at(0x150) << 32 if is64 else 0),
        first_data_block=field_at(0x14),
        block_size=_EXT4_MIN_BLOCK << min(field_at(0x18), 8),
        blocks_per_group=field_at(0x20),
        inodes_per_group=field_at(0x28),
        # Revision 0 filesystems have fixed 128-byte inodes.
        inode_size=field_at(0x58, "H") if field_at(0x4C) else _EXT4_GOOD_OLD_INODE_SIZE,
        desc_size=field_at(0xFE, "H") if is64 else _EXT4_MIN_DESC,
        first_meta_bg=field_at(0x104),
        backup_groups=(field_at(0x24C), field_at(0x250)),
        compat=field_at(0x5C),
        incompat=incompat,
        ro_compat=field_at(0x64),
    )


class Ext4:
    """Reads an ext4 filesystem at ``offset`` in the file open as ``fd``."""

    def __init__(self, fd: int, offset: int, size: int, label: str) -> None:
        self._fd, self._offset, self._size, self._label = fd, offset, size, label
        raw = self._read(_EXT4_SUPERBLOCK, 1024)
        if struct.unpack_from("<H", raw, 0x38)[0] != _EXT4_MAGIC:
            raise DriverError(f"{label}: partition 9 holds no ext4 filesystem; fetch it again")
        self.sb = _parse_superblock(raw)
        self._tables: dict[int, int] = {}
        self._written = 0  # bytes of file data extracted: no more than the partition holds
        self._check_geometry()
        self._check_features()

    def _check_geometry(self) -> None:
        sane = (
            _EXT4_MIN_BLOCK <= self.sb.block_size <= _EXT4_MAX_BLOCK
            and _EXT4_GOOD_OLD_INODE_SIZE <= self.sb.inode_size <= self.sb.block_size
            and _EXT4_MIN_DESC <= self.sb.desc_size <= _EXT4_MAX_DESC
            and self.sb.blocks_per_group > 0
            and self.sb.inodes_per_group > 0
        )
        if not sane:
            self._corrupt("implausible superblock geometry")
        if self.sb.blocks_count * self.sb.block_size > self._size:
            self._corrupt("the filesystem is larger than its partition")

    def _check_features(self) -> None:
        for flag, name in _INCOMPAT_UNSUPPORTED.items():
            if self.sb.incompat & flag:
                raise DriverError(
                    f"{self._label}: its ext4 filesystem uses {name}, which this reader does "
                    "not support; report this with the Flatcar version"
                )
        if self.sb.incompat & _INCOMPAT_RECOVER:
            warn(f"{self._label}: its ext4 journal was not replayed; reading it as it is")

    def _corrupt(self, detail: str) -> None:
        raise DriverError(
            f"{self._label}: its ext4 filesystem is corrupt ({detail}); "
            "delete it and fetch it again"
        )

    def _read(self, position: int, length: int) -> bytes:
        if position < 0 or length < 0 or position + length > self._size:
            self._corrupt(f"a read at byte {position} lies beyond the partition")
        data = os.pread(self._fd, length, self._offset + position)
        if len(data) != length:
            self._corrupt(f"the image ends inside the filesystem, at byte {position}")
        return data

    def _blocks(self, number: int, count: int = 1) -> bytes:
        if number + count > self.sb.blocks_count:
            self._corrupt(f"block {number} lies beyond the filesystem")
        return self._read(number * self.sb.block_size, count * self.sb.block_size)

    # Group descriptors and inodes.

    def _has_superblock(self, group: int) -> bool:
        if group <= 1:
            return True
        if self.sb.compat & _COMPAT_SPARSE_SUPER2:
            return group in self.sb.backup_groups
        if not self.sb.ro_compat & _RO_COMPAT_SPARSE_SUPER:
            return True
        for base in (3, 5, 7):
            power = base
            while power < group:
                power *= base
            if power == group:
                return True
        return False

    def _descriptor_position(self, group: int) -> int:
        per_block = self.sb.block_size // self.sb.desc_size
        index, slot = divmod(group, per_block)
        if self.sb.incompat & _INCOMPAT_META_BG and index >= self.sb.first_meta_bg:
            # meta_bg: each meta group's descriptors sit in its own first group.
            first = index * per_block
            block = self.sb.first_data_block + first * self.sb.blocks_per_group
            block += 1 if self._has_superblock(first) else 0
        else:
            block = self.sb.first_data_block + 1 + index
        return block * self.sb.block_size + slot * self.sb.desc_size

    def _inode_table(self, group: int) -> int:
        if group not in self._tables:
            descriptor = self._read(self._descriptor_position(group), self.sb.desc_size)
            (low,) = struct.unpack_from("<I", descriptor, 0x8)
            high = 0
            if self.sb.incompat & _INCOMPAT_64BIT and self.sb.desc_size >= _EXT4_DESC_64BIT:
                (high,) = struct.unpack_from("<I", descriptor, 0x28)
            self._tables[group] = int(low) | int(high) << 32
        return self._tables[group]

    def inode(self, number: int) -> _Inode:
        if not 1 <= number <= self.sb.inodes_count:
            self._corrupt(f"inode {number} out of range")
        group, index = divmod(number - 1, self.sb.inodes_per_group)
        position = self._inode_table(group) * self.sb.block_size + index * self.sb.inode_size
        raw = self._read(position, self.sb.inode_size)
        mode, _, size_lo, _, _, mtime, _, _, links, _, flags = struct.unpack_from(
            "<HHIIIIIHHII", raw, 0
        )
        (size_hi,) = struct.unpack_from("<I", raw, 0x6C)
        xattrs = b""
        if self.sb.inode_size > _EXT4_GOOD_OLD_INODE_SIZE:
            (extra,) = struct.unpack_from("<H", raw, _EXT4_GOOD_OLD_INODE_SIZE)
            xattrs = raw[_EXT4_GOOD_OLD_INODE_SIZE + extra :]
        if flags & _ENCRYPT_FL:
            raise DriverError(f"{self._label}: inode {number} is encrypted and cannot be read")
        block = raw[0x28 : 0x28 + _INLINE_SIZE]
        return _Inode(number, mode, size_lo | size_hi << 32, mtime, links, flags, block, xattrs)

    # File contents.

    def _runs(self, inode: _Inode) -> list[_Run]:
        if inode.flags & _EXTENTS_FL:
            return self._extent_runs(inode)
        return self._blockmap_runs(inode)

    def _map_budget(self, inode: _Inode) -> int:
        """How many block-map or extent entries a file can have: one per block, and some."""
        return min(-(-inode.size // self.sb.block_size), self.sb.blocks_count) + _MAP_SLACK

    def _over_budget(self, inode: _Inode) -> None:
        self._corrupt(f"inode {inode.number} maps more blocks than it has")

    def _extent_runs(self, inode: _Inode) -> list[_Run]:
        """The runs of an extent tree, depth first; its nodes are bounded by the file's blocks."""
        budget = self._map_budget(inode)
        runs: list[_Run] = []
        pending = [(inode.block, _EXTENT_MAX_DEPTH)]
        while pending:
            node, depth_left = pending.pop()
            magic, entries, _, depth = struct.unpack_from("<HHHH", node, 0)
            if magic != _EXTENT_MAGIC or depth > depth_left or 12 + 12 * entries > len(node):
                self._corrupt("a bad extent tree node")
            budget -= entries
            if budget < 0:
                self._over_budget(inode)
            children = []
            for index in range(entries):
                position = 12 + 12 * index
                if depth == 0:
                    logical, length, start_hi, start_lo = struct.unpack_from(
                        "<IHHI", node, position
                    )
                    # Longer than the maximum: unwritten (preallocated) blocks, read as zeros.
                    if length <= _EXTENT_INIT_MAX:
                        runs.append(_Run(logical, start_hi << 32 | start_lo, length))
                else:
                    _, leaf_lo, leaf_hi = struct.unpack_from("<IIH", node, position)
                    child = self._blocks(leaf_hi << 32 | leaf_lo)
                    if struct.unpack_from("<H", child, 6)[0] != depth - 1:
                        self._corrupt("an extent tree of inconsistent depth")
                    children.append((child, depth - 1))
            pending += reversed(children)
        return runs

    def _blockmap_runs(self, inode: _Inode) -> list[_Run]:
        pointers = struct.unpack("<15I", inode.block)
        wanted = -(-inode.size // self.sb.block_size)
        per_block = self.sb.block_size // 4
        mapped: list[tuple[int, int]] = [
            (index, block) for index, block in enumerate(pointers[:_DIRECT_POINTERS]) if block
        ]
        budget = [self._map_budget(inode)]  # indirect blocks read and blocks mapped
        logical = _DIRECT_POINTERS
        for level in range(1, _BLOCK_POINTERS - _DIRECT_POINTERS + 1):
            root = pointers[_DIRECT_POINTERS + level - 1]
            if root and logical < wanted:
                self._indirect(inode, (root, level, logical, wanted), mapped, budget)
            logical += per_block**level
        return _coalesce(mapped)

    def _indirect(
        self,
        inode: _Inode,
        where: tuple[int, int, int, int],
        mapped: list[tuple[int, int]],
        budget: list[int],
    ) -> None:
        block, level, logical, wanted = where
        per_block = self.sb.block_size // 4
        span = per_block ** (level - 1)
        budget[0] -= 1  # this indirect block
        for index, child in enumerate(struct.unpack(f"<{per_block}I", self._blocks(block))):
            start = logical + index * span
            if start >= wanted:
                break
            if budget[0] < 0:
                self._over_budget(inode)
            if child and level == 1:
                budget[0] -= 1
                mapped.append((start, child))
            elif child:
                self._indirect(inode, (child, level - 1, start, wanted), mapped, budget)

    def _inline_data(self, inode: _Inode) -> bytes:
        """The part of an inline-data inode stored in its system.data attribute."""
        area = inode.xattrs
        if area[:4] != struct.pack("<I", _XATTR_MAGIC):
            return b""
        entries = area[4:]
        position = 0
        while position + 16 <= len(entries) and entries[position : position + 4] != bytes(4):
            name_len, index, value_offset, _, value_size = struct.unpack_from(
                "<BBHII", entries, position
            )
            name = entries[position + 16 : position + 16 + name_len]
            if index == _XATTR_SYSTEM and name == b"data":
                return entries[value_offset : value_offset + value_size]
            position += (16 + name_len + 3) & ~3
        return b""

    def _content(self, inode: _Inode) -> bytes:
        """A small file's whole content (directories, slow symlinks)."""
        if inode.size > limits.EXT4_METADATA:
            self._corrupt(f"inode {inode.number} claims {inode.size} bytes")
        if inode.flags & _INLINE_DATA_FL:
            return (inode.block + self._inline_data(inode))[: inode.size]
        content = bytearray(inode.size)
        for run in self._runs(inode):
            start = run.logical * self.sb.block_size
            if start < inode.size:
                # Only the blocks within the size: a run may claim up to 32768 blocks.
                needed = -(-(inode.size - start) // self.sb.block_size)
                data = self._blocks(run.physical, min(run.length, needed))
                content[start : start + len(data)] = data[: inode.size - start]
        return bytes(content[: inode.size])

    def copy_to(self, inode: _Inode, fd: int) -> None:
        """Write a regular file's content to fd, leaving its holes as holes."""
        if inode.flags & _INLINE_DATA_FL:
            _write_all(fd, self._content(inode))
            return
        for run in self._runs(inode):
            start = run.logical * self.sb.block_size
            length = min(run.length * self.sb.block_size, inode.size - start)
            if length <= 0:
                continue
            if run.physical + run.length > self.sb.blocks_count:
                self._corrupt(f"inode {inode.number} points beyond the filesystem")
            self._written += length
            if self._written > self._size:
                # No file system holds more file data than its partition: blocks are shared.
                self._corrupt(f"its files hold more than its {self._size}-byte partition")
            for done in range(0, length, _CHUNK):
                piece = min(_CHUNK, length - done)
                data = self._read(run.physical * self.sb.block_size + done, piece)
                _write_all(fd, data, start + done)
        os.ftruncate(fd, inode.size)

    def link_target(self, inode: _Inode) -> str:
        if inode.size > limits.LINK_TARGET:
            self._corrupt(f"inode {inode.number} is a {inode.size}-byte symbolic link")
        is_fast = inode.size < _INLINE_SIZE and not inode.flags & (_EXTENTS_FL | _INLINE_DATA_FL)
        raw = inode.block[: inode.size] if is_fast else self._content(inode)
        return os.fsdecode(raw.split(b"\0", 1)[0])

    # Directories and paths.

    def _dirents(self, data: bytes) -> Iterator[tuple[bytes, int]]:
        position = 0
        while position + _DIRENT_HEADER <= len(data):
            number, rec_len, name_len, file_type = struct.unpack_from("<IHBB", data, position)
            if not self.sb.incompat & _INCOMPAT_FILETYPE:
                name_len |= file_type << 8
            if rec_len in (0, 0xFFFF) and len(data) == _EXT4_MAX_BLOCK:
                rec_len = _EXT4_MAX_BLOCK
            if rec_len < _DIRENT_HEADER or position + rec_len > len(data):
                self._corrupt("a bad directory entry")
            name = data[position + _DIRENT_HEADER : position + _DIRENT_HEADER + name_len]
            if number and name not in (b"", b".", b".."):
                yield name, number
            position += rec_len

    def entries(self, directory: _Inode) -> Iterator[tuple[bytes, int]]:
        if directory.flags & _INLINE_DATA_FL:
            # The parent's inode number comes first, then entries, continued in system.data.
            yield from self._dirents(directory.block[4:])
            yield from self._dirents(self._inline_data(directory))
            return
        data = self._content(directory)
        for start in range(0, len(data), self.sb.block_size):
            yield from self._dirents(data[start : start + self.sb.block_size])

    def _child(self, directory: _Inode, name: str) -> int | None:
        wanted = os.fsencode(name)
        return next((number for entry, number in self.entries(directory) if entry == wanted), None)

    def resolve(self, path: str) -> tuple[PurePosixPath, _Inode] | None:
        """Look path up as if the filesystem were /, following symlinks but in the last part."""
        pending = [part for part in path.split("/") if part not in ("", ".")]
        resolved: list[tuple[str, _Inode]] = []
        root = self.inode(_EXT4_ROOT_INODE)
        followed = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            directory = resolved[-1][1] if resolved else root
            number = self._child(directory, name) if directory.kind == stat.S_IFDIR else None
            if number is None:
                return None
            inode = self.inode(number)
            if inode.kind == stat.S_IFLNK and pending:
                followed += 1
                if followed > _MAX_SYMLINKS:
                    self._corrupt(f"too many levels of symbolic links in {path}")
                target = self.link_target(inode)
                if target.startswith("/"):
                    resolved = []
                pending = [p for p in target.split("/") if p not in ("", ".")] + pending
                continue
            resolved.append((name, inode))
        return PurePosixPath(*(name for name, _ in resolved)), resolved[-1][1] if resolved else root

    # Extraction.

    def extract(self, wanted: Iterable[str], destination: Path) -> list[PurePosixPath]:
        """Copy the wanted paths (and all below them) into destination, a new directory.

        Returns the paths found.
        """
        found = []
        for path in wanted:
            resolved = self.resolve(path)
            if resolved is None:
                warn(f"/{path.lstrip('/')} is not in the developer container; skipped")
            else:
                found.append(resolved)
        destination.mkdir(parents=True, exist_ok=True)
        extraction = _Extraction(_Writer(destination))
        done: list[PurePosixPath] = []
        # Parents first, so that a path inside another one is found already done.
        for rel, inode in sorted(found, key=lambda item: len(item[0].parts)):
            if any(rel == path or path in rel.parents for path in done):
                continue
            say(f"Extracting /{rel} from the developer container...")
            self._extract(inode, rel, extraction)
            done.append(rel)
        # Each link was checked as text; through one another (a chain of "..") they may leave.
        _drop_escaping_links(destination, extraction.writer.symlinks(), "the developer container")
        return done

    def _extract(self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction) -> None:
        if len(rel.parts) > limits.PATH_DEPTH:
            self._corrupt(f"/{str(rel)[:200]} is more than {limits.PATH_DEPTH} directories deep")
        extraction.entries += 1
        if extraction.entries > limits.EXT4_ENTRIES:
            self._corrupt(f"more than {limits.EXT4_ENTRIES} entries to extract")
        if inode.kind == stat.S_IFDIR:
            self._extract_directory(inode, rel, extraction)
        elif inode.kind == stat.S_IFREG:
            self._extract_file(inode, rel, extraction)
        elif inode.kind == stat.S_IFLNK:
            target = _contained_link_target(rel, self.link_target(inode))
            if target is None:
                warn(f"/{rel} points outside the developer container; left out")
            else:
                extraction.writer.symlink(_rel(rel), target, inode.mtime)
        # Devices, fifos and sockets have no place in a build root.

    def _extract_directory(
        self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction
    ) -> None:
        if inode.number in extraction.directories:
            self._corrupt(f"directory inode {inode.number} appears twice")
        extraction.directories.add(inode.number)
        path = extraction.writer.directory(_rel(rel))
        for raw_name, number in self.entries(inode):
            name = os.fsdecode(raw_name)
            if "/" in name or "\0" in name:
                self._corrupt(f"a file name with a slash in /{rel}")
            self._extract(self.inode(number), rel / name, extraction)
        os.chmod(path, inode.mode & 0o777 | 0o700)  # noqa: PTH101 - the writer's string path
        os.utime(path, (inode.mtime, inode.mtime))

    def _extract_file(self, inode: _Inode, rel: PurePosixPath, extraction: _Extraction) -> None:
        earlier = extraction.hardlinks.get(inode.number)
        if earlier is not None:
            extraction.writer.hardlink(_rel(rel), earlier)
            return
        path = extraction.writer.file(
            _rel(rel), inode.mode, inode.mtime, lambda fd: self.copy_to(inode, fd)
        )
        if inode.links > 1:
            extraction.hardlinks[inode.number] = path


def _coalesce(mapped: list[tuple[int, int]]) -> list[_Run]:
    runs: list[_Run] = []
    for logical, physical in sorted(mapped):
        last = runs[-1] if runs else None
        if (
            last
            and last.logical + last.length == logical
            and last.physical + last.length == physical
        ):
            runs[-1] = last._replace(length=last.length + 1)
        else:
            runs.append(_Run(logical, physical, 1))
    return runs


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
            filesystem = Ext4(image.fileno(), partition.offset, partition.size, label)
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
