"""A bounded fuzz suite of the parsers that read downloads and host files.

Every input either parses or fails with DriverError in one line, within a memory and a work
bound. Deterministic: a fixed seed (derandomize), a fixed number of examples, no example
database and no deadline (the work bound counts calls, per example, instead of a clock).
"""

from __future__ import annotations

import bz2
import cProfile
import gzip
import io
import lzma
import shutil
import tarfile
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kerneltree_fixtures import (
    KERNEL,
    LINUX_FILESYSTEM,
    GptPartition,
    gpt_disk,
    tar_gz,
    write,
)
from runfile_builder import compress, write_run
from tools import require
from vmlinuz_images import bzimage, vmlinux

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.vmlinuz import kernel_banner
from nvidia_driver.image.manifest import parse_manifest
from nvidia_driver.image.runfile import extract as unpack_run
from nvidia_driver.image.runfile import payload_offset, read_header, sniff_compression
from nvidia_driver.kbuild import container, devcontainer
from nvidia_driver.node.host import parse_os_release
from nvidia_driver.sources.fetch import sha512_from_digests

TOOLS = Commands()
MEMORY_BOUND = 64 << 20  # traced by tracemalloc, per example (the inputs are kilobytes)
# Calls per example, the C functions' too (a runaway loop or a quadratic one makes millions):
# 15 times the most one takes (6,648, a mutated tar).
CALL_BOUND = 100_000


def fuzz(examples: int) -> Callable[[Any], Any]:
    return settings(
        max_examples=examples,
        derandomize=True,  # the same examples on every run
        database=None,  # and no failures replayed from an earlier run
        deadline=None,  # the work bound below, not a clock, which flakes under load
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=False,
    )


def within_bounds(parse: Callable[[], object]) -> None:
    """Run parse: it returns, or raises DriverError in one line, within both bounds."""
    failure: DriverError | None = None
    counter = cProfile.Profile()
    tracemalloc.start()  # only around the parser: tracing hypothesis too would triple the time
    counter.enable()
    try:
        parse()
    except DriverError as error:
        failure = error
    finally:
        counter.disable()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    calls = sum(entry.callcount for entry in counter.getstats())
    assert failure is None or "\n" not in str(failure), str(failure)
    assert calls < CALL_BOUND, f"{calls} calls"
    assert peak < MEMORY_BOUND, f"{peak} bytes"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def fresh(scratch: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=scratch))


def mutated(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """data with bytes replaced at positions taken modulo its length, then maybe cut short."""
    changed = bytearray(data)
    for position, value in edits:
        changed[position % len(changed)] = value
    return bytes(changed[:cut] if cut is not None else changed)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 24), st.integers(0, 255)), max_size=12)
CUTS = st.none() | st.integers(0, 1 << 16)


# The tar reader (formats/tar.py: tarfile, bounded), as both its users read: the container
# tarball (gzip, inflated by the reader) and a .run (its payload decompressed before the reader).


@pytest.fixture(scope="module")
def small_root(scratch: Path) -> Path:
    root = scratch / "root"
    build = root / "usr/lib/modules" / KERNEL / "build"
    write(build / "Makefile", "# kernel Makefile\n")
    write(build / "include/generated/autoconf.h", "#define CONFIG_X86_64 1\n")
    (root / "usr/lib/modules" / KERNEL / "source").symlink_to("build")
    (build / "scripts").mkdir()
    (build / "scripts/link").symlink_to("../Makefile")
    write(root / "usr/lib64/libz.so.1.3", "zlib\n")
    (root / "usr/lib64/libz.so.1").symlink_to("libz.so.1.3")
    return root


def extract_tar(scratch: Path, data: bytes) -> None:
    destination = fresh(scratch) / "tree"
    try:
        within_bounds(lambda: container.extract_container_tree(io.BytesIO(data), destination, None))
    finally:
        shutil.rmtree(destination.parent)


def extract_run(scratch: Path, tar: bytes) -> None:
    directory = fresh(scratch)
    built = write_run(directory / "x.run", compress(tar, "gzip"), checksums="none")
    try:
        within_bounds(lambda: unpack_run(built.path, directory / "out"))
    finally:
        shutil.rmtree(directory)


def extract_both(scratch: Path, tar: bytes) -> None:
    extract_tar(scratch, zlib.compress(tar, 1, wbits=31))
    extract_run(scratch, tar)


