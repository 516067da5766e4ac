"""The partitions of a GPT disk image: the header and the entry array, both CRCs checked."""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass

from nvidia_driver import limits
from nvidia_driver.errors import DriverError

_SECTOR = 512
_GPT_SIGNATURE = b"EFI PART"
_GPT_HEADER_MIN, _GPT_ENTRY_MIN = 92, 128
LINUX_FILESYSTEM = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")


@dataclass(frozen=True)
class Partition:
    number: int
    name: str
    type_guid: uuid.UUID
    offset: int  # bytes from the start of the disk
    size: int  # bytes


def _pread_exact(fd: int, size: int, offset: int, label: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise DriverError(f"{label} is truncated at byte {offset}: delete it and fetch it again")
    return data


def _gpt_table(fd: int, label: str) -> tuple[bytes, int, int]:
    """The partition entry array, the number of entries and their size, CRCs checked."""
    header = _pread_exact(fd, _SECTOR, _SECTOR, label)
    if not header.startswith(_GPT_SIGNATURE):
        raise DriverError(
            f"{label} has no GPT (no 'EFI PART' at LBA 1): delete it and fetch it again"
        )
    (header_size, header_crc) = struct.unpack_from("<II", header, 12)
    entries_lba, count, entry_size, entries_crc = struct.unpack_from("<QIII", header, 72)
    if not _GPT_HEADER_MIN <= header_size <= _SECTOR or entry_size < _GPT_ENTRY_MIN:
        raise DriverError(f"{label} has a malformed GPT header: delete it and fetch it again")
    if zlib.crc32(header[:16] + bytes(4) + header[20:header_size]) != header_crc:
        raise DriverError(f"{label}: the GPT header's CRC does not match; fetch it again")
    if count * entry_size > limits.GPT_TABLE:
        raise DriverError(
            f"{label} has an implausible GPT ({count} entries of {entry_size} bytes, more than "
            f"{limits.size(limits.GPT_TABLE)}): fetch it again"
        )
    if entries_lba * _SECTOR + count * entry_size > os.fstat(fd).st_size:
        raise DriverError(
            f"{label}: its GPT partition table lies beyond the image (LBA {entries_lba}); "
            "fetch it again"
        )
    table = _pread_exact(fd, count * entry_size, entries_lba * _SECTOR, label)
    if zlib.crc32(table) != entries_crc:
        raise DriverError(f"{label}: the GPT partition table's CRC does not match; fetch it again")
    return table, count, entry_size


def read_gpt(fd: int, label: str) -> list[Partition]:
    """The partitions of the GPT disk image open as fd (512-byte sectors)."""
    table, count, entry_size = _gpt_table(fd, label)
    partitions = []
    for index in range(count):
        entry = table[index * entry_size : (index + 1) * entry_size]
        type_guid = uuid.UUID(bytes_le=entry[:16])
        if type_guid.int == 0:
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le", errors="replace").split("\0", 1)[0]
        size = (last - first + 1) * _SECTOR
        partitions.append(Partition(index + 1, name, type_guid, first * _SECTOR, size))
    return partitions
