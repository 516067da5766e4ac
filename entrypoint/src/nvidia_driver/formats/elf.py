"""ELF: just enough to read PT_INTERP and DT_NEEDED, and the machine a file is built for."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

_ELF_MAGIC = b"\x7fELF"
_ELF_IDENT_SIZE = 16
_ELFCLASS64 = 2
_ELFDATA2MSB = 2
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5
_MAX_PROGRAM_HEADERS = 512
_MAX_NAME = 4096
# The ELF machine this container runs, for `uname -m` values we know.
MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183}


@dataclass(frozen=True)
class ElfInfo:
    machine: int
    interpreter: str | None  # PT_INTERP: set for dynamically linked executables
    needed: tuple[str, ...]  # DT_NEEDED


class _Segment(NamedTuple):
    kind: int
    offset: int
    vaddr: int
    filesz: int


def _read_at(file: IO[bytes], offset: int, size: int) -> bytes:
    # Before reading: read(size) allocates size bytes first, whatever a header claims.
    if offset + size > os.fstat(file.fileno()).st_size:
        raise ValueError("truncated ELF file")
    file.seek(offset)
    data = file.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def _segments(file: IO[bytes], endian: str, is64: bool) -> tuple[int, list[_Segment]]:
    header = endian + ("HHIQQQIHHH" if is64 else "HHIIIIIHHH")
    fields = struct.unpack(header, _read_at(file, _ELF_IDENT_SIZE, struct.calcsize(header)))
    machine, phoff, phentsize, phnum = fields[1], fields[4], fields[8], fields[9]
    if phnum > _MAX_PROGRAM_HEADERS:
        raise ValueError("too many program headers")
    entry = endian + ("IIQQQQQQ" if is64 else "IIIIIIII")
    segments = []
    for index in range(phnum):
        raw = struct.unpack_from(entry, _read_at(file, phoff + index * phentsize, phentsize))
        # ELF64 puts p_flags second; ELF32 puts it seventh.
        kind, offset, vaddr, filesz = (
            (raw[0], raw[2], raw[3], raw[5]) if is64 else (raw[0], raw[1], raw[2], raw[4])
        )
        segments.append(_Segment(kind, offset, vaddr, filesz))
    return machine, segments


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    for segment in segments:
        if segment.kind == _PT_LOAD and segment.vaddr <= vaddr < segment.vaddr + segment.filesz:
            return vaddr - segment.vaddr + segment.offset
    raise ValueError("address outside the loaded segments")


def _needed(file: IO[bytes], endian: str, is64: bool, segments: list[_Segment]) -> tuple[str, ...]:
    dynamic = next((s for s in segments if s.kind == _PT_DYNAMIC), None)
    if dynamic is None:
        return ()
    entry = endian + ("qQ" if is64 else "iI")
    table = _read_at(file, dynamic.offset, dynamic.filesz)
    table = table[: len(table) - len(table) % struct.calcsize(entry)]
    names: list[int] = []
    strtab = None
    for tag, value in struct.iter_unpack(entry, table):
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            names.append(value)
        elif tag == _DT_STRTAB:
            strtab = _file_offset(segments, value)
    if strtab is None:
        return ()
    return tuple(_string_at(file, strtab + offset) for offset in names)


def _string_at(file: IO[bytes], offset: int) -> str:
    file.seek(offset)
    return file.read(_MAX_NAME).split(b"\0", 1)[0].decode(errors="surrogateescape")


def read_elf(path: Path) -> ElfInfo | None:
    """The dynamic-linking facts of an ELF file; None if it is not a readable ELF file."""
    try:
        with path.open("rb") as file:
            ident = file.read(_ELF_IDENT_SIZE)
            if len(ident) < _ELF_IDENT_SIZE or not ident.startswith(_ELF_MAGIC):
                return None
            endian = ">" if ident[5] == _ELFDATA2MSB else "<"
            is64 = ident[4] == _ELFCLASS64
            machine, segments = _segments(file, endian, is64)
            interp = next((s for s in segments if s.kind == _PT_INTERP), None)
            interpreter = None
            if interp is not None:
                raw = _read_at(file, interp.offset, min(interp.filesz, _MAX_NAME))
                interpreter = raw.split(b"\0", 1)[0].decode(errors="surrogateescape")
            return ElfInfo(machine, interpreter, _needed(file, endian, is64, segments))
    except (OSError, ValueError, struct.error):
        return None
