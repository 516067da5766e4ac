"""The developer container of a release: bz2 -> sparse disk image -> GPT -> ext4 -> a root.

Its gcc built the kernel; the result is a root to chroot into (``developer_container_tree``
describes its tree). The image is a GPT disk whose partition 9 holds ext4: util-linux's partx
reads the table and e2fsprogs' debugfs the filesystem, in place in the sparse image, so no loop
device is needed. debugfs writes what the image holds, which its signature vouches for (it is
verified whole before this runs); the tree is then checked and settled before any use.
"""

from __future__ import annotations

import bz2
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from nvidia_driver import limits
from nvidia_driver.atomic import replacing
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output
from nvidia_driver.kbuild.kerneltree import (
    DEVELOPER_CONTAINER,
    NOT_FLATCAR,
    KernelTree,
    kernels_in,
    one_line,
    scratch_beside,
    single_kernel,
    tells_of_full_disk,
    tree_at,
)
from nvidia_driver.links import resolve_within
from nvidia_driver.log import say, warn
from nvidia_driver.safetext import shown

_CHUNK = 1 << 20
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


# Flatcar compresses the developer container with lbzip2 (flatcar/scripts
# build_library/release_util.sh), which also decompresses it on every core: Python's bz2 module
# uses one (about 30 s for the 129 MB test image on a 2-core VM; Flatcar's is 480 MB). The
# module stays the fallback.
PARALLEL_BZIP2 = "lbzip2"


def decompress_sparse(source: Path, target: Path, commands: Commands) -> int:
    """Decompress a .bz2 file into target, leaving zero blocks as holes; return its size."""
    what = f"decompress {source.name}"
    with one_line(what, target.parent, "delete it and fetch it again"):
        try:
            with target.open("wb") as out:
                if commands.which(PARALLEL_BZIP2) is None:
                    with bz2.open(source, "rb") as compressed:
                        size = _write_sparse(compressed, out, source.name)
                else:
                    with (
                        source.open("rb") as raw,
                        commands.pipe_bytes(PARALLEL_BZIP2, ("-d", "-c"), raw) as compressed,
                    ):
                        size = _write_sparse(compressed, out, source.name)
                out.truncate(size)
        except _TooLargeError:
            raise
        except (EOFError, DriverError) as exc:  # a broken stream, as bz2 or lbzip2 reports it
            raise DriverError(f"cannot {what}: {exc}; delete it and fetch it again") from exc
    return size


class _TooLargeError(DriverError):
    """More than any developer container decompresses to."""


def _write_sparse(decompressed: IO[bytes], out: IO[bytes], name: str) -> int:
    """Copy decompressed into out, zero blocks as holes, refusing more than a disk image."""
    size = 0
    zero_chunk = bytes(_CHUNK)
    while chunk := decompressed.read(_CHUNK):
        if chunk != zero_chunk[: len(chunk)]:
            _write_nonzero(out.fileno(), chunk, size)
        size += len(chunk)
        if size > limits.DISK_IMAGE:
            raise _TooLargeError(
                f"{name} decompresses to more than {limits.size(limits.DISK_IMAGE)}, beyond "
                "any Flatcar developer container (6 GiB): refusing it; report it"
            )
    return size


ROOT_PARTITION = 9
ROOT_LABEL = "ROOT"
LINUX_FILESYSTEM = "0fc63daf-8483-4772-8e79-3d69d8477de4"  # the GPT type, as partx prints it
_SECTOR = 512  # partx counts a file's sectors in 512 bytes
_PARTX_SECONDS = 60.0
# How the messages name the root filesystem, and what to do about it.
WHERE = f"partition {ROOT_PARTITION}"
WHAT = "the developer container"
UNSUPPORTED = "report this with the Flatcar version"
THROUGH_LINK = NOT_FLATCAR


@dataclass(frozen=True)
class Partition:
    number: int
    name: str
    type_guid: str  # lower case
    offset: int  # bytes from the start of the disk
    size: int  # bytes


