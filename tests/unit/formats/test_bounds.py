"""Decompression bombs and fan-outs: every reader stops at its bound with one line.

The bounds themselves (limits.py) are far above what these small inputs reach, so most tests
lower the one they prove and check that the reader stops there, before writing or holding more.
"""

from __future__ import annotations

import bz2
import io
import tarfile
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from kerneltree_fixtures import (
    DECOMPRESSORS,
    KERNEL,
    decompressor_commands,
    flatcar_root,
    mkfs_ext4,
    tar_gz,
    write,
)
from runfile_builder import Compression, compress, write_run
from tools import needs
from vmlinuz_images import vmlinux

from nvidia_driver import limits
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import output, tar
from nvidia_driver.formats.vmlinuz import kernel_banner, kernel_banner_from_file
from nvidia_driver.image import runfile
from nvidia_driver.kbuild import container, devcontainer, kerneltree

MODULES = f"usr/lib/modules/{KERNEL}"
needs_e2fsprogs = needs("mkfs.ext4", "debugfs")


class Written:
    """Counts the bytes the extraction writes to files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        original = output.write_all

        def counting(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
            self.bytes += len(data)
            original(fd, data, offset)

        monkeypatch.setattr(output, "write_all", counting)


def zeros_gz(members: list[tuple[str, int]]) -> bytes:
    """A tar.gz of files of zeros (what a bomb holds), compressed without holding them."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as archive:
        archive.addfile(tarfile.TarInfo(f"{MODULES}/build/Makefile"), io.BytesIO(b""))
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, io.BytesIO(bytes(size)))
    return zlib.compress(raw.getvalue(), 9, wbits=31)


def extract(data: bytes, tmp_path: Path) -> kerneltree.KernelTree:
    return container.extract_container_tree(io.BytesIO(data), tmp_path / "tree", KERNEL)


# flatcar-container.tar.gz


def test_a_member_larger_than_its_bound_is_refused_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "CONTAINER_MEMBER", 1 << 20)
    written = Written(monkeypatch)
    bomb = zeros_gz([(f"{MODULES}/build/bomb", 8 << 20)])
    assert len(bomb) < 16 << 10  # 16 KiB of gzip for 8 MiB: the reviewer's 0.5 MB made 512 MiB

    with pytest.raises(DriverError, match=r"bomb of 8388608 bytes, more than the 1 MiB") as error:
        extract(bomb, tmp_path)

    assert "\n" not in str(error.value)
    assert "refusing the archive" in str(error.value)
    assert written.bytes == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # the staging dir is gone


def test_the_bytes_written_in_all_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "CONTAINER_WRITTEN", 4 << 20)
    written = Written(monkeypatch)
    bomb = zeros_gz([(f"{MODULES}/build/part{n}", 1 << 20) for n in range(8)])

    with pytest.raises(DriverError, match=r"has more than 4 MiB to write, beyond any Flatcar"):
        extract(bomb, tmp_path)

    assert written.bytes <= 4 << 20


def test_the_entries_written_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "CONTAINER_ENTRIES", 20)
    data = tar_gz(flatcar_root(tmp_path / "flatcar"))
    with pytest.raises(DriverError, match="has more than 20 entries to write"):
        extract(data, tmp_path / "out")


def test_the_inflated_archive_is_bounded_even_where_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "CONTAINER_INFLATED", 4 << 20)
    bomb = zeros_gz([("usr/share/skipped", 16 << 20)])  # not part of the tree: only inflated
    with pytest.raises(DriverError, match=r"has more than 4 MiB of data once inflated"):
        extract(bomb, tmp_path)


def pax_header(records: dict[str, str], kind: bytes = tarfile.XHDTYPE) -> bytes:
    return tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined,no-any-return]
        records, kind, "utf-8"
    )


def header(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.GNU_FORMAT)


MAKEFILE = header(f"{MODULES}/build/Makefile")
END = bytes(2 * tarfile.BLOCKSIZE)


def gzip_of(*parts: bytes) -> bytes:
    """parts, gzip-compressed a part at a time: many MiB of one byte take a few KiB."""
    compressor = zlib.compressobj(1, wbits=31)
    return b"".join(compressor.compress(part) for part in parts) + compressor.flush()


