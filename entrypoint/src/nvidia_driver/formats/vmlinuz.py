"""Read the kernel banner (what /proc/version shows) out of a kernel image that is not running.

Precompiled driver packages are matched against /proc/version, which embeds the compiler and
the build time, so the banner of a release's vmlinuz identifies the exact kernel build.
Supported: x86 bzImage, arm64 Image (plain or gzip-compressed) and EFI zboot images; anything
else is scanned for compressed streams as scripts/extract-vmlinux does.
"""

from __future__ import annotations

import bz2
import lzma
import re
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvidia_driver import limits
from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.naming import KERNEL_BANNER_RE, banner_release

BANNER_PREFIX = b"Linux version "
_MAX_BANNER_BYTES = 1024
_READ_CHUNK = 1 << 20

# x86 boot protocol (Documentation/arch/x86/boot.rst)
_SETUP_SECTS = 0x1F1
_HEADER_MAGIC = 0x202
_BOOT_PROTOCOL = 0x206
_PAYLOAD_FIELDS = 0x248  # payload_offset, payload_length: protocol 2.08+
_FIRST_PAYLOAD_PROTOCOL = 0x0208
_SECTOR = 512

# EFI zboot header (drivers/firmware/efi/libstub/zboot-header.S)
_ZBOOT_MAGIC = b"zimg"
_ZBOOT_MAGIC_OFFSET = 4
_ZBOOT_PAYLOAD_FIELDS = 8  # payload offset, payload size
_ZBOOT_COMPRESSION = 24  # NUL-terminated name, e.g. "gzip" or "zstd22"
_ZBOOT_COMPRESSION_MAX = 32

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
_ZSTD_BLOCK_HEADER = 3
_ZSTD_RLE_BLOCK = 1  # stores the one byte it repeats
_ZSTD_RESERVED_BLOCK = 3


class _NotAStreamError(Exception):
    """The bytes at a candidate offset did not decompress."""


class _TooLargeError(Exception):
    """A stream decompresses to more than limits.KERNEL_DECOMPRESSED."""


def _bounded(output: bytes | bytearray) -> bytes | bytearray:
    if len(output) > limits.KERNEL_DECOMPRESSED:
        raise _TooLargeError
    return output


def _zstd_frame_end(data: memoryview, start: int) -> int:
    """Where the zstd frame at ``start`` ends (RFC 8878 §3.1.1)."""
    descriptor = data[start + 4]
    content_size_flag, single_segment = descriptor >> 6, descriptor >> 5 & 1
    has_checksum, dictionary_flag = descriptor >> 2 & 1, descriptor & 3
    header = (
        1
        + (0 if single_segment else 1)
        + (0, 1, 2, 4)[dictionary_flag]
        + (single_segment, 2, 4, 8)[content_size_flag]
    )
    offset = start + 4 + header
    while True:
        if offset + _ZSTD_BLOCK_HEADER > len(data):
            raise _NotAStreamError("zstd frame is truncated")
        block = int.from_bytes(data[offset : offset + _ZSTD_BLOCK_HEADER], "little")
        block_type, block_size = block >> 1 & 3, block >> 3
        if block_type == _ZSTD_RESERVED_BLOCK:
            raise _NotAStreamError("not a zstd frame")
        offset += _ZSTD_BLOCK_HEADER + (1 if block_type == _ZSTD_RLE_BLOCK else block_size)
        if block & 1:
            return offset + 4 * has_checksum


def _zstd_frames(data: memoryview) -> memoryview:
    """The zstd frames at the start of ``data`` without what follows.

    zstd refuses trailing bytes, and the kernel build appends the uncompressed size to the
    stream.
    """
    end = 0
    while data[end : end + len(ZSTD_MAGIC)] == ZSTD_MAGIC:
        end = _zstd_frame_end(data, end)
    return data[:end]


def _run_tool(commands: Commands, tool: str, data: memoryview, arguments: list[str]) -> bytes:
    """Decompress with a command that reads the stream from a file and writes to a pipe.

    Its output is read up to the bound; a command still writing then is stopped by the closed
    pipe, so a bomb neither fills a disk nor the memory.
    """
    with tempfile.TemporaryFile(prefix="vmlinuz-") as source:
        source.write(data)
        source.seek(0)
        output = bytearray()
        try:
            with commands.pipe_bytes(tool, arguments, source) as decompressed:
                while chunk := decompressed.read(_READ_CHUNK):
                    output += chunk
                    _bounded(output)
        except DriverError as failure:
            # lz4 and lzop write the whole stream and then fail on the size the kernel build
            # appends to it: what they wrote counts, and the banner search judges it.
            if not output:
                raise _NotAStreamError(str(failure)) from None
    if not output:
        raise _NotAStreamError(f"{tool}: no output")
    return bytes(_bounded(output))  # also when the command failed after passing the bound


