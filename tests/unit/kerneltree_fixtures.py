"""Small Flatcar-shaped inputs for test_kerneltree, built at test time.

Real ELF tools come from this machine (/bin/true, /bin/echo, /bin/cat) and so do the loader
and libc that a "Flatcar" runtime root holds: the tests check that wrapped tools really run
with the libraries of that root.
"""

from __future__ import annotations

import bz2
import io
import os
import shutil
import struct
import subprocess
import tarfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from tools import require

from nvidia_driver.commands import Commands

KERNEL = "6.12.81-flatcar"
SECTOR = 512
PARTITION_START = 2 << 20  # Flatcar's container layout: partition 9 at 2 MiB
LINUX_FILESYSTEM = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
ENTRY_COUNT, ENTRY_SIZE = 128, 128
MANY = 150


def machine_runtime() -> dict[str, Path]:
    """This machine's loader and libc, by the names a program asks for (from ldd)."""
    output = subprocess.run(["ldd", "/bin/cat"], capture_output=True, text=True, check=True)
    found: dict[str, Path] = {}
    for line in output.stdout.splitlines():
        words = line.split()
        if "=>" in words and words[2].startswith("/"):
            found[words[0]] = Path(words[2]).resolve()
        elif words and words[0].startswith("/"):
            found[Path(words[0]).name] = Path(words[0]).resolve()
    return found


def install_machine_runtime(root: Path, lib_dir: str = "usr/lib64") -> dict[str, Path]:
    """Copies of this machine's loader and libc under root, as a Flatcar root holds its own."""
    target = root / lib_dir
    target.mkdir(parents=True, exist_ok=True)
    installed = {}
    for name, path in machine_runtime().items():
        shutil.copy2(path, target / name)
        installed[name] = target / name
    return installed


def write(path: Path, text: str = "", mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def copy_tool(source: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    target.chmod(0o755)
    return target


def flatcar_build_tree(build: Path) -> Path:
    """A build dir as install-extmod-build leaves it, with three real ELF host tools."""
    write(build / "Makefile", "# kernel Makefile\n")
    write(build / ".config", 'CONFIG_CC_VERSION_TEXT="gcc (Gentoo Hardened 14.3.0 p8) 14.3.0"\n')
    write(build / "Module.symvers", "0x1\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n")
    write(build / "include/generated/autoconf.h", "#define CONFIG_X86_64 1\n")
    write(build / "scripts/checkpatch.pl", "#!/usr/bin/perl\n", mode=0o755)
    write(build / "scripts/module.lds", "SECTIONS {}\n")
    copy_tool("/bin/true", build / "scripts/basic/fixdep")
    copy_tool("/bin/echo", build / "scripts/mod/modpost")
    copy_tool("/bin/cat", build / "tools/objtool/objtool")
    return build


def flatcar_root(root: Path, kernel: str = KERNEL, split_source: bool = False) -> Path:
    """A Flatcar root filesystem: its kernel tree, its glibc and things not wanted."""
    modules = root / "usr/lib/modules" / kernel
    flatcar_build_tree(modules / "build")
    if split_source:  # LTS 4081: a cleaned output dir and a separate stripped source tree
        write(modules / "source/Makefile", "# source Makefile\n")
        write(modules / "source/include/linux/module.h", "/* module.h */\n")
        (modules / "build/source").symlink_to(f"/usr/lib/modules/{kernel}/source")
    else:
        (modules / "source").symlink_to("build")
    # tar stores the second name of a file as a hard link to the first.
    os.link(modules / "build/Module.symvers", modules / "build/Module.symvers.orig")
    write(modules / "kernel/drivers/net/dummy.ko", "not wanted\n")
    write(modules / "modules.dep", "not wanted\n")
    install_machine_runtime(root)
    write(root / "usr/lib64/libjunk.so.1", "a library nothing needs\n", mode=0o755)
    (root / "usr/lib64/libjunk.so").symlink_to("libjunk.so.1")
    write(root / "usr/bin/bash", "not wanted\n", mode=0o755)
    (root / "lib64").symlink_to("usr/lib64")
    return root


def tar_gz(source: Path, prefix: str = "./", tar_format: int = tarfile.DEFAULT_FORMAT) -> bytes:
    """source as `tar -czpf` would pack it, members named with or without a leading ./"""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1, format=tar_format) as archive:
        for path in sorted(source.rglob("*")):
            archive.add(path, arcname=prefix + path.relative_to(source).as_posix(), recursive=False)
    return buffer.getvalue()


def tar_gz_members(
    members: list[tuple[tarfile.TarInfo, bytes | None]], tar_format: int = tarfile.DEFAULT_FORMAT
) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1, format=tar_format) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


class OneWayStream(io.RawIOBase):
    """A download: readable once, front to back, never seekable."""

    def __init__(self, data: bytes) -> None:
        self._source = io.BytesIO(data)
        self.size = len(data)
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = self._source.readinto(buffer)
        self.consumed += count
        return count


def mkfs_ext4(image: Path, source: Path, size: int, options: list[str]) -> None:
    """An ext4 image of source, as Flatcar's developer container holds, without root."""
    with image.open("wb") as file:
        file.truncate(size)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", *options, "-d", str(source), str(image)],
        check=True,
        capture_output=True,
    )
    # Index the large directories (htree), as a long-lived filesystem has them.
    subprocess.run(["e2fsck", "-fyD", str(image)], check=False, capture_output=True)


