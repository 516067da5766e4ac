"""Install the NVIDIA driver's userspace from its .run, driven by the package's own .manifest.

This replaces ``nvidia-installer`` at image build time (both images, and the tests, take this
path). It installs what a headless compute node needs (docs/nvidia-run-format.md
section 4): NVML, CUDA, OpenCL, Vulkan/EGL libraries with their SONAME links, nvidia-smi and
the other tools, the GSP firmware (under /opt/lib/firmware/nvidia/<version>, which ``init`` copies
into the Operator's /lib/firmware mount), and the kernel module sources that the build and the
GDS/GDRCopy sidecars look for in /usr/src/nvidia-<version>.

What goes where is selection.py's; the install, ldconfig included, is all or nothing
(transaction.py).

Usage at image build::

    python3 -m nvidia_driver.image.userspace install --run FILE [--sha256 HEX] [--root DIR]
        [--arch amd64|arm64] [--no-man-pages]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.image import runfile as run
from nvidia_driver.image.driverroot import ldconfig_root
from nvidia_driver.image.manifest import (
    MANIFEST,
    ManifestEntry,
    parse_manifest,
    relative_path,
    trimmed_manifest,
)
from nvidia_driver.image.selection import (
    FIRMWARE_GROUP,
    GROUPS,
    KERNEL_SOURCE_DIRS,
    MAN_PAGES_GROUP,
    SOURCES_GROUP,
    Layout,
    PlannedFile,
    plan,
)
from nvidia_driver.image.transaction import Transaction, all_or_nothing
from nvidia_driver.log import error, say, warn
from nvidia_driver.naming import MACHINE, TRIPLETS, machine_arch

SETUID_PROGRAM = "nvidia-modprobe"  # setuid root, so that users can create the device nodes
_PRIVILEGE_BITS = 0o6000  # setuid and setgid


@dataclass(frozen=True)
class InstalledGroup:
    title: str
    files: tuple[PurePosixPath, ...]  # absolute paths inside the root
    symlinks: tuple[PurePosixPath, ...] = ()

    def summary(self) -> str:
        names = ", ".join(path.name for path in self.files)
        count = len(self.symlinks)
        links = f" (+{count} symlink{'s' if count > 1 else ''})" if count else ""
        return f"Installed {self.title}: {names}{links}"


@dataclass(frozen=True)
class InstallResult:
    version: str
    root: Path
    groups: tuple[InstalledGroup, ...]


def host_arch() -> str:
    arch = machine_arch()
    if arch in TRIPLETS:
        return arch
    raise DriverError(f"no NVIDIA driver userspace for this machine ({arch}); use --arch")


def _known_arch(arch: str) -> str:
    if arch not in TRIPLETS:
        raise DriverError(f"unknown architecture {arch!r}: use one of {', '.join(TRIPLETS)}")
    return arch


def install_runfile(
    runfile: Path,
    root: Path = Path("/"),
    *,
    arch: str | None = None,
    sha256: str | None = None,
    commands: Commands | None = None,
    man_pages: bool = True,
) -> InstallResult:
    """Verify and unpack ``runfile`` in a scratch directory, then install from it into ``root``."""
    arch = _known_arch(arch or host_arch())
    header = run.read_header(runfile)
    if header.target_arch not in (None, MACHINE[arch]):
        raise DriverError(
            f"{runfile.name} is for {header.target_arch}, not {MACHINE[arch]} ({arch}); "
            "use the .run for the image's architecture"
        )
    commands = commands or Commands()
    say(f"Unpacking {runfile.name}...")
    with tempfile.TemporaryDirectory(prefix="nvidia-run.") as scratch:
        tree = run.extract(runfile, Path(scratch) / "package", commands=commands, sha256=sha256)
        result = install_tree(tree, root, arch=arch, commands=commands, man_pages=man_pages)
    if header.version not in (None, result.version):
        warn(f"{runfile.name} says version {header.version}, its .manifest {result.version}")
    return result


def install_tree(
    tree: Path,
    root: Path = Path("/"),
    *,
    arch: str,
    commands: Commands,
    man_pages: bool = True,
) -> InstallResult:
    """Install from an unpacked .run tree into ``root``: all of it, or nothing on failure."""
    manifest_text = _read_manifest(tree)
    manifest = parse_manifest(manifest_text)
    layout = Layout(TRIPLETS[_known_arch(arch)], manifest.version)
    planned = plan(manifest, layout, man_pages)
    _check_sources(tree, planned)
    kernel_dirs = [name for name in KERNEL_SOURCE_DIRS if (tree / name).is_dir()]
    if not kernel_dirs:
        raise DriverError(
            f"the NVIDIA {manifest.version} package has neither kernel/ nor kernel-open/: it "
            "is not a complete Linux driver package"
        )
    root = root.resolve()
    say(f"Installing the NVIDIA {manifest.version} userspace into {root}...")
    try:
        with all_or_nothing() as transaction:
            for item in planned:
                _stage(transaction, tree, root, item)
            sources = _stage_sources(
                transaction,
                tree,
                root,
                layout=layout,
                kernel_dirs=kernel_dirs,
                manifest_text=manifest_text,
            )
            transaction.directory(root / "etc")  # where ldconfig -r writes its cache
            transaction.commit()
            _update_linker_cache(root, commands)
    except (OSError, DriverError) as exc:  # DriverError: ldconfig
        raise DriverError(
            f"installing the NVIDIA {manifest.version} userspace into {root} failed "
            f"({exc}); nothing was installed"
        ) from exc
    result = InstallResult(manifest.version, root, (*_groups(planned), sources))
    for group in result.groups:
        say(group.summary())
    return result


def _read_manifest(tree: Path) -> str:
    try:
        return (tree / MANIFEST).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise DriverError(
            f"the driver package has no readable {MANIFEST} ({exc.strerror}): it is not an "
            "NVIDIA driver .run"
        ) from exc


def _source(tree: Path, entry: ManifestEntry) -> Path:
    return tree / relative_path(entry.file, entry)


def _check_sources(tree: Path, planned: list[PlannedFile]) -> None:
    for item in planned:
        if not item.entry.is_symlink and not _source(tree, item.entry).is_file():
            raise DriverError(
                f".manifest line {item.entry.line} lists {item.entry.file}, which the package "
                "does not have: the package is corrupt; download it again"
            )


def _in_root(root: Path, path: PurePosixPath) -> Path:
    return root / path.relative_to("/")


def _stage(transaction: Transaction, tree: Path, root: Path, item: PlannedFile) -> None:
    final = _in_root(root, item.destination)
    if item.entry.is_symlink:
        assert item.entry.target is not None  # parse_manifest requires it for symlink types
        transaction.stage_symlink(item.entry.target, final)
    else:
        transaction.stage_file(_source(tree, item.entry), final, _install_mode(item.entry))


def _install_mode(entry: ManifestEntry) -> int:
    """The entry's mode; setuid and setgid only for nvidia-modprobe, as nvidia-installer has it."""
    if not entry.mode & _PRIVILEGE_BITS or PurePosixPath(entry.file).name == SETUID_PROGRAM:
        return entry.mode
    mode = entry.mode & ~_PRIVILEGE_BITS
    warn(
        f".manifest line {entry.line}: {entry.file} asks for mode {entry.mode:04o}; only "
        f"{SETUID_PROGRAM} may be setuid or setgid: installing it {mode:04o}"
    )
    return mode


