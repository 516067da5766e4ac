"""The shell stub NVIDIA's makeself 1.6.0-nvN writes at the top of a driver .run, for the test
.run files of both suites (tests/unit/runfile_builder.py, tests/integration/fixtures/runfile.py).

The header lines and their order are those of the nv2 generator, as NVIDIA's .run files carry
them (docs/nvidia-run-format.md, section 1.2): ``KEY=value`` lines only, so that a
parser that collects the leading ones sees exactly these. What follows (a comment banner with
the format marker, the stub's code), then the embedded decompressor and the payload, is each
suite's own.
"""

from __future__ import annotations

from dataclasses import dataclass

# A str.format template: {crc} {md5} {skip} {skip_decompress} {size_decompress} {arch}
# {version}; TMPROOT's braces are doubled.
HEADER = """#! /bin/sh
CRCsum={crc}
MD5={md5}
skip={skip}
skip_decompress={skip_decompress}
size_decompress={size_decompress}
label="NVIDIA Accelerated Graphics Driver for Linux-{arch} {version}"
version_string={version}
pkg_version=1
script=./nvidia-installer
targetdir=NVIDIA-Linux-{arch}-{version}
scriptargs=""
keep=n
add_this_kernel=n
apply_patch=n
TMPROOT=${{TMPDIR:=/tmp}}
TARGET_OS="Linux"
TARGET_ARCH="{arch}"
"""
NO_MD5 = "0" * 32  # what the generator writes when it had no md5sum


@dataclass(frozen=True)
class StubNumbers:
    skip: int
    skip_decompress: int
    size_decompress: int


def render_stub(
    template: str,
    numbers: StubNumbers,
    *,
    crc: int | str,
    md5: str,
    arch: str,
    version: str,
    **more: str,
) -> bytes:
    """template (HEADER and what a suite adds, with its own fields in more), filled in."""
    return template.format(
        crc=crc,
        md5=md5,
        skip=numbers.skip,
        skip_decompress=numbers.skip_decompress,
        size_decompress=numbers.size_decompress,
        arch=arch,
        version=version,
        **more,
    ).encode()


def stub_numbers(stub_line_count: int, decompressor: bytes) -> StubNumbers:
    """Where the embedded decompressor and the payload start, as 1-based line numbers."""
    skip_decompress = stub_line_count + 1
    # The decompressor is followed by one extra newline, so the payload starts on a new line.
    size_decompress = (decompressor + b"\n").count(b"\n")
    return StubNumbers(skip_decompress + size_decompress, skip_decompress, size_decompress)