def read_partitions(disk: Path, label: str, commands: Commands) -> list[Partition]:
    """The partitions of a disk image, as util-linux's partx reads them (libblkid checks the
    GPT header's and entries' CRCs, and falls back to the backup GPT)."""
    columns = "NR,START,SECTORS,TYPE,NAME"
    result = commands.run(
        "partx", "--raw", "--noheadings", "--output", columns, disk,
        check=False, timeout=_PARTX_SECONDS,
    )  # fmt: skip
    if result.returncode != 0:
        reason = result.stderr.strip().splitlines()[-1:] or ["no output"]
        raise DriverError(
            f"{label} has no partition table partx can read ({reason[0]}): delete it and "
            "fetch it again"
        )
    partitions = []
    for line in result.stdout.splitlines():
        number, start, sectors, type_guid, name = [*line.split(" "), ""][:5]
        # Names come escaped (a space is \x20); only "ROOT" is looked for.
        offset, size = int(start) * _SECTOR, int(sectors) * _SECTOR
        partitions.append(Partition(int(number), name, type_guid.lower(), offset, size))
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


def _quoted(argument: str) -> str:
    """An argument of a debugfs command line (its ss parser doubles a quote inside quotes)."""
    if "\n" in argument:
        raise DriverError(f"{argument!r} has a newline: debugfs cannot be given it; rename it")
    return '"' + argument.replace('"', '""') + '"'


def _rdump(
    filesystem: str, wanted: list[str], slots: Path, label: str, commands: Commands
) -> set[str]:
    """rdump each wanted path into a slot directory of its own, slots/<index>; the paths the
    filesystem lacks.

    debugfs exits 0 when a command fails: its complaints are on stderr, each one refused but
    a path the filesystem lacks. Time is bounded by limits.DEBUGFS_SECONDS.
    """
    script = []
    for index, path in enumerate(wanted):
        (slots / str(index)).mkdir()
        script.append(f"rdump {_quoted('/' + path)} {_quoted(str(slots / str(index)))}\n")
    (slots / "script").write_text("".join(script))
    result = commands.run(
        "debugfs", "-f", slots / "script", filesystem,
        check=False, timeout=limits.DEBUGFS_SECONDS,
    )  # fmt: skip
    missing, complaints = set(), []
    for line in map(str.strip, result.stderr.splitlines()):
        if line.endswith("File not found by ext2_lookup"):
            missing.add(line.partition(": ")[0].lstrip("/"))
        elif line and not line.startswith("debugfs "):  # not its version banner
            complaints.append(line)
    if result.returncode or complaints:
        first = shown(complaints[0], 300) if complaints else f"exit {result.returncode}"
        storage = tells_of_full_disk(first)
        advice = f"make room in {slots.parent}, then retry" if storage else UNSUPPORTED
        raise DriverError(f"{label}: debugfs cannot extract {WHAT} from {WHERE}: {first}; {advice}")
    return missing


def _place(source: Path, target: Path) -> None:
    """Move source to target; into it, entry by entry, where both are directories."""
    pending = [(source, target)]
    while pending:
        source, target = pending.pop()
        if not target.is_symlink() and not target.exists():
            source.rename(target)
        elif target.is_dir() and not target.is_symlink() and not source.is_symlink():
            pending += [(entry, target / entry.name) for entry in source.iterdir()]
        # Else the path is there already, extracted within another wanted path.


def _settle(root: Path, label: str) -> None:
    """Make the extracted tree safe before anything uses it, bounded by limits.py.

    Absolute links become relative (the same meaning in a chroot of root), links that climb out
    are left out, setuid and setgid bits dropped; anything but a directory, a file or a link
    is refused (debugfs writes no other kind), as are paths beyond the bounds.
    """
    links: list[str] = []
    entries = 0
    pending = [""]
    while pending:
        directory = pending.pop()
        depth = directory.count("/") + 2 if directory else 1  # of the entries in it
        with os.scandir(root / directory) as listing:
            for entry in listing:
                entries += 1
                if entries > limits.EXT4_ENTRIES:
                    raise DriverError(
                        f"{label}: {WHAT} holds more than {limits.EXT4_ENTRIES} entries to "
                        f"extract; {THROUGH_LINK}"
                    )
                rel = f"{directory}/{entry.name}" if directory else entry.name
                if depth > limits.PATH_DEPTH:
                    raise DriverError(
                        f"{label}: /{shown(rel, 200)} is more than {limits.PATH_DEPTH} directories "
                        f"deep; {THROUGH_LINK}"
                    )
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    if _settle_link(entry.path, rel):
                        links.append(rel)
                elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                    # A directory the owner can fill and remove; no setuid or setgid.
                    settled = stat.S_IMODE(mode) & 0o777 | (0o700 if stat.S_ISDIR(mode) else 0)
                    if settled != stat.S_IMODE(mode):
                        os.chmod(entry.path, settled)  # noqa: PTH101
                    if stat.S_ISDIR(mode):
                        pending.append(rel)
                else:
                    raise DriverError(
                        f"{label}: /{shown(rel)} is not a directory, a file or a symbolic link; "
                        f"{THROUGH_LINK}"
                    )
    # Each link was checked as text; through one another (a chain of "..") they may leave.
    output.drop_escaping_links(root, links, WHAT)