def _stage_sources(
    transaction: Transaction,
    tree: Path,
    root: Path,
    *,
    layout: Layout,
    kernel_dirs: list[str],
    manifest_text: str,
) -> InstalledGroup:
    """/usr/src/nvidia-<version>: the module sources, LICENSE and the trimmed manifest."""
    staging = transaction.stage_directory(_in_root(root, layout.sources_dir))
    names = list(kernel_dirs)
    for name in kernel_dirs:
        shutil.copytree(tree / name, staging / name, symlinks=True)
    if (tree / "LICENSE").is_file():
        shutil.copy2(tree / "LICENSE", staging / "LICENSE")
        names.append("LICENSE")
    (staging / MANIFEST).write_text(
        trimmed_manifest(manifest_text), encoding="utf-8", errors="surrogateescape"
    )
    names.append(MANIFEST)
    return InstalledGroup(
        f"{SOURCES_GROUP} in {layout.sources_dir}",
        tuple(layout.sources_dir / name for name in names),
    )


def _update_linker_cache(root: Path, commands: Commands) -> None:
    # ldconfig also creates SONAME links the manifest lacks.
    commands.run("ldconfig", *ldconfig_root(root))


def _groups(planned: list[PlannedFile]) -> list[InstalledGroup]:
    order = [group.title for group in GROUPS] + [FIRMWARE_GROUP, MAN_PAGES_GROUP]
    groups = []
    for title in order:
        members = [item for item in planned if item.group == title]
        if members:
            groups.append(
                InstalledGroup(
                    title,
                    tuple(m.destination for m in members if not m.entry.is_symlink),
                    tuple(m.destination for m in members if m.entry.is_symlink),
                )
            )
    return groups


# --- command line ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(
        prog="python3 -m nvidia_driver.image.userspace",
        description="Install the NVIDIA driver userspace a headless node needs from a .run, "
        "without nvidia-installer (image build time).",
    )
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    install = commands.add_parser(
        "install", help="verify, unpack and install a driver .run into a root directory"
    )
    install.add_argument("--run", type=Path, required=True, metavar="FILE", help="the .run")
    install.add_argument("--sha256", metavar="HEX", help="the .run's pinned SHA-256")
    install.add_argument(
        "--root", type=Path, default=Path("/"), metavar="DIR", help="install under DIR (/)"
    )
    install.add_argument(
        "--arch", choices=sorted(TRIPLETS), help="the image's architecture (default: this host's)"
    )
    install.add_argument("--no-man-pages", action="store_true", help="skip the man pages")
    return main_parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        install_runfile(
            args.run,
            args.root,
            arch=args.arch,
            sha256=args.sha256,
            man_pages=not args.no_man_pages,
        )
    except DriverError as exc:
        error(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
