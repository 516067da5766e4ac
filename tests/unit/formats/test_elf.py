"""What formats/elf.py reads of an ELF file: within the file, whatever its headers say."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nvidia_driver.formats import elf

_EHDR, _PHDR = "<16sHHIQQQIHHHHHH", "<IIQQQQQQ"  # ELF64, little-endian


@pytest.mark.parametrize("filesz", [1 << 40, 1 << 62, 1 << 63])
def test_a_segment_larger_than_the_file_is_not_read(tmp_path: Path, filesz: int) -> None:
    # read(n) allocates n bytes before it reads: a crafted p_filesz was a MemoryError (an
    # OverflowError past 2**63), not "not a readable ELF file".
    ident = b"\x7fELF\x02\x01\x01".ljust(16, b"\0")
    header = struct.pack(_EHDR, ident, 3, 62, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    dynamic = struct.pack(_PHDR, 2, 4, 0, 0, 0, filesz, filesz, 8)  # PT_DYNAMIC
    path = tmp_path / "tool"
    path.write_bytes(header + dynamic)
    assert elf.read_elf(path) is None