def refused_within(data: bytes, tmp_path: Path, expected: str, memory: int = 8 << 20) -> None:
    """The container tarball data is refused with expected, holding less than memory at its
    peak, and tarfile asked for the stream's bytes a bounded number of times (counted, not
    timed: 3.11's tarfile, skipping past the end, asked 700,000 times for a 7 GiB member)."""
    reads = 0
    read = tar._Decompressed.read

    def counted(self: tar._Decompressed, size: int = -1, /) -> bytes:
        nonlocal reads
        reads += 1
        return read(self, size)

    tracemalloc.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tar._Decompressed, "read", counted)
            with pytest.raises(DriverError, match=expected) as error:
                extract(data, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reads < 1000
    assert "\n" not in str(error.value)
    assert peak < memory


def test_extended_headers_are_bounded_together(tmp_path: Path) -> None:
    # 20 pax headers before one member, each 64 KiB with keys of its own: they add up.
    pax = b"".join(
        pax_header({f"comment.{n}.{m}": "x" * 16000 for m in range(4)}) for n in range(20)
    )
    with pytest.raises(DriverError, match="more than 1048576 bytes of extended headers"):
        extract(zlib.compress(pax + MAKEFILE + END, 9, wbits=31), tmp_path)


@pytest.mark.parametrize(
    "kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK]
)
def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path, kind: bytes) -> None:
    # tarfile reads such a header whole: 64 MiB of it peaked at 128 MiB.
    size = 64 << 20
    data = gzip_of(header("././@LongHeader", kind, size), bytes(size), MAKEFILE, END)
    refused_within(data, tmp_path, f"a {size}-byte extended header")


def test_a_run_of_extended_headers_is_bounded(tmp_path: Path) -> None:
    # Empty ones: no bytes to count, but tarfile reads each by a level of recursion.
    data = gzip_of(pax_header({}) * 5000, MAKEFILE, END)
    refused_within(data, tmp_path, "more than 32 extended headers before one member")


def test_an_old_gnu_sparse_map_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sparse header whose blocks of 21 holes each say another block follows, 100,000 times;
    # tarfile reads them into a list.
    monkeypatch.setattr(limits, "TAR_METADATA", 64 << 10)
    sparse = bytearray(header("usr/share/holes", tarfile.GNUTYPE_SPARSE))
    sparse[482] = 1  # the header's "extended" flag
    sparse[148:156] = b" " * 8
    sparse[148:156] = b"%06o\0 " % sum(sparse)  # its checksum again
    block = bytearray(b"%011o\0%011o\0" % (1, 1) * 21 + bytes(8))
    block[504] = 1  # and another
    data = gzip_of(bytes(sparse), bytes(block) * 100_000, MAKEFILE, END)
    refused_within(data, tmp_path, "more than 65536 bytes of extended headers")


def test_a_gnu_1_0_sparse_map_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GNU's pax sparse format 1.0: the map, a number a line, before the data; tarfile reads it
    # into a list.
    monkeypatch.setattr(limits, "TAR_METADATA", 64 << 10)
    sparse = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "4"}
    count = 1 << 20
    data = gzip_of(
        pax_header(sparse),
        header("usr/share/GNUSparseFile.0/holes", size=len(b"%d\n" % count) + 4 * count),
        b"%d\n" % count,
        b"1\n" * 2 * count,
        MAKEFILE,
        END,
    )
    refused_within(data, tmp_path, "more than 65536 bytes of extended headers")


@pytest.mark.parametrize("size", [1 << 80, 9 << 30], ids=["base-256", "pax"])
def test_a_member_past_the_bound_is_refused_before_it_is_skipped(tmp_path: Path, size: int) -> None:
    # Nothing follows its header: tarfile would skip it to its end a block at a time.
    info = tarfile.TarInfo("usr/share/huge")
    info.size = size
    tar_format = tarfile.GNU_FORMAT if size > 1 << 64 else tarfile.PAX_FORMAT
    data = gzip_of(MAKEFILE, info.tobuf(tar_format))
    refused_within(data, tmp_path, "has more than 8 GiB of data once inflated")


