"""Kernel images built at test time: x86 bzImage, arm64 Image, Image.gz and EFI zboot."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import subprocess

from tools import require

FLATCAR_RELEASE = "6.12.81-flatcar"
FLATCAR_BANNER = (
    "Linux version 6.12.81-flatcar (build@pony-truck.infra.kinvolk.io) "
    "(x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1 20250801, "
    "GNU ld (Gentoo 2.45 p3) 2.45.0) #1 SMP PREEMPT_DYNAMIC Mon Apr 20 18:02:03 -00 2026"
)
_BUILT_BY = "(build@pony-truck.infra.kinvolk.io)"
_COMPILER = (
    "(x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1 20250801, "
    "GNU ld (Gentoo 2.45 p3) 2.45.0)"
)
# What a Flatcar kernel holds before its real banner: a printf template and a copy that was
# cut before the build number.
TEMPLATE_BANNERS = (
    f"Linux version %s {_BUILT_BY} {_COMPILER} %s",
    f"Linux version {FLATCAR_RELEASE} {_BUILT_BY} {_COMPILER} # SMP PREEMPT_DYNAMIC ",
)
COMPRESSORS = ("gzip", "bzip2", "lzma", "xz", "lzo", "lz4", "zstd")
TOOLS = {"lzo": "lzop", "lz4": "lz4", "zstd": "zstd"}
# The names Makefile.zboot writes into the header.
ZBOOT_NAMES = {"xz": "xzkern", "zstd": "zstd22"}


def filler(size: int, seed: int = 1) -> bytes:
    """Deterministic bytes with no banner and no compression magic in them."""
    pattern = bytes((seed * 37 + index * 11) % 251 for index in range(251)).replace(b"\x1f", b"")
    return (pattern * (size // len(pattern) + 1))[:size]


def vmlinux(
    banner: str = FLATCAR_BANNER, *, templates: tuple[str, ...] = TEMPLATE_BANNERS
) -> bytes:
    """A decompressed kernel: code, then the templates, then the banner, as .rodata has them."""
    parts = [b"\x7fELF\x02\x01\x01\x00", filler(4096)]
    for template in templates:
        parts += [template.encode(), b"\0", filler(512, seed=2)]
    parts += [banner.encode(), b"\n\0", filler(8192, seed=3)]
    return b"".join(parts)


def run_tool(tool: str, *args: str, data: bytes) -> bytes:
    """The output of a compressor fed ``data``; fails the test when it is not installed."""
    require(tool)
    return subprocess.run([tool, *args], input=data, capture_output=True, check=True).stdout


def compress(name: str, data: bytes) -> bytes:
    """``data`` as one stream in the format the kernel's Makefiles use."""
    return {
        "gzip": lambda: gzip.compress(data, mtime=0),
        "bzip2": lambda: bz2.compress(data),
        "lzma": lambda: lzma.compress(data, format=lzma.FORMAT_ALONE),
        "xz": lambda: lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32),
        "lzo": lambda: run_tool("lzop", "-9", "-c", data=data),
        "lz4": lambda: run_tool("lz4", "-l", "-9", "-c", data=data),
        "zstd": lambda: run_tool("zstd", "-19", "-c", data=data),
    }[name]()


def bzimage_payload(name: str, data: bytes) -> bytes:
    """arch/x86/boot/compressed appends the uncompressed size to all but gzip (which has it)."""
    stream = compress(name, data)
    return stream if name == "gzip" else stream + struct.pack("<I", len(data))


def zboot_payload(name: str, data: bytes) -> bytes:
    """Makefile.zboot appends the uncompressed size whatever the compression."""
    return compress(name, data) + struct.pack("<I", len(data))


def bzimage(payload: bytes, *, setup_sects: int = 15) -> bytes:
    """An x86 bzImage: real-mode setup with a boot header, then the decompressor and payload."""
    setup = bytearray(filler(((setup_sects or 4) + 1) * 512, seed=4))
    setup[0x1F1] = setup_sects
    setup[0x1FE:0x200] = b"\x55\xaa"
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, 0x020F)  # boot protocol 2.15
    decompressor = filler(0x600, seed=5)
    struct.pack_into("<II", setup, 0x248, len(decompressor), len(payload))
    return bytes(setup) + decompressor + payload + filler(0x300, seed=6)


def arm64_image(kernel: bytes) -> bytes:
    header = bytearray(64)
    header[0x38:0x3C] = b"ARM\x64"
    return bytes(header) + kernel


def zboot(payload: bytes, compression: str) -> bytes:
    """An EFI zboot image: a PE stub whose header says where the compressed Image is.

    The header's size leaves out the appended uncompressed size, as zboot-header.S does.
    """
    header = bytearray(filler(0x1000, seed=7))
    header[0:4] = b"MZ\0\0"
    header[4:8] = b"zimg"
    struct.pack_into("<IIII", header, 8, len(header), len(payload) - 4, 0, 0)
    name = ZBOOT_NAMES.get(compression, compression).encode()
    header[24:56] = name.ljust(32, b"\0")
    return bytes(header) + payload + filler(0x200, seed=8)
