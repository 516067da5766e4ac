"""The node's own kernel build tree, copied so that its host tools can run here.

The node's ``/usr/lib/modules/<kernel>/build`` is read through PID 1's root (the Operator gives
the pod hostPID). It is copied, because the host's /usr is read-only and the copy's host tools
must be pointed at the host's glibc (hosttools.py). Absolute links are rewritten relative to
the copy; links that leave it are dropped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from nvidia_driver.atomic import replacing
from nvidia_driver.formats.output import contained_link_target, drop_escaping_links
from nvidia_driver.kbuild.hosttools import make_tools_runnable
from nvidia_driver.kbuild.kerneltree import (
    HOST,
    MODULES_DIR,
    KernelTree,
    missing_symbol_versions,
    one_line,
    tree_at,
)
from nvidia_driver.links import resolve_within, tree_links
from nvidia_driver.log import say, warn
from nvidia_driver.paths import Paths


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
        one_line(what, destination.parent, "check the node's /usr/lib/modules"),
        replacing(destination, directory=True) as staging,
    ):
        modules = staging / MODULES_DIR / kernel_release
        shutil.copytree(build, modules / "build", symlinks=True)
        if source is None:
            (modules / "source").symlink_to("build")
        else:
            shutil.copytree(source, modules / "source", symlinks=True)
        _contain_symlinks(staging)
        make_tools_runnable(modules / "build", host_root, staging, HOST)
    return tree_at(destination, kernel_release, None, HOST)