@fuzz(150)
@given(edits=EDITS, cut=CUTS, tar_format=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_tar_reader_on_mutated_archives(
    scratch: Path, small_root: Path, edits: list[tuple[int, int]], cut: int | None, tar_format: int
) -> None:
    raw = gzip.decompress(tar_gz(small_root, tar_format=tar_format))
    extract_both(scratch, mutated(raw, edits, cut))


NAMES = st.lists(
    st.sampled_from(["usr", "lib", "modules", KERNEL, "build", "source", "..", ".", "", "a",
                     "lib64", "x.so.1", "\0", "scripts", "tools"]),
    min_size=1,
    max_size=10,
).map("/".join)  # fmt: skip
PAX_VALUES = st.text(st.sampled_from("0123456789.-+e nanif\0/²٣,"), max_size=24)
# What tarfile reads of a pax header, GNU's sparse formats included (1.0: major 1, minor 0).
PAX_KEYS = st.sampled_from([
    "path", "linkpath", "size", "mtime", "GNU.sparse.x", "GNU.sparse.size", "GNU.sparse.map",
    "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.realsize", "GNU.sparse.name",
])  # fmt: skip
MEMBERS = st.lists(
    st.tuples(
        NAMES,
        st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                         tarfile.CHRTYPE, tarfile.FIFOTYPE, tarfile.GNUTYPE_SPARSE]),
        NAMES,
        st.binary(max_size=600),
        st.dictionaries(PAX_KEYS, PAX_VALUES, max_size=3),
        st.sampled_from([tarfile.XHDTYPE, tarfile.XGLTYPE]),
    ),
    max_size=12,
)  # fmt: skip


@fuzz(150)
@given(members=MEMBERS)
def test_tar_reader_on_made_up_members(scratch: Path, members: list[Any]) -> None:
    archive = bytearray()
    for name, kind, link, data, pax, pax_kind in members:
        if pax:
            archive += tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
                pax, pax_kind, "utf-8"
            )
        info = tarfile.TarInfo(name[:99])
        info.type, info.linkname, info.size = kind, link[:99], len(data)
        archive += info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        archive += data + bytes(-len(data) % tarfile.BLOCKSIZE)
    archive += bytes(2 * tarfile.BLOCKSIZE)
    extract_both(scratch, bytes(archive))


# The developer container's partition table, as partx reads it.

GPT_HEAD = 64 << 10  # the protective MBR, the GPT header and its entries, and then some


@pytest.fixture(scope="module")
def gpt_image(scratch: Path) -> tuple[bytes, int]:
    """The first 64 KiB of a GPT disk (its partition 9 starts at 2 MiB) and the disk's size."""
    write(scratch / "partition.img", "\0" * 4096)
    disk = gpt_disk(
        scratch / "disk.bin",
        [GptPartition(9, LINUX_FILESYSTEM, "ROOT", scratch / "partition.img")],
        tail=4096,
    )
    with disk.open("rb") as file:
        return file.read(GPT_HEAD), disk.stat().st_size


@fuzz(50)  # a partx process each
@given(
    # The header's 92 bytes, and the first entries (partition 9's at 2048).
    edits=st.lists(
        st.tuples(st.integers(512, 604) | st.integers(1024, 2304), st.integers(0, 255)),
        max_size=8,
    ),
    fix_crcs=st.booleans(),
)
def test_partition_table_on_mutated_tables(
    scratch: Path, gpt_image: tuple[bytes, int], edits: list[tuple[int, int]], fix_crcs: bool
) -> None:
    require("partx")
    head, size = gpt_image
    disk = bytearray(mutated(head, edits, None))
    if fix_crcs:  # past the checksums, to the fields behind them
        header_size = min(max(int.from_bytes(disk[524:528], "little"), 92), 512)
        disk[512 + 88 : 512 + 92] = zlib.crc32(disk[1024 : 1024 + 128 * 128]).to_bytes(4, "little")
        disk[512 + 16 : 512 + 20] = bytes(4)
        crc = zlib.crc32(disk[512 : 512 + header_size])
        disk[512 + 16 : 512 + 20] = crc.to_bytes(4, "little")
    directory = fresh(scratch)
    try:
        with (directory / "disk.bin").open("wb") as file:
            file.write(disk)
            file.truncate(size)  # sparse: the rest of the disk is zeros

        def read() -> None:
            partitions = devcontainer.read_partitions(directory / "disk.bin", "disk.bin", TOOLS)
            devcontainer.root_partition(partitions, size, "disk.bin")

        within_bounds(read)
    finally:
        shutil.rmtree(directory)


# The kernel banner finder (vmlinuz).

NO_TOOLS = Commands(env={"PATH": "/nonexistent"})  # the stdlib codecs; no process per example
KERNEL_IMAGE = vmlinux()
PIECES = st.sampled_from([
    b"BZh91AY&SY", b"BZh", b"\x1f\x8b\x08\x00", b"\x5d\x00\x00\x80\x00", b"\xfd7zXZ\x00",
    b"\x89LZO\x00\r\n\x1a\n", b"\x02\x21\x4c\x18", b"\x28\xb5\x2f\xfd", b"HdrS", b"zimg",
    b"Linux version ", b"6.12.81-flatcar (b@h) (gcc) #1 SMP\n", b"%s", b"\0", b"\xff" * 8,
    gzip.compress(KERNEL_IMAGE[:2048]), bz2.compress(KERNEL_IMAGE[:2048]),
    lzma.compress(KERNEL_IMAGE[:2048]),
])  # fmt: skip