def test_a_member_past_the_end_of_the_stream_is_refused_at_the_end(tmp_path: Path) -> None:
    # 3.11's tarfile went on skipping past the end, a block at a time, for as long as the size
    # said: within the bound, 7 GiB took 700,000 reads.
    data = gzip_of(MAKEFILE, header("usr/share/big", size=7 << 30))
    refused_within(data, tmp_path, "cannot extract flatcar-container.tar.gz: unexpected end of")


def test_global_pax_headers_are_not_kept(tmp_path: Path) -> None:
    # tarfile adds every global record to every later member: 2,000 global headers before as
    # many members would make 2,000 records to copy per member, and a global path renames all.
    globals_ = (pax_header({f"comment.{n}": "x", "path": "/etc/evil"}, tarfile.XGLTYPE)
                + header(f"usr/share/doc/{n}") for n in range(2000))  # fmt: skip
    data = gzip_of(*globals_, MAKEFILE, END)
    with tar.TarStream.open(io.BytesIO(data), 1 << 30, tar.Budget(0, 0, 0), "gzip") as archive:
        members = [(member.name, member.pax_headers) for member in archive.members()]
    assert members[0] == ("usr/share/doc/0", {})
    assert members[-1] == (f"{MODULES}/build/Makefile", {})


# NVIDIA's .run: one tar stream, walked member by member (image/runfile.py).


