"""The developer container of a release: bz2 -> sparse disk image -> GPT -> ext4 -> a root.

Its gcc built the kernel; the result is a root to chroot into (``developer_container_tree``
describes its tree). The image is a GPT disk whose partition 9 holds ext4: formats/gpt.py and
formats/ext4.py read it in place, from the sparse image, so no loop device is needed.
"""

from __future__ import annotations

import bz2
from pathlib import Path
from typing import IO

from nvidia_driver import limits
from nvidia_driver.atomic import replacing
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output
from nvidia_driver.formats.ext4 import Ext4
from nvidia_driver.formats.gpt import LINUX_FILESYSTEM, Partition, read_gpt
from nvidia_driver.kbuild.kerneltree import (
    DEVELOPER_CONTAINER,
    NOT_FLATCAR,
    KernelTree,
    kernels_in,
    one_line,
    scratch_beside,
    single_kernel,
    tree_at,
)
from nvidia_driver.log import say

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


class DeveloperContainerRoot(Ext4):
    """The developer container's root filesystem, with messages in its terms."""

    WHERE = f"partition {ROOT_PARTITION}"
    WHAT = "the developer container"
    UNSUPPORTED = "report this with the Flatcar version"
    THROUGH_LINK = NOT_FLATCAR


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


def extract_developer_container(
    image_bz2: Path, destination: Path, wanted: list[str], commands: Commands
) -> Path:
    """Extract the wanted paths of a flatcar_developer_container.bin.bz2 into destination.

    The image is decompressed sparse beside destination (about 6 GiB apparent, only its data
    on disk) and removed afterwards; no loop device is needed. Absolute symlinks are rewritten
    relative, which means the same inside a chroot of destination. Returns destination.
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
    release = single_kernel(kernels_in(root), kernel_release, DEVELOPER_CONTAINER)
    return tree_at(root, release, root, DEVELOPER_CONTAINER)