@fuzz(200)
@given(pieces=st.lists(PIECES | st.binary(max_size=64), max_size=24))
def test_banner_finder_on_made_up_images(pieces: list[bytes]) -> None:
    within_bounds(lambda: kernel_banner(b"".join(pieces), commands=NO_TOOLS, source="vmlinuz"))


@fuzz(100)
@given(compression=st.sampled_from(["gzip", "bzip2", "xz", "lzma"]), edits=EDITS, cut=CUTS)
def test_banner_finder_on_mutated_bzimages(
    compression: str, edits: list[tuple[int, int]], cut: int | None
) -> None:
    compress = {
        "gzip": gzip.compress,
        "bzip2": bz2.compress,
        "xz": lzma.compress,
        "lzma": lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE),
    }[compression]
    image = mutated(bzimage(compress(KERNEL_IMAGE)), edits, cut)
    within_bounds(lambda: kernel_banner(image, commands=NO_TOOLS, source="vmlinuz"))


# The .run header and the .manifest.

HEADER_LINES = st.lists(
    st.sampled_from([
        "#!/bin/sh", 'CRCsum="3795466356"', 'MD5="d41d8cd98f00b204e9800998ecf8427e"',
        "skip=735", "skip=0", "skip=²", "skip=99999999999", 'label="NVIDIA Accelerated Graphics"',
        'version_string="580.105.08"', 'TARGET_ARCH="x86_64"', "CRCsum=x", "MD5=zz", "",
        "exit 0", "\x28\xb5\x2f\xfd", "\xfd7zXZ", "\x1f\x8b\x08",
    ]) | st.text(max_size=40),
    max_size=16,
)  # fmt: skip


@fuzz(200)
@given(lines=HEADER_LINES, tail=st.binary(max_size=256))
def test_runfile_header_parser(scratch: Path, lines: list[str], tail: bytes) -> None:
    directory = fresh(scratch)
    runfile = directory / "NVIDIA-Linux-x86_64-580.105.08.run"
    runfile.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n" + tail)

    def parse() -> None:
        header = read_header(runfile)
        sniff_compression(runfile, payload_offset(runfile, header))

    try:
        within_bounds(parse)
    finally:
        shutil.rmtree(directory)


MANIFEST_HEAD = (
    "NVIDIA Accelerated Graphics Driver\n580.105.08\nNVIDIA\nnvidia nvidia-uvm\n\n\n\n\n"
)
MANIFEST_WORDS = st.sampled_from([
    "nvidia-smi", "0755", "04755", "0o755", "²", "UTILITY_BINARY", "CUDA_LIB", "NATIVE",
    "COMPAT32", "/", "INHERIT_PATH_DEPTH:1", "INHERIT_PATH_DEPTH:99", "INHERIT_PATH_DEPTH:x",
    "KERNEL_MODULE_SRC", "CUDA_SYMLINK", "MODULE:nvml", "kernel/a/b.h", "../x", "FIRMWARE",
    "SYSTEMD_UNIT_SYMLINK", "TLS_LIB", "CLASSIC", "libcuda.so.1",
])  # fmt: skip


@fuzz(300)
@given(
    entries=st.lists(st.lists(MANIFEST_WORDS | st.text(max_size=12), max_size=8), max_size=12),
    head=st.booleans(),
)
def test_manifest_parser(entries: list[list[str]], head: bool) -> None:
    text = (MANIFEST_HEAD if head else "") + "\n".join(" ".join(words) for words in entries)
    within_bounds(lambda: parse_manifest(text))


# The DIGESTS file and os-release.

DIGEST_LINES = st.lists(
    st.sampled_from([
        "# SHA512 HASH", "# MD5 HASH", "# sha512 hash", "#", "a" * 128 + "  vmlinuz",
        "A" * 128 + " *dir/vmlinuz", "z" * 128 + "  vmlinuz", "a" * 127 + "  vmlinuz",
        "²" * 128 + "  vmlinuz",
    ]) | st.text(max_size=60),
    max_size=12,
)  # fmt: skip


@fuzz(300)
@given(lines=DIGEST_LINES)
def test_digests_parser(lines: list[str]) -> None:
    text = "\n".join(lines)

    def parse() -> None:
        digest = sha512_from_digests(text, "vmlinuz")
        assert digest is None or len(digest) == 128

    within_bounds(parse)


OS_RELEASE_LINES = st.lists(
    st.sampled_from([
        "ID=flatcar", 'VERSION_ID="4593.2.5"', "VERSION_ID='4081.3.10'", 'NAME="a \\"b\\""',
        "#comment", "=", "KEY=", 'BROKEN="', "A='unterminated", "X=a b c", "\\", "ID=\0",
    ]) | st.text(max_size=40),
    max_size=16,
)  # fmt: skip


@fuzz(300)
@given(lines=OS_RELEASE_LINES)
def test_os_release_parser(lines: list[str]) -> None:
    within_bounds(lambda: parse_os_release("\n".join(lines)))