def _lz4_legacy_blocks(data: memoryview) -> memoryview:
    """The legacy lz4 frame at the start of ``data``: its magic, then blocks, each a 4-byte
    little-endian size and that many bytes, without what follows.

    The kernel build appends the uncompressed size, which lz4 1.10 (Debian forky's, the
    images') reads as one more block header: it fails, and writes none of a stream of one block.
    """
    end = len(LZ4_LEGACY_MAGIC)
    while end + 4 <= len(data):
        size = int.from_bytes(data[end : end + 4], "little")
        if size == 0 or end + 4 + size > len(data):
            break
        end += 4 + size
    return data[:end]


@dataclass(frozen=True)
class Codec:
    """A compression the kernel build uses: decompressed by the standard library's
    ``decompressor``, or by the command ``tool`` (given the stream's ``frames``)."""

    name: str
    magic: bytes
    decompressor: Callable[[], Any] | None = field(default=None, repr=False)
    tool: str = ""
    frames: Callable[[memoryview], memoryview] = field(default=memoryview, repr=False)

    def available(self, commands: Commands) -> bool:
        return not self.tool or commands.which(self.tool) is not None

    def decompress(self, data: memoryview, commands: Commands) -> bytes:
        if self.decompressor is None:
            return _run_tool(commands, self.tool, self.frames(data), ["-d", "-q", "-c"])
        # It stops one byte past the bound: more than a kernel is a bomb, not a kernel (and at
        # the end of its stream, ignoring what follows).
        inflater = self.decompressor()
        return bytes(_bounded(inflater.decompress(data, limits.KERNEL_DECOMPRESSED + 1)))


def _lzma(kind: int) -> Callable[[], Any]:
    return lambda: lzma.LZMADecompressor(kind, memlimit=limits.LZMA_MEMORY)


# The magics lib/decompress.c recognises, lengthened where the formats allow.
CODECS = (
    Codec("gzip", b"\x1f\x8b\x08", lambda: zlib.decompressobj(wbits=31)),
    Codec("bzip2", b"BZh", bz2.BZ2Decompressor),
    Codec("lzma", b"\x5d\x00\x00", _lzma(lzma.FORMAT_ALONE)),
    Codec("xz", b"\xfd7zXZ\x00", _lzma(lzma.FORMAT_XZ)),
    Codec("lzo", b"\x89LZO\x00\r\n\x1a\n", tool="lzop"),
    Codec("lz4", LZ4_LEGACY_MAGIC, tool="lz4", frames=_lz4_legacy_blocks),  # the kernel's frame
    Codec("zstd", ZSTD_MAGIC, tool="zstd", frames=_zstd_frames),
)
_CODEC_BY_NAME = {codec.name: codec for codec in CODECS}
# Makefile.zboot writes the make command's name: gzip, lz4, lzma, lzo, xzkern, zstd22.
_ZBOOT_NAMES = {"xzkern": "xz", "zstd22": "zstd"}


def codec_at(data: bytes, offset: int = 0) -> Codec | None:
    return next((codec for codec in CODECS if data.startswith(codec.magic, offset)), None)


@dataclass(frozen=True)
class _Stream:
    """A compressed stream whose place a container header states."""

    container: str
    start: int
    end: int
    codec: Codec


def _bzimage_stream(image: bytes) -> _Stream | None:
    if len(image) < _PAYLOAD_FIELDS + 8 or image[_HEADER_MAGIC : _HEADER_MAGIC + 4] != b"HdrS":
        return None
    (protocol,) = struct.unpack_from("<H", image, _BOOT_PROTOCOL)
    if protocol < _FIRST_PAYLOAD_PROTOCOL:
        return None
    setup_sectors = image[_SETUP_SECTS] or 4  # 0 means 4, for historical reasons
    offset, length = struct.unpack_from("<II", image, _PAYLOAD_FIELDS)
    start = (setup_sectors + 1) * _SECTOR + offset  # relative to the protected-mode code
    codec = codec_at(image, start)
    return None if codec is None else _Stream("bzImage", start, start + length, codec)


def _zboot_stream(image: bytes) -> _Stream | None:
    magic_end = _ZBOOT_MAGIC_OFFSET + len(_ZBOOT_MAGIC)
    if len(image) < _ZBOOT_COMPRESSION or image[_ZBOOT_MAGIC_OFFSET:magic_end] != _ZBOOT_MAGIC:
        return None
    start, size = struct.unpack_from("<II", image, _ZBOOT_PAYLOAD_FIELDS)
    field_end = _ZBOOT_COMPRESSION + _ZBOOT_COMPRESSION_MAX
    name = image[_ZBOOT_COMPRESSION:field_end].split(b"\0", 1)[0].decode("ascii", "replace")
    codec = _CODEC_BY_NAME.get(_ZBOOT_NAMES.get(name, name)) or codec_at(image, start)
    return None if codec is None else _Stream("EFI zboot", start, start + size, codec)


def _whole_file_stream(image: bytes) -> _Stream | None:
    codec = codec_at(image)  # e.g. Image.gz, as arm64 distributions ship it
    return None if codec is None else _Stream(codec.name, 0, len(image), codec)


def _stated_streams(image: bytes) -> Iterator[_Stream]:
    for find in (_bzimage_stream, _zboot_stream, _whole_file_stream):
        stream = find(image)
        if stream is not None:
            yield stream