@dataclass(frozen=True)
class GptPartition:
    number: int
    type_guid: uuid.UUID
    name: str
    image: Path


def _copy_sparse(source: Path, target_fd: int, offset: int) -> None:
    with source.open("rb") as file:
        position = 0
        while chunk := file.read(1 << 16):
            if chunk.count(0) != len(chunk):
                os.pwrite(target_fd, chunk, offset + position)
            position += len(chunk)


def gpt_disk(path: Path, partitions: list[GptPartition], tail: int = 1 << 20) -> Path:
    """A GPT disk image with each partition's image copied in, the first at 2 MiB."""
    entries = bytearray(ENTRY_COUNT * ENTRY_SIZE)
    placed = []
    start = PARTITION_START // SECTOR
    for partition in partitions:
        sectors = -(-partition.image.stat().st_size // SECTOR)
        offset = (partition.number - 1) * ENTRY_SIZE
        entries[offset : offset + 16] = partition.type_guid.bytes_le
        entries[offset + 16 : offset + 32] = uuid.uuid4().bytes_le
        struct.pack_into("<QQQ", entries, offset + 32, start, start + sectors - 1, 0)
        name = partition.name.encode("utf-16-le")
        entries[offset + 56 : offset + 56 + len(name)] = name
        placed.append((partition, start))
        start += sectors
    size = start * SECTOR + tail
    last_lba = size // SECTOR - 1
    header = bytearray(
        struct.pack(
            "<8sIIIIQQQQ16sQIII",
            b"EFI PART",
            0x00010000,
            92,
            0,
            0,
            1,
            last_lba,
            34,
            last_lba - 33,
            uuid.uuid4().bytes_le,
            2,
            ENTRY_COUNT,
            ENTRY_SIZE,
            zlib.crc32(entries),
        )
    )
    struct.pack_into("<I", header, 16, zlib.crc32(header))
    mbr = bytearray(SECTOR)
    mbr[446:462] = struct.pack("<BBBBBBBBII", 0, 0, 2, 0, 0xEE, 0xFF, 0xFF, 0xFF, 1, last_lba)
    mbr[510:512] = b"\x55\xaa"
    with path.open("wb") as disk:
        disk.truncate(size)
        fd = disk.fileno()
        os.pwrite(fd, bytes(mbr), 0)
        os.pwrite(fd, bytes(header), SECTOR)
        os.pwrite(fd, bytes(entries), 2 * SECTOR)
        for partition, first in placed:
            _copy_sparse(partition.image, fd, first * SECTOR)
    return path


def bzip2_file(source: Path, target: Path) -> Path:
    compressor = bz2.BZ2Compressor()
    with source.open("rb") as file, target.open("wb") as out:
        while chunk := file.read(1 << 20):
            out.write(compressor.compress(chunk))
        out.write(compressor.flush())
    return target


# The developer container's two decompressors: lbzip2 where the image has it (the build image
# does), else Python's bz2 module. Each as a PATH with only that tool, or with none.
DECOMPRESSORS = ("lbzip2", "bz2-module")


def decompressor_commands(kind: str, directory: Path) -> Commands:
    """Commands whose PATH offers lbzip2 (kind "lbzip2", this machine's) or nothing."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "lbzip2":
        require("lbzip2")
        (directory / "lbzip2").symlink_to(shutil.which("lbzip2") or "lbzip2")
    return Commands(env={"PATH": str(directory)})


def developer_container_source(root: Path) -> Path:
    """What a developer container's ROOT filesystem holds, in small."""
    modules = root / "usr/lib/modules" / KERNEL
    flatcar_build_tree(modules / "build")
    (modules / "source").symlink_to("build")
    write(root / "usr/bin/gcc", "#!/bin/sh\necho gcc 14.3.0\n", mode=0o755)
    os.link(root / "usr/bin/gcc", root / "usr/bin/x86_64-cros-linux-gnu-gcc")
    write(root / "usr/lib64/libc.so.6", "a Flatcar libc\n", mode=0o755)
    write(root / "usr/lib64/libz.so.1.3", "zlib\n", mode=0o755)
    (root / "usr/lib64/libz.so.1").symlink_to("libz.so.1.3")
    (root / "lib64").symlink_to("usr/lib64")
    share = root / "usr/share/test"
    write(share / "small.txt", "hello\n")
    # With inline_data, this overflows i_block into the inode's system.data attribute.
    write(share / "medium.txt", "0123456789" * 9 + "\n")
    write(share / "empty")
    (share / "big.bin").write_bytes(os.urandom((1 << 20) + 4096) + b"tail")  # > 1 MiB: chunked
    with (share / "sparse.bin").open("wb") as sparse:
        for block in range(0, 40, 2):  # more extents than fit in an inode: a deeper tree
            sparse.seek(block * 4096)
            sparse.write(bytes([block + 1]) * 4096)
    with (share / "tail-hole.bin").open("wb") as tail_hole:
        tail_hole.write(b"data")
        tail_hole.truncate(16 * 4096)
    for number in range(MANY):  # more than a 4 KiB block of entries: e2fsck -D indexes it
        write(share / "many" / f"an-entry-with-a-long-name-{number:03d}", f"{number}\n")
    (share / "slow-link").symlink_to("x" * 100)
    (share / "absolute-link").symlink_to("/usr/lib64/libc.so.6")
    (share / "escaping-link").symlink_to("../../../../../etc/passwd")
    write(root / "etc/portage/make.conf", "not wanted\n")
    return root