def _settle_link(path: str, rel: str) -> bool:
    """Rewrite the link at path relative, or remove it if it leads out; whether it stays."""
    target = os.readlink(path)  # noqa: PTH115 - scandir's string path
    contained = output.contained_link_target(PurePosixPath(rel), target)
    if contained is None:
        warn(f"/{shown(rel)} points outside {WHAT}; left out")
        os.unlink(path)  # noqa: PTH108
        return False
    if contained != target:
        mtime = os.lstat(path).st_mtime
        os.unlink(path)  # noqa: PTH108
        os.symlink(contained, path)  # noqa: PTH211
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return True


def extract_root(
    disk: Path,
    partition: Partition,
    wanted: list[str],
    staging: Path,
    *,
    label: str,
    commands: Commands,
) -> list[str]:
    """Extract the wanted paths of the ext4 filesystem in partition into staging, a new
    directory; the paths found.

    A wanted path is found as if the filesystem were / (links followed, but in its last part)
    and lands where its parent resolves in staging; one inside another is extracted once.
    """
    paths = sorted({path.strip("/") for path in wanted}, key=lambda p: (p.count("/"), p))
    say(f"Extracting {', '.join('/' + path for path in paths)} from {WHAT}...")
    found = []
    with scratch_beside(staging) as slots:
        # unix_io opens the filesystem at an offset in the disk file (ext2fs_open's io_options).
        filesystem = f"{disk}?offset={partition.offset}"
        missing = _rdump(filesystem, paths, slots, label, commands)
        for index, path in enumerate(paths):
            slot = slots / str(index)
            if not any(slot.iterdir()):
                if path not in missing:
                    raise DriverError(f"{label}: debugfs wrote nothing for /{path}; {UNSUPPORTED}")
                warn(f"/{path} is not in {WHAT}; skipped")
                continue
            parent = resolve_within(staging, staging / PurePosixPath(path).parent)
            parent.mkdir(parents=True, exist_ok=True)
            for entry in slot.iterdir():
                _place(entry, parent / entry.name)
            found.append(path)
    _settle(staging, label)
    return found


def extract_developer_container(
    image_bz2: Path, destination: Path, wanted: list[str], commands: Commands
) -> Path:
    """Extract the wanted paths of a flatcar_developer_container.bin.bz2 into destination.

    The image is decompressed sparse beside destination (about 6 GiB apparent, only its data
    on disk) and removed afterwards; no loop device is needed: partx reads the GPT and debugfs
    the ext4 filesystem in partition 9, at its offset in the disk file. Absolute symlinks are
    rewritten relative, which means the same inside a chroot of destination. Returns
    destination.
    """
    label = image_bz2.name
    destination = destination.absolute()
    with (
        one_line(f"extract {label} to {destination}", destination.parent, "retry"),
        replacing(destination, directory=True) as staging,
        scratch_beside(destination) as scratch,
    ):
        disk = scratch / "disk.bin"
        say(f"Decompressing {label} (about 6 GiB, written sparse)...")
        size = decompress_sparse(image_bz2, disk, commands)
        partition = root_partition(read_partitions(disk, label, commands), size, label)
        if not extract_root(disk, partition, wanted, staging, label=label, commands=commands):
            raise DriverError(
                f"none of {', '.join(wanted)} is in {label}: is it a developer container?"
            )
    return destination


def developer_container_tree(root: Path, kernel_release: str | None) -> KernelTree:
    """The kernel build tree inside an extracted developer container, built from a chroot."""
    root = root.absolute()
    release = single_kernel(kernels_in(root), kernel_release, DEVELOPER_CONTAINER)
    return tree_at(root, release, root, DEVELOPER_CONTAINER)