def _scanned_streams(image: bytes, commands: Commands) -> list[tuple[int, Codec]]:
    """The first offsets where the magic of a usable codec appears, in file order.

    At most limits.KERNEL_CANDIDATES per codec: a real image has its payload's magic and a
    few found by chance, and each candidate costs a decompression attempt.
    """
    found = []
    for codec in CODECS:
        if not codec.available(commands):
            continue
        start = image.find(codec.magic)
        for _ in range(limits.KERNEL_CANDIDATES):
            if start == -1:
                break
            found.append((start, codec))
            start = image.find(codec.magic, start + 1)
    return sorted(found, key=lambda pair: pair[0])


def _try_decompress(codec: Codec, data: memoryview, commands: Commands, start: int) -> bytes:
    try:
        return codec.decompress(data, commands)
    except (zlib.error, OSError, EOFError, lzma.LZMAError, IndexError) as exc:
        raise _NotAStreamError(f"{codec.name}: {exc}") from None
    except _TooLargeError:
        raise _TooLargeError(f"the {codec.name} stream at byte {start}") from None


@dataclass
class _Search:
    """Banners looked for across the candidate decodings of one image."""

    kernel_release: str | None
    other_releases: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def banner_in(self, data: bytes) -> str | None:
        for banner in real_banners(data):
            release = banner_release(banner)
            if self.kernel_release is None or release == self.kernel_release:
                return banner
            if release not in self.other_releases:
                self.other_releases.append(release)
        return None


def real_banners(data: bytes) -> Iterator[str]:
    """Each "Linux version …" line in ``data`` that is a real banner, not a template.

    Only the first limits.BANNER_CANDIDATES such strings are looked at: one search is linear.
    """
    start = data.find(BANNER_PREFIX)
    for _ in range(limits.BANNER_CANDIDATES):
        if start == -1:
            return
        raw = data[start : start + _MAX_BANNER_BYTES]
        line = re.split(rb"[\0\n]", raw, maxsplit=1)[0].decode("utf-8", "replace")
        if KERNEL_BANNER_RE.match(line):
            yield line
        start = data.find(BANNER_PREFIX, start + 1)


def _decodings(image: bytes, commands: Commands, search: _Search) -> Iterator[bytes]:
    # An uncompressed arm64 Image ("ARM\x64" at 0x38) or vmlinux carries its banner as is.
    yield image
    view = memoryview(image)  # slices of it copy nothing
    tried = set()
    for stream in _stated_streams(image):
        tried.add(stream.start)
        if stream.codec.tool:
            # A missing decompressor is the operator's to fix: its DriverError propagates.
            commands.require(stream.codec.tool)
        payload = view[stream.start : stream.end]
        try:
            yield _try_decompress(stream.codec, payload, commands, stream.start)
        except _NotAStreamError as exc:
            search.failures.append(f"{stream.container} payload: {exc}")
    for start, codec in _scanned_streams(image, commands):
        if start not in tried:
            try:
                yield _try_decompress(codec, view[start:], commands, start)
            except _NotAStreamError:
                continue  # magics also occur by chance inside compressed data


def kernel_banner(
    image: bytes,
    *,
    kernel_release: str | None = None,
    commands: Commands | None = None,
    source: str = "kernel image",
) -> str:
    """The banner of the kernel in ``image``; with ``kernel_release``, that kernel's banner."""
    commands = commands or Commands()
    search = _Search(kernel_release)
    try:
        for data in _decodings(image, commands, search):
            banner = search.banner_in(data)
            if banner is not None:
                return banner
    except _TooLargeError as exc:
        raise DriverError(
            f"{source}: {exc} decompresses to more than "
            f"{limits.size(limits.KERNEL_DECOMPRESSED)}, more than any kernel: refusing it "
            "(a decompression bomb, or not a kernel image)"
        ) from None
    if search.other_releases:
        raise DriverError(
            f"{source} is kernel {', '.join(search.other_releases)}, not {kernel_release}: "
            "use the image of the kernel the node runs"
        )
    details = f" ({'; '.join(search.failures)})" if search.failures else ""
    raise DriverError(
        f"no kernel banner found in {source}: the image format/compression was not "
        f"recognised{details}; pass a bzImage, an arm64 Image, Image.gz or EFI zboot image"
    )


def kernel_banner_from_file(
    path: Path | str,
    *,
    kernel_release: str | None = None,
    commands: Commands | None = None,
) -> str:
    try:
        with Path(path).open("rb") as file:
            image = file.read(limits.KERNEL_IMAGE + 1)
    except OSError as exc:
        raise DriverError(f"cannot read kernel image {path}: {exc.strerror}") from None
    if len(image) > limits.KERNEL_IMAGE:
        raise DriverError(
            f"{path} is larger than {limits.size(limits.KERNEL_IMAGE)}, more than any kernel "
            "image: refusing it"
        )
    return kernel_banner(image, kernel_release=kernel_release, commands=commands, source=str(path))