def run_of_zeros(
    path: Path, members: list[tuple[str, int]], compression: Compression = "gzip"
) -> Path:
    """A .run whose tar holds files of zeros, compressed (so a few KiB for many MiB)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, io.BytesIO(bytes(size)))
    return write_run(path, compress(raw.getvalue(), compression)).path


def test_a_run_member_larger_than_its_bound_is_refused_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "RUN_MEMBER", 1 << 20)
    written = Written(monkeypatch)
    bomb = run_of_zeros(tmp_path / "x.run", [("./nvidia-smi", 10), ("./bomb", 8 << 20)])
    with pytest.raises(
        DriverError, match=r"it has \./bomb of 8388608 bytes, more than the 1 MiB a file may have"
    ) as error:
        runfile.extract(bomb, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert written.bytes == 10
    assert not (tmp_path / "out").exists()


def test_the_bytes_a_run_writes_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "RUN_WRITTEN", 4 << 20)
    written = Written(monkeypatch)
    bomb = run_of_zeros(tmp_path / "x.run", [(f"./part{n}", 1 << 20) for n in range(8)])
    with pytest.raises(DriverError, match=r"it has more than 4 MiB to write; it is not a genuine"):
        runfile.extract(bomb, tmp_path / "out")
    assert written.bytes <= 4 << 20


def test_the_entries_a_run_writes_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "RUN_ENTRIES", 20)
    bomb = run_of_zeros(tmp_path / "x.run", [(f"./empty{n}", 0) for n in range(30)])
    with pytest.raises(DriverError, match="it has more than 20 entries to write"):
        runfile.extract(bomb, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_run_s_tar_stream_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "RUN_INFLATED", 4 << 20)
    bomb = run_of_zeros(tmp_path / "x.run", [("./big", 16 << 20)])
    with pytest.raises(DriverError, match="it has more than 4 MiB of data once inflated"):
        runfile.extract(bomb, tmp_path / "out")


def test_an_xz_stream_that_needs_more_memory_than_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # xz's default preset (6) has an 8 MiB dictionary: about 9 MiB to decompress.
    monkeypatch.setattr(limits, "LZMA_MEMORY", 1 << 20)
    built = run_of_zeros(tmp_path / "x.run", [("./small", 1024)], "xz")
    with pytest.raises(DriverError, match=r"^unpacking the driver package failed: Memory usage"):
        runfile.extract(built, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# The developer container: its disk image and what debugfs extracts from its ext4 file system.


@pytest.mark.parametrize("kind", DECOMPRESSORS)
def test_the_decompressed_disk_image_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(limits, "DISK_IMAGE", 4 << 20)
    commands = decompressor_commands(kind, tmp_path / "bin")
    compressor = bz2.BZ2Compressor()
    data = b"".join(compressor.compress(bytes(1 << 20)) for _ in range(16)) + compressor.flush()
    (tmp_path / "dev.bin.bz2").write_bytes(data)
    with pytest.raises(DriverError, match=r"dev.bin.bz2 decompresses to more than 4 MiB"):
        devcontainer.decompress_sparse(tmp_path / "dev.bin.bz2", tmp_path / "disk.bin", commands)
    assert (tmp_path / "disk.bin").stat().st_size <= 5 << 20


@pytest.fixture
def small_root_partition(tmp_path: Path) -> Path:
    """An ext4 image holding usr/share/deep/d/.../d, 8 d deep, with 4 files at the bottom."""
    deep = tmp_path / "source/usr/share/deep" / "/".join("d" * 8)
    for number in range(4):
        write(deep / f"f{number}", f"{number}\n")
    mkfs_ext4(tmp_path / "root.img", tmp_path / "source", 4 << 20, ["-O", "^has_journal"])
    return tmp_path / "root.img"


@needs_e2fsprogs
@pytest.mark.parametrize(("bound", "value", "expected"), [
    ("EXT4_ENTRIES", 14, "holds more than 14 entries to extract"),  # it has 15
    ("PATH_DEPTH", 11, r"/usr/share/deep(/d){8}/f[0-3] is more than 11 directories deep"),
])  # fmt: skip
def test_the_extracted_developer_container_is_bounded(  # noqa: PLR0917 - pytest's fixtures
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    small_root_partition: Path,
    bound: str,
    value: int,
    expected: str,
) -> None:
    monkeypatch.setattr(limits, bound, value)
    partition = devcontainer.Partition(9, "ROOT", devcontainer.LINUX_FILESYSTEM, 0, 4 << 20)
    (tmp_path / "root").mkdir()
    with pytest.raises(DriverError, match=expected) as failure:
        devcontainer.extract_root(
            small_root_partition,
            partition,
            ["usr"],
            tmp_path / "root",
            label="root.img",
            commands=Commands(),
        )
    assert "\n" not in str(failure.value)


# vmlinuz


def test_a_kernel_image_bomb_is_refused_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "KERNEL_DECOMPRESSED", 8 << 20)
    compressor = bz2.BZ2Compressor()
    bomb = b"".join(compressor.compress(bytes(1 << 20)) for _ in range(64)) + compressor.flush()
    assert len(bomb) < 1024  # the reviewer's: 402 bytes to 1 GiB
    tracemalloc.start()
    try:
        with pytest.raises(DriverError, match=r"bzip2 stream at byte 0 decompresses to more"):
            kernel_banner(bomb, source="vmlinuz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20  # the bound and a copy, not the 64 MiB the stream holds


def test_a_kernel_image_larger_than_its_bound_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "KERNEL_IMAGE", 1 << 20)
    (tmp_path / "vmlinuz").write_bytes(bytes(2 << 20))
    with pytest.raises(DriverError, match=r"vmlinuz is larger than 1 MiB"):
        kernel_banner_from_file(tmp_path / "vmlinuz")


@pytest.mark.parametrize("magic", [b"BZh", b"\x1f\x8b\x08", b"\x5d\x00\x00", b"Linux version "])
def test_the_banner_search_is_linear(magic: bytes) -> None:
    # 1 MB of bzip2 magics took 4.9 s: every candidate copied the rest of the image.
    image = magic * ((1 << 20) // len(magic))
    started = time.monotonic()
    with pytest.raises(DriverError, match="no kernel banner found"):
        kernel_banner(image, source="vmlinuz")
    assert time.monotonic() - started < 2.0  # ~0.05 s here; quadratic, it took seconds


def test_the_banner_is_still_found_behind_chance_magics() -> None:
    # Chance magics before the real stream, as compressed data has them, cost one try each.
    payload = zlib.compress(vmlinux(), 9, wbits=31)
    image = b"BZh" * 10 + b"\0" * 64 + payload
    assert kernel_banner(image).startswith("Linux version 6.12.81-flatcar ")
