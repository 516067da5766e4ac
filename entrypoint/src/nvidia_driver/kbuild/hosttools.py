"""The host tools of a Flatcar kernel tree, made to run in this container.

kbuild's host tools (fixdep, modpost, objtool, sign-file...) in a Flatcar tree are linked
against Flatcar's glibc, which is newer than the container's. Their PT_INTERP
(/lib64/ld-linux-x86-64.so.2) exists in the container too, but it is the container's loader with
the container's libc, so the tools fail with "GLIBC_2.xx not found". So every dynamically linked
tool is renamed to ``<tool>.real``, and a shell wrapper runs it with the loader and the
libraries it was linked against. The wrapper finds them relative to its own canonical path, so
the tree can be renamed or bind-mounted elsewhere.

Library selection: a tool's libraries are the transitive closure of the DT_NEEDED entries
(read by formats/elf.py), looked up in usr/lib64, lib64, usr/lib, lib and gcc's versioned
runtime directory. A streamed archive can be read only once and its members come in no useful
order, so every shared library of those directories is written to a scratch directory, and
only the closure is kept. This costs some scratch space, but no allowlist can fall behind a new
Flatcar dependency. Tool directories that are links are refused.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.elf import MACHINES, ElfInfo, read_elf
from nvidia_driver.links import resolve_within

RUNTIME_LIB_DIR = PurePosixPath("usr/lib64")  # where a tree's host tools find their glibc
_TOOL_DIRS = ("scripts", "tools")
LIBRARY_DIRS = ("usr/lib64", "lib64", "usr/lib", "lib")
_GCC_RUNTIME_DIRS = "usr/lib/gcc/*/*"  # Gentoo keeps libgcc_s and libstdc++ there
_GCC_RUNTIME_PREFIX, _GCC_RUNTIME_DEPTH = "usr/lib/gcc/", _GCC_RUNTIME_DIRS.count("/")
LIBRARY_NAME = re.compile(r"^[^/]+\.so(\.[0-9][^/]*)?$")
_REAL_SUFFIX = ".real"  # a wrapped host tool's own binary


def is_gcc_runtime_dir(parent: str) -> bool:
    """Whether parent, a normalized relative path, matches _GCC_RUNTIME_DIRS."""
    return parent.startswith(_GCC_RUNTIME_PREFIX) and parent.count("/") == _GCC_RUNTIME_DEPTH


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
    candidates = [resolve_within(root, root / name) for name in LIBRARY_DIRS]
    gcc_dirs = sorted(root.glob(_GCC_RUNTIME_DIRS), reverse=True)
    candidates += [resolve_within(root, directory) for directory in gcc_dirs]
    # Resolved inside root: equal paths are the same directory, listed once, in order.
    return list(dict.fromkeys(directory for directory in candidates if directory.is_dir()))


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


def host_tools(build_dir: Path) -> list[tuple[Path, ElfInfo]]:
    """The tree's dynamically linked host tools, each checked to be built for this machine."""
    tools = _dynamic_executables(build_dir)
    for tool, info in tools:
        _check_machine(tool, info)
    return tools


def relocate_host_tools(tools: list[tuple[Path, ElfInfo]], runtime_root: Path) -> list[Path]:
    """Make the host tools (:func:`host_tools`) run with runtime_root's loader and libraries.

    Each tool becomes a shell wrapper beside ``<tool>.real``; the wrapped tools are returned.
    """
    directories = _library_dirs(runtime_root)
    # Only directories that hold libraries go on the tools' library path.
    library_path = [d for d in directories if any(LIBRARY_NAME.match(p.name) for p in d.iterdir())]
    for tool, info in tools:
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


def make_tools_runnable(build_dir: Path, libraries_from: Path, root: Path, origin: str) -> None:
    """Wrap the tree's tools; only ever called on a tree whose links were checked."""
    _check_tool_dirs(build_dir, root, origin)
    # Checked before their libraries are looked for: an x86-64 tool's loader is not on an arm64
    # root.
    tools = host_tools(build_dir)
    if tools:
        install_runtime([tool for tool, _ in tools], libraries_from, root / RUNTIME_LIB_DIR)
        relocate_host_tools(tools, root)
